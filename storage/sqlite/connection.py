"""Connections to the project database: pragmas, read-only mode, write transactions
(``BEGIN IMMEDIATE``), and the translation of sqlite3 errors into storage errors."""

from __future__ import annotations

import datetime as _dt
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.errors import (
    CommitOutcomeUnknown,
    CorruptDatabase,
    StorageBusy,
    StorageError,
    StoragePermissionDenied,
    disk_full,
    disk_full_at_commit,
    permission_denied,
)
from keepstep.storage.sqlite.sqlite_lib import Database

BUSY_TIMEOUT_MS = 30_000
_CORRUPT_MARKERS = ("malformed", "not a database")
_BUSY_MARKERS = ("database is locked", "database is busy", "database table is locked")
_FULL_MARKERS = ("database or disk is full", "disk is full")
_PERMISSION_MARKERS = ("readonly database", "unable to open database file",
                       "attempt to write a readonly", "access permission denied")


def iso(ts: float) -> str:
    """The store's timestamp format (UTC, microseconds): string order is time order."""
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="microseconds")


def _permission_problem(path: Path, *, write: bool) -> str | None:
    """What this process may not do at ``path`` (or its folder), or None."""
    folder = path.parent
    if folder.exists() and not os.access(folder, os.R_OK | os.X_OK):
        return "read the folder of"
    if path.exists() and not os.access(path, os.R_OK):
        return "read"
    if write:
        if path.exists() and not os.access(path, os.W_OK):
            return "write to"
        if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
            return "write in the folder of"
    return None


def storage_error(exc: sqlite3.Error, what: str, path: Path | None = None, *,
                  write: bool = True) -> StorageError:
    """The storage-level error for a sqlite3 error (the engine never sees sqlite3).

    Corruption wins over everything else, so that a damaged file is never reported as
    a transient "busy"; a full disk and a permission problem are named as such.
    """
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and any(m in text for m in _CORRUPT_MARKERS):
        return CorruptDatabase(f"{what}: the database file is damaged ({text})")
    if isinstance(exc, sqlite3.OperationalError) and any(m in text for m in _BUSY_MARKERS):
        return StorageBusy(f"{what}: the database stayed locked for "
                           f"{BUSY_TIMEOUT_MS / 1000:g} s ({text})")
    if any(m in text for m in _FULL_MARKERS):
        return disk_full(path or Path("."), what)
    if path is not None and any(m in text for m in _PERMISSION_MARKERS):
        doing = _permission_problem(path, write=write)
        if doing is not None:
            return permission_denied(path, doing)
    return StorageError(f"{what}: {type(exc).__name__}: {text}")


@contextmanager
def sqlite_errors(what: str, path: Path | None = None) -> Iterator[None]:
    """Re-raise any sqlite3 error inside the block as the matching StorageError."""
    try:
        yield
    except sqlite3.Error as exc:
        raise storage_error(exc, what, path) from exc


def _set_wal(conn: sqlite3.Connection) -> None:
    # Switching a fresh file to WAL takes an exclusive lock that SQLite does not wait for
    # (busy_timeout is skipped to avoid deadlock), so processes creating one project at once
    # can get "database is locked" here. Retry within the busy timeout instead.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def unreadable(path: Path, exc: sqlite3.Error, *, write: bool) -> StorageError:
    err = storage_error(exc, f"opening {path}", path, write=write)
    if isinstance(err, StorageBusy | StoragePermissionDenied):
        return err
    return CorruptDatabase(f"{path} is not a readable keepstep database: {exc}")


def read_only_uri(path: Path) -> str:
    """The URI that opens ``path`` for reading only, also from a folder nobody can write.

    ``mode=ro`` reads the write-ahead log when its -wal and -shm files exist (SQLite ≥
    3.22 needs no write access then). Only when the folder cannot be written *and* there
    is no log to read is ``immutable=1`` added — it makes SQLite ignore the log, which
    would hide every change not yet checkpointed into the main file.
    """
    uri = f"{path.resolve().as_uri()}?mode=ro"
    wal, shm = path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")
    has_log = wal.is_file() and wal.stat().st_size > 0 and shm.is_file()
    if not os.access(path.parent, os.W_OK) and not has_log:
        uri += "&immutable=1"
    return uri


