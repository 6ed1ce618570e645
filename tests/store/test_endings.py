"""Store contract: an attempt that does not commit ends in one transaction (end_attempt), and
the one commit takes a CommitRequest.

The crash test SIGKILLs a forked child at every named point inside ``end_attempt`` (the
``KEEPSTEP_CRASH_AT`` crash points each backend places after each of its statements): after
the kill, either the whole ending is there (attempt status, lease gone, unit status, events,
usage) or none of it is.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from keepstep.storage import (
    AttemptEnd,
    AttemptStatus,
    CommitRequest,
    EventIn,
    StorageError,
    Store,
    UnitStatusChange,
    UnitStatusKind,
)
from tests.store.contract import RUN, FakeClock, stage

BLOCKED = AttemptEnd(
    status=AttemptStatus.blocked, error_class="quota", message="provider quota exhausted",
    unit_status=UnitStatusChange(UnitStatusKind.blocked, "provider quota exhausted",
                                 {"kind": "quota"}),
    events=(EventIn(kind="attempt.note", unit="U1", payload={"n": 1}),),
    usage={"wall_time_s": 2.5})


def _ending_parts(store: Store) -> dict[str, bool]:
    """Which parts of BLOCKED's ending for U1/a1 are in the store."""
    att = store.get_attempt(RUN, "U1/a1")
    return {
        "attempt": att is not None and att.status == AttemptStatus.blocked,
        "lease": not store.leases(RUN),
        "unit_status": "U1" in store.unit_statuses(RUN),
        "status_event": bool(store.events(RUN, kinds=["unit.blocked"])),
        "event": bool(store.events(RUN, kinds=["attempt.note"])),
        "usage": store.get_budget(RUN).used.get("wall_time_s") == 2.5,
    }


def test_end_attempt_writes_the_whole_ending(run: Store) -> None:
    """Status, error class and message, lease released by token, unit status with its event,
    the events after it, and the usage: all of it, with the attempt ended."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    assert run.end_attempt(c, BLOCKED) is True
    assert set(_ending_parts(run).values()) == {True}
    att = run.get_attempt(RUN, c.attempt_id)
    assert (att.error_class, att.message) == ("quota", "provider quota exhausted")
    assert att.ended_at is not None
    st = run.unit_statuses(RUN)["U1"]
    assert (st.status, st.reason, st.details) == (UnitStatusKind.blocked,
                                                  "provider quota exhausted", {"kind": "quota"})
    kinds = [e.kind for e in run.events(RUN, unit="U1")]
    assert kinds[-2:] == ["unit.blocked", "attempt.note"]
    assert run.events(RUN, kinds=["unit.blocked"])[0].attempt_id == c.attempt_id


def test_end_attempt_releases_only_its_own_lease(run: Store, clock: FakeClock) -> None:
    """A fenced attempt's ending leaves the lease of the claim that took over in place."""
    old = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=5)
    clock.t += 10
    new = run.claim(RUN, "main", "U1", expected_version=0, owner="p", lease_seconds=60)
    assert run.end_attempt(old, AttemptEnd(status=AttemptStatus.fenced, message="lease lost"))
    assert [le.fencing_token for le in run.leases(RUN)] == [new.fencing_token]
    assert run.get_attempt(RUN, old.attempt_id).status == "fenced"


def test_end_attempt_only_if_writes_nothing_when_refused(run: Store) -> None:
    """With only_if and the attempt already ended, nothing at all is written."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    run.end_attempt(c, AttemptEnd(status=AttemptStatus.failed, message="first"))
    events = len(run.events(RUN))
    assert run.end_attempt(c, AttemptEnd(
        status=AttemptStatus.cancelled, only_if=(AttemptStatus.claimed,),
        events=(EventIn(kind="attempt.cancelled", unit="U1"),))) is False
    assert run.get_attempt(RUN, c.attempt_id).status == "failed"
    assert len(run.events(RUN)) == events


@pytest.mark.parametrize("status", [AttemptStatus.claimed, AttemptStatus.committed])
def test_end_attempt_refuses_a_status_that_is_no_ending(run: Store,
                                                        status: AttemptStatus) -> None:
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    with pytest.raises(StorageError):
        run.end_attempt(c, AttemptEnd(status=status))
    assert run.get_attempt(RUN, c.attempt_id).status == "claimed"
    assert len(run.leases(RUN)) == 1


POINTS = ["end_attempt.before_begin", "end_attempt.after_attempt", "end_attempt.after_lease",
          "end_attempt.after_unit_status", "end_attempt.after_usage",
          "end_attempt.before_commit", "end_attempt.after_commit"]


@pytest.mark.parametrize("point", POINTS)
def test_no_crash_point_leaves_an_ending_half_written(run: Store, reopen: Callable[[], Store],
                                                      point: str) -> None:
    """SIGKILL at each point of end_attempt (in a forked child with its own store): the
    ending is then wholly there (after the commit) or wholly absent (before it)."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    pid = os.fork()
    if pid == 0:  # the child: its own store, killed at the point
        try:
            os.environ["KEEPSTEP_CRASH_AT"] = point
            reopen().end_attempt(c, BLOCKED)
        finally:
            os._exit(3)  # only reached when the point was never hit
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    fresh = reopen()
    try:
        parts = _ending_parts(fresh)
        expected = point == "end_attempt.after_commit"
        assert parts == dict.fromkeys(parts, expected), parts
        if not expected:
            assert fresh.get_attempt(RUN, c.attempt_id).status == "claimed"
            # ... and the ending can still be written whole.
            assert fresh.end_attempt(c, BLOCKED) and set(_ending_parts(fresh).values()) == {True}
    finally:
        fresh.close()


def test_commit_takes_one_request(run: Store) -> None:
    """commit(CommitRequest) is the commit: CAS on the head, token, manifest, pointers,
    usage, attempt committed, lease released, statuses cleared, events."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    run.set_unit_status(RUN, "main", "U1", "failed", "earlier try")
    entry = stage(run, c.attempt_id)
    version = run.commit(CommitRequest(
        run_id=RUN, branch_id="main", expected_version=0, delta={"unit/U1": {"ok": 1}},
        manifest=(entry,), unit="U1", attempt_id=c.attempt_id, fencing_token=c.fencing_token,
        current={"U1": c.attempt_id}, events=(EventIn(kind="unit.succeeded", unit="U1"),),
        clear_unit_status=("U1",), usage={"wall_time_s": 1.0}))
    assert version == 1 and run.get_head(RUN).version == 1
    assert run.read_key(RUN, "unit/U1") == {"ok": 1}
    assert run.get_attempt(RUN, c.attempt_id).status == AttemptStatus.committed
    assert run.leases(RUN) == [] and run.unit_statuses(RUN) == {}
    assert run.current_attempts(RUN) == {"U1": c.attempt_id}
    assert [m.name for m in run.manifest(RUN, unit="U1")] == ["out.json"]
    assert run.get_budget(RUN).used["wall_time_s"] == 1.0
    assert [e.kind for e in run.events(RUN, after_seq=0)][-2:] == ["checkpoint.committed",
                                                                 "unit.succeeded"]
