"""Executors: two processes on one run, a paused executor fenced out, unit time limits."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from keepstep.engine.api import open_project
from keepstep.engine.gateway import offline_provider
from keepstep.engine.gateway.client import ModelGateway
from keepstep.storage import SQLiteStore
from tests.support.engine_harness import (
    RUN,
    StepClock,
    attempts_by_unit,
    calls_by_attempt,
    finish,
    make_small_project,
    start_worker,
    wait_for,
)
from tests.support.fake_provider import running_provider
from tests.support.small_project import small_units


def _ts(iso: str | None) -> float:
    assert iso is not None
    return dt.datetime.fromisoformat(iso).timestamp()


def test_two_executors_never_execute_one_unit_at_once(tmp_path: Path) -> None:
    """Two worker processes share a run: one committed attempt per unit, no overlap."""
    # The offline model answers in microseconds and no longer waits for litellm's import:
    # a worker would finish every unit before the other has started. The offline answers
    # come from a local provider with a latency per call instead, so both workers overlap.
    with running_provider(latency=0.4, offline=True) as provider:
        root = make_small_project(tmp_path / "small", per_group=3,
                                  default_model="openai/fake-model",
                                  api_base=provider.api_base)
        with open_project(root) as p:
            # Intake first, so that both workers meet two ready units (U03, U04) at once.
            p.start_run(RUN).run(max_units=2)
        workers = [start_worker(root, executor_id=f"exec-{n}:{n}:x") for n in (1, 2)]
        results = [finish(w) for w in workers]
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]

    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.status().decision == "done"
        assert run.store.verify_chain(RUN).ok
        by_unit: dict[str, list[Any]] = {}
        for a in run.store.attempts(RUN):
            by_unit.setdefault(a.unit, []).append(a)
        commits = [c.unit for c in run.store.list_checkpoints(RUN) if c.kind == "unit-success"]
    assert sorted(commits) == sorted(u["id"] for u in small_units())
    for unit, atts in by_unit.items():
        assert [a.status for a in atts].count("committed") == 1, (unit, atts)
        spans = sorted((_ts(a.started_at), _ts(a.ended_at)) for a in atts)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"{unit}: two attempts overlap in time"
    executors = {a.executor for u, atts in by_unit.items() for a in atts
                 if u not in ("U01", "U02")}
    assert executors == {"exec-1:1:x", "exec-2:2:x"}, "both executors should have done work"


def pause_outside_a_write(pid: int, db_path: Path) -> None:
    """SIGSTOP ``pid`` at a moment it holds no SQLite write lock. A process stopped inside a
    write transaction holds the lock until it continues (SQLite's rule, not keepstep's), so
    a stop that lands inside one is undone and tried again a moment later."""
    import sqlite3

    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(db_path, timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.003)
        finally:
            probe.close()
    raise AssertionError("the worker held the write lock at every try")


def test_paused_executor_is_fenced_out_after_takeover(tmp_path: Path) -> None:
    """A SIGSTOPped worker whose lease expired cannot commit after another executor took the
    unit over: its attempt is fenced and its output an orphan; the unit is committed once."""
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        p.start_run(RUN)
    # The worker is forked from a zygote with everything imported, and the offline model
    # answers at once: U03's first call is held for a second (tests/faults/child.py's call
    # rules), so that the pause below lands inside U03 however fast the machine is.
    hold = json.dumps([{"unit": "U03", "call": 1, "do": "slow", "seconds": 1.0}])
    paused = start_worker(root, RUN, "--call-rules", hold, executor_id="paused:1:p",
                          lease_seconds=0.5)
    store = SQLiteStore(root / ".keepstep")
    try:
        # Its first model call is reserved, then held: pause it there.
        wait_for(lambda: store.calls(RUN, unit="U03"), timeout=60, interval=0.005)
        pause_outside_a_write(paused.pid, root / ".keepstep" / "state.db")
        lease = wait_for(lambda: store.leases(RUN))[0]
        assert lease.attempt_id == "U03/a1"
        wait_for(lambda: store.now() > lease.expires_at + 0.2)
        with open_project(root, executor_id="takeover:2:t") as p:
            p.get_run(RUN).resume(stop_after={"U03"})
        assert store.get_attempt(RUN, "U03/a2").status == "committed"
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        result = finish(paused)
        store.close()
    assert result.returncode == 0, result.stderr[-2000:]
    mine = [e for e in result.kinds("attempt") if e["unit"] == "U03"]
    assert [(e["attempt"], e["outcome"]) for e in mine] == [("U03/a1", "orphaned")]

    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.resume().decision == "done"
        cps = [c for c in run.store.list_checkpoints(RUN) if c.unit == "U03"]
        assert [c.attempt for c in cps] == ["U03/a2"]
        assert run.facts_records()["U03"].attempt == "U03/a2"
        assert "U03/a1" in [o.attempt_id for o in run.store.orphaned_attempts(RUN)]
        assert run.store.get_attempt(RUN, "U03/a1").status in ("fenced", "orphaned")
        kinds = {e.kind for e in run.events(unit="U03")}
        assert {"lease.fenced", "attempt.fenced"} <= kinds
        assert run.store.verify_chain(RUN).ok
    ledger = calls_by_attempt(root)
    assert set(ledger["U03"]) == {"U03/a1", "U03/a2"}


def test_commit_with_stale_token_is_refused_in_process(tmp_path: Path) -> None:
    """Injected clock: while executor A waits on its first model call, time passes its lease
    and executor B takes U03 over and commits; A's commit is refused (stale token)."""
    root = make_small_project(tmp_path / "small")
    clock = StepClock()
    seen = {"calls": 0}

    def takeover() -> None:
        clock.advance(120)  # A's 30 s lease is long gone
        with open_project(root, clock=clock, executor_id="B:2:b") as pb:
            pb.get_run(RUN).resume(max_units=1)

    def completion(**kwargs: Any) -> Any:
        seen["calls"] += 1
        if seen["calls"] == 1:
            takeover()
        # The offline model's own transport: no litellm dispatch (its first call loads
        # modules for seconds) between the takeover and A's next call.
        return offline_provider.completion(**kwargs)

    events: list[dict[str, Any]] = []
    with open_project(root, clock=clock, executor_id="A:1:a", gateway_factory=lambda ledger:
                      ModelGateway(ledger=ledger, completion_fn=completion)) as pa:
        run = pa.start_run(RUN)
        status = run.run(on_event=events.append)
        assert status.decision != "done"
        outcome = [(e["attempt"], e["outcome"]) for e in events if e["kind"] == "attempt"]
        assert ("U03/a1", "orphaned") in outcome
        fenced = run.events(kinds=["attempt.fenced"])
        assert [e.attempt_id for e in fenced] == ["U03/a1"]
        assert run.store.get_attempt(RUN, "U03/a1").status == "fenced"
        cps = [c for c in run.store.list_checkpoints(RUN) if c.unit == "U03"]
        assert [c.attempt for c in cps] == ["U03/a2"]
        assert run.resume().decision == "done"
    ledger = calls_by_attempt(root)
    assert set(ledger["U03"]) == {"U03/a1", "U03/a2"}
    assert len(ledger["U03"]["U03/a1"]) == len(ledger["U03"]["U03/a2"]) == 2


