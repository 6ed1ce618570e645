"""Projects whose plan is an arbitrary DAG of one-call units, and a fake model for them.

``make_dag_project(dest, deps)`` writes a project whose units are kind ``notes`` (which needs
no sources); ``dag_kind`` (install it with ``use_dag_kind``) replaces that kind's function for
the test: it reads every dependency's ``out.json``, makes one model call whose payload names
those hashes, and writes ``out.json`` from the answer — so a unit's output hash depends on its
whole upstream, and a unit that ran before a dependency committed could not have produced it.

``FakeGateway`` answers every call after a latency (fixed or random) through the real call
ledger (``reserve`` before, ``settle`` after, so budgets apply), counting the calls in flight.
Pass ``lambda ledger: FakeGateway(ledger, ...)`` as ``open_project(..., gateway_factory=...)``.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

PACK = Path(__file__).resolve().parents[2] / "sample_projects" / "market-entry"


def make_dag_project(dest: Path, deps: Mapping[str, list[str]], **config: Any) -> Path:
    """A project over the plan ``unit -> its dependencies`` (in plan order); sinks are the
    required finals. ``config`` goes into keepstep.toml."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(PACK / "contract.md", dest / "contract.md")
    shutil.copytree(PACK / "templates", dest / "templates", dirs_exist_ok=True)
    (dest / "sources").mkdir(exist_ok=True)
    (dest / "sources.toml").write_text("", encoding="utf-8")
    used = {d for ds in deps.values() for d in ds}
    units = [{"id": uid, "title": f"Unit {uid}", "phase": "synthesis", "kind": "notes",
              "outputs": ["out.json"], "depends_on": list(ds),
              "required_final": uid not in used} for uid, ds in deps.items()]
    doc = {"plan": {"title": "DAG test plan", "deliverables": []}, "unit": units}
    (dest / "plan.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")
    cfg: dict[str, Any] = {
        "name": "dag", "default_model": "local/keepstep-offline",
        "budget": {"calls": 100_000, "tokens": 100_000_000, "retries": 50, "recoveries": 50},
        "policy": {"lease_seconds": 30.0, "heartbeat_seconds": 10.0, "recovery_cooldown_s": 0.0},
    }
    for key, value in config.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    (dest / "keepstep.toml").write_text(tomli_w.dumps(cfg), encoding="utf-8")
    return dest


def _read(content: str) -> tuple[Any, dict[str, Any], list[Any]]:
    value = json.loads(content)
    return value, value, []


def dag_kind(ctx: Any) -> Any:
    from keepstep.engine.kinds.context import KindOutcome, ValidatorResult
    from keepstep.engine.kinds.model_step import StepCall

    seen = {d.unit: hashlib.sha256(ctx.dep_bytes(d.unit, "out.json")).hexdigest()
            for d in ctx.unit.depends_on}
    payload = json.dumps({"task": "dag", "unit": ctx.unit.id, "deps": seen}, sort_keys=True)
    call = StepCall(prompt="dag", prompt_sha256=hashlib.sha256(b"dag").hexdigest(),
                    messages=[{"role": "user", "content": payload}], schema_name="dag",
                    json_schema={"type": "object"})
    answer = ctx.call_model(call, check=_read).value
    ctx.write("out.json", {"unit": ctx.unit.id, "deps": seen, "answer": answer})
    return KindOutcome(validators=[ValidatorResult(name="structure", passed=True)])


@contextmanager
def use_dag_kind() -> Iterator[None]:
    """Run ``notes`` units with ``dag_kind`` inside the block."""
    from keepstep.engine.kinds.context import REGISTRY

    old = REGISTRY["notes"]
    REGISTRY["notes"] = (old[0], dag_kind)
    try:
        yield
    finally:
        REGISTRY["notes"] = old


class _Result:
    def __init__(self, content: str) -> None:
        self.content = content
        self.call_id: str | None = None
        self.finish_reason = "stop"


class FakeGateway:
    """A model that answers ``sha256(request)`` after ``latency`` seconds (a float, or a
    (low, high) range drawn per call), through the call ledger."""

    def __init__(self, ledger: Any, *, latency: float | tuple[float, float] = 0.0,
                 seed: int = 0, est_tokens: int = 10) -> None:
        self.ledger = ledger
        self.latency = latency
        self.est_tokens = est_tokens
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    def complete(self, ctx: Any, request: Any, **_estimates: Any) -> _Result:
        from keepstep.engine.gateway.client import request_hash

        rhash = request_hash(request)
        call_id = self.ledger.reserve(ctx, model=request.model, request_hash=rhash,
                                      est_tokens=self.est_tokens)
        with self._lock:
            self.in_flight += 1
            self.calls += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            lat = self.latency if isinstance(self.latency, (int, float)) else \
                self._rng.uniform(*self.latency)
        try:
            time.sleep(lat)
        finally:
            with self._lock:
                self.in_flight -= 1
        self.ledger.settle(call_id, tokens_in=self.est_tokens, tokens_out=0, cost=0.0,
                           latency_ms=int(lat * 1000), outcome="ok")
        return _Result(json.dumps({"digest": rhash[:16]}))


def random_dag(rng: random.Random, n: int, p: float = 0.35) -> dict[str, list[str]]:
    """``n`` units, each depending on each earlier one with probability ``p``."""
    ids = [f"N{i:02d}" for i in range(n)]
    return {uid: [ids[j] for j in range(i) if rng.random() < p] for i, uid in enumerate(ids)}
