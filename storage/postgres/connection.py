"""Connections to a PostgreSQL store: a small psycopg pool, one serialised write
transaction at a time, reconnection after a server restart, the server's clock, and the
translation of psycopg errors into storage errors.

The capability classes of the SQLite backend are written in the SQL both engines share
(``INSERT … ON CONFLICT``, ``RETURNING``, ``COALESCE``); this module runs them on PostgreSQL
through :class:`PgConn`, which turns ``?`` placeholders into psycopg's, drops SQLite's
``INDEXED BY`` hints and returns an inserted event's sequence number as ``lastrowid``.
Writers take one transaction-scoped advisory lock, so every write transaction sees the
state it changes exactly as SQLite's ``BEGIN IMMEDIATE`` does: the compare-and-swap on a
head and the fencing-token check hold across hosts.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.errors import (
    CommitOutcomeUnknown,
    DiskFull,
    StorageBusy,
    StorageError,
    StoragePermissionDenied,
)

# One key for every writer of the database (any run): writes are short, and one writer at
# a time is the SQLite backend's contract too.
WRITE_LOCK_KEY = 0x6B656570  # "keep"
# How long a store waits for the server to come back (a restart, a network blip) before an
# operation fails with StorageBusy; nothing is written meanwhile.
RECONNECT_SECONDS = 60.0
LOCK_TIMEOUT_MS = 30_000
# The hidden insertion-order column some tables carry (SQLite's rowid): never returned.
HIDDEN = "rowid"
_RETURNING = {"events": "seq"}


class ConnectionLost(StorageBusy):
    """The connection dropped inside a write transaction before COMMIT: nothing was written,
    and the whole operation may run again (PostgresStore retries it on a new connection)."""


def _in_transaction_error(exc: BaseException, what: str, where: str) -> StorageError:
    err = storage_error(exc, what, where)
    if is_connection_error(exc):
        return ConnectionLost(err.message, hint=err.hint)
    return err


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> str:
    """SQLite-flavoured SQL of the shared capability classes -> PostgreSQL (psycopg)."""
    sql = re.sub(r"\s+INDEXED BY \w+", "", sql)
    # An upsert's bare column on the right-hand side is the existing row's in SQLite;
    # PostgreSQL wants it qualified by the table ("n = n + 1" -> "n = t.n + 1").
    target = _inserted_table(sql)
    if target:
        sql = re.sub(r"(DO UPDATE SET .*?)\b(\w+) = \2\b",
                     lambda m: f"{m.group(1)}{m.group(2)} = {target}.{m.group(2)}", sql)
    return sql.replace("%", "%%").replace("?", "%s")


class PgCursor:
    """The part of a DB-API cursor the capability classes use."""

    def __init__(self, cur: psycopg.Cursor[Any], lastrowid: int | None = None) -> None:
        self._cur = cur
        self.lastrowid = lastrowid
        self.rowcount = cur.rowcount
        self.description = cur.description

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._cur.fetchone()

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cur.fetchall()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._cur.fetchall())


class PgConn:
    """A psycopg connection that speaks the shared SQL (``?`` placeholders)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn
        self.in_transaction = False

    def execute(self, sql: str, params: Iterable[Any] = ()) -> PgCursor:
        text = translate(sql)
        table = _inserted_table(sql)
        returning = _RETURNING.get(table) if table else None
        if returning is not None and "RETURNING" not in sql.upper():
            cur = self.raw.execute(f"{text} RETURNING {returning}", list(params))
            row = cur.fetchone()
            return PgCursor(cur, int(row[0]) if row else None)
        return PgCursor(self.raw.execute(text, list(params)))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [list(r) for r in rows]
        if rows:
            with self.raw.cursor() as cur:
                cur.executemany(translate(sql), rows)


@functools.lru_cache(maxsize=512)
def _inserted_table(sql: str) -> str | None:
    m = re.match(r"\s*INSERT\s+INTO\s+(\w+)", sql, re.IGNORECASE)
    return m.group(1).lower() if m else None


class PgDb:
    """What a write transaction yields (the SQLite backend yields sqlite-utils' Database)."""

    def __init__(self, conn: PgConn) -> None:
        self.conn = conn


def is_connection_error(exc: BaseException) -> bool:
    """A lost or refused connection (the server restarting, the network gone)."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return not isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled
                              | pg_errors.DiskFull)
    if isinstance(exc, pg_errors.AdminShutdown | pg_errors.CrashShutdown
                  | pg_errors.CannotConnectNow):
        return True
    return False


def storage_error(exc: BaseException, what: str, where: str) -> StorageError:
    """The storage-level error for a psycopg error (nothing above storage sees psycopg)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, pg_errors.DiskFull):
        return DiskFull(f"{what}: the database server's disk is full ({text})",
                        hint="free space on the database server, then resume")
    if isinstance(exc, pg_errors.InsufficientPrivilege | pg_errors.ReadOnlySqlTransaction):
        return StoragePermissionDenied(
            f"{what}: the database role may not do this ({text})",
            hint="grant the keepstep role ownership of its schema (see docs/team.md)")
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled
                  | pg_errors.SerializationFailure | pg_errors.DeadlockDetected):
        return StorageBusy(f"{what}: the database stayed busy ({text}); nothing was written")
    if is_connection_error(exc):
        return StorageBusy(f"{what}: the database server at {where} cannot be reached "
                           f"({text}); nothing was written",
                           hint="check that the server is running and reachable, then resume")
    return StorageError(f"{what}: {type(exc).__name__}: {text}")


