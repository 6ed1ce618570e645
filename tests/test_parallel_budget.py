"""Budgets with units in flight at once: reservations never pass a limit."""

from __future__ import annotations

from pathlib import Path

from keepstep.engine.api import open_project
from tests.support.dag_project import FakeGateway, make_dag_project, use_dag_kind

RUN = "R"


def test_concurrent_units_never_overspend_a_tight_call_and_token_limit(tmp_path: Path) -> None:
    """Twelve independent one-call units at --jobs 8 against a limit of 5 calls and 50 tokens:
    at most 5 calls are made, the counters never pass the limits, the rest wait for a
    decision with no lease held; a raise lets the run finish."""
    deps = {f"N{i:02d}": [] for i in range(12)}
    root = make_dag_project(tmp_path / "p", deps, budget={"calls": 5, "tokens": 50})
    gateways: list[FakeGateway] = []

    def factory(ledger: object) -> FakeGateway:
        gateways.append(FakeGateway(ledger, latency=0.05, est_tokens=10))
        return gateways[-1]

    with use_dag_kind(), open_project(root, gateway_factory=factory) as p:
        run = p.start_run(RUN)
        status = run.run(jobs=8)
        budget = run.store.get_budget(RUN)
        assert status.decision == "blocked"
        assert budget.used["calls"] <= 5 and budget.used["tokens"] <= 50
        assert len(run.calls()) == gateways[0].calls <= 5
        assert not run.store.leases(RUN)
        assert not [a for a in run.store.attempts(RUN) if a.status == "claimed"]
        blocked = {u for u, s in run.store.unit_statuses(RUN).items() if s.status == "blocked"}
        current = set(run.facts_records())
        assert len(current) == gateways[0].calls and blocked and not blocked & current
        run.raise_budget(calls=100, tokens=1000, reason="test: allow the rest", who="test")
        assert run.run(jobs=8).decision == "done"
        assert run.store.get_budget(RUN).used["calls"] == 12