def connect(path: Path, *, synchronous: str = "FULL", read_only: bool = False) -> Database:
    """A new connection with keepstep's pragmas (one per thread).

    ``isolation_level=None``: the driver opens no implicit transactions, so writers
    take ``BEGIN IMMEDIATE`` themselves. ``read_only`` opens :func:`read_only_uri`.
    """
    try:
        if read_only:
            conn = sqlite3.connect(read_only_uri(path), uri=True, isolation_level=None,
                                   timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True)
        else:
            conn = sqlite3.connect(str(path), isolation_level=None,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise unreadable(path, exc, write=not read_only) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if read_only:
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        else:
            _set_wal(conn)
            conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as exc:
        conn.close()
        raise unreadable(path, exc, write=not read_only) from exc
    return Database(conn, execute_plugins=False)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite already rolled back (e.g. after an I/O error)
            pass


class SQLiteBase:
    """Connections (one per thread), write transactions and reads shared by the backend's
    capability modules. Not part of the Store interface."""

    root: Path
    db_path: Path
    artifacts: ArtifactStore
    clock: Callable[[], float]
    read_only: bool
    _synchronous: str

    def _init_connections(self, db: Database) -> None:
        self._local = threading.local()
        self._all: list[Database] = []
        self._lock = threading.Lock()
        # Writers of this process queue here, not in SQLite: a thread waiting for SQLite's
        # write lock sleeps 1, 2, 5, 10… 50 ms between tries, so with units in flight on
        # several threads every contended write lost tens of milliseconds. Re-entrant: a
        # write may run a nested helper that writes on the same connection. Other
        # processes are still waited for by the busy timeout.
        self._writer = threading.RLock()
        self._register(db)

    def _register(self, db: Database) -> None:
        self._local.db = db
        with self._lock:
            self._all.append(db)

    @property
    def db(self) -> Database:
        """This thread's connection (opened on first use)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = connect(self.db_path, synchronous=self._synchronous, read_only=self.read_only)
            self._register(db)
        return db

    def close(self) -> None:
        """Close every connection this store opened, in any thread. Idempotent."""
        with self._lock:
            for db in self._all:
                try:
                    db.close()
                except Exception:  # closing a connection owned by a finished thread
                    pass
            self._all.clear()
        self._local = threading.local()

    def now(self) -> float:
        """The store's clock (seconds since the epoch): leases and timestamps use it."""
        return self.clock()

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[Database]:
        """One ``BEGIN IMMEDIATE`` transaction; sqlite3 errors leave as StorageErrors.

        Busy past the timeout -> StorageBusy (nothing written); a failing COMMIT ->
        CommitOutcomeUnknown (the caller reads the head); a damaged file ->
        CorruptDatabase, wherever it shows. ``durable=False`` commits without syncing
        the WAL: the change survives a crash of the process, and a power cut only
        until the next durable commit (which syncs it too).
        """
        if self.read_only:
            raise StoragePermissionDenied(
                f"{self.db_path} was opened read-only; this command cannot change it",
                hint="run the command that writes without the read-only option")
        db = self.db
        conn = db.conn
        relaxed = not durable and self._synchronous.upper() not in ("OFF", "NORMAL")
        try:
            if relaxed:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                yield from self._transaction(db)
            finally:
                if relaxed:
                    conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except sqlite3.Error as exc:  # only the PRAGMAs can get here
            raise storage_error(exc, "setting up a write transaction", self.db_path) from exc

    def _transaction(self, db: Database) -> Iterator[Database]:
        with self._writer:
            yield from self._transaction_locked(db)

    def _transaction_locked(self, db: Database) -> Iterator[Database]:
        conn = db.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise storage_error(exc, "starting a write transaction", self.db_path) from exc
        try:
            yield db
        except sqlite3.Error as exc:
            _rollback(conn)
            raise storage_error(exc, "writing to the database", self.db_path) from exc
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            err = storage_error(exc, "COMMIT", self.db_path)
            if isinstance(err, CorruptDatabase):
                raise err from exc
            if any(m in str(exc) for m in _FULL_MARKERS):
                raise disk_full_at_commit(self.db_path) from exc
            raise CommitOutcomeUnknown(
                f"saving to {self.db_path} failed at the last step ({exc}); the change may "
                "or may not have been saved") from exc
        except BaseException:
            _rollback(conn)
            raise

    def _q(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        try:
            cur = self.db.conn.execute(sql, list(params))
            cols = [c[0] for c in cur.description] if cur.description else []
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        except sqlite3.Error as exc:
            raise storage_error(exc, "reading the database", self.db_path, write=False) from exc

    def _q1(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._q(sql, params)
        return rows[0] if rows else None

    def _q_many(self, queries: Iterable[tuple[str, Iterable[Any]]]) -> list[list[dict[str, Any]]]:
        """Several reads, each answered as ``_q`` answers it (a server backend sends them
        together: one round trip)."""
        return [self._q(sql, params) for sql, params in queries]
