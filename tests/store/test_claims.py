"""Store contract: claims, leases, fencing, attempts and runtime unit statuses."""

from __future__ import annotations

import time

import pytest

from keepstep.storage import CheckpointConflict, LeaseHeld, StaleFencingToken, Store
from tests.store.contract import RUN, FakeClock


def test_claim_renew_and_release_a_lease(run: Store, clock: FakeClock) -> None:
    """claim makes an attempt, a lease and a fresh token; renew extends it; release drops it."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="host:1:x", lease_seconds=10)
    assert (c.attempt_id, c.attempt_no, c.claimed_at_version) == ("U1/a1", 1, 0)
    assert c.fencing_token == run.current_token() and c.expires_at == clock.t + 10
    (lease,) = run.leases(RUN)
    assert (lease.unit, lease.owner, lease.fencing_token) == ("U1", "host:1:x", c.fencing_token)
    assert run.get_attempt(RUN, "U1/a1").status == "claimed"
    with pytest.raises(LeaseHeld):
        run.claim(RUN, "main", "U1", expected_version=0, owner="other", lease_seconds=10)
    clock.t += 5
    assert run.renew_lease(RUN, "main", "U1", fencing_token=c.fencing_token,
                           lease_seconds=10) == clock.t + 10
    run.release_lease(RUN, "main", "U1", c.fencing_token)
    assert run.leases(RUN) == []
    with pytest.raises(StaleFencingToken):
        run.renew_lease(RUN, "main", "U1", fencing_token=c.fencing_token, lease_seconds=10)
    again = run.claim(RUN, "main", "U1", expected_version=0, owner="other", lease_seconds=10)
    assert again.attempt_id == "U1/a2" and again.fencing_token > c.fencing_token
    assert [a.attempt_id for a in run.attempts(RUN, "U1")] == ["U1/a1", "U1/a2"]


def test_claim_requires_the_expected_head(run: Store) -> None:
    """A claim made against a stale head raises CheckpointConflict and records no attempt."""
    run.commit_checkpoint(RUN, "main", 0, {"x": 1})
    with pytest.raises(CheckpointConflict):
        run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    assert run.attempts(RUN) == []


def test_expired_leases_are_fenced(run: Store, clock: FakeClock) -> None:
    """fence_expired_leases takes away expired leases only and marks their attempts fenced."""
    old = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=5)
    run.claim(RUN, "main", "U2", expected_version=0, owner="o", lease_seconds=60)
    clock.t += 10
    assert [le.unit for le in run.fence_expired_leases(RUN)] == ["U1"]
    assert [le.unit for le in run.leases(RUN)] == ["U2"]
    assert run.get_attempt(RUN, old.attempt_id).status == "fenced"
    with pytest.raises(StaleFencingToken):
        run.commit_checkpoint(RUN, "main", 0, {"unit/U1": 1}, fencing_token=old.fencing_token,
                              unit="U1", attempt_id=old.attempt_id)


def test_run_overlay_reads_head_leases_statuses_and_budget_together(run: Store) -> None:
    """run_overlay answers what get_head, leases, unit_statuses and get_budget answer."""
    run.commit_checkpoint(RUN, "main", 0, {"x": 1})
    run.claim(RUN, "main", "U2", expected_version=1, owner="host:1:x", lease_seconds=10)
    run.set_unit_status(RUN, "main", "U3", "blocked", "quota exhausted", {"provider": "x"})
    run.add_usage(RUN, {"model_calls": 1})
    overlay = run.run_overlay(RUN, "main")
    assert overlay.head == run.get_head(RUN)
    assert overlay.leases == run.leases(RUN, "main")
    assert [le.unit for le in overlay.leases] == ["U2"]
    assert overlay.statuses == run.unit_statuses(RUN) and set(overlay.statuses) == {"U3"}
    assert overlay.budget == run.get_budget(RUN) and overlay.budget.used == {"model_calls": 1}


def test_wait_for_change_returns_by_its_timeout(run: Store) -> None:
    """wait_for_change waits at most its timeout (a backend that hears changes may return
    sooner, True); either way it answers a bool."""
    for _ in range(2):
        started = time.monotonic()
        woke = run.wait_for_change(RUN, 0.2)
        assert isinstance(woke, bool) and time.monotonic() - started < 2.0


def test_unit_status_is_runtime_state_cleared_by_a_commit(run: Store) -> None:
    """set_unit_status records a status and event; a commit can clear it without a new version."""
    run.set_unit_status(RUN, "main", "U1", "blocked", "quota exhausted", {"provider": "x"})
    (status,) = run.unit_statuses(RUN).values()
    assert (status.unit, status.status, status.details) == ("U1", "blocked", {"provider": "x"})
    assert run.events(RUN, kinds=["unit.blocked"])[0].payload["reason"] == "quota exhausted"
    assert run.get_head(RUN).version == 0
    run.commit_checkpoint(RUN, "main", 0, {"unit/U1": "done"}, clear_unit_status=["U1"])
    assert run.unit_statuses(RUN) == {}


def test_now_is_the_store_clock_that_leases_use(run: Store, clock: FakeClock) -> None:
    """now() reads the injected clock, and a claim's expiry is counted from it."""
    assert run.now() == clock.t
    clock.t += 30
    assert run.now() == clock.t
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=10)
    assert c.expires_at == run.now() + 10


