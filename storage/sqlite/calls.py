"""Budgets and the model-call ledger (SQLite)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Mapping
from typing import Any

from keepstep.storage.errors import BudgetLimitReached, NotFound
from keepstep.storage.hashing import canonical_json
from keepstep.storage.models import Budget, EventIn, ModelCall
from keepstep.storage.sqlite.connection import SQLiteBase, iso
from keepstep.storage.sqlite.events import insert_events

# A branch's budget: named so the PostgreSQL store can send it ahead with a commit's read of
# the head, and read with the others of Store.run_overlay.
BUDGET_SQL = "SELECT limits, used FROM budgets WHERE run_id = ? AND branch_id = ?"


def budget_of(row: Mapping[str, Any] | None) -> Budget:
    """The Budget of a BUDGET_SQL row (an empty one for no row)."""
    if row is None:
        return Budget()
    return Budget(limits=json.loads(row["limits"]), used=json.loads(row["used"]))


def budget_in(conn: sqlite3.Connection, run_id: str, branch_id: str) -> Budget:
    """The budget, read inside the caller's transaction."""
    row = conn.execute(BUDGET_SQL, [run_id, branch_id]).fetchone()
    if row is None:
        return Budget()
    return Budget(limits=json.loads(row[0]), used=json.loads(row[1]))


def add_usage_in(conn: sqlite3.Connection, run_id: str, branch_id: str,
                 delta: Mapping[str, float], enforce: bool) -> Budget:
    """Add to the used counters inside the caller's transaction; with ``enforce``, raise
    BudgetLimitReached (nothing changed) when a positive increment would pass a limit."""
    budget = budget_in(conn, run_id, branch_id)
    if enforce:
        over = {
            k: {"used": budget.used.get(k, 0), "requested": d, "limit": budget.limits[k]}
            for k, d in delta.items()
            if d > 0 and k in budget.limits and budget.used.get(k, 0) + d > budget.limits[k]
        }
        if over:
            raise BudgetLimitReached(
                "budget limit reached: " + ", ".join(
                    f"{k} {f['used']:g}/{f['limit']:g}" for k, f in sorted(over.items())),
                over,
            )
    for k, d in delta.items():
        budget.used[k] = budget.used.get(k, 0) + d
    conn.execute("UPDATE budgets SET used = ? WHERE run_id = ? AND branch_id = ?",
                 [canonical_json(budget.used), run_id, branch_id])
    return budget


class Calls(SQLiteBase):
    """The calls-and-budget capability of SQLiteStore."""

    def get_budget(self, run_id: str, branch_id: str = "main") -> Budget:
        return budget_of(self._q1(BUDGET_SQL, [run_id, branch_id]))

    def add_usage(self, run_id: str, delta: Mapping[str, float], *, branch_id: str = "main",
                  enforce: bool = False) -> Budget:
        with self._write() as db:
            return add_usage_in(db.conn, run_id, branch_id, delta, enforce)

    def set_budget_limits(self, run_id: str, limits: Mapping[str, float], *,
                          branch_id: str = "main", event: EventIn | None = None) -> Budget:
        ts = iso(self.now())
        with self._write() as db:
            budget = budget_in(db.conn, run_id, branch_id)
            budget.limits.update(limits)
            db.conn.execute("UPDATE budgets SET limits = ? WHERE run_id = ? AND branch_id = ?",
                            [canonical_json(budget.limits), run_id, branch_id])
            if event is not None:
                insert_events(db.conn, run_id, branch_id, ts, [event])
        return budget

    def reserve_call(
        self,
        run_id: str,
        *,
        branch_id: str,
        unit: str,
        attempt_id: str,
        round: int,
        model: str,
        request_hash: str,
        budget_delta: Mapping[str, float],
        enforce: bool = True,
    ) -> str:
        call_id = uuid.uuid4().hex
        ts = iso(self.now())
        # Durable before the call is made: a reservation must survive whatever happens
        # during the call, so that a resume never gives the budget back.
        with self._write() as db:
            add_usage_in(db.conn, run_id, branch_id, budget_delta, enforce)
            db.conn.execute(
                "INSERT INTO model_calls (call_id, run_id, branch_id, unit, attempt_id, round, "
                "model, request_hash, status, reserved_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'reserved', ?)",
                [call_id, run_id, branch_id, unit, attempt_id, round, model, request_hash, ts],
            )
        return call_id

    def settle_call(
        self,
        call_id: str,
        *,
        tokens_in: int,
        tokens_out: int,
        cost: float,
        latency_ms: int,
        outcome: str,
        error_class: str | None = None,
        safe_message: str | None = None,
        response_artifact: str | None = None,
        budget_delta: Mapping[str, float] | None = None,
    ) -> None:
        ts = iso(self.now())
        # Not synced on its own (the unit's commit syncs it): a settlement lost to a power
        # cut leaves the call "reserved" with its estimate spent — exactly what a crash
        # during the call leaves, which the ledger already treats as spent.
        with self._write(durable=False) as db:
            row = db.conn.execute("SELECT run_id, branch_id FROM model_calls WHERE call_id = ?",
                                  [call_id]).fetchone()
            if row is None:
                raise NotFound(f"no reserved call {call_id}")
            db.conn.execute(
                "UPDATE model_calls SET status = 'settled', tokens_in = ?, tokens_out = ?, "
                "cost = ?, latency_ms = ?, outcome = ?, error_class = ?, safe_message = ?, "
                "response_artifact = ?, settled_at = ? WHERE call_id = ?",
                [tokens_in, tokens_out, cost, latency_ms, outcome, error_class, safe_message,
                 response_artifact, ts, call_id],
            )
            if budget_delta:
                add_usage_in(db.conn, row[0], row[1], budget_delta, False)

    def calls(self, run_id: str, *, unit: str | None = None) -> list[ModelCall]:
        sql, params = "SELECT * FROM model_calls WHERE run_id = ?", [run_id]
        if unit is not None:
            sql += " AND unit = ?"
            params.append(unit)
        return [ModelCall(**r) for r in self._q(sql + " ORDER BY reserved_at, rowid", params)]
