"""The Store contract: behaviour every backend must show, written against the Protocol only.

A second backend (PostgreSQL) adds itself to BACKENDS and must pass this file unchanged.
No SQL and no backend internals here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keepstep.storage import (
    ApprovalRefused,
    BudgetLimitReached,
    CheckpointConflict,
    EventIn,
    LeaseHeld,
    NotFound,
    SQLiteStore,
    StaleFencingToken,
    StorageError,
    Store,
)

RUN = "ME-042"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


BACKENDS: dict[str, Callable[[Path, FakeClock], Store]] = {
    "sqlite": lambda root, clock: SQLiteStore(root, clock=clock),
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    store = BACKENDS[request.param](tmp_path / ".keepstep", clock)
    yield store
    store.close()


@pytest.fixture
def run(backend: Store) -> Store:
    backend.create_run(RUN, {"plan": "plan-v1", "unit/U1": {"status": "pending"}},
                       meta={"title": "market entry"}, limits={"model_calls": 3})
    return backend


def _stage(store: Store, attempt_id: str, name: str = "out.json", data: bytes = b"{}"):
    return store.artifacts.stage(RUN, attempt_id, name, data, media_type="application/json",
                                 producer_version="test", created_at="2024-01-01T00:00:00+00:00")


def test_backend_implements_the_store_protocol(backend: Store) -> None:
    """Each backend is a runtime-checkable Store with a root and an artifact store."""
    assert isinstance(backend, Store)
    assert backend.root.name == ".keepstep"
    assert backend.artifacts.root.is_relative_to(backend.root)


def test_create_run_starts_at_version_zero_with_the_initial_state(run: Store) -> None:
    """A new run has head 0, its initial state, meta and limits, and a 'run.created' event."""
    head = run.get_head(RUN)
    assert (head.run_id, head.branch_id, head.version) == (RUN, "main", 0)
    assert run.read_state(RUN) == {"plan": "plan-v1", "unit/U1": {"status": "pending"}}
    assert run.read_state(RUN, prefix="unit/") == {"unit/U1": {"status": "pending"}}
    assert run.read_key(RUN, "plan") == "plan-v1"
    assert run.read_key(RUN, "absent") is None
    assert run.runs() == [RUN] and run.run_exists(RUN) and not run.run_exists("nope")
    assert run.run_meta(RUN) == {"title": "market entry"}
    assert run.get_budget(RUN).limits == {"model_calls": 3}
    assert [b["branch_id"] for b in run.branches(RUN)] == ["main"]
    assert [e.kind for e in run.events(RUN)] == ["run.created"]
    genesis = run.get_checkpoint(RUN, 0)
    assert (genesis.kind, genesis.parent_version, genesis.hash) == ("genesis", None, head.hash)


def test_creating_a_run_twice_is_refused(run: Store) -> None:
    """A run id is used once; a second create_run raises and changes nothing."""
    with pytest.raises(StorageError):
        run.create_run(RUN, {"plan": "other"})
    assert run.read_key(RUN, "plan") == "plan-v1"


def test_unknown_runs_and_checkpoints_raise_not_found(run: Store) -> None:
    """Reading a run, branch or checkpoint that does not exist raises NotFound."""
    with pytest.raises(NotFound):
        run.get_head("nope")
    with pytest.raises(NotFound):
        run.get_head(RUN, "no-branch")
    with pytest.raises(NotFound):
        run.get_checkpoint(RUN, 7)
    with pytest.raises(NotFound):
        run.run_meta("nope")


def test_commit_is_a_compare_and_swap_on_the_head(run: Store) -> None:
    """A commit on head n makes n+1 linked to n; a second commit on n raises CheckpointConflict."""
    v0 = run.get_head(RUN)
    assert run.commit_checkpoint(RUN, "main", 0, {"unit/U1": {"status": "done"}, "plan": None},
                                 kind="unit-success", unit="U1") == 1
    with pytest.raises(CheckpointConflict):
        run.commit_checkpoint(RUN, "main", 0, {"x": 1})
    cp = run.get_checkpoint(RUN, 1)
    assert (cp.parent_version, cp.parent_hash, cp.kind, cp.unit) == (0, v0.hash, "unit-success",
                                                                      "U1")
    assert cp.delta == {"unit/U1": {"status": "done"}, "plan": None}
    assert run.get_head(RUN).hash == cp.hash
    assert run.read_state(RUN) == {"unit/U1": {"status": "done"}}  # None deletes a key
    assert [c.version for c in run.list_checkpoints(RUN)] == [0, 1]
    assert [c.version for c in run.list_checkpoints(RUN, kinds=["unit-success"])] == [1]
    assert run.count_checkpoints(RUN) == {"unit-success": 1}
    assert run.verify_head(RUN).ok and run.verify_chain(RUN).ok
    assert run.events(RUN, kinds=["checkpoint.committed"])[0].payload["version"] == 1


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


def test_a_fenced_commit_records_manifest_and_ends_the_attempt(run: Store) -> None:
    """A commit with a current token stores the manifest, ends the attempt, releases the lease."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    entries = [_stage(run, c.attempt_id, "a.json", b"[1]"),
               _stage(run, c.attempt_id, "t/b.csv", b"x,y")]
    v = run.commit_checkpoint(RUN, "main", 0, {"unit/U1": {"status": "done"}}, entries,
                              c.fencing_token, unit="U1", attempt_id=c.attempt_id)
    run.artifacts.seal(entries)
    manifest = run.manifest(RUN)
    assert [(e.name, e.sha256, e.checkpoint_version) for e in manifest] == [
        (e.name, e.sha256, v) for e in entries
    ]
    assert run.manifest(RUN, unit="U1", attempt_id=c.attempt_id) == manifest
    assert run.manifest(RUN, unit="U9") == []
    assert run.artifacts.verify(manifest) == []
    assert run.get_attempt(RUN, c.attempt_id).status == "committed"
    assert run.leases(RUN) == []
    assert run.orphaned_attempts(RUN) == []


