"""Budgets: exhaustion blocks with figures, counters are never reset, only a recorded decision
raises a limit; the recovery-attempt budget and the recovery circuit breaker."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.errors import KeepstepError
from tests.support.engine_harness import (
    RUN,
    StepClock,
    attempts_by_unit,
    budget_used,
    calls_by_attempt,
    in_flight_unit,
    ledger_ids,
    make_small_project,
    redone_units,
    run_worker,
)


def _rows(ledger: dict) -> int:
    """Ledger rows of calls made: a reused answer has a row (outcome "reused") but no call."""
    return sum(1 for atts in ledger.values() for cs in atts.values() for c in cs
               if c.outcome != "reused")


@pytest.fixture
def blocked(tmp_path: Path) -> Path:
    """A small run stopped by a call limit of 3: U03 makes 2 calls, U04 gets 1 of its 2."""
    root = make_small_project(tmp_path / "small", budget={"calls": 3})
    with open_project(root) as p:
        p.start_run(RUN).run()
    return root


def test_exhausted_budget_blocks_the_unit_with_figures(blocked: Path) -> None:
    """The unit whose call was refused is blocked (not failed), its reason gives the figures,
    and the next action says to raise the budget."""
    with open_project(blocked) as p:
        status = p.get_run(RUN).status()
    u04 = status.units["U04"]
    assert u04.state == "blocked"
    assert "calls 3/3" in (u04.reason or ""), u04.reason
    assert status.decision == "blocked"
    assert status.next_action.startswith("raise the budget"), status.next_action
    assert "calls 3/3" in status.next_action
    assert not [u for u, v in status.units.items() if v.state == "failed"]
    attempts = attempts_by_unit(blocked)["U04"]
    assert [(a.attempt_id, a.status, a.error_class) for a in attempts] == [
        ("U04/a1", "blocked", "budget")]
    ledger = calls_by_attempt(blocked)
    assert _rows(ledger) == 3 == budget_used(blocked)["calls"]  # the refused call left no row
    assert len(ledger["U04"]["U04/a1"]) == 1


def test_resume_without_a_decision_stays_blocked(blocked: Path) -> None:
    """Resuming without a budget decision opens no attempt and makes no call."""
    before = calls_by_attempt(blocked)
    with open_project(blocked) as p:
        status = p.get_run(RUN).resume()
        status = p.get_run(RUN).resume()
    assert status.units["U04"].state == "blocked"
    assert status.decision == "blocked"
    assert calls_by_attempt(blocked).keys() == before.keys()
    assert ledger_ids(calls_by_attempt(blocked)) == ledger_ids(before)
    assert len(attempts_by_unit(blocked)["U04"]) == 1


def test_raise_budget_records_a_decision_and_unblocks(blocked: Path) -> None:
    """raise_budget writes a decision event with old/new/used figures; the resume then runs
    U04 again and nothing before it."""
    before = calls_by_attempt(blocked)
    used_before = budget_used(blocked)
    with open_project(blocked) as p:
        run = p.get_run(RUN)
        with pytest.raises(KeepstepError, match="reason"):
            run.raise_budget(calls=100, reason=" ")
        with pytest.raises(KeepstepError, match="blocked by the budget"):
            run.retry("U04")  # a retry is not a budget decision
        run.raise_budget(calls=100, reason="client approved more calls", who="tester")
        [event] = run.events(kinds=["decision.budget_raise"])
        assert event.payload["old"] == {"calls": 3.0}
        assert event.payload["new"] == {"calls": 100.0}
        assert event.payload["used"] == {"calls": 3.0}
        assert event.payload["who"] == "tester"
        assert run.status().units["U04"].state == "pending"
        status = run.resume()
    assert status.decision == "done", status.reasons
    after = calls_by_attempt(blocked)
    assert redone_units(after) == {"U04"}
    # U04/a1's one answered call is reused, not paid again; only the refused one is made.
    assert [c.outcome for c in after["U04"]["U04/a2"]] == ["reused", "ok"]
    for unit in ("U03",):
        assert ledger_ids(after)[unit] == ledger_ids(before)[unit]
    used_after = budget_used(blocked)
    assert used_after["calls"] == _rows(after) > used_before["calls"]


def test_budget_counters_survive_a_kill_and_a_resume(tmp_path: Path) -> None:
    """Killed inside the commit transaction (rolled back): the calls already made stay spent,
    and the resume only adds to every counter."""
    root = make_small_project(tmp_path / "small")
    crashed = run_worker(root, crash_at="commit.before_commit@4")
    assert crashed.killed, crashed.stderr[-2000:]
    unit = in_flight_unit(crashed)
    assert unit == "U04"
    before = calls_by_attempt(root)
    used_before = budget_used(root)
    assert used_before["calls"] == _rows(before) == 4

    with open_project(root) as p:
        run = p.get_run(RUN)
        status = run.resume()
        assert status.decision == "done", status.reasons
        committed_budget = run.store.read_key(RUN, "budget")
    used_after = budget_used(root)
    for counter, value in used_before.items():
        assert used_after[counter] >= value, counter
    after = calls_by_attempt(root)
    # U04 redone (2), U05 (1), U06's synthesis and its support check (2), U07 (2).
    assert used_after["calls"] == _rows(after) == _rows(before) + 2 + 1 + 2 + 2
    assert redone_units(after) == {"U04"}
    assert committed_budget["calls"] >= used_before["calls"]


def test_recovery_attempt_budget_trips(tmp_path: Path) -> None:
    """Recoveries that do work are counted; past the limit the run blocks with
    'recovery attempts over their limit' until a budget decision raises it."""
    root = make_small_project(tmp_path / "small", budget={"recoveries": 2})
    with open_project(root) as p:
        run = p.start_run(RUN)
        assert run.run().decision == "done"
        source = root / "sources" / "A2-household-demand.md"
        statuses = []
        for n in range(3):
            source.write_text(source.read_text() + f"\nEdit {n}: a note added.\n")
            statuses.append(run.resume())
        assert [s.decision for s in statuses[:2]] == ["done", "done"]
        blocked = statuses[2]
        assert blocked.decision == "blocked"
        assert any("recovery attempts over their limit" in r for r in blocked.reasons)
        assert "recoveries" in blocked.next_action
        assert run.store.get_budget(RUN).used["recoveries"] == 2
        [ev] = run.events(kinds=["recovery.blocked"])
        assert "over their limit" in ev.payload["reason"]

        run.raise_budget(recoveries=5, reason="one more edit round", who="tester")
        assert run.resume().decision == "done"


def _tamper_head(root: Path) -> tuple[int, str]:
    """Simulate a damaged head checkpoint row (a disk error or a hand edit)."""
    with open_project(root) as p:
        head = p.store.get_head(RUN).version
    conn = sqlite3.connect(root / ".keepstep" / "state.db", isolation_level=None)
    try:
        old = conn.execute("SELECT kind FROM checkpoints WHERE run_id = ? AND version = ?",
                           [RUN, head]).fetchone()[0]
        conn.execute("UPDATE checkpoints SET kind = 'tampered' WHERE run_id = ? AND version = ?",
                     [RUN, head])
    finally:
        conn.close()
    return head, old


def _untamper(root: Path, head: int, kind: str) -> None:
    conn = sqlite3.connect(root / ".keepstep" / "state.db", isolation_level=None)
    try:
        conn.execute("UPDATE checkpoints SET kind = ? WHERE run_id = ? AND version = ?",
                     [kind, RUN, head])
    finally:
        conn.close()


def test_circuit_breaker_opens_after_consecutive_recovery_failures(tmp_path: Path) -> None:
    """A head that never verifies fails recovery each time (with a cool-down between tries);
    after max_recoveries failures the breaker opens and says what a person must do."""
    root = make_small_project(tmp_path / "small",
                              policy={"max_recoveries": 3, "recovery_cooldown_s": 5.0})
    clock = StepClock()
    with open_project(root, clock=clock) as p:
        assert p.start_run(RUN).run(max_units=4).decision == "claim"  # an unfinished run
    head, kind = _tamper_head(root)
    with open_project(root, clock=clock) as p:
        run = p.get_run(RUN)
        first = run.resume()
        assert first.decision == "blocked"
        assert any("does not verify" in r for r in first.reasons), first.reasons
        cooling = run.resume()
        assert any("cooling down" in r for r in cooling.reasons), cooling.reasons
        for _ in range(2):
            clock.advance(10)
            run.resume()
        clock.advance(10)
        opened = run.resume()
        assert len(run.events(kinds=["recovery.failed"])) == 3
        assert any("circuit breaker is open" in r for r in opened.reasons), opened.reasons
        assert "keepstep verify" in opened.next_action
        clock.advance(3600)  # time alone does not close it
        assert any("circuit breaker" in r for r in run.resume().reasons)
        calls_before = run.calls()

        _untamper(root, head, kind)  # a person repaired the database...
        run.reset_recovery(reason="restored the head row from a backup", who="tester")
        assert run.status().decision == "claim"
        assert run.resume().decision == "done"
        assert len(run.calls()) > len(calls_before)
        assert run.events(kinds=["decision.recovery_reset"])
