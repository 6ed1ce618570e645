"""SQL for two ledgers of facts: approval requests/decisions and external side effects.

A mixin of SQLiteStore (it uses the store's ``_write``, ``_q``/``_q1``,
``_append_events`` and ``now``). What the rows *mean* — when an approval still
applies, when an effect may be retried — is engine knowledge (engine/approvals.py,
engine/effects.py); this module only guarantees that each change is atomic,
conditional where a race matters, and recorded as an event in the same
transaction.

Privacy: a resume token is stored only as its sha256; no token ever reaches a
row or an event payload.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.storage.errors import NotFound, StaleFencingToken, StorageError
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import EventIn

if TYPE_CHECKING:
    from sqlite_utils import Database

APPROVAL_STATUSES = ("requested", "decided", "revoked", "expired", "superseded")
EFFECT_STATUSES = ("intent", "committed", "unknown", "failed", "compensated",
                   "compensation-intent")


class ApprovalRecord(BaseModel):
    """One approval request and, once answered, its decision (a row of ``approvals``)."""

    request_id: str
    run_id: str
    branch_id: str
    gate_id: str
    unit: str
    question: str
    options: list[dict[str, Any]] = Field(default_factory=list)
    status: str  # requested | decided | revoked | expired | superseded
    created_at: str
    bound_object: dict[str, Any] = Field(default_factory=dict)
    choice: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    scope: str | None = None
    expires_at: float | None = None
    revoked_by: str | None = None
    revoked_at: str | None = None
    revoke_reason: str | None = None
    token_hash: str | None = None
    token_expires_at: float | None = None
    token_used_at: float | None = None


class EffectRecord(BaseModel):
    """One external action in the side-effect ledger (a row of ``side_effects``)."""

    idem_key: str
    run_id: str
    branch_id: str
    unit: str
    attempt_id: str | None = None
    action: str
    adapter: str
    request_hash: str
    fencing_token: int | None = None
    plan_n: int
    status: str  # intent | committed | unknown | failed | compensated | compensation-intent
    remote_id: str | None = None
    created_at: str
    updated_at: str
    compensates: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class ApprovalRefused(StorageError):
    """A decision, revocation or token use was refused; nothing was written.

    ``code`` is one of: ``no-request`` (no such request for that run and gate),
    ``not-open`` (the request is no longer ``requested``), ``not-decided``,
    ``token-unknown``, ``token-other`` (issued for another run or gate),
    ``token-used``, ``token-expired``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _iso(ts: float) -> str:
    # Same format as sqlite_store._iso (importing it would be circular).
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="microseconds")


def _approval(row: Mapping[str, Any]) -> ApprovalRecord:
    return ApprovalRecord(**{**row, "options": json.loads(row["options"]),
                             "bound_object": json.loads(row["bound_object"])})


def _effect(row: Mapping[str, Any]) -> EffectRecord:
    return EffectRecord(**{**row, "detail": json.loads(row["detail"])})


def _in(column: str, values: Iterable[str]) -> tuple[str, list[str]]:
    vals = list(values)
    return f" AND {column} IN ({', '.join('?' * len(vals))})", vals


def token_problem(row: ApprovalRecord | None, run_id: str, gate_id: str,
                  now: float) -> str | None:
    """Why a resume token (already looked up by its hash as ``row``) cannot be used, or None."""
    if row is None:
        return "token-unknown"
    if row.run_id != run_id or row.gate_id != gate_id:
        return "token-other"
    if row.token_used_at is not None:
        return "token-used"
    if row.token_expires_at is None or now >= row.token_expires_at:
        return "token-expired"
    if row.status != "requested":
        return "not-open"
    return None


_TOKEN_MESSAGES = {
    "token-unknown": "resume token not recognised",
    "token-other": "token is for another run or gate",
    "token-used": "token already used",
    "token-expired": "token expired",
    "not-open": "the request this token answers is no longer open",
}


