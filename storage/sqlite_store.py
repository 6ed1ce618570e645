"""The SQLite implementation of the Store: every SQL statement of keepstep lives here.

Writers take ``BEGIN IMMEDIATE`` so that the compare-and-swap on a branch head
and the fencing-token check see the state they change. Each thread gets its own
connection (sqlite3 connections are not shared across threads).
"""

from __future__ import annotations

import datetime as _dt
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.db import connect, open_database, sqlite_errors, storage_error
from keepstep.storage.errors import (
    CheckpointConflict,
    CommitOutcomeUnknown,
    CorruptDatabase,
    NotFound,
    StaleFencingToken,
    StorageError,
)
from keepstep.storage.faults import crash_point
from keepstep.storage.hashing import (
    EMPTY_STATE_HASH,
    canonical_json,
    sha256_hex,
    state_hash_of,
    state_hash_update,
)
from keepstep.storage.models import (
    ArtifactEntry,
    Attempt,
    Budget,
    ChainProblem,
    ChainReport,
    Checkpoint,
    Claim,
    Event,
    EventIn,
    Head,
    Lease,
    ModelCall,
    OrphanAttempt,
    UnitStatus,
)
from keepstep.storage.schema import SCHEMA_VERSION
from keepstep.storage.sqlite_ledgers import ApprovalsAndEffectsMixin


class LeaseHeld(StorageError):
    """Another executor holds a live lease on the unit."""

    hint = "wait for the lease to expire (or for that executor to finish), then resume"


class BudgetLimitReached(StorageError):
    """A conditional budget increment would pass a limit; nothing was recorded."""

    def __init__(self, message: str, figures: dict[str, dict[str, float]]):
        super().__init__(message)
        self.figures = figures


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="microseconds")


_HASHED_FIELDS = (
    "run_id", "branch_id", "version", "parent_branch", "parent_version", "parent_hash",
    "kind", "schema_version", "unit", "attempt", "fencing_token", "state_hash", "created_at",
)


def _checkpoint_hash(row: Mapping[str, Any]) -> str:
    fields = {k: row[k] for k in _HASHED_FIELDS}
    delta = row["delta"]
    fields["delta"] = json.loads(delta) if isinstance(delta, str) else delta
    return sha256_hex(canonical_json(fields))


def _object_json(values: Mapping[str, str | None]) -> str:
    """canonical_json of a dict whose values are already canonical JSON (None -> null).

    Byte-identical to ``canonical_json({k: json.loads(v)})``: sorted keys, no
    spaces — so a commit encodes each delta value once, not three times.
    """
    return "{" + ",".join(
        f"{json.dumps(k, ensure_ascii=False)}:{'null' if values[k] is None else values[k]}"
        for k in sorted(values)
    ) + "}"


def _checkpoint_hash_encoded(row: Mapping[str, Any], delta_json: str) -> str:
    """_checkpoint_hash of ``row`` whose delta is given as its canonical JSON.

    "delta" sorts just before "fencing_token" among the hashed fields, so the delta is
    spliced in before that key. The key's text cannot occur earlier: inside a JSON
    string every quote is escaped.
    """
    head = canonical_json({k: row[k] for k in _HASHED_FIELDS})
    at = head.index(',"fencing_token":')
    return sha256_hex(f'{head[:at]},"delta":{delta_json}{head[at:]}')


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite already rolled back (e.g. after an I/O error)
            pass


def _checkpoint(row: Mapping[str, Any]) -> Checkpoint:
    data = dict(row)
    data["delta"] = json.loads(data["delta"])
    return Checkpoint(**data)


