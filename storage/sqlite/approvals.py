"""Approval requests and decisions (SQLite).

Each change is atomic, conditional where a race matters, and recorded as an event in
the same transaction. What the rows *mean* — when an approval still applies — is engine
knowledge. A resume token is stored only as its sha256; no token reaches a row or event.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from keepstep.storage.errors import ApprovalRefused, StorageError
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import ApprovalRecord, EventIn
from keepstep.storage.sqlite.connection import SQLiteBase, iso
from keepstep.storage.sqlite.events import insert_events
from keepstep.storage.sqlite.sqlite_lib import Database


def _approval(row: Mapping[str, Any]) -> ApprovalRecord:
    return ApprovalRecord(**{**row, "options": json.loads(row["options"]),
                             "bound_object": json.loads(row["bound_object"])})


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


class Approvals(SQLiteBase):
    """The approvals capability of SQLiteStore."""

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
        ts = iso(self.now())
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
            insert_events(db.conn, run_id, branch_id, ts, events)
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
            insert_events(db.conn, run_id, row.branch_id, iso(now), [EventIn(
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
        ts = iso(now)
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
            insert_events(db.conn, run_id, current.branch_id, ts, [EventIn(
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
        ts = iso(now)
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
            insert_events(db.conn, current.run_id, current.branch_id, ts, [EventIn(
                kind="approval.revoked", unit=current.unit, payload={
                    "gate": current.gate_id, "gate_id": current.gate_id,
                    "request_id": request_id, "who": who, "reason": reason,
                    "choice": current.choice})])
        out = self.get_approval(request_id)
        assert out is not None
        return out
