"""Provider faults through the real run loop: litellm over HTTP to a scripted local server.

The project's model is ``openai/fake-model`` with ``api_base`` on 127.0.0.1 (tests/
fake_provider.py). Backoff sleeps are injected (recorded, never slept).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway.client import ModelGateway
from tests.support.engine_harness import RUN, make_small_project
from tests.support.fake_provider import FakeProvider
from tests.support.small_project import extract_only_units

EMPTY_EVIDENCE = '{"evidence": []}'  # a valid extract answer: nothing found


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    p = FakeProvider(content=EMPTY_EVIDENCE).start()
    yield p
    p.stop()


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.sleeps: list[float] = []

    def gateway(self, ledger: Any) -> ModelGateway:
        return ModelGateway(ledger=ledger, sleep=self.sleeps.append, rng=random.Random(0),
                            api_key_lookup=lambda provider: None)

    def run(self) -> Any:
        with open_project(self.root, gateway_factory=self.gateway) as p:
            return p.open_or_start(RUN).run()

    def calls(self) -> list[Any]:
        with open_project(self.root) as p:
            return p.get_run(RUN).calls()

    def attempts(self) -> list[Any]:
        with open_project(self.root) as p:
            return p.store.attempts(RUN)


@pytest.fixture
def setup(tmp_path: Path, provider: FakeProvider) -> Setup:
    root = make_small_project(tmp_path / "fake", per_group=1, units=extract_only_units(1),
                              default_model="openai/fake-model", api_base=provider.api_base)
    return Setup(root)


def test_rate_limit_then_ok_succeeds_after_retry_after(setup: Setup,
                                                       provider: FakeProvider) -> None:
    """429 with Retry-After, then 200: the unit succeeds in one attempt; the ledger shows
    rate_limited then ok; the backoff honoured Retry-After (injected sleep)."""
    provider.script("rate_limited", "ok")
    status = setup.run()
    assert status.decision == "done", status.reasons
    assert [c.outcome for c in setup.calls()] == ["rate_limited", "ok"]
    assert [a.status for a in setup.attempts()] == ["committed"]
    assert len(setup.sleeps) == 1 and setup.sleeps[0] >= 1.0
    assert provider.request_count == 2


def test_insufficient_quota_blocks_without_retrying(setup: Setup, provider: FakeProvider) -> None:
    """A quota error blocks the unit (quota), not failed; no retry now or on resume."""
    provider.script("insufficient_quota")
    status = setup.run()
    unit = status.units["E01"]
    assert unit.state == "blocked" and "quota" in (unit.reason or ""), unit
    assert [(a.status, a.error_class) for a in setup.attempts()] == [("blocked", "quota")]
    assert [c.outcome for c in setup.calls()] == ["quota_exhausted"]
    again = setup.run()
    assert again.units["E01"].state == "blocked"
    assert provider.request_count == 1 and setup.sleeps == []


def test_server_errors_exhaust_bounded_retries_then_fail_safely(setup: Setup,
                                                               provider: FakeProvider) -> None:
    """500s: the gateway retries a bounded number of times per attempt, the run loop retries
    the attempt within max_unit_retries, then the unit fails with a short, safe message and
    a repeated-error alert."""
    provider.script(*["server_error"] * 12)
    status = setup.run()
    unit = status.units["E01"]
    assert unit.state == "failed", unit
    assert "HTTP 500" in (unit.reason or "") and "Traceback" not in (unit.reason or "")
    assert len(unit.reason or "") < 300
    attempts = setup.attempts()
    assert [a.status for a in attempts] == ["failed"] * 3  # 1 + max_unit_retries
    calls = setup.calls()
    assert len(calls) == 12 == provider.request_count  # 4 gateway tries per attempt
    assert {c.outcome for c in calls} == {"transient"}
    assert {c.attempt_id for c in calls} == {"E01/a1", "E01/a2", "E01/a3"}
    assert len(setup.sleeps) == 9  # 3 backoffs per attempt
    alerts = [a for a in status.alerts if a["kind"] == "repeated_error"]
    assert alerts and alerts[0]["error_class"] == "transient"


def test_auth_failure_blocks_and_scrubs_the_key(setup: Setup, provider: FakeProvider) -> None:
    """401: blocked (auth), one request, no retry; the key-shaped text is scrubbed."""
    provider.script("unauthorized")
    status = setup.run()
    unit = status.units["E01"]
    assert unit.state == "blocked" and "authentication" in (unit.reason or ""), unit
    assert "sk-fake" not in (unit.reason or "") and "1234" not in (unit.reason or "")
    assert [(a.status, a.error_class) for a in setup.attempts()] == [("blocked", "auth")]
    assert setup.run().units["E01"].state == "blocked"
    assert provider.request_count == 1
