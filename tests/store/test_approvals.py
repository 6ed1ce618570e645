"""Store contract: approval requests, decisions and resume tokens."""

from __future__ import annotations

import pytest

from keepstep.storage import ApprovalRefused, StorageError, Store
from tests.store.contract import RUN, FakeClock


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