class ApprovalsAndEffectsMixin:
    """Approvals and side-effect ledger operations of SQLiteStore."""

    if TYPE_CHECKING:
        def _write(self) -> AbstractContextManager[Database]: ...
        def _q(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]: ...
        def _q1(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None: ...
        def _append_events(self, db: Database, run_id: str, branch_id: str, ts: str,
                           events: Iterable[EventIn]) -> None: ...
        def now(self) -> float: ...

    # -- approvals -------------------------------------------------------------
    def create_approval_request(
        self,
        *,
        request_id: str,
        run_id: str,
        branch_id: str,
        gate_id: str,
        unit: str,
        question: str,
        options: list[dict[str, Any]],
        bound_object: Mapping[str, Any],
        token_hash: str | None,
        token_expires_at: float | None,
        retire: Mapping[str, str] | None = None,
    ) -> ApprovalRecord:
        """Insert a ``requested`` row; in the same transaction retire older rows.

        ``retire`` maps request ids to their new status (``superseded`` or
        ``expired``); a row is only retired while it is still requested or
        decided, each with an ``approval.<status>`` event.
        """
        ts = _iso(self.now())
        with self._write() as db:
            events = []
            for old_id, new_status in (retire or {}).items():
                if new_status not in ("superseded", "expired"):
                    raise StorageError(f"cannot retire an approval as {new_status!r}")
                changed = db.conn.execute(
                    "UPDATE approvals SET status = ? WHERE request_id = ? AND run_id = ? "
                    "AND gate_id = ? AND status IN ('requested', 'decided')",
                    [new_status, old_id, run_id, gate_id],
                ).rowcount
                if changed:
                    events.append(EventIn(kind=f"approval.{new_status}", unit=unit, payload={
                        "gate": gate_id, "request_id": old_id, "replaced_by": request_id}))
            db.conn.execute(
                "INSERT INTO approvals (request_id, run_id, branch_id, gate_id, unit, question, "
                "options, status, created_at, bound_object, token_hash, token_expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'requested', ?, ?, ?, ?)",
                [request_id, run_id, branch_id, gate_id, unit, question, canonical_json(options),
                 ts, canonical_json(dict(bound_object)), token_hash, token_expires_at],
            )
            events.append(EventIn(kind="approval.requested", unit=unit, payload={
                "gate": gate_id, "request_id": request_id, "question": question,
                "options": [o.get("label") for o in options],
                "bound_object": dict(bound_object)}))
            self._append_events(db, run_id, branch_id, ts, events)
        row = self.get_approval(request_id)
        assert row is not None
        return row

    def get_approval(self, request_id: str) -> ApprovalRecord | None:
        row = self._q1("SELECT * FROM approvals WHERE request_id = ?", [request_id])
        return None if row is None else _approval(row)

    def approval_by_token_hash(self, token_hash: str) -> ApprovalRecord | None:
        row = self._q1("SELECT * FROM approvals WHERE token_hash = ?", [token_hash])
        return None if row is None else _approval(row)

    def approvals(
        self,
        run_id: str,
        *,
        branch_id: str | None = None,
        gate_id: str | None = None,
        statuses: Iterable[str] | None = None,
    ) -> list[ApprovalRecord]:
        """Approval rows of a run, oldest first."""
        sql, params = "SELECT * FROM approvals WHERE run_id = ?", [run_id]
        if branch_id is not None:
            sql += " AND branch_id = ?"
            params.append(branch_id)
        if gate_id is not None:
            sql += " AND gate_id = ?"
            params.append(gate_id)
        if statuses is not None:
            clause, vals = _in("status", statuses)
            sql += clause
            params.extend(vals)
        return [_approval(r) for r in self._q(sql + " ORDER BY rowid", params)]

    def check_resume_token(self, token_hash: str, run_id: str, gate_id: str,
                           now: float) -> str | None:
        """Read-only: the problem code a consume would raise, or None if it would succeed."""
        return token_problem(self.approval_by_token_hash(token_hash), run_id, gate_id, now)

    def _consume_token(self, db: Database, token_hash: str, run_id: str, gate_id: str,
                       now: float) -> ApprovalRecord:
        row = self.approval_by_token_hash(token_hash)
        problem = token_problem(row, run_id, gate_id, now)
        if problem is not None:
            raise ApprovalRefused(problem, _TOKEN_MESSAGES[problem])
        assert row is not None
        # Conditional on "not used yet": with BEGIN IMMEDIATE held this cannot race,
        # but the condition keeps single use true even under a weaker backend.
        used = db.conn.execute(
            "UPDATE approvals SET token_used_at = ? WHERE token_hash = ? "
            "AND token_used_at IS NULL", [now, token_hash],
        ).rowcount
        if not used:
            raise ApprovalRefused("token-used", _TOKEN_MESSAGES["token-used"])
        return row

    def consume_resume_token(self, token_hash: str, run_id: str, gate_id: str,
                             now: float) -> ApprovalRecord:
        """Use a resume token once: it must exist, match run and gate, be unused and unexpired.

        Raises ApprovalRefused (nothing written) otherwise.
        """
        with self._write() as db:
            row = self._consume_token(db, token_hash, run_id, gate_id, now)
            self._append_events(db, run_id, row.branch_id, _iso(now), [EventIn(
                kind="approval.token_used", unit=row.unit,
                payload={"gate": gate_id, "request_id": row.request_id})])
        out = self.get_approval(row.request_id)
        assert out is not None
        return out

    def decide_approval(
        self,
        run_id: str,
        gate_id: str,
        request_id: str,
        *,
        choice: str,
        decided_by: str,
        scope: str,
        expires_at: float | None,
        bound_object: Mapping[str, Any],
        now: float,
        token_hash: str | None = None,
    ) -> ApprovalRecord:
        """Record the decision on a ``requested`` row, with event ``approval.decided``.

        Atomic: the status check, the token's single use (when ``token_hash`` is
        given: it must be the token of this request) and the decision commit
        together or not at all (ApprovalRefused).
        """
        ts = _iso(now)
        with self._write() as db:
            current = self.get_approval(request_id)
            if current is None or current.run_id != run_id or current.gate_id != gate_id:
                raise ApprovalRefused(
                    "no-request", f"no approval request {request_id} for gate {gate_id!r} "
                    f"of run {run_id!r}")
            if token_hash is not None:
                used = self._consume_token(db, token_hash, run_id, gate_id, now)
                if used.request_id != request_id:
                    raise ApprovalRefused("token-other", "token is for another request")
            changed = db.conn.execute(
                "UPDATE approvals SET status = 'decided', choice = ?, decided_by = ?, "
                "decided_at = ?, scope = ?, expires_at = ?, bound_object = ? "
                "WHERE request_id = ? AND status = 'requested'",
                [choice, decided_by, ts, scope, expires_at, canonical_json(dict(bound_object)),
                 request_id],
            ).rowcount
            if not changed:
                raise ApprovalRefused(
                    "not-open", f"approval request {request_id} is {current.status}, not open")
            self._append_events(db, run_id, current.branch_id, ts, [EventIn(
                kind="approval.decided", unit=current.unit, payload={
                    "gate": gate_id, "gate_id": gate_id, "request_id": request_id,
                    "choice": choice, "who": decided_by, "scope": scope,
                    "bound_object": dict(bound_object), "expires_at": expires_at,
                    "via": "resume-token" if token_hash is not None else "direct"})])
        out = self.get_approval(request_id)
        assert out is not None
        return out

    def revoke_approval(self, request_id: str, *, who: str, reason: str,
                        now: float) -> ApprovalRecord:
        """Revoke a decided approval (event ``approval.revoked``); ApprovalRefused otherwise."""
        ts = _iso(now)
        with self._write() as db:
            current = self.get_approval(request_id)
            if current is None:
                raise ApprovalRefused("no-request", f"no approval request {request_id}")
            changed = db.conn.execute(
                "UPDATE approvals SET status = 'revoked', revoked_by = ?, revoked_at = ?, "
                "revoke_reason = ? WHERE request_id = ? AND status = 'decided'",
                [who, ts, reason, request_id],
            ).rowcount
            if not changed:
                raise ApprovalRefused(
                    "not-decided", f"approval request {request_id} is {current.status}; only a "
                    "decided approval can be revoked")
            self._append_events(db, current.run_id, current.branch_id, ts, [EventIn(
                kind="approval.revoked", unit=current.unit, payload={
                    "gate": current.gate_id, "gate_id": current.gate_id,
                    "request_id": request_id, "who": who, "reason": reason,
                    "choice": current.choice})])
        out = self.get_approval(request_id)
        assert out is not None
        return out

    # -- the side-effect ledger ----------------------------------------------------
    def get_effect(self, idem_key: str) -> EffectRecord | None:
        row = self._q1("SELECT * FROM side_effects WHERE idem_key = ?", [idem_key])
        return None if row is None else _effect(row)

    def effects(
        self,
        run_id: str,
        status: str | Iterable[str] | None = None,
        *,
        unit: str | None = None,
        branch_id: str | None = None,
    ) -> list[EffectRecord]:
        """Ledger rows of a run, oldest first, optionally by status (one or several)."""
        sql, params = "SELECT * FROM side_effects WHERE run_id = ?", [run_id]
        if status is not None:
            clause, vals = _in("status", [status] if isinstance(status, str) else status)
            sql += clause
            params.extend(vals)
        if unit is not None:
            sql += " AND unit = ?"
            params.append(unit)
        if branch_id is not None:
            sql += " AND branch_id = ?"
            params.append(branch_id)
        return [_effect(r) for r in self._q(sql + " ORDER BY created_at, rowid", params)]

    def record_effect_intent(
        self,
        *,
        idem_key: str,
        run_id: str,
        branch_id: str,
        unit: str,
        attempt_id: str | None,
        action: str,
        adapter: str,
        request_hash: str,
        fencing_token: int | None,
        plan_n: int,
        compensates: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> tuple[EffectRecord, bool]:
        """Insert an ``intent`` row, or return the existing row for the key unchanged.

        Returns (row, created). With a ``fencing_token``, the unit's lease must
        still carry it (else StaleFencingToken, nothing written): a fenced
        executor can start no external action. A compensation intent
        (``compensates`` = the original's key) moves the original from
        ``committed`` to ``compensation-intent`` in the same transaction.
        """
        ts = _iso(self.now())
        with self._write() as db:
            if fencing_token is not None:
                lease = self._q1(
                    "SELECT fencing_token FROM leases WHERE run_id = ? AND branch_id = ? "
                    "AND unit = ?", [run_id, branch_id, unit],
                )
                if lease is None or lease["fencing_token"] != fencing_token:
                    raise StaleFencingToken(
                        f"{run_id}/{unit}: token {fencing_token} is no longer current; "
                        f"the external action {action!r} was not started")
            existing = self.get_effect(idem_key)
            if existing is not None:
                return existing, False
            events = []
            if compensates is not None:
                changed = db.conn.execute(
                    "UPDATE side_effects SET status = 'compensation-intent', updated_at = ? "
                    "WHERE idem_key = ? AND status = 'committed'", [ts, compensates],
                ).rowcount
                if not changed:
                    raise StorageError(
                        f"effect {compensates} is not committed; only a committed effect can be "
                        "compensated")
                events.append(EventIn(kind="effect.compensation-intent", unit=unit,
                                      attempt_id=attempt_id,
                                      payload={"key": compensates, "by": idem_key}))
            db.conn.execute(
                "INSERT INTO side_effects (idem_key, run_id, branch_id, unit, attempt_id, action, "
                "adapter, request_hash, fencing_token, plan_n, status, created_at, updated_at, "
                "compensates, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'intent', ?, ?, ?, ?)",
                [idem_key, run_id, branch_id, unit, attempt_id, action, adapter, request_hash,
                 fencing_token, plan_n, ts, ts, compensates, canonical_json(dict(detail or {}))],
            )
            events.append(EventIn(kind="effect.intent", unit=unit, attempt_id=attempt_id, payload={
                "key": idem_key, "action": action, "adapter": adapter,
                "request_hash": request_hash, "plan_n": plan_n, "compensates": compensates}))
            self._append_events(db, run_id, branch_id, ts, events)
        row = self.get_effect(idem_key)
        assert row is not None
        return row, True

    def mark_effect(
        self,
        idem_key: str,
        status: str,
        *,
        remote_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
        only_if: Iterable[str] | None = None,
        event: EventIn | None = None,
    ) -> EffectRecord | None:
        """Move an effect to ``status`` (event ``effect.<status>``); None if ``only_if`` refused.

        ``detail`` is merged over the stored detail; ``remote_id`` is kept when
        not given. A compensation row reaching ``committed`` marks its original
        ``compensated`` in the same transaction. ``event`` (e.g. a person's
        decision) is appended in the same transaction too.
        """
        if status not in EFFECT_STATUSES:
            raise StorageError(f"unknown effect status {status!r}")
        ts = _iso(self.now())
        with self._write() as db:
            row = self.get_effect(idem_key)
            if row is None:
                raise NotFound(f"no side effect with key {idem_key}")
            if only_if is not None and row.status not in set(only_if):
                return None
            merged = {**row.detail, **dict(detail or {})}
            db.conn.execute(
                "UPDATE side_effects SET status = ?, remote_id = COALESCE(?, remote_id), "
                "detail = ?, updated_at = ? WHERE idem_key = ?",
                [status, remote_id, canonical_json(merged), ts, idem_key],
            )
            payload: dict[str, Any] = {"key": idem_key, "action": row.action,
                                       "adapter": row.adapter, "from": row.status}
            if remote_id is not None:
                payload["remote_id"] = remote_id
            if detail:
                payload["detail"] = dict(detail)
            events = [EventIn(kind=f"effect.{status}", unit=row.unit, attempt_id=row.attempt_id,
                              payload=payload)]
            if row.compensates is not None and status == "committed":
                db.conn.execute(
                    "UPDATE side_effects SET status = 'compensated', updated_at = ? "
                    "WHERE idem_key = ? AND status IN ('compensation-intent', 'committed')",
                    [ts, row.compensates],
                )
                events.append(EventIn(kind="effect.compensated", unit=row.unit,
                                      payload={"key": row.compensates, "by": idem_key}))
            if event is not None:
                events.append(event)
            self._append_events(db, row.run_id, row.branch_id, ts, events)
        return self.get_effect(idem_key)

