"""Real SIGKILLs at named points of the commit protocol: only the unit in flight is redone.

Each test kills a real executor process (the process kills itself at a crash point),
resumes with a new executor, and checks through the call ledger exactly which units
were executed again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from tests.support.engine_harness import (
    RUN,
    attempts_by_unit,
    budget_used,
    calls_by_attempt,
    in_flight_unit,
    ledger_ids,
    make_small_project,
    redone_units,
    run_kill_in_call,
    run_worker,
)
from tests.support.fake_provider import running_provider


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_small_project(tmp_path / "small")


def resume(root: Path, **kwargs):
    with open_project(root) as p:
        return p.get_run(RUN).resume(**kwargs)


def assert_only_redone(root: Path, before: dict, unit: str) -> dict:
    """After the resume: ``unit`` alone spans two attempts, every call made before the
    kill is still there, and no other unit made a call again."""
    after = calls_by_attempt(root)
    assert redone_units(after) <= {unit}, f"re-executed: {sorted(redone_units(after))}"
    ids_before, ids_after = ledger_ids(before), ledger_ids(after)
    for u, ids in ids_before.items():
        assert ids <= ids_after[u], f"{u}: calls disappeared from the ledger"
        if u != unit:
            assert ids_after[u] == ids, f"{u} was called again"
    attempts = attempts_by_unit(root)
    for u, atts in attempts.items():
        committed = [a for a in atts if a.status == "committed"]
        assert len(committed) == 1, f"{u}: {[(a.attempt_id, a.status) for a in atts]}"
        if u != unit:
            assert len(atts) == 1, f"{u} ran again: {[a.attempt_id for a in atts]}"
    return after


def test_kill_after_stage_leaves_orphan_and_redoes_only_that_unit(project: Path) -> None:
    """SIGKILL between staging and commit: the attempt is an orphan, the unit runs as a2."""
    crashed = run_worker(project, crash_at="unit.after_stage:U04")
    assert crashed.killed, crashed.stderr[-2000:]
    assert in_flight_unit(crashed) == "U04"
    before = calls_by_attempt(project)
    assert set(before["U04"]) == {"U04/a1"}

    status = resume(project)
    assert status.decision == "done", status.reasons
    after = assert_only_redone(project, before, "U04")
    assert set(after["U04"]) == {"U04/a1", "U04/a2"}
    with open_project(project) as p:
        run = p.get_run(RUN)
        orphans = [o.attempt_id for o in run.store.orphaned_attempts(RUN)]
        assert orphans == ["U04/a1"]
        assert run.store.get_attempt(RUN, "U04/a1").status == "orphaned"
        records = run.facts_records()
        assert records["U04"].attempt == "U04/a2"
        assert "U04/a1" not in str([r.model_dump() for r in records.values()])
        assert run.store.verify_chain(RUN).ok


def test_kill_after_commit_before_ack_does_not_rerun_the_unit(project: Path) -> None:
    """SIGKILL right after the COMMIT: the head holds the attempt, so it is never re-run."""
    crashed = run_worker(project, crash_at="commit.after_commit@3")
    assert crashed.killed, crashed.stderr[-2000:]
    unit = in_flight_unit(crashed)
    assert unit == "U03"  # U01, U02, then the first model unit
    before = calls_by_attempt(project)
    assert before[unit] and set(before[unit]) == {f"{unit}/a1"}

    status = resume(project)
    assert status.decision == "done", status.reasons
    after = assert_only_redone(project, before, unit="")
    assert ledger_ids(after)[unit] == ledger_ids(before)[unit]
    assert status.units[unit].attempts == 1
    with open_project(project) as p:
        cps = [c for c in p.store.list_checkpoints(RUN) if c.unit == unit]
        assert [c.attempt for c in cps] == [f"{unit}/a1"]
        assert p.store.orphaned_attempts(RUN) == []


@pytest.mark.parametrize("point", ["unit.before_call@4", "unit.after_call@4", "in-provider@4"])
def test_kill_mid_model_call_redoes_only_the_unit_in_flight(project: Path, point: str) -> None:
    """SIGKILL around or inside the 4th model call (U04's second): only U04 is redone, and a
    reserved-but-unsettled call stays counted in the budget."""
    if point.startswith("in-provider"):
        crashed = run_kill_in_call(project, int(point.split("@")[1]))
    else:
        crashed = run_worker(project, crash_at=point)
    assert crashed.killed, crashed.stderr[-2000:]
    assert in_flight_unit(crashed) == "U04"
    before = calls_by_attempt(project)
    first = before["U04"]["U04/a1"]
    reserved = [c for c in first if c.status == "reserved"]
    if point.startswith("in-provider"):
        assert len(first) == 2 and len(reserved) == 1, [(c.status, c.outcome) for c in first]
    else:
        assert len(first) == (1 if "before_call" in point else 2) and not reserved
    rows_before = sum(len(cs) for atts in before.values() for cs in atts.values())
    used_before = budget_used(project)
    assert used_before["calls"] == rows_before  # the reserved row is counted too

    status = resume(project)
    assert status.decision == "done", status.reasons
    after = assert_only_redone(project, before, "U04")
    assert set(after["U04"]) == {"U04/a1", "U04/a2"}
    rows_after = sum(len(cs) for atts in after.values() for cs in atts.values())
    used_after = budget_used(project)
    assert used_after["calls"] == rows_after >= used_before["calls"]
    assert used_after["tokens"] >= used_before["tokens"]
    # The unsettled row is never settled or dropped by the resume.
    still = [c for cs in after["U04"].values() for c in cs if c.status == "reserved"]
    assert [c.call_id for c in still] == [c.call_id for c in reserved]


def test_kill_during_heartbeat_redoes_only_the_unit_in_flight(tmp_path: Path) -> None:
    """SIGKILL from the heartbeat thread while it renews a short lease: resume redoes only
    the unit that held the lease."""
    # The heartbeat (every 0.1 s here) stops before the commit, and the offline model answers
    # in microseconds without waiting for litellm's import: no unit would be in flight when
    # it first beats. The offline answers come from a local provider with a latency per call
    # instead, so a model unit is still in flight at the first renewal.
    with running_provider(latency=0.3, offline=True) as provider:
        project = make_small_project(tmp_path / "small", default_model="openai/fake-model",
                                     api_base=provider.api_base)
        _heartbeat_kill_then_resume(project)


def _heartbeat_kill_then_resume(project: Path) -> None:
    crashed = run_worker(project, crash_at="heartbeat.renew", lease_seconds=0.3)
    assert crashed.killed, crashed.stderr[-2000:]
    unit = in_flight_unit(crashed)
    before = calls_by_attempt(project)
    committed_before = {e["unit"] for e in crashed.kinds("attempt")
                        if e["outcome"] == "committed"}
    assert unit not in committed_before

    status = resume(project)
    assert status.decision == "done", status.reasons
    assert_only_redone(project, before, unit)
    attempts = attempts_by_unit(project)
    assert [a.status for a in attempts[unit]] in (["fenced", "committed"],
                                                  ["orphaned", "committed"])
    for u in committed_before:
        assert len(attempts[u]) == 1
