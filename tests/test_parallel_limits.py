"""Provider limits shared by units in flight, against a local OpenAI-compatible server."""

from __future__ import annotations

import time
from pathlib import Path

from keepstep.engine.api import open_project
from keepstep.engine.gateway.limits import ProviderLimiter
from tests.support.dag_project import make_dag_project, use_dag_kind
from tests.support.fake_provider import running_provider

RUN = "R"
WIDE = {f"N{i:02d}": [] for i in range(6)}


def _project(tmp_path: Path, api_base: str, **providers: dict) -> Path:
    return make_dag_project(tmp_path / "p", WIDE, default_model="openai/fake-model",
                            api_base=api_base, providers=providers)


def test_provider_concurrency_limit_is_respected(tmp_path: Path) -> None:
    """max_concurrent = 2 for the provider: with --jobs 6 the server never sees more than 2
    requests at once, and the run finishes."""
    with running_provider(latency=0.25) as provider:
        root = _project(tmp_path, provider.api_base, openai={"max_concurrent": 2})
        with use_dag_kind(), open_project(root) as p:
            status = p.start_run(RUN).run(jobs=6)
        assert status.decision == "done"
        assert provider.request_count == 6
        assert provider.max_in_flight == 2


def test_a_429_backs_the_whole_provider_off(tmp_path: Path) -> None:
    """One 429 with Retry-After: 1 holds every unit's next request, not only the unit that got
    it: no request reaches the server in the second after the 429."""
    with running_provider("rate_limited", latency=0.05) as provider:
        root = _project(tmp_path, provider.api_base, openai={"max_concurrent": 1})
        with use_dag_kind(), open_project(root) as p:
            status = p.start_run(RUN).run(jobs=4)
        assert status.decision == "done"
        assert provider.rate_limited == 1
        first, *rest = provider.arrivals
        assert rest and min(rest) - first >= 0.95


def test_requests_per_minute_spaces_calls() -> None:
    """A limiter with 2 requests per minute lets two calls start, then waits for the window."""
    now = [0.0]
    limiter = ProviderLimiter(requests_per_minute=2, clock=lambda: now[0])
    with limiter.slot():
        pass
    with limiter.slot():
        pass
    assert limiter._wait_for(now[0], 0) == 60.0
    now[0] = 60.5
    started = time.monotonic()
    with limiter.slot():
        pass
    assert time.monotonic() - started < 0.5