def test_staged_files_without_a_commit_are_orphans_once_the_lease_is_gone(
    run: Store, clock: FakeClock
) -> None:
    """An attempt's uncommitted files are in flight under a live lease, an orphan after it."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=5)
    _stage(run, c.attempt_id, "draft.json")
    assert run.orphaned_attempts(RUN) == []
    clock.t += 10
    (orphan,) = run.orphaned_attempts(RUN)
    assert (orphan.unit, orphan.attempt_id, orphan.files) == ("U1", "U1/a1", ["draft.json"])


def test_events_filter_by_kind_prefix_unit_branch_and_position(run: Store) -> None:
    """events() filters by kinds, kind prefix, unit, branch and seq, newest first on request."""
    seqs = [
        run.append_event(RUN, "unit.blocked", unit="U1", payload={"why": "quota"}),
        run.append_event(RUN, "unit.failed", unit="U2"),
        run.append_event(RUN, "recovery.started"),
    ]
    assert seqs == sorted(seqs)
    assert [e.kind for e in run.events(RUN, kind_prefix="unit.")] == ["unit.blocked",
                                                                      "unit.failed"]
    assert [e.seq for e in run.events(RUN, kinds=["recovery.started"])] == [seqs[2]]
    assert [e.payload for e in run.events(RUN, unit="U1")] == [{"why": "quota"}]
    assert [e.seq for e in run.events(RUN, after_seq=seqs[0])] == seqs[1:]
    assert [e.seq for e in run.events(RUN, newest_first=True, limit=2)] == seqs[:0:-1]
    assert run.events(RUN, branch_id="elsewhere") == []
    assert run.events("other-run") == []


def test_commit_appends_its_events_in_the_same_step(run: Store) -> None:
    """Events passed to commit_checkpoint are stored with it, after 'checkpoint.committed'."""
    run.commit_checkpoint(RUN, "main", 0, {"x": 1},
                          events=[EventIn(kind="plan.changed", payload={"to": "plan-v2"})])
    kinds = [e.kind for e in run.events(RUN)]
    assert kinds[-2:] == ["checkpoint.committed", "plan.changed"]


def test_unit_status_is_runtime_state_cleared_by_a_commit(run: Store) -> None:
    """set_unit_status records a status and event; a commit can clear it without a new version."""
    run.set_unit_status(RUN, "main", "U1", "blocked", "quota exhausted", {"provider": "x"})
    (status,) = run.unit_statuses(RUN).values()
    assert (status.unit, status.status, status.details) == ("U1", "blocked", {"provider": "x"})
    assert run.events(RUN, kinds=["unit.blocked"])[0].payload["reason"] == "quota exhausted"
    assert run.get_head(RUN).version == 0
    run.commit_checkpoint(RUN, "main", 0, {"unit/U1": "done"}, clear_unit_status=["U1"])
    assert run.unit_statuses(RUN) == {}


def test_calls_are_reserved_against_the_budget_then_settled(run: Store) -> None:
    """reserve_call counts against limits before a call; settle_call records its figures."""
    ids = [run.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1", round=r,
                            model="offline/m", request_hash=f"h{r}",
                            budget_delta={"model_calls": 1}) for r in (1, 2, 3)]
    with pytest.raises(BudgetLimitReached):
        run.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1", round=4,
                         model="offline/m", request_hash="h4", budget_delta={"model_calls": 1})
    run.settle_call(ids[0], tokens_in=3, tokens_out=4, cost=0.0, latency_ms=1, outcome="ok")
    calls = run.calls(RUN, unit="U1")
    assert [(c.call_id, c.status) for c in calls] == [
        (ids[0], "settled"), (ids[1], "reserved"), (ids[2], "reserved")
    ]
    assert run.calls(RUN, unit="U2") == []
    assert run.get_budget(RUN).left() == {"model_calls": 0}
    raised = run.set_budget_limits(RUN, {"model_calls": 5},
                                   event=EventIn(kind="budget.raised", payload={"by": "user"}))
    assert raised.left() == {"model_calls": 2}
    assert run.events(RUN, kinds=["budget.raised"])[0].payload == {"by": "user"}
    with pytest.raises(BudgetLimitReached):
        run.add_usage(RUN, {"model_calls": 3}, enforce=True)
    assert run.add_usage(RUN, {"model_calls": 2}, enforce=True).left() == {"model_calls": 0}


def test_a_branch_has_its_own_head_over_shared_history(run: Store) -> None:
    """fork_branch starts a head at a past version; commits on it leave the parent alone."""
    run.commit_checkpoint(RUN, "main", 0, {"a": 1})
    run.commit_checkpoint(RUN, "main", 1, {"b": 2})
    head = run.fork_branch(RUN, "main", 1, "alt")
    assert (head.branch_id, head.version) == ("alt", 1)
    assert run.get_checkpoint(RUN, 1, "alt") == run.get_checkpoint(RUN, 1)
    run.commit_checkpoint(RUN, "alt", 1, {"c": 3})
    assert "b" not in run.read_state(RUN, "alt") and run.read_key(RUN, "c", "alt") == 3
    assert run.read_key(RUN, "c") is None and run.get_head(RUN).version == 2
    assert run.verify_chain(RUN, "alt").ok and run.verify_chain(RUN).ok
    with pytest.raises(StorageError):
        run.fork_branch(RUN, "main", 1, "alt")


# -- approvals ------------------------------------------------------------------------------
def _request(store: Store, request_id: str = "req-1", *, gate: str = "audience",
             token_hash: str | None = "t" * 64, expires: float | None = None,
             retire: dict[str, str] | None = None):
    return store.create_approval_request(
        request_id=request_id, run_id=RUN, branch_id="main", gate_id=gate, unit="U1",
        question="Confirm the audience", options=[{"label": "product team"}],
        bound_object={"plan_n": 1, "contract_hash": "c" * 64}, token_hash=token_hash,
        token_expires_at=expires, retire=retire)


def test_an_approval_is_requested_decided_once_and_revoked(run: Store, clock: FakeClock) -> None:
    """A request is decided once (with an event); a decided one can be revoked, once."""
    req = _request(run, token_hash=None)
    assert (req.status, req.gate_id, req.options) == ("requested", "audience",
                                                      [{"label": "product team"}])
    assert run.get_approval("req-1") == req and run.get_approval("nope") is None
    assert [a.request_id for a in run.approvals(RUN, gate_id="audience",
                                                statuses=["requested"])] == ["req-1"]
    assert run.approvals(RUN, branch_id="other") == []
    decided = run.decide_approval(RUN, "audience", "req-1", choice="product team",
                                  decided_by="ana", scope="run", expires_at=None,
                                  bound_object=req.bound_object, now=clock.t)
    assert (decided.status, decided.choice, decided.decided_by) == ("decided", "product team",
                                                                    "ana")
    event = run.events(RUN, kinds=["approval.decided"])[-1]
    assert (event.payload["request_id"], event.payload["via"]) == ("req-1", "direct")
    with pytest.raises(ApprovalRefused) as again:
        run.decide_approval(RUN, "audience", "req-1", choice="other", decided_by="bo",
                            scope="run", expires_at=None, bound_object={}, now=clock.t)
    assert again.value.code == "not-open"
    assert run.get_approval("req-1").choice == "product team"
    revoked = run.revoke_approval("req-1", who="ana", reason="wrong audience", now=clock.t)
    assert (revoked.status, revoked.revoked_by, revoked.revoke_reason) == (
        "revoked", "ana", "wrong audience")
    assert run.events(RUN, kinds=["approval.revoked"])[-1].payload["reason"] == "wrong audience"
    with pytest.raises(ApprovalRefused) as twice:
        run.revoke_approval("req-1", who="ana", reason="again", now=clock.t)
    assert twice.value.code == "not-decided"


def test_deciding_an_unknown_or_foreign_request_is_refused(run: Store, clock: FakeClock) -> None:
    """A request id that does not exist, or belongs to another gate, raises 'no-request'."""
    _request(run, token_hash=None)
    for gate, request_id in (("audience", "nope"), ("other-gate", "req-1")):
        with pytest.raises(ApprovalRefused) as info:
            run.decide_approval(RUN, gate, request_id, choice="x", decided_by="a", scope="run",
                                expires_at=None, bound_object={}, now=clock.t)
        assert info.value.code == "no-request"
    with pytest.raises(ApprovalRefused) as revoke:
        run.revoke_approval("nope", who="a", reason="r", now=clock.t)
    assert revoke.value.code == "no-request"
    assert run.get_approval("req-1").status == "requested"


def test_a_new_request_retires_older_ones_in_the_same_step(run: Store) -> None:
    """retire= supersedes or expires older open rows atomically, each with an event."""
    _request(run, "req-1", token_hash=None)
    _request(run, "req-2", token_hash=None)
    _request(run, "req-3", token_hash=None, retire={"req-1": "superseded", "req-2": "expired"})
    assert [(a.request_id, a.status) for a in run.approvals(RUN)] == [
        ("req-1", "superseded"), ("req-2", "expired"), ("req-3", "requested")]
    assert [e.payload["replaced_by"] for e in run.events(RUN, kind_prefix="approval.")
            if e.kind in ("approval.superseded", "approval.expired")] == ["req-3", "req-3"]
    with pytest.raises(StorageError):
        _request(run, "req-4", token_hash=None, retire={"req-3": "decided"})
    assert run.get_approval("req-4") is None
    assert run.get_approval("req-3").status == "requested"


def test_a_resume_token_is_single_use_bound_to_its_run_and_gate_and_expires(
    run: Store, clock: FakeClock
) -> None:
    """check_resume_token predicts what consume does; a token works once, before expiry."""
    token = "a" * 64
    _request(run, token_hash=token, expires=clock.t + 60)
    assert run.approval_by_token_hash(token).request_id == "req-1"
    assert run.approval_by_token_hash("b" * 64) is None
    assert run.check_resume_token(token, RUN, "audience", clock.t) is None
    assert run.check_resume_token(token, RUN, "other", clock.t) == "token-other"
    assert run.check_resume_token(token, "other-run", "audience", clock.t) == "token-other"
    assert run.check_resume_token("b" * 64, RUN, "audience", clock.t) == "token-unknown"
    assert run.check_resume_token(token, RUN, "audience", clock.t + 60) == "token-expired"
    used = run.consume_resume_token(token, RUN, "audience", clock.t)
    assert used.token_used_at == clock.t and used.status == "requested"
    assert run.events(RUN, kinds=["approval.token_used"])[-1].payload["request_id"] == "req-1"
    with pytest.raises(ApprovalRefused) as again:
        run.consume_resume_token(token, RUN, "audience", clock.t)
    assert again.value.code == "token-used"
    assert run.check_resume_token(token, RUN, "audience", clock.t) == "token-used"


def test_deciding_with_a_token_uses_it_in_the_same_step(run: Store, clock: FakeClock) -> None:
    """A decision given with the request's token consumes it; a used or foreign token
    refuses the decision and writes nothing."""
    _request(run, "req-1", gate="audience", token_hash="a" * 64, expires=clock.t + 60)
    _request(run, "req-2", gate="scope", token_hash="b" * 64, expires=clock.t + 60)
    with pytest.raises(ApprovalRefused) as foreign:
        run.decide_approval(RUN, "audience", "req-1", choice="x", decided_by="a", scope="run",
                            expires_at=None, bound_object={}, now=clock.t, token_hash="b" * 64)
    assert foreign.value.code == "token-other"
    assert run.get_approval("req-1").status == "requested"
    assert run.get_approval("req-2").token_used_at is None
    decided = run.decide_approval(RUN, "audience", "req-1", choice="product team",
                                  decided_by="link", scope="run", expires_at=clock.t + 3600,
                                  bound_object={"plan_n": 1}, now=clock.t, token_hash="a" * 64)
    assert (decided.status, decided.token_used_at, decided.expires_at) == (
        "decided", clock.t, clock.t + 3600)
    assert run.events(RUN, kinds=["approval.decided"])[-1].payload["via"] == "resume-token"


# -- the side-effect ledger -------------------------------------------------------------------
def _intent(store: Store, key: str = "k-1", *, unit: str = "U1", token: int | None = None,
            compensates: str | None = None, detail: dict | None = None):
    return store.record_effect_intent(
        idem_key=key, run_id=RUN, branch_id="main", unit=unit, attempt_id=f"{unit}/a1",
        action="notify", adapter="webhook", request_hash="h-" + key, fencing_token=token,
        plan_n=1, compensates=compensates, detail=detail or {"request": {"to": "team"}})


def test_an_effect_intent_is_recorded_once_per_key(run: Store) -> None:
    """The first intent for a key is created with an event; a repeat returns it unchanged."""
    row, created = _intent(run)
    assert created and (row.status, row.idem_key, row.plan_n) == ("intent", "k-1", 1)
    again, created_again = _intent(run, detail={"request": {"to": "someone else"}})
    assert not created_again and again == row
    assert run.get_effect("k-1") == row and run.get_effect("nope") is None
    assert [e.payload["key"] for e in run.events(RUN, kinds=["effect.intent"])] == ["k-1"]
    _intent(run, "k-2", unit="U2")
    assert [r.idem_key for r in run.effects(RUN)] == ["k-1", "k-2"]
    assert [r.idem_key for r in run.effects(RUN, "intent", unit="U2")] == ["k-2"]
    assert run.effects(RUN, ["committed", "failed"]) == []
    assert run.effects(RUN, branch_id="other") == []


def test_a_fenced_executor_cannot_record_an_effect_intent(run: Store, clock: FakeClock) -> None:
    """With a fencing token, the unit's lease must still carry it; else nothing is written."""
    old = run.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=5)
    clock.t += 10
    new = run.claim(RUN, "main", "U1", expected_version=0, owner="b", lease_seconds=60)
    with pytest.raises(StaleFencingToken):
        _intent(run, token=old.fencing_token)
    assert run.get_effect("k-1") is None
    row, created = _intent(run, token=new.fencing_token)
    assert created and row.fencing_token == new.fencing_token


