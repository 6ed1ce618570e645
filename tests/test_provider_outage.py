"""A provider outage is the provider's state, not the unit's: through a flaky local server
(429 with Retry-After, 500s, timeouts, dropped connections) units wait — saying "waiting for
openai: …, retry in N s" — and the run ends done with no unit failed and no attempt used up;
an outage longer than ``provider_outage_minutes`` blocks the units, naming how long the
provider has been down. Time is scaled: the gateway's clock advances by each back-off
instead of sleeping it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from keepstep.engine.api import open_project
from keepstep.engine.gateway.client import ModelGateway
from tests.support.engine_harness import RUN, make_small_project
from tests.support.fake_provider import FakeProvider
from tests.support.small_project import extract_only_units

EMPTY_EVIDENCE = '{"evidence": []}'


class ScaledTime:
    """A clock that moves by what the gateway would have slept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _run(root: Path, limit_s: float) -> tuple[Any, list[dict], ScaledTime, list[Any]]:
    time = ScaledTime()

    def gateway(ledger: Any) -> ModelGateway:
        return ModelGateway(ledger=ledger, sleep=time.sleep, clock=time.clock,
                            rng=random.Random(0), api_key_lookup=lambda provider: None,
                            outage_limit_s=limit_s)
    events: list[dict] = []
    with open_project(root, gateway_factory=gateway) as p:
        run = p.open_or_start(RUN)
        status = run.run(on_event=events.append)
        attempts = p.store.attempts(RUN)
    return status, events, time, attempts


def _project(tmp_path: Path, provider: FakeProvider) -> Path:
    return make_small_project(tmp_path / "p", per_group=1, units=extract_only_units(2),
                              default_model="openai/fake-model", api_base=provider.api_base,
                              request_timeout_s=0.5, max_parallel=1)


def test_a_30_second_outage_ends_done_with_no_unit_failed(tmp_path: Path) -> None:
    """429 with Retry-After 20, 500s, a timeout and dropped connections, ~30 s in all: both
    units wait and then succeed in their first attempt; the waits are shown as progress."""
    provider = FakeProvider(content=EMPTY_EVIDENCE).start()
    try:
        provider.script(("rate_limited", 20), "server_error", "reset", ("slow", 1.0),
                        "server_error", "reset", ("rate_limited", 5), "server_error",
                        "ok", "server_error", "ok")
        status, events, time, attempts = _run(_project(tmp_path, provider), limit_s=600)
    finally:
        provider.stop()
    assert status.decision == "done", status.reasons
    assert all(u.state == "succeeded" for u in status.units.values())
    assert [a.status for a in attempts] == ["committed", "committed"], attempts
    assert sum(time.sleeps) >= 30  # the outage lasted (scaled) over 30 s
    assert 20 in time.sleeps  # Retry-After honoured
    steps = [e["step"] for e in events if e["kind"] == "progress"]
    assert "waiting for openai: rate limited, retry in 20 s" in steps, steps
    assert any(s.startswith("waiting for openai: server error, retry in") for s in steps)
    assert not [e for e in events if e["kind"] == "attempt" and e["outcome"] != "committed"]


def test_an_outage_past_the_limit_blocks_naming_how_long(tmp_path: Path) -> None:
    """500s for longer than the limit (30 s here): the unit is blocked, not failed, with "the
    provider has been down for 0.5 minutes"; the run ends blocked (exit 3 in the CLI)."""
    provider = FakeProvider(content=EMPTY_EVIDENCE).start()
    try:
        provider.script(*["server_error"] * 40)
        status, _events, _time, attempts = _run(_project(tmp_path, provider), limit_s=30)
    finally:
        provider.stop()
    states = {k: (u.state, u.reason) for k, u in status.units.items()}
    assert status.decision == "blocked", (status.decision, status.reasons, states)
    blocked = [u for u in status.units.values() if u.state == "blocked"]
    assert blocked and not [u for u in status.units.values() if u.state == "failed"]
    assert "the provider has been down for 0.5 minutes" in (blocked[0].reason or "")
    assert {a.status for a in attempts} <= {"blocked"}
