"""Approvals: version-bound decisions, expiry, revocation, asking again, resume tokens, m002."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database, Migrations

from keepstep.engine.core.plan import Gate
from keepstep.engine.errors import ApprovalError
from keepstep.engine.run.approvals import (
    ApprovalOption,
    approval_applies,
    decide,
    gate_status,
    hash_token,
    pending_requests,
    request_gate,
    revoke,
)
from keepstep.storage import SCHEMA_VERSION, SQLiteStore
from keepstep.storage.sqlite.schema import MIGRATION_SET, m001_initial

T0 = 1_700_000_000.0
DAY = 86400.0
RUN = "ME-042"
GATE = Gate(id="audience-ok", unit="U30", question="Is the audience right for the risk ranking?",
            options=["board", "operations"], expires_days=7)
OTHER_GATE = Gate(id="publish-ok", unit="U40", question="Publish the pack?")
PLAN2 = {"plan_n": 2, "contract_hash": "c" * 64}
PLAN3 = {"plan_n": 3, "contract_hash": "c" * 64}
OPTIONS = [
    ApprovalOption(label="board", reuse=["U01", "U02"], redo=["U30", "U31"],
                   estimate={"calls": 6, "cost": 0.12}),
    ApprovalOption(label="operations", reuse=["U01", "U02", "U30"], redo=[],
                   estimate={"calls": 0, "cost": 0.0}),
]


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(store_root: Path, clock: Clock):
    s = SQLiteStore(store_root, clock=clock)
    s.create_run(RUN, {})
    s.create_run("ME-043", {})
    yield s
    s.close()


def _ask(store: SQLiteStore, clock: Clock, bound: dict = PLAN2, gate: Gate = GATE, run: str = RUN):
    return request_gate(store, run, "main", gate, bound_object=bound, options=OPTIONS,
                        now=clock())


def test_m002_migrates_an_m001_only_database_after_a_backup(store_root: Path) -> None:
    """An m001-only database opens at SCHEMA_VERSION with m002's tables, keeping a v1 backup."""
    store_root.mkdir(parents=True)
    path = store_root / "state.db"
    old = Migrations(MIGRATION_SET)
    old()(m001_initial)
    db = Database(sqlite3.connect(str(path), isolation_level=None))
    old.apply(db)
    db.execute("INSERT INTO runs (run_id, created_at, meta) VALUES ('R-old', '2024-01-01', '{}')")
    db.close()

    s = SQLiteStore(store_root)
    try:
        assert s.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert s.runs() == ["R-old"]
        tables = {r[0] for r in s.db.conn.execute("SELECT name FROM sqlite_master")}
        assert {"approvals", "side_effects"} <= tables
        backup = s.migrated_from_backup
    finally:
        s.close()
    assert backup is not None and backup.name.startswith("state.db.v1-")
    copy = sqlite3.connect(backup)
    try:
        assert copy.execute("PRAGMA user_version").fetchone()[0] == 1
        assert not copy.execute("SELECT 1 FROM sqlite_master WHERE name = 'approvals'").fetchall()
    finally:
        copy.close()


def test_a_request_stores_question_options_reuse_redo_and_estimate(ledger, clock) -> None:
    """The request keeps the gate's question and each option's reuse, redo and estimated cost."""
    req = _ask(ledger, clock)
    stored = ledger.get_approval(req.request_id)
    assert stored.status == "requested" and stored.question == GATE.question
    assert stored.options[0] == {"label": "board", "reuse": ["U01", "U02"],
                                 "redo": ["U30", "U31"], "estimate": {"calls": 6, "cost": 0.12},
                                 "note": "", "available": True}
    assert stored.bound_object == PLAN2
    assert [r.request_id for r in pending_requests(ledger, RUN, "main")] == [req.request_id]
    assert [e.kind for e in ledger.events(RUN, kind_prefix="approval.")] == ["approval.requested"]


