"""Units of one run in flight at once: order, dependencies, one commit per unit, same outputs."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keepstep.engine.api import open_project
from keepstep.engine.core.decide import ReadySet, critical_path, ready_units
from keepstep.engine.core.state import RunFacts, UnitRecord, UnitState
from tests.support.dag_project import FakeGateway, make_dag_project, random_dag, use_dag_kind

RUN = "R"


def _run(root: Path, jobs: int, latency: float | tuple[float, float] = 0.0, seed: int = 0
         ) -> tuple[object, FakeGateway, list[dict]]:
    gateways: list[FakeGateway] = []
    events: list[dict] = []

    def factory(ledger: object) -> FakeGateway:
        gateways.append(FakeGateway(ledger, latency=latency, seed=seed))
        return gateways[-1]

    with use_dag_kind(), open_project(root, gateway_factory=factory) as p:
        run = p.start_run(RUN)
        status = run.run(jobs=jobs, on_event=events.append)
        facts = run.facts_records()
        outputs = {u: r.outputs["out.json"].sha256 for u, r in facts.items()}
        cps = run.store.list_checkpoints(RUN)
        claims = run.events(kinds=["unit.claimed"])
        commits = run.events(kinds=["checkpoint.committed"])
        leases = run.store.leases(RUN)
    assert not leases
    return (status, outputs, cps, claims, commits), gateways[0], events


def _check_order(deps: dict[str, list[str]], claims: list, commits: list) -> None:
    committed_at = {e.unit: e.seq for e in commits if e.unit}
    for e in claims:
        for d in deps[e.unit]:
            assert committed_at[d] < e.seq, f"{e.unit} claimed before {d} committed"


def test_independent_units_run_at_the_same_time(tmp_path: Path) -> None:
    """Four independent units with --jobs 4 are all in flight at once; each commits once."""
    deps = {"A": [], "B": [], "C": [], "D": [], "E": ["A", "B", "C", "D"]}
    (status, outputs, cps, claims, commits), gw, events = _run(
        make_dag_project(tmp_path / "p", deps), jobs=4, latency=0.3)
    assert status.decision == "done"
    assert gw.max_in_flight == 4
    assert sorted(c.unit for c in cps if c.kind == "unit-success") == list("ABCDE")
    _check_order(deps, claims, commits)
    claimed = [e for e in events if e["kind"] == "claimed"]
    assert max(len(e["in_flight"]) for e in claimed) == 4
    assert all({"unit", "attempt", "started"} <= set(e) for e in claimed)
    steps = [e for e in events if e["kind"] == "progress"]
    assert {"unit", "attempt", "step", "started"} <= set(steps[0])
    assert any(e["step"] == "model call 1" for e in steps)


def test_jobs_one_claims_in_plan_order_one_at_a_time(tmp_path: Path) -> None:
    """--jobs 1 keeps today's behaviour: one unit in flight, claims in dependency/plan order."""
    deps = {"C": [], "A": ["C"], "B": [], "D": ["A", "B"]}
    (status, _outputs, _cps, claims, _commits), gw, _ = _run(
        make_dag_project(tmp_path / "p", deps), jobs=1)
    assert status.decision == "done"
    assert gw.max_in_flight == 1
    assert [e.unit for e in claims] == ["C", "A", "B", "D"]


def test_critical_path_first_at_more_jobs(tmp_path: Path) -> None:
    """With more jobs than one, the unit heading the longest chain is claimed first."""
    deps = {"X": [], "Y": [], "A": [], "B": ["A"], "C": ["B"]}
    (status, _o, _c, claims, _m), _gw, _ = _run(make_dag_project(tmp_path / "p", deps), jobs=2)
    assert status.decision == "done"
    assert claims[0].unit == "A"


def test_ready_set_matches_ready_units_as_records_change() -> None:
    """The incremental ready set agrees with the full scan after every record change."""
    from keepstep.engine.core.plan import Plan

    rng = random.Random(7)
    deps = random_dag(rng, 30, 0.15)
    plan = Plan.model_validate({"unit": [
        {"id": u, "title": u, "phase": "p", "kind": "notes", "outputs": ["out.json"],
         "depends_on": ds} for u, ds in deps.items()]})
    records: dict[str, UnitRecord] = {}
    rs = ReadySet(plan, records)
    for _ in range(200):
        uid = rng.choice(list(deps))
        state = rng.choice([UnitState.succeeded, UnitState.invalidated, None])
        rec = None if state is None else UnitRecord(state=state, attempt=f"{uid}/a1")
        if rec is None:
            records.pop(uid, None)
        else:
            records[uid] = rec
        rs.update(uid, rec)
        facts = RunFacts(run_id="r", branch_id="main", head_version=1, plan_info={},
                         inputs_info={}, records=records, statuses={}, leases={},
                         budget={"limits": {}, "used": {}}, now=0.0)
        assert rs.ready(facts) == ready_units(plan, facts)
    cp = critical_path(plan)
    assert all(cp[u] >= max((cp[d] for d in deps if u in deps[d]), default=0) for u in deps)


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(3, 9), jobs=st.integers(1, 8))
def test_any_dag_at_any_jobs_ends_as_at_jobs_one(tmp_path_factory, seed: int, n: int,
                                                  jobs: int) -> None:
    """Random DAGs, random latencies: no unit starts before its dependencies committed, every
    unit commits once, and the outputs' hashes equal those of the --jobs 1 run."""
    deps = random_dag(random.Random(seed), n)
    base = tmp_path_factory.mktemp("dag")
    (s1, out1, _c, _cl, _cm), _, _ = _run(make_dag_project(base / "one", deps), jobs=1)
    (sn, outn, cps, claims, commits), _, _ = _run(
        make_dag_project(base / "many", deps), jobs=jobs, latency=(0.0, 0.03), seed=seed)
    assert s1.decision == sn.decision == "done"
    assert outn == out1
    successes = [c.unit for c in cps if c.kind == "unit-success"]
    assert sorted(successes) == sorted(deps)  # every unit exactly once
    _check_order(deps, claims, commits)