def _timed_out_project(tmp_path: Path, **policy: Any) -> Path:
    units = small_units()
    units[2]["timeout_minutes"] = 0.0001  # U03: 6 ms
    return make_small_project(tmp_path / "small", units=units, policy=policy)


def test_unit_past_its_time_limit_is_stopped_and_retried_within_bounds(tmp_path: Path) -> None:
    """A unit over timeout_minutes stops at its next safe point (timed_out) and is retried
    max_unit_retries times, then marked failed; other units are untouched."""
    root = _timed_out_project(tmp_path)
    with open_project(root, clock=StepClock(step=0.01)) as p:
        status = p.start_run(RUN).run()
    assert status.units["U03"].state == "failed"
    assert "time limit" in (status.units["U03"].reason or "")
    attempts = attempts_by_unit(root)["U03"]
    assert [a.status for a in attempts] == ["timed_out"] * 3  # 1 + max_unit_retries (2)
    assert all(a.error_class == "timeout" for a in attempts)
    assert status.units["U04"].state == "succeeded"  # the timeout touched U03 only
    assert status.decision == "blocked"


def test_repeated_error_class_shows_a_stall_alert(tmp_path: Path) -> None:
    """The same error class repeating (here: timeouts) raises a stall alert in status.alerts."""
    root = _timed_out_project(tmp_path, stall_repeated_errors=2)
    with open_project(root, clock=StepClock(step=0.01)) as p:
        status = p.start_run(RUN).run()
    repeated = [a for a in status.alerts if a["kind"] == "repeated_error"]
    assert repeated, status.alerts
    assert repeated[0]["unit"] == "U03" and repeated[0]["error_class"] == "timeout"
    assert repeated[0]["count"] >= 2
    assert any(a["kind"] == "nothing_ready" for a in status.alerts)