def test_fence_lease_takes_a_live_lease_away_once(run: Store) -> None:
    """fence_lease drops a live lease carrying the token (its attempt is fenced, event
    lease.owner_dead); a second call, or another token, changes nothing."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="host:1:x", lease_seconds=60)
    assert not run.fence_lease(RUN, "main", "U1", c.fencing_token + 1, reason="wrong token")
    assert run.fence_lease(RUN, "main", "U1", c.fencing_token, reason="owner process is gone")
    assert run.leases(RUN) == []
    assert run.get_attempt(RUN, c.attempt_id).status == "fenced"
    (dead,) = run.events(RUN, kinds=["lease.owner_dead"])
    assert dead.payload == {"owner": "host:1:x", "reason": "owner process is gone"}
    assert not run.fence_lease(RUN, "main", "U1", c.fencing_token, reason="again")
    with pytest.raises(StaleFencingToken):
        run.renew_lease(RUN, "main", "U1", fencing_token=c.fencing_token, lease_seconds=10)


def test_set_attempt_status_ends_the_attempt_and_honours_only_if(run: Store) -> None:
    """A final status ends the attempt with its error class and message; only_if refuses a
    move from any other status (False, nothing changed)."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    assert run.get_attempt(RUN, c.attempt_id).ended_at is None
    assert run.set_attempt_status(RUN, c.attempt_id, "failed", error_class="invalid_output",
                                  message="validators failed", only_if=["claimed"])
    att = run.get_attempt(RUN, c.attempt_id)
    assert (att.status, att.error_class, att.message) == ("failed", "invalid_output",
                                                          "validators failed")
    assert att.ended_at is not None
    assert not run.set_attempt_status(RUN, c.attempt_id, "orphaned", only_if=["claimed"])
    assert run.get_attempt(RUN, c.attempt_id).status == "failed"
    assert run.set_attempt_status(RUN, c.attempt_id, "orphaned")
    assert run.get_attempt(RUN, c.attempt_id).error_class == "invalid_output"
    assert not run.set_attempt_status(RUN, "U9/a1", "failed")


def test_attempt_counts_follow_every_claim(run: Store) -> None:
    """attempt_counts gives the attempts claimed per unit, released or not."""
    assert run.attempt_counts(RUN) == {}
    first = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    run.release_lease(RUN, "main", "U1", first.fencing_token)
    run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    run.claim(RUN, "main", "U2", expected_version=0, owner="o", lease_seconds=60)
    assert run.attempt_counts(RUN) == {"U1": 2, "U2": 1}


def test_clear_unit_status_removes_it_without_a_checkpoint(run: Store) -> None:
    """clear_unit_status drops one unit's runtime status; the head does not move."""
    run.set_unit_status(RUN, "main", "U1", "failed", "validators failed")
    run.set_unit_status(RUN, "main", "U2", "blocked", "quota exhausted")
    run.clear_unit_status(RUN, "main", "U1")
    assert list(run.unit_statuses(RUN)) == ["U2"]
    run.clear_unit_status(RUN, "main", "U1")  # nothing to clear: no error
    assert run.get_head(RUN).version == 0