class PostgresBase:
    """The pool, write transactions and reads shared by the capability classes on
    PostgreSQL. Not part of the Store interface."""

    root: Path
    artifacts: ArtifactStore
    read_only: bool
    clock: Callable[[], float]
    _fixed_clock: Callable[[], float] | None
    where: str  # the URL without its password, for messages

    def _init_pool(self, conninfo: str, *, max_size: int, password: str | None) -> None:
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": 10,
                                  "application_name": "keepstep"}
        if password:
            kwargs["password"] = password
        self._pool = ConnectionPool(conninfo, min_size=1, max_size=max_size, kwargs=kwargs,
                                    open=False, name="keepstep", timeout=RECONNECT_SECONDS)
        self._pool.open(wait=False)
        self._tx = threading.local()
        self._clock_lock = threading.Lock()
        self._offset: float | None = None
        self._offset_at = 0.0
        self._closed = False

    # -- connections ---------------------------------------------------------
    def _run(self, fn: Callable[[PgConn], Any], what: str) -> Any:
        """``fn`` on a pooled connection outside any transaction (reads, idempotent
        statements), reconnecting while the server is away (up to RECONNECT_SECONDS)."""
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                with self._pool.connection() as raw:
                    return fn(PgConn(raw))
            except (psycopg.Error, PoolTimeout) as exc:
                if not is_connection_error(exc) or time.monotonic() >= deadline:
                    raise storage_error(exc, what, self.where) from exc
                time.sleep(0.2)

    def _q(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        params = list(params)

        def read(conn: PgConn) -> list[dict[str, Any]]:
            cur = conn.execute(sql, params)
            cols = [c.name for c in cur.description] if cur.description else []
            return [{k: v for k, v in zip(cols, r, strict=True) if k != HIDDEN}
                    for r in cur.fetchall()]

        conn = getattr(self._tx, "conn", None)
        if conn is not None:  # inside this thread's write transaction
            try:
                return read(conn)
            except psycopg.Error as exc:
                raise _in_transaction_error(exc, "reading the database", self.where) from exc
        result: list[dict[str, Any]] = self._run(read, "reading the database")
        return result

    def _q1(self, sql: str, params: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._q(sql, params)
        return rows[0] if rows else None

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[Any]:
        """One write transaction holding the store's write lock. A write inside another on
        the same thread joins it (one COMMIT for both).

        The server unreachable before the transaction starts: reconnect and retry (up to
        RECONNECT_SECONDS), then StorageBusy. Lost during the transaction: StorageBusy,
        nothing written. A failing COMMIT: CommitOutcomeUnknown (read the head).
        ``durable=False`` commits without waiting for the server's WAL flush.
        """
        if self.read_only:
            raise StoragePermissionDenied(
                f"the store at {self.where} was opened read-only; this command cannot change it",
                hint="run the command that writes without the read-only option")
        outer = getattr(self._tx, "conn", None)
        if outer is not None:
            yield PgDb(outer)
            return
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                cm = self._pool.connection()
                raw = cm.__enter__()
            except PoolTimeout as exc:
                raise storage_error(exc, "starting a write transaction", self.where) from exc
            try:
                # One round trip: the transaction, its settings and the writers' lock.
                relaxed = "" if durable else " SET LOCAL synchronous_commit = off;"
                raw.execute(f"BEGIN; SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS};{relaxed} "
                            f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
                break
            except psycopg.Error as exc:
                cm.__exit__(type(exc), exc, exc.__traceback__)
                if not is_connection_error(exc) or time.monotonic() >= deadline:
                    raise storage_error(exc, "starting a write transaction",
                                        self.where) from exc
                time.sleep(0.2)
        conn = PgConn(raw)
        conn.in_transaction = True
        self._tx.conn = conn
        try:
            try:
                blobs = getattr(self._tx, "pending", None)
                if blobs:  # a commit's files (PostgresStore.commit), in its transaction
                    self._tx.pending = None
                    conn.executemany("INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) "
                                     "ON CONFLICT (sha256) DO NOTHING", blobs)
                yield PgDb(conn)
            except psycopg.Error as exc:
                _rollback(raw)
                raise _in_transaction_error(exc, "writing to the database",
                                            self.where) from exc
            except BaseException:
                _rollback(raw)
                raise
            try:
                raw.execute("COMMIT")
            except psycopg.Error as exc:
                _rollback(raw)
                if isinstance(exc, pg_errors.DiskFull):
                    raise storage_error(exc, "COMMIT", self.where) from exc
                raise CommitOutcomeUnknown(
                    f"saving to {self.where} failed at the last step ({exc}); the change may "
                    "or may not have been saved") from exc
        finally:
            self._tx.conn = None
            conn.in_transaction = False
            cm.__exit__(None, None, None)

    # -- the clock -----------------------------------------------------------
    def now(self) -> float:
        """The database server's clock (seconds since the epoch), so that hosts whose
        clocks differ agree on lease expiry. Read once and then every few seconds; in
        between, the local monotonic clock plus the measured offset (error ≤ half a round
        trip). A clock given to the constructor (tests) replaces it."""
        if self._fixed_clock is not None:
            return self._fixed_clock()
        local = time.time()
        with self._clock_lock:
            if self._offset is None or time.monotonic() - self._offset_at > 5.0:
                def server(conn: PgConn) -> float:
                    t0 = time.time()
                    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())"
                                       "::float8").fetchone()
                    t1 = time.time()
                    assert row is not None
                    return float(row[0]) - (t0 + t1) / 2
                self._offset = self._run(server, "reading the database server's clock")
                self._offset_at = time.monotonic()
                local = time.time()
            assert self._offset is not None
            return local + self._offset

    def close(self) -> None:
        """Close the pool's connections. Idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.close()


def _rollback(raw: psycopg.Connection[Any]) -> None:
    try:
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.execute("ROLLBACK")
    except psycopg.Error:  # the connection is gone; the server rolled back
        pass
