"""The side-effect ledger (SQLite).

Each change is atomic, conditional where a race matters, and recorded as an event in
the same transaction. When an effect may be retried is engine knowledge.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from keepstep.storage.errors import NotFound, StaleFencingToken, StorageError
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import EFFECT_STATUSES, EffectRecord, EventIn
from keepstep.storage.sqlite.connection import SQLiteBase, iso
from keepstep.storage.sqlite.events import insert_events


def _effect(row: Mapping[str, Any]) -> EffectRecord:
    return EffectRecord(**{**row, "detail": json.loads(row["detail"])})


def _in(column: str, values: Iterable[str]) -> tuple[str, list[str]]:
    vals = list(values)
    return f" AND {column} IN ({', '.join('?' * len(vals))})", vals


class Effects(SQLiteBase):
    """The side-effect ledger capability of SQLiteStore."""

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
        ts = iso(self.now())
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
            insert_events(db.conn, run_id, branch_id, ts, events)
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
        ts = iso(self.now())
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
            insert_events(db.conn, row.run_id, row.branch_id, ts, events)
        return self.get_effect(idem_key)