def test_a_decision_records_who_when_choice_object_scope_and_expiry(ledger, clock) -> None:
    """decide() stores the decision and an approval.decided event carrying gate and choice."""
    _ask(ledger, clock)
    clock.t += 60
    d = decide(ledger, RUN, GATE.id, "Board", who="ana", bound_object=PLAN2, expires_days=7)
    assert (d.status, d.choice, d.decided_by, d.scope) == ("decided", "board", "ana", "gate")
    assert d.expires_at == pytest.approx(T0 + 60 + 7 * DAY)
    assert d.bound_object == PLAN2 and d.decided_at.startswith("2023-11-14")
    ev = ledger.events(RUN, kinds=["approval.decided"])[-1]
    assert ev.payload["gate"] == GATE.id and ev.payload["choice"] == "board"
    assert ev.payload["who"] == "ana" and ev.payload["via"] == "direct"
    ok, why = approval_applies(d, current_bound_object=PLAN2, now=clock())
    assert ok and "board" in why and "plan-v2" in why


def test_an_approval_bound_to_plan_n_does_not_apply_at_n_plus_1_and_the_gate_asks_again(
    ledger, clock
) -> None:
    """A plan-v2 decision does not open the gate at plan-v3; the next check supersedes and
    re-asks."""
    first = _ask(ledger, clock)
    decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7)
    assert gate_status(ledger, RUN, "main", GATE, PLAN2, clock()).open

    status = gate_status(ledger, RUN, "main", GATE, PLAN3, clock())
    assert not status.open and status.request is None  # read-only without options
    assert "plan-v2 to plan-v3" in status.reason

    asked = gate_status(ledger, RUN, "main", GATE, PLAN3, clock(), options=OPTIONS)
    assert not asked.open and asked.request is not None
    assert asked.request.request_id != first.request_id
    assert asked.request.bound_object == PLAN3 and asked.request.resume_token
    assert ledger.get_approval(first.request_id).status == "superseded"
    assert "approval.superseded" in [e.kind for e in ledger.events(RUN)]
    # asking is idempotent while the new request waits
    again = gate_status(ledger, RUN, "main", GATE, PLAN3, clock(), options=OPTIONS)
    assert again.request.request_id == asked.request.request_id
    decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN3, expires_days=7)
    assert gate_status(ledger, RUN, "main", GATE, PLAN3, clock()).open


def test_a_changed_contract_hash_at_the_same_plan_n_does_not_apply(ledger, clock) -> None:
    """Plan version AND contract hash are both bound: either changing closes the gate."""
    _ask(ledger, clock)
    d = decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7)
    ok, why = approval_applies(d, current_bound_object={**PLAN2, "contract_hash": "d" * 64},
                               now=clock())
    assert not ok and "contract changed" in why


def test_an_artifact_bound_approval_stops_applying_when_the_artifact_changes(ledger, clock) -> None:
    """An approval bound to an artifact hash does not apply to a different artifact."""
    gate = Gate(id="ranking-ok", unit="U31", question="Ranking OK?", binds="artifact:U30")
    old = {"artifact_unit": "U30", "artifact": ["a" * 64]}
    request_gate(ledger, RUN, "main", gate, bound_object=old, options=[], now=clock())
    d = decide(ledger, RUN, gate.id, "approve", who="ana", bound_object=old, expires_days=7)
    assert approval_applies(d, current_bound_object=old, now=clock())[0]
    ok, why = approval_applies(d, current_bound_object={**old, "artifact": ["b" * 64]},
                               now=clock())
    assert not ok and "artifact changed" in why


def test_an_expired_approval_does_not_apply_and_is_marked_expired_when_asked_again(
    ledger, clock
) -> None:
    """Past its expiry (injected clock) a decision no longer opens the gate; re-asking marks it."""
    _ask(ledger, clock)
    d = decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7)
    clock.t += 7 * DAY - 1
    assert gate_status(ledger, RUN, "main", GATE, PLAN2, clock()).open
    clock.t += 1
    status = gate_status(ledger, RUN, "main", GATE, PLAN2, clock(), options=OPTIONS)
    assert not status.open and "expired" in status.reason
    assert ledger.get_approval(d.request_id).status == "expired"
    assert status.request.status == "requested"