class SQLiteStore(ApprovalsAndEffectsMixin):
    """keepstep's embedded store. Safe to share across threads (one connection each)."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "FULL",
        durable_files: bool = True,
    ) -> None:
        self.root = Path(root)
        self.db_path = self.root / "state.db"
        self.clock = clock
        self._synchronous = synchronous
        self.artifacts = ArtifactStore(self.root / "artifacts", durable=durable_files)
        self._local = threading.local()
        self._all: list[Database] = []
        self._lock = threading.Lock()
        db, self.migrated_from_backup = open_database(self.db_path, synchronous=synchronous)
        self._register(db)

    # -- connections ---------------------------------------------------------
    def _register(self, db: Database) -> None:
        self._local.db = db
        with self._lock:
            self._all.append(db)

    @property
    def db(self) -> Database:
        db = getattr(self._local, "db", None)
        if db is None:
            db = connect(self.db_path, synchronous=self._synchronous)
            self._register(db)
        return db

    def close(self) -> None:
        with self._lock:
            for db in self._all:
                try:
                    db.close()
                except Exception:  # closing a connection owned by a finished thread
                    pass
            self._all.clear()
        self._local = threading.local()

    @contextmanager
    def _write(self) -> Iterator[Database]:
        """One ``BEGIN IMMEDIATE`` transaction; sqlite3 errors leave as StorageErrors.

        Busy past the timeout -> StorageBusy (nothing written); a failing COMMIT
        -> CommitOutcomeUnknown (the caller reads the head); a damaged file ->
        CorruptDatabase, wherever it shows.
        """
        db = self.db
        conn = db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise storage_error(exc, "starting a write transaction") from exc
        try:
            yield db
        except sqlite3.Error as exc:
            _rollback(conn)
            raise storage_error(exc, "writing to the database") from exc
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            err = storage_error(exc, "COMMIT")
            if not isinstance(err, CorruptDatabase):
                err = CommitOutcomeUnknown(
                    f"COMMIT failed ({type(exc).__name__}: {exc}); the transaction may or may "
                    "not be durable")
            raise err from exc
        except BaseException:
            _rollback(conn)
            raise

    def _q(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        try:
            cur = self.db.conn.execute(sql, list(params))
            cols = [c[0] for c in cur.description] if cur.description else []
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        except sqlite3.Error as exc:
            raise storage_error(exc, "reading the database") from exc

    def _q1(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._q(sql, params)
        return rows[0] if rows else None

    def now(self) -> float:
        return self.clock()

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
        """Create a run with its genesis checkpoint (version 0) holding ``initial_state``."""
        ts = _iso(self.now())
        state = {k: canonical_json(v) for k, v in initial_state.items()}
        with self._write() as db:
            if self._q1("SELECT 1 FROM runs WHERE run_id = ?", [run_id]):
                raise StorageError(
                    f"run {run_id} already exists",
                    hint="choose a new run id, or resume the existing run",
                )
            db.conn.execute(
                "INSERT INTO runs (run_id, created_at, meta) VALUES (?, ?, ?)",
                [run_id, ts, canonical_json(dict(meta or {}))],
            )
            row = {
                "run_id": run_id, "branch_id": branch_id, "version": 0, "parent_branch": None,
                "parent_version": None, "parent_hash": "", "kind": "genesis",
                "schema_version": SCHEMA_VERSION, "unit": None, "attempt": None,
                "fencing_token": None, "delta": dict(initial_state),
                "state_hash": state_hash_of(state), "created_at": ts,
            }
            row["hash"] = _checkpoint_hash(row)
            db.conn.execute(
                "INSERT INTO branches (run_id, branch_id, head_version, head_hash, created_at) "
                "VALUES (?, ?, 0, ?, ?)",
                [run_id, branch_id, row["hash"], ts],
            )
            self._insert_checkpoint(db, row)
            db.conn.executemany(
                "INSERT INTO current_state (run_id, branch_id, key, value) VALUES (?, ?, ?, ?)",
                [(run_id, branch_id, k, v) for k, v in state.items()],
            )
            db.conn.execute(
                "INSERT INTO state_meta (run_id, branch_id, state_hash) VALUES (?, ?, ?)",
                [run_id, branch_id, row["state_hash"]],
            )
            db.conn.execute(
                "INSERT INTO budgets (run_id, branch_id, limits, used) VALUES (?, ?, ?, '{}')",
                [run_id, branch_id, canonical_json(dict(limits or {}))],
            )
            self._append_events(db, run_id, branch_id, ts, [EventIn(kind="run.created"), *events])
        return Head(run_id=run_id, branch_id=branch_id, version=0, hash=row["hash"])

    def runs(self) -> list[str]:
        return [r["run_id"] for r in self._q("SELECT run_id FROM runs ORDER BY created_at, run_id")]

    def run_exists(self, run_id: str) -> bool:
        return self._q1("SELECT 1 FROM runs WHERE run_id = ?", [run_id]) is not None

    def run_meta(self, run_id: str) -> dict[str, Any]:
        row = self._q1("SELECT meta FROM runs WHERE run_id = ?", [run_id])
        if row is None:
            raise NotFound(f"no run {run_id}", hint="list runs with `keepstep status DIR`")
        return json.loads(row["meta"])

    def branches(self, run_id: str) -> list[dict[str, Any]]:
        return self._q(
            "SELECT branch_id, head_version, head_hash, forked_from, forked_at, created_at "
            "FROM branches WHERE run_id = ? ORDER BY created_at", [run_id]
        )

    def get_head(self, run_id: str, branch_id: str = "main") -> Head:
        row = self._q1(
            "SELECT head_version, head_hash FROM branches WHERE run_id = ? AND branch_id = ?",
            [run_id, branch_id],
        )
        if row is None:
            raise NotFound(
                f"no branch {branch_id!r} in run {run_id!r}",
                hint="list runs with `keepstep status DIR`; start one with `keepstep run`",
            )
        return Head(run_id=run_id, branch_id=branch_id, version=row["head_version"],
                    hash=row["head_hash"])

    # -- state ---------------------------------------------------------------
    def read_state(self, run_id: str, branch_id: str = "main", prefix: str = "") -> dict[str, Any]:
        rows = self._q(
            "SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ? "
            "AND key >= ? AND key < ? ORDER BY key",
            [run_id, branch_id, prefix, prefix + "\uffff"],
        )
        return {r["key"]: json.loads(r["value"]) for r in rows}

    def read_key(self, run_id: str, key: str, branch_id: str = "main") -> Any | None:
        row = self._q1(
            "SELECT value FROM current_state WHERE run_id = ? AND branch_id = ? AND key = ?",
            [run_id, branch_id, key],
        )
        return None if row is None else json.loads(row["value"])

    def _apply_delta(
        self, conn: sqlite3.Connection, run_id: str, branch_id: str,
        values: Mapping[str, str | None], current: str,
    ) -> str:
        """Write an encoded delta (key -> canonical JSON, None deletes) into the materialised
        state and return the new state hash. The old values are read in one query."""
        keys = sorted(values)
        old: dict[str, str] = {}
        for i in range(0, len(keys), 500):  # stay far below SQLite's bound-variable limit
            chunk = keys[i:i + 500]
            old.update(conn.execute(
                "SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ? "
                f"AND key IN ({', '.join('?' * len(chunk))})", [run_id, branch_id, *chunk],
            ).fetchall())
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

    # -- checkpoints -----------------------------------------------------------
    def _insert_checkpoint(self, db: Database, row: Mapping[str, Any]) -> None:
        data = dict(row)
        data["delta"] = canonical_json(data["delta"])
        cols = ", ".join(data)
        db.conn.execute(
            f"INSERT INTO checkpoints ({cols}) VALUES ({', '.join('?' * len(data))})",
            list(data.values()),
        )

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
    ) -> int:
        """Atomically append checkpoint ``expected_version + 1``.

        Succeeds only if the branch head is still ``expected_version`` (else
        CheckpointConflict) and, when a fencing token is given, the unit's lease
        still carries it (else StaleFencingToken). In the same transaction:
        the materialised state, the manifest rows, the attempt's status, the
        lease release and the events. Nothing is written on failure.
        """
        manifest = list(manifest)
        ts = _iso(self.now())
        # Each delta value is encoded once: the same strings feed the materialised state,
        # the state hash, the stored delta and the checkpoint hash.
        if all(isinstance(k, str) for k in delta):
            values = {k: None if v is None else canonical_json(v) for k, v in delta.items()}
            delta_json = _object_json(values)
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
                raise NotFound(f"no branch {branch_id!r} in run {run_id!r}",
                               hint="list runs with `keepstep status DIR`")
            head_version, head_hash, current_hash, lease_token = found
            if head_version != expected_version:
                raise CheckpointConflict(
                    f"{run_id}/{branch_id}: head is {head_version}, expected {expected_version}"
                )
            if fencing_token is not None:
                if unit is None:
                    raise StorageError("a fenced commit must name its unit")
                if lease_token != fencing_token:
                    raise StaleFencingToken(
                        f"{run_id}/{unit}: token {fencing_token} is no longer current "
                        f"(lease {'gone' if lease_token is None else 'token ' + str(lease_token)})"
                    )
            version = expected_version + 1
            state_hash = self._apply_delta(conn, run_id, branch_id, values,
                                           current_hash or EMPTY_STATE_HASH)
            crash_point("commit.inside_txn")
            row = {
                "run_id": run_id, "branch_id": branch_id, "version": version,
                "parent_branch": branch_id, "parent_version": expected_version,
                "parent_hash": head_hash, "kind": kind, "schema_version": SCHEMA_VERSION,
                "unit": unit, "attempt": attempt_id, "fencing_token": fencing_token,
                "state_hash": state_hash, "created_at": ts,
            }
            row["hash"] = _checkpoint_hash_encoded(row, delta_json)
            row["delta"] = delta_json
            conn.execute(
                f"INSERT INTO checkpoints ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                list(row.values()),
            )
            conn.execute(
                "UPDATE branches SET head_version = ?, head_hash = ? "
                "WHERE run_id = ? AND branch_id = ?",
                [version, row["hash"], run_id, branch_id],
            )
            if kind != "genesis":
                conn.execute(
                    "INSERT INTO checkpoint_counts (run_id, branch_id, kind, n) "
                    "VALUES (?, ?, ?, 1) ON CONFLICT (run_id, branch_id, kind) "
                    "DO UPDATE SET n = n + 1", [run_id, branch_id, kind],
                )
            if manifest:
                conn.executemany(
                    "INSERT INTO artifacts (run_id, branch_id, unit, attempt_id, name, path, "
                    "media_type, size, sha256, schema_version, source_ids, validators, "
                    "producer_version, created_at, checkpoint_version) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(run_id, branch_id, e.unit, e.attempt_id, e.name, e.path, e.media_type,
                      e.size, e.sha256, e.schema_version, canonical_json(e.source_ids),
                      canonical_json(e.validators), e.producer_version, e.created_at, version)
                     for e in manifest],
                )
            if attempt_id is not None:
                conn.execute(
                    "UPDATE attempts SET status = 'committed', ended_at = ? "
                    "WHERE run_id = ? AND attempt_id = ?", [ts, run_id, attempt_id],
                )
            if fencing_token is not None:
                conn.execute(
                    "DELETE FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                    "AND fencing_token = ?", [run_id, branch_id, unit, fencing_token],
                )
            cleared = [(run_id, branch_id, u) for u in clear_unit_status]
            if cleared:
                conn.executemany(
                    "DELETE FROM unit_status WHERE run_id = ? AND branch_id = ? AND unit = ?",
                    cleared,
                )
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

    def _lineage(self, run_id: str, branch_id: str) -> list[tuple[str, int | None]]:
        """[(branch, max version owned)] from this branch back to the root branch."""
        out: list[tuple[str, int | None]] = []
        b, upto = branch_id, None
        while b is not None:
            row = self._q1(
                "SELECT forked_from, forked_at FROM branches WHERE run_id = ? AND branch_id = ?",
                [run_id, b],
            )
            if row is None:
                raise NotFound(f"no branch {b!r} in run {run_id!r}")
            out.append((b, upto))
            b, upto = row["forked_from"], row["forked_at"]
        return out

    def get_checkpoint(self, run_id: str, version: int, branch_id: str = "main") -> Checkpoint:
        for b, upto in self._lineage(run_id, branch_id):
            if upto is not None and version > upto:
                continue
            row = self._q1(
                "SELECT * FROM checkpoints WHERE run_id = ? AND branch_id = ? AND version = ?",
                [run_id, b, version],
            )
            if row is not None:
                return _checkpoint(row)
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
        """Checkpoints of a branch's lineage in version order (ancestors included);
        with ``limit``, only the newest ``limit`` of them (still oldest first)."""
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
        return [_checkpoint(r) for r in rows]

    def count_checkpoints(self, run_id: str, branch_id: str = "main") -> dict[str, int]:
        """Commits by kind along the branch lineage (genesis excluded).

        Read from counters the commits keep (a fork starts from its ancestors' counts at
        the fork point), so the cost does not grow with the history.
        """
        rows = self._q(
            "SELECT kind, n FROM checkpoint_counts WHERE run_id = ? AND branch_id = ? "
            "AND n > 0 ORDER BY kind", [run_id, branch_id],
        )
        if not rows:
            self.get_head(run_id, branch_id)  # NotFound for a branch that does not exist
        return {r["kind"]: r["n"] for r in rows}

    def _materialised_hash(self, run_id: str, branch_id: str) -> str:
        rows = self._q(
            "SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ?",
            [run_id, branch_id],
        )
        return state_hash_of({r["key"]: r["value"] for r in rows})

    def verify_head(self, run_id: str, branch_id: str = "main") -> ChainReport:
        """The quick resume check: head row hash, its parent link, and the materialised state."""
        problems: list[ChainProblem] = []
        head = self.get_head(run_id, branch_id)

        def bad(v: int, what: str) -> None:
            problems.append(ChainProblem(version=v, branch_id=branch_id, problem=what))

        try:
            cp = self.get_checkpoint(run_id, head.version, branch_id)
        except NotFound:
            bad(head.version, "head checkpoint row is missing")
            return ChainReport(ok=False, checked=0, problems=problems)
        if _checkpoint_hash(cp.model_dump()) != cp.hash:
            bad(cp.version, "checkpoint row does not match its hash (edited)")
        if cp.hash != head.hash:
            bad(cp.version, "branch head hash does not match the head checkpoint")
        if cp.parent_version is not None:
            try:
                parent = self.get_checkpoint(run_id, cp.parent_version, branch_id)
                if parent.hash != cp.parent_hash:
                    bad(cp.version, f"parent hash does not match checkpoint {parent.version}")
            except NotFound:
                bad(cp.version, f"parent checkpoint {cp.parent_version} is missing")
        if self._materialised_hash(run_id, branch_id) != cp.state_hash:
            bad(cp.version, "materialised state does not match the head's state hash")
        return ChainReport(ok=not problems, checked=1, problems=problems)

    def verify_chain(self, run_id: str, branch_id: str = "main") -> ChainReport:
        """Every link from the head back to genesis, then a replay of all deltas.

        Reports each problem with the version where the chain breaks.
        """
        problems: list[ChainProblem] = []
        head = self.get_head(run_id, branch_id)
        rows = {c.version: c for c in self.list_checkpoints(run_id, branch_id)}

        def bad(v: int, what: str) -> None:
            problems.append(ChainProblem(version=v, branch_id=branch_id, problem=what))

        if head.version not in rows:
            bad(head.version, "head checkpoint row is missing")
        elif rows[head.version].hash != head.hash:
            bad(head.version, "branch head hash does not match the head checkpoint")
        for v in range(head.version, -1, -1):
            cp = rows.get(v)
            if cp is None:
                bad(v, f"checkpoint {v} is missing (the chain breaks here)")
                continue
            if _checkpoint_hash(cp.model_dump()) != cp.hash:
                bad(v, "checkpoint row does not match its hash (edited)")
            if v == 0:
                if cp.parent_version is not None or cp.kind != "genesis":
                    bad(v, "version 0 is not a genesis checkpoint")
                continue
            if cp.parent_version != v - 1:
                bad(v, f"parent version is {cp.parent_version}, expected {v - 1}")
            parent = rows.get(v - 1)
            if parent is not None and parent.hash != cp.parent_hash:
                bad(v, f"parent hash does not match checkpoint {v - 1}")
        # Replay: each stored state hash must follow from its parent's and its delta.
        state: dict[str, str] = {}
        current = EMPTY_STATE_HASH
        for v in range(0, head.version + 1):
            cp = rows.get(v)
            if cp is None:
                break
            removed, added = [], []
            for key in sorted(cp.delta):
                if key in state:
                    removed.append((key, state.pop(key)))
                if cp.delta[key] is not None:
                    state[key] = canonical_json(cp.delta[key])
                    added.append((key, state[key]))
            current = state_hash_update(current, removed, added)
            if current != cp.state_hash:
                bad(v, "state hash does not follow from the parent state and the delta")
                current = cp.state_hash
        else:
            if self._materialised_hash(run_id, branch_id) != current:
                bad(head.version, "materialised state differs from the replayed chain")
        problems.sort(key=lambda p: -p.version)
        return ChainReport(ok=not problems, checked=len(rows), problems=problems)

    def fork_branch(
        self, run_id: str, from_branch: str, at_version: int, new_branch: str
    ) -> Head:
        """A new branch whose head is checkpoint ``at_version`` of ``from_branch``."""
        cps = self.list_checkpoints(run_id, from_branch)
        cps = [c for c in cps if c.version <= at_version]
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
        ts = _iso(self.now())
        with self._write() as db:
            if self._q1("SELECT 1 FROM branches WHERE run_id = ? AND branch_id = ?",
                        [run_id, new_branch]):
                raise StorageError(f"branch {new_branch} already exists in {run_id}",
                                   hint="choose another branch id")
            db.conn.execute(
                "INSERT INTO branches (run_id, branch_id, head_version, head_hash, forked_from, "
                "forked_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, new_branch, at_version, cps[-1].hash, from_branch, at_version, ts],
            )
            db.conn.executemany(
                "INSERT INTO current_state (run_id, branch_id, key, value) VALUES (?, ?, ?, ?)",
                [(run_id, new_branch, k, v) for k, v in state.items()],
            )
            db.conn.execute(
                "INSERT INTO state_meta (run_id, branch_id, state_hash) VALUES (?, ?, ?)",
                [run_id, new_branch, state_hash_of(state)],
            )
            db.conn.execute(
                "INSERT INTO budgets (run_id, branch_id, limits, used) "
                "SELECT run_id, ?, limits, used FROM budgets WHERE run_id = ? AND branch_id = ?",
                [new_branch, run_id, from_branch],
            )
            db.conn.executemany(
                "INSERT INTO checkpoint_counts (run_id, branch_id, kind, n) VALUES (?, ?, ?, ?)",
                [(run_id, new_branch, k, n) for k, n in sorted(inherited.items())],
            )
            self._append_events(db, run_id, new_branch, ts, [EventIn(
                kind="branch.created",
                payload={"from": from_branch, "at_version": at_version},
            )])
        return Head(run_id=run_id, branch_id=new_branch, version=at_version, hash=cps[-1].hash)

    # -- claims, leases, attempts ----------------------------------------------
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
        ts = _iso(now)
        crash_point("claim.before")
        with self._write() as db:
            conn = db.conn
            # Head, the unit's lease (if any) and its next attempt number in one read.
            found = conn.execute(
                "SELECT b.head_version, "
                "COALESCE((SELECT c.n FROM attempt_counters c "
                " WHERE c.run_id = b.run_id AND c.unit = ?), 0) + 1, "
                "l.attempt_id, l.owner, l.fencing_token, l.expires_at, l.renewed_at, "
                "l.progress, l.progress_at FROM branches b "
                "LEFT JOIN leases l ON l.run_id = b.run_id AND l.branch_id = b.branch_id "
                "AND l.unit = ? WHERE b.run_id = ? AND b.branch_id = ?",
                [unit, unit, run_id, branch_id],
            ).fetchone()
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
                    raise LeaseHeld(f"{unit} is leased by {lease_owner} until {_iso(expires_at)}")
                self._fence(db, run_id, branch_id, Lease(
                    run_id=run_id, branch_id=branch_id, unit=unit, attempt_id=lease_attempt,
                    owner=lease_owner, fencing_token=lease_token, expires_at=expires_at,
                    renewed_at=renewed_at, progress=progress, progress_at=progress_at), ts)
            token = conn.execute(
                "UPDATE fencing SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token"
            ).fetchone()[0]
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
                     "expires_at": _iso(expires)})],
            )
        crash_point("claim.after")
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
            "WHERE run_id = ? AND attempt_id = ? AND status IN ('claimed', 'staged')",
            [ts, f"lease expired (owner {lease.owner})", run_id, lease.attempt_id],
        )
        self._append_events(db, run_id, branch_id, ts, [EventIn(
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
        with self._write() as db:
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
        sql, params = "SELECT * FROM leases WHERE run_id = ?", [run_id]
        if branch_id is not None:
            sql += " AND branch_id = ?"
            params.append(branch_id)
        return [Lease(**r) for r in self._q(sql + " ORDER BY unit", params)]

    def fence_expired_leases(self, run_id: str, branch_id: str = "main") -> list[Lease]:
        """Take away every expired lease (their attempts become ``fenced``)."""
        now = self.now()
        ts = _iso(now)
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
        ts = _iso(self.now())
        with self._write() as db:
            row = self._q1(
                "SELECT * FROM leases WHERE run_id = ? AND branch_id = ? AND unit = ? "
                "AND fencing_token = ?", [run_id, branch_id, unit, fencing_token],
            )
            if row is None:
                return False
            self._fence(db, run_id, branch_id, Lease(**row), ts)
            self._append_events(db, run_id, branch_id, ts, [EventIn(
                kind="lease.owner_dead", unit=unit, attempt_id=row["attempt_id"],
                payload={"owner": row["owner"], "reason": reason})])
            return True

    def current_token(self) -> int:
        return self._q1("SELECT last_token FROM fencing WHERE id = 1")["last_token"]

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
        ts = _iso(self.now())
        sql = ("UPDATE attempts SET status = ?, error_class = COALESCE(?, error_class), "
               "message = COALESCE(?, message), ended_at = CASE WHEN ? IN ('claimed', 'staged') "
               "THEN ended_at ELSE ? END WHERE run_id = ? AND attempt_id = ?")
        params: list[Any] = [status, error_class, message, status, ts, run_id, attempt_id]
        if only_if is not None:
            only = list(only_if)
            sql += f" AND status IN ({', '.join('?' * len(only))})"
            params.extend(only)
        with self._write() as db:
            return db.conn.execute(sql, params).rowcount > 0

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
        ts = _iso(self.now())
        with self._write() as db:
            db.conn.execute(
                "INSERT INTO unit_status (run_id, branch_id, unit, status, reason, details, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, branch_id, unit) "
                "DO UPDATE SET status = excluded.status, reason = excluded.reason, "
                "details = excluded.details, updated_at = excluded.updated_at",
                [run_id, branch_id, unit, status, reason, canonical_json(dict(details or {})), ts],
            )
            self._append_events(db, run_id, branch_id, ts, [EventIn(
                kind=event_kind or f"unit.{status}", unit=unit, attempt_id=attempt_id,
                payload={"reason": reason, **dict(details or {})},
            )])

    def clear_unit_status(self, run_id: str, branch_id: str, unit: str) -> None:
        with self._write() as db:
            db.conn.execute(
                "DELETE FROM unit_status WHERE run_id = ? AND branch_id = ? AND unit = ?",
                [run_id, branch_id, unit],
            )

    def unit_statuses(self, run_id: str, branch_id: str = "main") -> dict[str, UnitStatus]:
        rows = self._q(
            "SELECT unit, status, reason, details, updated_at FROM unit_status "
            "WHERE run_id = ? AND branch_id = ?", [run_id, branch_id],
        )
        return {
            r["unit"]: UnitStatus(unit=r["unit"], status=r["status"], reason=r["reason"],
                                  details=json.loads(r["details"]), updated_at=r["updated_at"])
            for r in rows
        }

    # -- events --------------------------------------------------------------
    def _append_events(
        self, db: Database, run_id: str, branch_id: str, ts: str, events: Iterable[EventIn]
    ) -> None:
        db.conn.executemany(
            "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, branch_id, ts, e.kind, e.unit, e.attempt_id, canonical_json(e.payload))
             for e in events],
        )

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
        ts = _iso(self.now())
        with self._write() as db:
            cur = db.conn.execute(
                "INSERT INTO events (run_id, branch_id, ts, kind, unit, attempt_id, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [run_id, branch_id, ts, kind, unit, attempt_id,
                 canonical_json(dict(payload or {}))],
            )
            return cur.lastrowid

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
        """Events of a run in seq order (newest first on request), filtered.

        A filter by kind reads the events_kind index, so its cost follows the matching
        events, not the history.
        """
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
        """Retention: keep events' metadata, drop their payloads."""
        with self._write() as db:
            return db.conn.execute(
                "UPDATE events SET payload = '{}' WHERE run_id = ? AND ts < ? AND payload != '{}'",
                [run_id, before_ts],
            ).rowcount

    # -- manifest and orphans --------------------------------------------------
    def manifest(
        self,
        run_id: str,
        *,
        unit: str | None = None,
        attempt_id: str | None = None,
    ) -> list[ArtifactEntry]:
        sql, params = "SELECT * FROM artifacts WHERE run_id = ?", [run_id]
        if unit is not None:
            sql += " AND unit = ?"
            params.append(unit)
        if attempt_id is not None:
            sql += " AND attempt_id = ?"
            params.append(attempt_id)
        rows = self._q(sql + " ORDER BY unit, attempt_id, name", params)
        return [
            ArtifactEntry(**{**r, "source_ids": json.loads(r["source_ids"]),
                             "validators": json.loads(r["validators"])})
            for r in rows
        ]

    def orphaned_attempts(self, run_id: str, *, full: bool = False) -> list[OrphanAttempt]:
        """Attempt directories holding files that no committed manifest references, in
        (unit, attempt folder) order.

        An attempt that still holds a live lease is in flight, not an orphan.

        By default only attempts that never committed are looked at on disk (read from the
        attempts table: the cost follows the uncommitted attempts, not the history; a commit
        records a manifest row for every file its attempt staged). ``full=True`` walks every
        attempt folder instead, which also finds a folder with no attempt row at all (left
        by hand, or by a database restored from an older backup) — recovery's audit.
        """
        live = {
            r["attempt_id"]
            for r in self._q("SELECT attempt_id FROM leases WHERE run_id = ? AND expires_at > ?",
                             [run_id, self.now()])
        }
        out = []
        if full:
            referenced = {r["attempt_id"] for r in self._q(
                "SELECT DISTINCT attempt_id FROM artifacts WHERE run_id = ?", [run_id])}
            for unit, attempt_id, directory, files in self.artifacts.attempt_dirs(run_id):
                if attempt_id in referenced or attempt_id in live or not files:
                    continue
                out.append(OrphanAttempt(run_id=run_id, unit=unit, attempt_id=attempt_id,
                                         directory=str(directory), files=files))
            return out
        # "status < … OR status > …" rather than "!=": each side is a range on the
        # attempts_status index.
        candidates = self._q(
            "SELECT attempt_id FROM attempts a WHERE a.run_id = ? "
            "AND (a.status < 'committed' OR a.status > 'committed') "
            "AND NOT EXISTS (SELECT 1 FROM artifacts m "
            "WHERE m.run_id = a.run_id AND m.attempt_id = a.attempt_id)", [run_id],
        )
        found: list[tuple[tuple[str, str], OrphanAttempt]] = []
        for r in candidates:
            attempt_id = r["attempt_id"]
            listed = None if attempt_id in live else self.artifacts.attempt_files(
                run_id, attempt_id)
            if listed is None or not listed[1]:
                continue
            unit, _, attempt = attempt_id.partition("/")
            found.append(((unit, attempt), OrphanAttempt(
                run_id=run_id, unit=unit, attempt_id=attempt_id, directory=str(listed[0]),
                files=listed[1])))
        return [orphan for _, orphan in sorted(found, key=lambda f: f[0])]

    # -- budgets and the call ledger -----------------------------------------
    def get_budget(self, run_id: str, branch_id: str = "main") -> Budget:
        row = self._q1("SELECT limits, used FROM budgets WHERE run_id = ? AND branch_id = ?",
                       [run_id, branch_id])
        if row is None:
            return Budget()
        return Budget(limits=json.loads(row["limits"]), used=json.loads(row["used"]))

    def _add_usage(
        self, db: Database, run_id: str, branch_id: str, delta: Mapping[str, float], enforce: bool
    ) -> Budget:
        budget = self.get_budget(run_id, branch_id)
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
        db.conn.execute(
            "UPDATE budgets SET used = ? WHERE run_id = ? AND branch_id = ?",
            [canonical_json(budget.used), run_id, branch_id],
        )
        return budget

    def add_usage(
        self,
        run_id: str,
        delta: Mapping[str, float],
        *,
        branch_id: str = "main",
        enforce: bool = False,
    ) -> Budget:
        """Add to the used counters (conditionally on the limits when ``enforce``)."""
        with self._write() as db:
            return self._add_usage(db, run_id, branch_id, delta, enforce)

    def set_budget_limits(
        self,
        run_id: str,
        limits: Mapping[str, float],
        *,
        branch_id: str = "main",
        event: EventIn | None = None,
    ) -> Budget:
        """Replace limits (merged over the old ones) and record why, in one transaction."""
        ts = _iso(self.now())
        with self._write() as db:
            budget = self.get_budget(run_id, branch_id)
            budget.limits.update(limits)
            db.conn.execute(
                "UPDATE budgets SET limits = ? WHERE run_id = ? AND branch_id = ?",
                [canonical_json(budget.limits), run_id, branch_id],
            )
            if event is not None:
                self._append_events(db, run_id, branch_id, ts, [event])
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
        """Record a call about to be made and reserve its budget, atomically.

        BudgetLimitReached means nothing was recorded and no call may be made.
        """
        call_id = uuid.uuid4().hex
        ts = _iso(self.now())
        with self._write() as db:
            self._add_usage(db, run_id, branch_id, budget_delta, enforce)
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
        ts = _iso(self.now())
        with self._write() as db:
            row = self._q1("SELECT run_id, branch_id FROM model_calls WHERE call_id = ?", [call_id])
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
                self._add_usage(db, row["run_id"], row["branch_id"], budget_delta, False)

    def calls(self, run_id: str, *, unit: str | None = None) -> list[ModelCall]:
        sql, params = "SELECT * FROM model_calls WHERE run_id = ?", [run_id]
        if unit is not None:
            sql += " AND unit = ?"
            params.append(unit)
        return [ModelCall(**r) for r in self._q(sql + " ORDER BY reserved_at, rowid", params)]

    # -- maintenance -------------------------------------------------------------
    def integrity_check(self) -> str:
        with sqlite_errors("checking the database's integrity"):
            return self.db.conn.execute("PRAGMA integrity_check").fetchone()[0]

    def backup_to(self, target: Path) -> None:
        """A consistent copy through SQLite's online backup API."""
        with sqlite_errors(f"backing up the database to {target}"):
            dst = sqlite3.connect(str(target))
            try:
                self.db.conn.backup(dst)
            finally:
                dst.close()
