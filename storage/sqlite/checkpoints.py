"""Runs, branches, the materialised state and the checkpoint commit (SQLite)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from keepstep.storage.errors import CheckpointConflict, NotFound, StaleFencingToken, StorageError
from keepstep.storage.faults import crash_point
from keepstep.storage.hashing import (
    EMPTY_STATE_HASH,
    canonical_json,
    state_hash_of,
    state_hash_update,
)
from keepstep.storage.models import ArtifactEntry, Checkpoint, CommitRequest, EventIn, Head
from keepstep.storage.sqlite.calls import add_usage_in, budget_in
from keepstep.storage.sqlite.chain import (
    ChainChecks,
    checkpoint_hash,
    checkpoint_hash_encoded,
    checkpoint_of,
    object_json,
)
from keepstep.storage.sqlite.connection import iso
from keepstep.storage.sqlite.events import insert_events
from keepstep.storage.sqlite.manifests import current_at, insert_manifest, write_current
from keepstep.storage.sqlite.schema import SCHEMA_VERSION


def _insert_checkpoint(conn: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    data = dict(row)
    if not isinstance(data["delta"], str):
        data["delta"] = canonical_json(data["delta"])
    conn.execute(
        f"INSERT INTO checkpoints ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})",
        list(data.values()),
    )


# The read of a delta's old state values, in chunks far below SQLite's bound-variable limit;
# named so the PostgreSQL store can send it ahead with the commit's read of the head.
STATE_VALUES_SQL = ("SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ? "
                    "AND key IN ({})")
STATE_VALUES_CHUNK = 500


def _apply_delta(conn: sqlite3.Connection, run_id: str, branch_id: str,
                 values: Mapping[str, str | None], current: str) -> str:
    """Write an encoded delta (key -> canonical JSON, None deletes) into the materialised
    state and return the new state hash. The old values are read in one query."""
    keys = sorted(values)
    old: dict[str, str] = {}
    for i in range(0, len(keys), STATE_VALUES_CHUNK):
        chunk = keys[i:i + STATE_VALUES_CHUNK]
        old.update(conn.execute(STATE_VALUES_SQL.format(", ".join("?" * len(chunk))),
                                [run_id, branch_id, *chunk]).fetchall())
    removed = [(k, old[k]) for k in keys if k in old]
    added = [(k, v) for k in keys if (v := values[k]) is not None]
    gone = [(run_id, branch_id, k) for k in keys if values[k] is None and k in old]
    if gone:
        conn.executemany(
            "DELETE FROM current_state WHERE run_id = ? AND branch_id = ? AND key = ?", gone)
    if added:
        conn.executemany(
            "INSERT INTO current_state (run_id, branch_id, key, value) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run_id, branch_id, key) DO UPDATE SET value = excluded.value",
            [(run_id, branch_id, k, v) for k, v in added],
        )
    new_hash = state_hash_update(current, removed, added)
    conn.execute(
        "INSERT INTO state_meta (run_id, branch_id, state_hash) VALUES (?, ?, ?) "
        "ON CONFLICT (run_id, branch_id) DO UPDATE SET state_hash = excluded.state_hash",
        [run_id, branch_id, new_hash],
    )
    return new_hash


HEAD_SQL = "SELECT head_version, head_hash FROM branches WHERE run_id = ? AND branch_id = ?"


def head_of(row: Mapping[str, Any] | None, run_id: str, branch_id: str) -> Head:
    """The Head of a HEAD_SQL row (NotFound for no row)."""
    if row is None:
        raise _no_branch(run_id, branch_id)
    return Head(run_id=run_id, branch_id=branch_id, version=row["head_version"],
                hash=row["head_hash"])


def _no_branch(run_id: str, branch_id: str) -> NotFound:
    return NotFound(f"no branch {branch_id!r} in run {run_id!r}",
                    hint="list runs with `keepstep status DIR`; start one with `keepstep run`")


class Checkpoints(ChainChecks):
    """The checkpoint capability of SQLiteStore."""

    # -- runs and branches ---------------------------------------------------
    def create_run(
        self,
        run_id: str,
        initial_state: Mapping[str, Any],
        *,
        branch_id: str = "main",
        meta: Mapping[str, Any] | None = None,
        limits: Mapping[str, float] | None = None,
        events: Iterable[EventIn] = (),
    ) -> Head:
        ts = iso(self.now())
        state = {k: canonical_json(v) for k, v in initial_state.items()}
        with self._write() as db:
            conn = db.conn
            if self._q1("SELECT 1 FROM runs WHERE run_id = ?", [run_id]):
                raise StorageError(
                    f"run {run_id} already exists",
                    hint="choose a new run id, or resume the existing run",
                )
            conn.execute("INSERT INTO runs (run_id, created_at, meta) VALUES (?, ?, ?)",
                         [run_id, ts, canonical_json(dict(meta or {}))])
            row = {
                "run_id": run_id, "branch_id": branch_id, "version": 0, "parent_branch": None,
                "parent_version": None, "parent_hash": "", "kind": "genesis",
                "schema_version": SCHEMA_VERSION, "unit": None, "attempt": None,
                "fencing_token": None, "delta": dict(initial_state),
                "state_hash": state_hash_of(state), "created_at": ts,
            }
            row["hash"] = checkpoint_hash(row)
            conn.execute(
                "INSERT INTO branches (run_id, branch_id, head_version, head_hash, created_at) "
                "VALUES (?, ?, 0, ?, ?)", [run_id, branch_id, row["hash"], ts])
            _insert_checkpoint(conn, row)
            conn.executemany(
                "INSERT INTO current_state (run_id, branch_id, key, value) VALUES (?, ?, ?, ?)",
                [(run_id, branch_id, k, v) for k, v in state.items()])
            conn.execute("INSERT INTO state_meta (run_id, branch_id, state_hash) VALUES (?, ?, ?)",
                         [run_id, branch_id, row["state_hash"]])
            conn.execute(
                "INSERT INTO budgets (run_id, branch_id, limits, used) VALUES (?, ?, ?, '{}')",
                [run_id, branch_id, canonical_json(dict(limits or {}))])
            insert_events(conn, run_id, branch_id, ts, [EventIn(kind="run.created"), *events])
        return Head(run_id=run_id, branch_id=branch_id, version=0, hash=str(row["hash"]))

    def runs(self) -> list[str]:
        return [r["run_id"] for r in self._q("SELECT run_id FROM runs ORDER BY created_at, run_id")]

    def run_exists(self, run_id: str) -> bool:
        return self._q1("SELECT 1 FROM runs WHERE run_id = ?", [run_id]) is not None

    def run_meta(self, run_id: str) -> dict[str, Any]:
        row = self._q1("SELECT meta FROM runs WHERE run_id = ?", [run_id])
        if row is None:
            raise NotFound(f"no run {run_id}", hint="list runs with `keepstep status DIR`")
        meta: dict[str, Any] = json.loads(row["meta"])
        return meta

    def branches(self, run_id: str) -> list[dict[str, Any]]:
        return self._q(
            "SELECT branch_id, head_version, head_hash, forked_from, forked_at, created_at "
            "FROM branches WHERE run_id = ? ORDER BY created_at", [run_id])

    def get_head(self, run_id: str, branch_id: str = "main") -> Head:
        return head_of(self._q1(HEAD_SQL, [run_id, branch_id]), run_id, branch_id)

    # -- state ---------------------------------------------------------------
    def read_state(self, run_id: str, branch_id: str = "main", prefix: str = "") -> dict[str, Any]:
        rows = self._q(
            "SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ? "
            "AND key >= ? AND key < ? ORDER BY key",
            [run_id, branch_id, prefix, prefix + "\uffff"])
        return {r["key"]: json.loads(r["value"]) for r in rows}

    def read_key(self, run_id: str, key: str, branch_id: str = "main") -> Any | None:
        row = self._q1(
            "SELECT value FROM current_state WHERE run_id = ? AND branch_id = ? AND key = ?",
            [run_id, branch_id, key])
        return None if row is None else json.loads(row["value"])

    # -- the commit ------------------------------------------------------------
    def commit_checkpoint(
        self,
        run_id: str,
        branch_id: str,
        expected_version: int,
        delta: Mapping[str, Any],
        manifest: Iterable[ArtifactEntry] = (),
        fencing_token: int | None = None,
        *,
        kind: str = "unit-success",
        unit: str | None = None,
        attempt_id: str | None = None,
        events: Iterable[EventIn] = (),
        clear_unit_status: Iterable[str] = (),
        current: Mapping[str, str | None] | None = None,
        usage: Mapping[str, float] | None = None,
        budget_key: str | None = None,
    ) -> int:
        manifest = list(manifest)
        ts = iso(self.now())
        # Each delta value is encoded once: the same strings feed the materialised state,
        # the state hash, the stored delta and the checkpoint hash.
        if all(isinstance(k, str) for k in delta):
            values = {k: None if v is None else canonical_json(v) for k, v in delta.items()}
            delta_json = object_json(values)
        else:  # unusual keys: let json decide how they encode
            delta_json = canonical_json(dict(delta))
            values = {k: None if v is None else canonical_json(v)
                      for k, v in json.loads(delta_json).items()}
        crash_point("commit.before_begin")
        with self._write() as db:
            conn = db.conn
            # Head, state hash and the unit's lease token in one read.
            found = conn.execute(
                "SELECT b.head_version, b.head_hash, m.state_hash, l.fencing_token "
                "FROM branches b "
                "LEFT JOIN state_meta m ON m.run_id = b.run_id AND m.branch_id = b.branch_id "
                "LEFT JOIN leases l ON l.run_id = b.run_id AND l.branch_id = b.branch_id "
                "AND l.unit = ? WHERE b.run_id = ? AND b.branch_id = ?",
                [unit, run_id, branch_id],
            ).fetchone()
            if found is None:
                raise _no_branch(run_id, branch_id)
            head_version, head_hash, current_hash, lease_token = found
            if head_version != expected_version:
                raise CheckpointConflict(
                    f"{run_id}/{branch_id}: head is {head_version}, expected {expected_version}")
            if fencing_token is not None:
                if unit is None:
                    raise StorageError("a fenced commit must name its unit")
                if lease_token != fencing_token:
                    raise StaleFencingToken(
                        f"{run_id}/{unit}: token {fencing_token} is no longer current "
                        f"(lease {'gone' if lease_token is None else 'token ' + str(lease_token)})"
                    )
            version = expected_version + 1
            budget = add_usage_in(conn, run_id, branch_id, usage, enforce=False) \
                if usage else None
            if budget_key is not None:
                # The budget at this checkpoint, recorded in its delta (this transaction's
                # own read: no other writer can change it before the COMMIT).
                budget = budget or budget_in(conn, run_id, branch_id)
                values = {**values, budget_key: canonical_json(budget.used)}
                delta_json = object_json(values)
            state_hash = _apply_delta(conn, run_id, branch_id, values,
                                      current_hash or EMPTY_STATE_HASH)
            crash_point("commit.inside_txn")
            row = {
                "run_id": run_id, "branch_id": branch_id, "version": version,
                "parent_branch": branch_id, "parent_version": expected_version,
                "parent_hash": head_hash, "kind": kind, "schema_version": SCHEMA_VERSION,
                "unit": unit, "attempt": attempt_id, "fencing_token": fencing_token,
                "state_hash": state_hash, "created_at": ts,
            }
            row["hash"] = checkpoint_hash_encoded(row, delta_json)
            row["delta"] = delta_json
            _insert_checkpoint(conn, row)
            conn.execute("UPDATE branches SET head_version = ?, head_hash = ? "
                         "WHERE run_id = ? AND branch_id = ?",
                         [version, row["hash"], run_id, branch_id])
            if kind != "genesis":
                conn.execute(
                    "INSERT INTO checkpoint_counts (run_id, branch_id, kind, n) "
                    "VALUES (?, ?, ?, 1) ON CONFLICT (run_id, branch_id, kind) "
                    "DO UPDATE SET n = n + 1", [run_id, branch_id, kind])
            if manifest:
                insert_manifest(conn, run_id, branch_id, version, manifest)
            if current:
                write_current(conn, run_id, branch_id, version, current)
            if attempt_id is not None:
                conn.execute("UPDATE attempts SET status = 'committed', ended_at = ? "
                             "WHERE run_id = ? AND attempt_id = ?", [ts, run_id, attempt_id])
            if fencing_token is not None:
                conn.execute("DELETE FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                             "AND fencing_token = ?", [run_id, branch_id, unit, fencing_token])
            cleared = [(run_id, branch_id, u) for u in clear_unit_status]
            if cleared:
                conn.executemany(
                    "DELETE FROM unit_status WHERE run_id = ? AND branch_id = ? AND unit = ?",
                    cleared)
            conn.executemany(
                "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, branch_id, ts, "checkpoint.committed", unit, attempt_id,
                  f'{{"kind":{json.dumps(kind, ensure_ascii=False)},"version":{version}}}'),
                 *((run_id, branch_id, ts, e.kind, e.unit, e.attempt_id,
                    canonical_json(e.payload)) for e in events)],
            )
            crash_point("commit.before_commit")
        crash_point("commit.after_commit")
        return version

    def commit(self, request: CommitRequest) -> int:
        # Through commit_checkpoint, so one method holds the SQL (and a test that stands in
        # for commit_checkpoint stands in for every commit).
        return self.commit_checkpoint(
            request.run_id, request.branch_id, request.expected_version, request.delta,
            request.manifest, request.fencing_token, kind=request.kind, unit=request.unit,
            attempt_id=request.attempt_id, events=request.events,
            clear_unit_status=request.clear_unit_status, current=request.current or None,
            usage=request.usage or None, budget_key=request.budget_key)

    # -- reading checkpoints -------------------------------------------------------
    def _lineage(self, run_id: str, branch_id: str) -> list[tuple[str, int | None]]:
        """[(branch, max version owned)] from this branch back to the root branch."""
        out: list[tuple[str, int | None]] = []
        b: str | None = branch_id
        upto: int | None = None
        while b is not None:
            row = self._q1("SELECT forked_from, forked_at FROM branches WHERE run_id = ? "
                           "AND branch_id = ?", [run_id, b])
            if row is None:
                raise NotFound(f"no branch {b!r} in run {run_id!r}")
            out.append((b, upto))
            b, upto = row["forked_from"], row["forked_at"]
        return out

    def get_checkpoint(self, run_id: str, version: int, branch_id: str = "main") -> Checkpoint:
        for b, upto in self._lineage(run_id, branch_id):
            if upto is not None and version > upto:
                continue
            row = self._q1("SELECT * FROM checkpoints WHERE run_id = ? AND branch_id = ? "
                           "AND version = ?", [run_id, b, version])
            if row is not None:
                return checkpoint_of(row)
        raise NotFound(f"no checkpoint {version} in {run_id}/{branch_id}")

    def list_checkpoints(
        self,
        run_id: str,
        branch_id: str = "main",
        *,
        kinds: Iterable[str] | None = None,
        since_version: int = 0,
        limit: int | None = None,
    ) -> list[Checkpoint]:
        if kinds is not None:
            kinds = list(kinds)
        rows: list[dict[str, Any]] = []
        # The lineage runs from this branch back to the root, and each branch owns only
        # versions above its children's fork points: newest segments come first.
        for b, upto in self._lineage(run_id, branch_id):
            sql = "SELECT * FROM checkpoints WHERE run_id = ? AND branch_id = ? AND version >= ?"
            params: list[Any] = [run_id, b, since_version]
            if upto is not None:
                sql += " AND version <= ?"
                params.append(upto)
            if kinds is not None:
                sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
                params.extend(kinds)
            if limit is not None:
                sql += f" ORDER BY version DESC LIMIT {int(limit) - len(rows)}"
            rows.extend(self._q(sql, params))
            if limit is not None and len(rows) >= limit:
                break
        rows.sort(key=lambda r: r["version"])
        return [checkpoint_of(r) for r in rows]

    def count_checkpoints(self, run_id: str, branch_id: str = "main") -> dict[str, int]:
        # Counters kept by the commits (a fork starts from its ancestors' counts at the
        # fork point), so the cost does not grow with the history.
        rows = self._q("SELECT kind, n FROM checkpoint_counts WHERE run_id = ? "
                       "AND branch_id = ? AND n > 0 ORDER BY kind", [run_id, branch_id])
        if not rows:
            self.get_head(run_id, branch_id)  # NotFound for a branch that does not exist
        return {r["kind"]: r["n"] for r in rows}

    # -- branches --------------------------------------------------------------
    def fork_branch(self, run_id: str, from_branch: str, at_version: int,
                    new_branch: str) -> Head:
        cps = [c for c in self.list_checkpoints(run_id, from_branch) if c.version <= at_version]
        if not cps or cps[-1].version != at_version:
            raise NotFound(f"no checkpoint {at_version} in {run_id}/{from_branch}")
        state: dict[str, str] = {}
        inherited: dict[str, int] = {}
        for cp in cps:
            if cp.kind != "genesis":
                inherited[cp.kind] = inherited.get(cp.kind, 0) + 1
            for key, value in cp.delta.items():
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = canonical_json(value)
        pointers = current_at(self._q, self._lineage(run_id, from_branch), run_id, at_version)
        ts = iso(self.now())
        with self._write() as db:
            conn = db.conn
            if self._q1("SELECT 1 FROM branches WHERE run_id = ? AND branch_id = ?",
                        [run_id, new_branch]):
                raise StorageError(f"branch {new_branch} already exists in {run_id}",
                                   hint="choose another branch id")
            conn.execute(
                "INSERT INTO branches (run_id, branch_id, head_version, head_hash, forked_from, "
                "forked_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, new_branch, at_version, cps[-1].hash, from_branch, at_version, ts])
            conn.executemany(
                "INSERT INTO current_state (run_id, branch_id, key, value) VALUES (?, ?, ?, ?)",
                [(run_id, new_branch, k, v) for k, v in state.items()])
            conn.execute("INSERT INTO state_meta (run_id, branch_id, state_hash) VALUES (?, ?, ?)",
                         [run_id, new_branch, state_hash_of(state)])
            conn.execute(
                "INSERT INTO budgets (run_id, branch_id, limits, used) "
                "SELECT run_id, ?, limits, used FROM budgets WHERE run_id = ? AND branch_id = ?",
                [new_branch, run_id, from_branch])
            conn.executemany(
                "INSERT INTO checkpoint_counts (run_id, branch_id, kind, n) VALUES (?, ?, ?, ?)",
                [(run_id, new_branch, k, n) for k, n in sorted(inherited.items())])
            conn.executemany(
                "INSERT INTO current_attempts (run_id, branch_id, unit, attempt_id) "
                "VALUES (?, ?, ?, ?)",
                [(run_id, new_branch, u, a) for u, a in sorted(pointers.items())])
            insert_events(conn, run_id, new_branch, ts, [EventIn(
                kind="branch.created", payload={"from": from_branch, "at_version": at_version})])
        return Head(run_id=run_id, branch_id=new_branch, version=at_version, hash=cps[-1].hash)