def test_a_revoked_approval_does_not_apply_and_revoking_is_a_decision_event(ledger, clock) -> None:
    """revoke() closes the gate, records who and why as approval.revoked; nothing left to revoke."""
    _ask(ledger, clock)
    decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7)
    r = revoke(ledger, RUN, GATE.id, "ben", "the client changed the audience")
    assert r.status == "revoked" and r.revoked_by == "ben"
    status = gate_status(ledger, RUN, "main", GATE, PLAN2, clock())
    assert not status.open and "revoked by ben" in status.reason
    ev = ledger.events(RUN, kinds=["approval.revoked"])[-1]
    assert ev.payload == {"gate": GATE.id, "gate_id": GATE.id, "request_id": r.request_id,
                          "who": "ben", "reason": "the client changed the audience",
                          "choice": "board"}
    with pytest.raises(ApprovalError, match="no decision to revoke"):
        revoke(ledger, RUN, GATE.id, "ben", "again")


def test_a_decision_for_another_object_or_an_unknown_option_is_refused(ledger, clock) -> None:
    """The decision must be about the object the request asked about, with one of its options."""
    _ask(ledger, clock)
    with pytest.raises(ApprovalError, match="asked about plan-v2"):
        decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN3, expires_days=7)
    with pytest.raises(ApprovalError, match="no option 'investors'") as info:
        decide(ledger, RUN, GATE.id, "investors", who="ana", bound_object=PLAN2, expires_days=7)
    assert "board, operations" in str(info.value)
    with pytest.raises(ApprovalError, match="no open approval request"):
        decide(ledger, RUN, OTHER_GATE.id, "approve", who="ana", bound_object=PLAN2,
               expires_days=7)


def test_a_resume_token_works_once_then_is_refused(ledger, clock) -> None:
    """The token decides its gate once; a second use says "token already used"."""
    req = _ask(ledger, clock)
    token = req.resume_token
    d = decide(ledger, RUN, GATE.id, "operations", who="ana (token)", bound_object=PLAN2,
               expires_days=7, token=token)
    assert d.status == "decided" and d.token_used_at == clock()
    assert ledger.events(RUN, kinds=["approval.decided"])[-1].payload["via"] == "resume-token"
    _ask(ledger, clock)  # a fresh request is open again: the old token still may not answer it
    with pytest.raises(ApprovalError, match="token already used"):
        decide(ledger, RUN, GATE.id, "board", who="mallory", bound_object=PLAN2,
               expires_days=7, token=token)


def test_a_token_for_another_run_or_gate_is_refused_and_not_burned(ledger, clock) -> None:
    """A token answers only its own run and gate; a refused try leaves it usable."""
    req = _ask(ledger, clock)
    _ask(ledger, clock, gate=OTHER_GATE)
    _ask(ledger, clock, run="ME-043")
    with pytest.raises(ApprovalError, match="token is for another run or gate"):
        decide(ledger, RUN, OTHER_GATE.id, "approve", who="x", bound_object=PLAN2,
               expires_days=7, token=req.resume_token)
    with pytest.raises(ApprovalError, match="token is for another run or gate"):
        decide(ledger, "ME-043", GATE.id, "board", who="x", bound_object=PLAN2,
               expires_days=7, token=req.resume_token)
    with pytest.raises(ApprovalError, match="not recognised"):
        decide(ledger, RUN, GATE.id, "board", who="x", bound_object=PLAN2, expires_days=7,
               token="guessed-" + req.resume_token[8:])
    assert ledger.get_approval(req.request_id).token_used_at is None
    decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7,
           token=req.resume_token)


