"""Parallel fault cases beside the 48: real SIGKILLs and double starts with units in flight.

The ME-042 pack runs against a local OpenAI-compatible server answering like the offline
model after a fixed latency, so several extraction units are inside model calls at once.
Checked from stored facts: only the units in flight at the kill are redone (attempts and
the call ledger), no unit has two committed successes, the chain verifies.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import tomli_w

from keepstep.engine.api import open_project
from keepstep.storage import SQLiteStore
from tests.support.engine_harness import WorkerProcess, start_worker
from tests.support.fake_provider import FakeProvider, running_provider

HERE = Path(__file__).resolve().parent
PACK = HERE.parents[1] / "sample_projects" / "market-entry"
RUN = "ME-042"
APPROVE = ("--approve", "audience=product team")


def _pack(dest: Path, provider: FakeProvider) -> Path:
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep"))
    import tomllib

    cfg = tomllib.loads((dest / "keepstep.toml").read_text())
    cfg.update(default_model="openai/fake-model", api_base=provider.api_base, max_parallel=4)
    (dest / "keepstep.toml").write_text(tomli_w.dumps(cfg))
    return dest


def _worker(root: Path, *args: str) -> WorkerProcess:
    return start_worker(root, RUN, "--jobs", "4", *APPROVE, *args)


def _successes(store: SQLiteStore) -> Counter[str]:
    return Counter(c.unit for c in store.list_checkpoints(RUN) if c.kind == "unit-success")


def _attempts_with_calls(store: SQLiteStore) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for c in store.calls(RUN):
        out[c.unit].add(c.attempt_id)
    return out


def test_sigkill_with_four_units_in_flight_redoes_only_those(tmp_path: Path) -> None:
    """SIGKILL while 4 extraction units are inside model calls: the resume redoes exactly
    those 4 (second attempts, in the call ledger too), every other unit runs once, and no
    unit has two committed successes."""
    with running_provider(latency=0.4, offline=True) as provider:
        root = _pack(tmp_path / "pack", provider)
        proc = _worker(root)
        deadline = time.monotonic() + 90
        while provider.in_flight < 4:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "never 4 calls in flight"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        store = SQLiteStore(root / ".keepstep")
        try:
            in_flight = {le.unit for le in store.leases(RUN)}
            before = _successes(store)
        finally:
            store.close()
        assert len(in_flight) == 4
        provider.latency = 0.02
        resumed = _worker(root)
        _out, err = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, err[-2000:]
    with open_project(root) as p:
        run = p.get_run(RUN)
        store = run.store
        assert run.status().decision == "done"
        successes = _successes(store)
        assert max(successes.values()) == 1 and len(successes) == 36
        assert not set(before) & in_flight
        attempts = Counter(a.unit for a in store.attempts(RUN))
        assert {u for u, n in attempts.items() if n > 1} == in_flight
        redone_calls = {u for u, atts in _attempts_with_calls(store).items() if len(atts) > 1}
        assert redone_calls <= in_flight and redone_calls
        assert store.leases(RUN) == []
        assert store.verify_chain(RUN).ok


def test_two_processes_with_four_jobs_each_share_the_run(tmp_path: Path) -> None:
    """Two executors started together, each with --jobs 4, on one run: both do work, every
    unit is claimed and committed once (no redo in the call ledger), and the run is done."""
    with running_provider(latency=0.3, offline=True) as provider:
        root = _pack(tmp_path / "pack", provider)
        with open_project(root) as p:
            p.start_run(RUN)
        first, second = _worker(root), _worker(root)
        results = [w.communicate(timeout=300) for w in (first, second)]
        for w, (_out, err) in zip((first, second), results, strict=True):
            assert w.returncode == 0, err[-2000:]
        assert provider.max_in_flight >= 4
    with open_project(root) as p:
        run = p.get_run(RUN)
        store = run.store
        assert run.status().decision == "done"
        successes = _successes(store)
        assert max(successes.values()) == 1 and len(successes) == 36
        assert all(len(a) == 1 for a in _attempts_with_calls(store).values())
        owners = {a.executor for a in store.attempts(RUN) if a.status == "committed"}
        assert len(owners) == 2
        assert store.verify_chain(RUN).ok