def test_mark_effect_moves_the_status_merges_detail_and_honours_only_if(run: Store) -> None:
    """mark_effect records a receipt (remote id kept when not given) with its event; only_if
    refuses a move from another status (None, nothing written)."""
    _intent(run)
    done = run.mark_effect("k-1", "committed", remote_id="r-9", detail={"http": 201},
                           only_if=["intent", "unknown"],
                           event=EventIn(kind="decision.effect", payload={"who": "ana"}))
    assert (done.status, done.remote_id) == ("committed", "r-9")
    assert done.detail == {"request": {"to": "team"}, "http": 201}
    assert run.events(RUN, kinds=["effect.committed"])[-1].payload["from"] == "intent"
    assert run.events(RUN, kinds=["decision.effect"])[-1].payload == {"who": "ana"}
    assert run.mark_effect("k-1", "failed", only_if=["intent"]) is None
    assert run.get_effect("k-1").status == "committed"
    assert run.mark_effect("k-1", "unknown").remote_id == "r-9"
    with pytest.raises(StorageError):
        run.mark_effect("k-1", "sent")
    with pytest.raises(NotFound):
        run.mark_effect("nope", "committed")


def test_a_committed_compensation_marks_its_original_compensated(run: Store) -> None:
    """A compensation is its own ledger entry: its intent moves the original to
    compensation-intent, its receipt to compensated; only a committed effect is compensable."""
    _intent(run, "k-1")
    with pytest.raises(StorageError):
        _intent(run, "k-1-undo", compensates="k-1")
    assert run.get_effect("k-1-undo") is None
    run.mark_effect("k-1", "committed", remote_id="r-1")
    comp, created = _intent(run, "k-1-undo", compensates="k-1")
    assert created and comp.compensates == "k-1"
    assert run.get_effect("k-1").status == "compensation-intent"
    run.mark_effect("k-1-undo", "committed", remote_id="r-2")
    assert run.get_effect("k-1").status == "compensated"
    assert [e.payload["key"] for e in run.events(RUN, kinds=["effect.compensated"])] == ["k-1"]
