"""Claims, leases, fencing tokens, attempts and runtime unit statuses (SQLite)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from keepstep.storage.errors import (
    CheckpointConflict,
    LeaseHeld,
    NotFound,
    StaleFencingToken,
    StorageError,
)
from keepstep.storage.faults import crash_point
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import (
    Attempt,
    AttemptEnd,
    AttemptStatus,
    Claim,
    EventIn,
    Lease,
    RunOverlay,
    UnitStatus,
    UnitStatusChange,
    UnitStatusKind,
)
from keepstep.storage.sqlite.calls import BUDGET_SQL, add_usage_in, budget_of
from keepstep.storage.sqlite.checkpoints import HEAD_SQL, head_of
from keepstep.storage.sqlite.connection import SQLiteBase, iso
from keepstep.storage.sqlite.events import insert_events
from keepstep.storage.sqlite.sqlite_lib import Database

_ENDINGS = frozenset(AttemptStatus) - {AttemptStatus.claimed, AttemptStatus.committed}


# A claim's two reads, named so the PostgreSQL store can send them ahead with BEGIN
# (storage/postgres/store.py): the head, the unit's lease and its next attempt number in one
# read; then the fencing token.
CLAIM_HEAD_SQL = (
    "SELECT b.head_version, "
    "COALESCE((SELECT c.n FROM attempt_counters c "
    " WHERE c.run_id = b.run_id AND c.unit = ?), 0) + 1, "
    "l.attempt_id, l.owner, l.fencing_token, l.expires_at, l.renewed_at, "
    "l.progress, l.progress_at FROM branches b "
    "LEFT JOIN leases l ON l.run_id = b.run_id AND l.branch_id = b.branch_id "
    "AND l.unit = ? WHERE b.run_id = ? AND b.branch_id = ?")
CLAIM_TOKEN_SQL = "UPDATE fencing SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token"


class Claims(SQLiteBase):
    """The claims-and-leases capability of SQLiteStore."""

    def claim(
        self,
        run_id: str,
        branch_id: str,
        unit: str,
        *,
        expected_version: int,
        owner: str,
        lease_seconds: float,
    ) -> Claim:
        """Claim a unit at head ``expected_version``: new attempt, lease, fencing token.

        An expired lease on the unit is fenced (its attempt marked ``fenced``);
        a live one raises LeaseHeld.
        """
        now = self.now()
        ts = iso(now)
        crash_point("claim.before")
        # Not synced on its own: the unit's commit (or a model call's reservation, the
        # first durable write after it) syncs the log with the claim in it. A process
        # crash keeps it (the log is written, only not synced); a power cut before that
        # sync loses only the claim of a unit that had not committed, whose attempt id the
        # next claim then takes again (its leftover folder is set aside below).
        with self._write(durable=False) as db:
            conn = db.conn
            # Head, the unit's lease (if any) and its next attempt number in one read.
            found = conn.execute(CLAIM_HEAD_SQL, [unit, unit, run_id, branch_id]).fetchone()
            if found is None:
                raise NotFound(f"no branch {branch_id!r} in run {run_id!r}",
                               hint="list runs with `keepstep status DIR`")
            head_version, n, lease_attempt, lease_owner, lease_token, *rest = found
            if head_version != expected_version:
                raise CheckpointConflict(
                    f"{run_id}/{branch_id}: head is {head_version}, expected {expected_version}"
                )
            if lease_attempt is not None:
                expires_at, renewed_at, progress, progress_at = rest
                if expires_at > now:
                    raise LeaseHeld(f"{unit} is leased by {lease_owner} until {iso(expires_at)}")
                self._fence(db, run_id, branch_id, Lease(
                    run_id=run_id, branch_id=branch_id, unit=unit, attempt_id=lease_attempt,
                    owner=lease_owner, fencing_token=lease_token, expires_at=expires_at,
                    renewed_at=renewed_at, progress=progress, progress_at=progress_at), ts)
            token = conn.execute(CLAIM_TOKEN_SQL).fetchone()[0]
            attempt_id = f"{unit}/a{n}"
            expires = now + lease_seconds
            conn.execute(
                "INSERT INTO attempts (attempt_id, run_id, branch_id, unit, attempt_no, executor, "
                "fencing_token, status, claimed_at_version, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'claimed', ?, ?)",
                [attempt_id, run_id, branch_id, unit, n, owner, token, expected_version, ts],
            )
            conn.execute(
                "INSERT INTO attempt_counters (run_id, unit, n) VALUES (?, ?, ?) "
                "ON CONFLICT (run_id, unit) DO UPDATE SET n = excluded.n",
                [run_id, unit, n],
            )
            conn.execute(
                "INSERT INTO leases (run_id, branch_id, unit, attempt_id, owner, fencing_token, "
                "expires_at, renewed_at, progress, progress_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                [run_id, branch_id, unit, attempt_id, owner, token, expires, now, now],
            )
            conn.execute(
                "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
                "VALUES (?, ?, ?, 'unit.claimed', ?, ?, ?)",
                [run_id, branch_id, ts, unit, attempt_id, canonical_json(
                    {"owner": owner, "token": token, "at_version": expected_version,
                     "expires_at": iso(expires)})],
            )
        crash_point("claim.after")
        lost = self.artifacts.set_aside(run_id, attempt_id, f"t{token}")
        if lost is not None:
            with self._write() as db:
                insert_events(db.conn, run_id, branch_id, ts, [EventIn(
                    kind="attempt.set_aside", unit=unit, attempt_id=attempt_id,
                    payload={"folder": lost, "reason": "a folder of this attempt id was "
                             "already there, left by a claim the database lost (a power "
                             "cut before its sync, or a restored older database)"})])
        return Claim(run_id=run_id, branch_id=branch_id, unit=unit, attempt_id=attempt_id,
                     attempt_no=n, fencing_token=token, owner=owner, expires_at=expires,
                     claimed_at_version=expected_version)

    def _fence(self, db: Database, run_id: str, branch_id: str, lease: Lease, ts: str) -> None:
        db.conn.execute(
            "DELETE FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ?",
            [run_id, branch_id, lease.unit],
        )
        db.conn.execute(
            "UPDATE attempts SET status = 'fenced', ended_at = ?, message = ? "
            "WHERE run_id = ? AND attempt_id = ? AND status = 'claimed'",
            [ts, f"lease expired (owner {lease.owner})", run_id, lease.attempt_id],
        )
        insert_events(db.conn, run_id, branch_id, ts, [EventIn(
            kind="lease.fenced", unit=lease.unit, attempt_id=lease.attempt_id,
            payload={"owner": lease.owner, "token": lease.fencing_token},
        )])

    def renew_lease(
        self,
        run_id: str,
        branch_id: str,
        unit: str,
        *,
        fencing_token: int,
        lease_seconds: float,
        progress: str | None = None,
    ) -> float:
        """Extend a lease; StaleFencingToken if it was taken over or released."""
        now = self.now()
        # Not synced on its own: a renewal lost to a power cut only shortens the lease of
        # an executor that stopped with the machine; the next durable commit syncs it.
        with self._write(durable=False) as db:
            lease = self._q1(
                "SELECT * FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ?",
                [run_id, branch_id, unit],
            )
            if lease is None or lease["fencing_token"] != fencing_token:
                raise StaleFencingToken(
                    f"{run_id}/{unit}: lease with token {fencing_token} is gone")
            moved = progress is not None and progress != lease["progress"]
            db.conn.execute(
                "UPDATE leases SET expires_at = ?, renewed_at = ?, progress = ?, progress_at = ? "
                "WHERE run_id = ? AND branch_id = ? AND unit = ?",
                [now + lease_seconds, now, progress if progress is not None else lease["progress"],
                 now if moved else lease["progress_at"], run_id, branch_id, unit],
            )
        return now + lease_seconds

    def release_lease(self, run_id: str, branch_id: str, unit: str, fencing_token: int) -> None:
        with self._write() as db:
            db.conn.execute(
                "DELETE FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                "AND fencing_token = ?", [run_id, branch_id, unit, fencing_token],
            )

    def leases(self, run_id: str, branch_id: str | None = None) -> list[Lease]:
        if branch_id is not None:
            return [Lease(**r) for r in self._q(BRANCH_LEASES_SQL, [run_id, branch_id])]
        return [Lease(**r) for r in self._q(
            "SELECT * FROM leases WHERE run_id = ? ORDER BY unit", [run_id])]

    def fence_expired_leases(self, run_id: str, branch_id: str = "main") -> list[Lease]:
        """Take away every expired lease (their attempts become ``fenced``)."""
        now = self.now()
        ts = iso(now)
        with self._write() as db:
            expired = [
                Lease(**r) for r in self._q(
                    "SELECT * FROM leases WHERE run_id = ? AND branch_id = ? AND expires_at <= ?",
                    [run_id, branch_id, now],
                )
            ]
            for lease in expired:
                self._fence(db, run_id, branch_id, lease, ts)
        return expired

    def fence_lease(self, run_id: str, branch_id: str, unit: str, fencing_token: int,
                    reason: str) -> bool:
        """Take a lease away before expiry (its owner is known to be dead)."""
        ts = iso(self.now())
        with self._write() as db:
            row = self._q1(
                "SELECT * FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                "AND fencing_token = ?", [run_id, branch_id, unit, fencing_token],
            )
            if row is None:
                return False
            self._fence(db, run_id, branch_id, Lease(**row), ts)
            insert_events(db.conn, run_id, branch_id, ts, [EventIn(
                kind="lease.owner_dead", unit=unit, attempt_id=row["attempt_id"],
                payload={"owner": row["owner"], "reason": reason})])
            return True

    def current_token(self) -> int:
        row = self._q1("SELECT last_token FROM fencing WHERE id = 1")
        assert row is not None  # the first migration inserts it
        return int(row["last_token"])

    def set_attempt_status(
        self,
        run_id: str,
        attempt_id: str,
        status: str,
        *,
        error_class: str | None = None,
        message: str | None = None,
        only_if: Iterable[str] | None = None,
    ) -> bool:
        """Set an attempt's status; with ``only_if``, only from one of those statuses."""
        ts = iso(self.now())
        status = AttemptStatus(status)
        sql = ("UPDATE attempts SET status = ?, error_class = COALESCE(?, error_class), "
               "message = COALESCE(?, message), ended_at = CASE WHEN ? = 'claimed' "
               "THEN ended_at ELSE ? END WHERE run_id = ? AND attempt_id = ?")
        params: list[Any] = [status.value, error_class, message, status.value, ts, run_id,
                             attempt_id]
        if only_if is not None:
            only = list(only_if)
            sql += f" AND status IN ({', '.join('?' * len(only))})"
            params.extend(AttemptStatus(o).value for o in only)
        with self._write() as db:
            return db.conn.execute(sql, params).rowcount > 0

    def end_attempt(self, claim: Claim, end: AttemptEnd) -> bool:
        """End an attempt that did not commit, in one ``BEGIN IMMEDIATE``: its status, its
        lease released by the claim's token, the unit's runtime status and its event, the
        events, the usage. With ``end.only_if`` refused, nothing is written (False)."""
        status = AttemptStatus(end.status)
        if status not in _ENDINGS:
            raise StorageError(f"{status.value!r} does not end an attempt",
                               hint="a commit ends its attempt as committed itself")
        ts = iso(self.now())
        run_id, branch_id, unit = claim.run_id, claim.branch_id, claim.unit
        sql = ("UPDATE attempts SET status = ?, error_class = COALESCE(?, error_class), "
               "message = COALESCE(?, message), ended_at = ? WHERE run_id = ? AND attempt_id = ?")
        params: list[Any] = [status.value, end.error_class, end.message, ts, run_id,
                             claim.attempt_id]
        if end.only_if is not None:
            only = [AttemptStatus(o).value for o in end.only_if]
            sql += f" AND status IN ({', '.join('?' * len(only))})"
            params.extend(only)
        crash_point("end_attempt.before_begin")
        with self._write() as db:
            conn = db.conn
            if conn.execute(sql, params).rowcount == 0 and end.only_if is not None:
                return False
            crash_point("end_attempt.after_attempt")
            conn.execute("DELETE FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                         "AND fencing_token = ?", [run_id, branch_id, unit, claim.fencing_token])
            crash_point("end_attempt.after_lease")
            events = list(end.events)
            if end.unit_status is not None:
                events.insert(0, _write_unit_status(conn, run_id, branch_id, unit,
                                                    end.unit_status, claim.attempt_id, ts))
                crash_point("end_attempt.after_unit_status")
            if end.usage:
                add_usage_in(conn, run_id, branch_id, end.usage, enforce=False)
                crash_point("end_attempt.after_usage")
            if events:
                insert_events(conn, run_id, branch_id, ts, events)
            crash_point("end_attempt.before_commit")
        crash_point("end_attempt.after_commit")
        return True

    def attempts(self, run_id: str, unit: str | None = None) -> list[Attempt]:
        sql, params = "SELECT * FROM attempts WHERE run_id = ?", [run_id]
        if unit is not None:
            sql += " AND unit = ?"
            params.append(unit)
        return [Attempt(**r) for r in self._q(sql + " ORDER BY unit, attempt_no", params)]

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        """Attempts claimed per unit (all branches), from the counter ``claim`` keeps."""
        return {r["unit"]: r["n"] for r in self._q(
            "SELECT unit, n FROM attempt_counters WHERE run_id = ? ORDER BY unit", [run_id])}

    def get_attempt(self, run_id: str, attempt_id: str) -> Attempt | None:
        row = self._q1("SELECT * FROM attempts WHERE run_id = ? AND attempt_id = ?",
                       [run_id, attempt_id])
        return None if row is None else Attempt(**row)

    # -- runtime unit status ---------------------------------------------------
    def set_unit_status(
        self,
        run_id: str,
        branch_id: str,
        unit: str,
        status: str,
        reason: str,
        details: Mapping[str, Any] | None = None,
        *,
        event_kind: str | None = None,
        attempt_id: str | None = None,
    ) -> None:
        ts = iso(self.now())
        change = UnitStatusChange(UnitStatusKind(status), reason, dict(details or {}),
                                  event_kind)
        with self._write() as db:
            event = _write_unit_status(db.conn, run_id, branch_id, unit, change, attempt_id, ts)
            insert_events(db.conn, run_id, branch_id, ts, [event])

    def clear_unit_status(self, run_id: str, branch_id: str, unit: str) -> None:
        with self._write() as db:
            db.conn.execute(
                "DELETE FROM unit_status WHERE run_id = ? AND branch_id = ? AND unit = ?",
                [run_id, branch_id, unit],
            )

    def unit_statuses(self, run_id: str, branch_id: str = "main") -> dict[str, UnitStatus]:
        return statuses_of(self._q(STATUSES_SQL, [run_id, branch_id]))

    def run_overlay(self, run_id: str, branch_id: str = "main") -> RunOverlay:
        params = [run_id, branch_id]
        head, leases, statuses, budget = self._q_many([
            (HEAD_SQL, params), (BRANCH_LEASES_SQL, params), (STATUSES_SQL, params),
            (BUDGET_SQL, params)])
        return RunOverlay(head=head_of(head[0] if head else None, run_id, branch_id),
                          leases=[Lease(**r) for r in leases], statuses=statuses_of(statuses),
                          budget=budget_of(budget[0] if budget else None))


# A branch's leases and runtime statuses (also read together by Store.run_overlay).
BRANCH_LEASES_SQL = "SELECT * FROM leases WHERE run_id = ? AND branch_id = ? ORDER BY unit"
STATUSES_SQL = ("SELECT unit, status, reason, details, updated_at FROM unit_status "
                "WHERE run_id = ? AND branch_id = ?")


def statuses_of(rows: Iterable[Mapping[str, Any]]) -> dict[str, UnitStatus]:
    """unit -> UnitStatus of STATUSES_SQL rows."""
    return {
        r["unit"]: UnitStatus(unit=r["unit"], status=r["status"], reason=r["reason"],
                              details=json.loads(r["details"]), updated_at=r["updated_at"])
        for r in rows
    }


def _write_unit_status(conn: Any, run_id: str, branch_id: str, unit: str,
                       change: UnitStatusChange, attempt_id: str | None, ts: str) -> EventIn:
    """Upsert a unit's runtime status; returns its event (for the caller to append)."""
    status = UnitStatusKind(change.status).value
    details = dict(change.details)
    conn.execute(
        "INSERT INTO unit_status (run_id, branch_id, unit, status, reason, details, "
        "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, branch_id, unit) "
        "DO UPDATE SET status = excluded.status, reason = excluded.reason, "
        "details = excluded.details, updated_at = excluded.updated_at",
        [run_id, branch_id, unit, status, change.reason, canonical_json(details), ts],
    )
    return EventIn(kind=change.event_kind or f"unit.{status}", unit=unit,
                   attempt_id=attempt_id, payload={"reason": change.reason, **details})