def test_an_expired_token_is_refused(ledger, clock) -> None:
    """A token past its 24 h lifetime is refused and the request stays open."""
    req = _ask(ledger, clock)
    clock.t += 24 * 3600
    with pytest.raises(ApprovalError, match="token expired") as info:
        decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7,
               token=req.resume_token)
    assert "asks again" in str(info.value)
    assert ledger.get_approval(req.request_id).status == "requested"


def test_a_token_of_a_superseded_request_is_refused(ledger, clock) -> None:
    """When the gate asked again (new plan version), the old request's token answers nothing."""
    old = _ask(ledger, clock)
    gate_status(ledger, RUN, "main", GATE, PLAN3, clock(), options=OPTIONS)
    with pytest.raises(ApprovalError, match="no longer open"):
        decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN3, expires_days=7,
               token=old.resume_token)


def test_consume_resume_token_is_single_use_and_checks_run_and_gate(ledger, clock) -> None:
    """The storage primitive refuses a foreign run/gate, then consumes once, then refuses."""
    from keepstep.storage.errors import ApprovalRefused

    req = _ask(ledger, clock)
    h = hash_token(req.resume_token)
    with pytest.raises(ApprovalRefused) as info:
        ledger.consume_resume_token(h, "ME-043", GATE.id, clock())
    assert info.value.code == "token-other"
    used = ledger.consume_resume_token(h, RUN, GATE.id, clock())
    assert used.token_used_at == clock()
    with pytest.raises(ApprovalRefused) as info:
        ledger.consume_resume_token(h, RUN, GATE.id, clock())
    assert info.value.code == "token-used"


def test_the_database_holds_only_the_tokens_hash(ledger, clock, store_root: Path) -> None:
    """Scanning the database files finds the sha256 of the token but never the token itself."""
    req = _ask(ledger, clock)
    token = req.resume_token
    assert token and len(token) >= 43
    assert "resume_token" not in req.model_dump() and token not in repr(req)
    decide(ledger, RUN, GATE.id, "board", who="ana", bound_object=PLAN2, expires_days=7,
           token=token)
    blob = b"".join(p.read_bytes() for p in store_root.glob("state.db*"))
    assert hash_token(token).encode() in blob
    assert token.encode() not in blob
    ledger.db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert token.encode() not in (store_root / "state.db").read_bytes()


def test_an_approve_answer_racing_another_executor_is_settled_by_the_gate_status(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two executors with --approve on one run: the second's answer meets a request the first
    already answered (refused) — the gate is open, so it goes on; a request superseded by the
    other executor is answered once more; a refusal with the gate still closed stands."""
    from types import SimpleNamespace

    from keepstep.engine.run import gates

    run = SimpleNamespace(store=None, run_id=RUN, branch_id="main", clock=lambda: 0.0)
    answers: list[str] = []

    def script(outcomes: list[bool], statuses: list[SimpleNamespace]) -> None:
        def record_choice(*_a, **_k):  # noqa: ANN202
            answers.append("tried")
            if not outcomes.pop(0):
                raise ApprovalError("gate 'g': the request is no longer open")

        monkeypatch.setattr(gates, "record_choice", record_choice)
        monkeypatch.setattr(gates.approvals, "gate_status", lambda *_a: statuses.pop(0))

    script([False], [SimpleNamespace(open=True, request=None)])
    gates._answer_once(run, GATE, {}, "yes", None)  # answered by the other: fine
    script([False, True], [SimpleNamespace(open=False, request=object())])
    gates._answer_once(run, GATE, {}, "yes", None)  # superseded: answered again
    assert answers == ["tried", "tried", "tried"]
    script([False, False], [SimpleNamespace(open=False, request=object())] * 2)
    with pytest.raises(ApprovalError):
        gates._answer_once(run, GATE, {}, "yes", None)
    script([False], [SimpleNamespace(open=False, request=None)])
    with pytest.raises(ApprovalError):
        gates._answer_once(run, GATE, {}, "yes", None)
