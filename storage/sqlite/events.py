"""The append-only event log (SQLite)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import Event, EventIn
from keepstep.storage.sqlite.connection import SQLiteBase, iso


def insert_events(conn: sqlite3.Connection, run_id: str, branch_id: str, ts: str,
                  events: Iterable[EventIn]) -> None:
    """Append events inside the caller's transaction."""
    conn.executemany(
        "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(run_id, branch_id, ts, e.kind, e.unit, e.attempt_id, canonical_json(e.payload))
         for e in events],
    )


class Events(SQLiteBase):
    """The event capability of SQLiteStore."""

    def append_event(
        self,
        run_id: str,
        kind: str,
        *,
        branch_id: str = "main",
        unit: str | None = None,
        attempt_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> int:
        ts = iso(self.now())
        with self._write() as db:
            cur = db.conn.execute(
                "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, branch_id, ts, kind, unit, attempt_id,
                 canonical_json(dict(payload or {}))],
            )
            seq = cur.lastrowid
        assert seq is not None
        return seq

    def events(
        self,
        run_id: str,
        *,
        branch_id: str | None = None,
        after_seq: int = 0,
        kinds: Iterable[str] | None = None,
        kind_prefix: str | None = None,
        unit: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[Event]:
        where = "run_id = ? AND seq > ?"
        params: list[Any] = [run_id, after_seq]
        if branch_id is not None:
            where += " AND branch_id = ?"
            params.append(branch_id)
        if kind_prefix is not None:
            where += " AND kind >= ? AND kind < ?"
            params.extend([kind_prefix, kind_prefix + "\uffff"])
        if unit is not None:
            where += " AND unit = ?"
            params.append(unit)
        order = " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        tail = order + ("" if limit is None else f" LIMIT {int(limit)}")
        # Without statistics SQLite prefers walking events_run in seq order (no sort) and
        # testing each event's kind, which reads the whole history when the kind is rare.
        # Pinning events_kind makes a kind filter cost what it matches.
        by_kind = "SELECT * FROM events INDEXED BY events_kind WHERE "
        if kinds is not None:
            kinds = list(dict.fromkeys(kinds))
            if not kinds:
                return []
            if limit is not None and len(kinds) > 1:
                # Several kinds with a limit: the newest (oldest) ``limit`` of each kind come
                # straight off the index; merged, the first ``limit`` are the answer.
                rows = [r for k in kinds
                        for r in self._q(by_kind + where + " AND kind = ?" + tail, [*params, k])]
                rows.sort(key=lambda r: r["seq"], reverse=newest_first)
                rows = rows[:max(0, int(limit))]
            else:
                rows = self._q(by_kind + where + f" AND kind IN ({', '.join('?' * len(kinds))})"
                               + tail, [*params, *kinds])
        elif kind_prefix is not None:
            rows = self._q(by_kind + where + tail, params)
        else:
            rows = self._q("SELECT * FROM events WHERE " + where + tail, params)
        return [Event(**{**r, "payload": json.loads(r["payload"])}) for r in rows]

    def strip_event_payloads(self, run_id: str, before_ts: str) -> int:
        with self._write() as db:
            return db.conn.execute(
                "UPDATE events SET payload = '{}' WHERE run_id = ? AND ts < ? AND payload != '{}'",
                [run_id, before_ts],
            ).rowcount
