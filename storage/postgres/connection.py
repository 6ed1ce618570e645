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
# The channel every commit, attempt ending and lease release notifies (the run id as payload;
# PostgresStore sets ``_tx.notify``) and waiting executors listen on
# (PostgresStore.wait_for_change).
CHANGES_CHANNEL = "keepstep_changes"
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
    """The part of a DB-API cursor the capability classes use.

    Inside a write transaction statements are pipelined: a statement is sent without
    waiting for its answer, and the answer is awaited only when the caller looks at it
    (a row, ``rowcount``, ``description`` or an event's ``lastrowid``). A transaction then
    costs one round trip per answer it needs before deciding what to write next, plus one
    for the rest and the COMMIT, instead of one per statement."""

    def __init__(self, cur: psycopg.Cursor[Any], conn: PgConn, *,
                 returning: bool = False) -> None:
        self._cur = cur
        self._conn = conn
        self._returning = returning
        self._lastrowid: int | None = None

    @property
    def rowcount(self) -> int:
        self._conn.wait_for(self._cur)
        return self._cur.rowcount

    @property
    def description(self) -> Any:
        self._conn.wait_for(self._cur)
        return self._cur.description

    @property
    def lastrowid(self) -> int | None:
        if self._returning and self._lastrowid is None:
            row = self._cur.fetchone()
            self._lastrowid = int(row[0]) if row else None
        return self._lastrowid

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._cur.fetchone()

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cur.fetchall()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._cur.fetchall())


class PgConn:
    """A psycopg connection that speaks the shared SQL (``?`` placeholders); in a write
    transaction, in pipeline mode (see PgCursor)."""

    def __init__(self, conn: psycopg.Connection[Any],
                 pipeline: psycopg.Pipeline | None = None) -> None:
        self.raw = conn
        self.pipeline = pipeline
        self.in_transaction = False
        self._sent: dict[tuple[str, tuple[Any, ...]], PgCursor] = {}

    def send_ahead(self, sql: str, params: Sequence[Any]) -> None:
        """Send a statement the transaction is about to run, without waiting: when the
        shared code then executes exactly that statement with those parameters, it gets
        this cursor, whose answer came back with an earlier one (a round trip saved). A
        statement that is never asked for still runs: only for reads, or for a write the
        caller will certainly ask for (the transaction rolls back otherwise)."""
        self._sent[(sql, tuple(params))] = self.execute(sql, params)

    def execute(self, sql: str, params: Iterable[Any] = ()) -> PgCursor:
        if self._sent:
            params = list(params)
            try:
                ahead = self._sent.pop((sql, tuple(params)), None)
            except TypeError:  # an unhashable parameter: never sent ahead
                ahead = None
            if ahead is not None:
                return ahead
        text = translate(sql)
        table = _inserted_table(sql)
        returning = _RETURNING.get(table) if table else None
        if returning is not None and "RETURNING" not in sql.upper():
            cur = self.raw.execute(f"{text} RETURNING {returning}", list(params))
            return PgCursor(cur, self, returning=True)
        return PgCursor(self.raw.execute(text, list(params)), self)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [list(r) for r in rows]
        if rows:
            # Not closed here: in a pipeline its answers arrive later.
            self.raw.cursor().executemany(translate(sql), rows)

    def wait_for(self, cur: psycopg.Cursor[Any]) -> None:
        """Make ``cur``'s answer (and every answer before it) arrive: one round trip when
        it is still on its way, none otherwise."""
        if self.pipeline is not None and cur.pgresult is None:
            self.pipeline.sync()


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
            return _rows(conn.execute(sql, params))

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

    def _q_many(self, queries: Iterable[tuple[str, Iterable[Any]]]) -> list[list[dict[str, Any]]]:
        """Several reads sent together in a pipeline on one pooled connection, answered in
        one round trip (each statement sees the database as it is when it runs, as separate
        ``_q`` calls would)."""
        batch = [(sql, list(params)) for sql, params in queries]
        if getattr(self._tx, "conn", None) is not None:  # inside a write transaction
            return [self._q(sql, params) for sql, params in batch]

        def read(conn: PgConn) -> list[list[dict[str, Any]]]:
            with conn.raw.pipeline():
                curs = [conn.raw.execute(translate(sql), params) for sql, params in batch]
            return [_rows(cur) for cur in curs]

        result: list[list[dict[str, Any]]] = self._run(read, "reading the database")
        return result

    @contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[Any]:
        """One write transaction holding the store's write lock. A write inside another on
        the same thread joins it (one COMMIT for both).

        Pipelined (see PgCursor): BEGIN, the transaction's settings, the writers' lock and
        the transaction's id go out with the first statements, and the last statements go
        out with the COMMIT, so a transaction costs one round trip more than the answers it
        waits for (a claim: two; a commit: two).

        The server unreachable or the connection lost before the COMMIT was sent:
        ConnectionLost, nothing written (the caller may run the whole operation again).
        Lost while the COMMIT was on its way: the transaction's id says, on a new
        connection, whether it committed (then this returns normally) or not
        (ConnectionLost); only when the server cannot tell (still running after
        RECONNECT_SECONDS) CommitOutcomeUnknown (read the head). A COMMIT the server
        refuses: CommitOutcomeUnknown, as before. ``durable=False`` commits without waiting
        for the server's WAL flush.
        """
        if self.read_only:
            raise StoragePermissionDenied(
                f"the store at {self.where} was opened read-only; this command cannot change it",
                hint="run the command that writes without the read-only option")
        outer = getattr(self._tx, "conn", None)
        if outer is not None:
            yield PgDb(outer)
            return
        try:
            cm = self._pool.connection()
            raw = cm.__enter__()
        except PoolTimeout as exc:
            raise storage_error(exc, "starting a write transaction", self.where) from exc
        pipe_cm: Any = None
        try:
            pipe_cm = raw.pipeline()
            conn = PgConn(raw, pipe_cm.__enter__())
            raw.execute("BEGIN")
            raw.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            if not durable:
                raw.execute("SET LOCAL synchronous_commit = off")
            raw.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
            xid_cur = raw.execute("SELECT pg_current_xact_id()::text")
        except psycopg.Error as exc:
            _end_pipeline(pipe_cm)
            _rollback(raw)
            cm.__exit__(None, None, None)
            raise _in_transaction_error(exc, "starting a write transaction",
                                        self.where) from exc
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
                notify = getattr(self._tx, "notify", None)
                if notify:  # listening executors hear it once this commits (no round trip)
                    conn.execute(f"SELECT pg_notify('{CHANGES_CHANNEL}', ?)", [notify])
                # The transaction's id must be known before the COMMIT goes out (it is when
                # the body waited for any answer; otherwise this is one more round trip).
                row = xid_cur.fetchone()
                xid = str(row[0]) if row else None
            except psycopg.Error as exc:
                _end_pipeline(pipe_cm)
                _rollback(raw)
                raise _in_transaction_error(exc, "writing to the database",
                                            self.where) from exc
            except BaseException:
                _end_pipeline(pipe_cm)
                _rollback(raw)
                raise
            try:
                raw.execute("COMMIT")
                # Leaving pipeline mode sends the Sync and reads every answer: the last
                # statements and the COMMIT cost this one round trip.
                pipe_cm, ending = None, pipe_cm
                ending.__exit__(None, None, None)
            except psycopg.Error as exc:
                lost = is_connection_error(exc) or raw.broken
                failed_before = (not lost and raw.info.transaction_status
                                 == psycopg.pq.TransactionStatus.INERROR)
                _end_pipeline(pipe_cm)
                _rollback(raw)
                if lost:
                    self._settle_lost_commit(xid, exc)
                    return
                if failed_before:  # a statement of the body: the COMMIT never ran
                    raise _in_transaction_error(exc, "writing to the database",
                                                self.where) from exc
                if isinstance(exc, pg_errors.DiskFull):
                    raise storage_error(exc, "COMMIT", self.where) from exc
                raise CommitOutcomeUnknown(
                    f"saving to {self.where} failed at the last step ({exc}); the change may "
                    "or may not have been saved") from exc
        finally:
            self._tx.conn = None
            conn.in_transaction = False
            cm.__exit__(None, None, None)

    def _settle_lost_commit(self, xid: str | None, exc: BaseException) -> None:
        """The connection dropped while a COMMIT was on its way: ask the server (on a new
        connection, waiting for it to come back) whether transaction ``xid`` committed.
        Returns when it did; ConnectionLost when it did not (nothing written);
        CommitOutcomeUnknown when the server cannot say."""
        unknown = CommitOutcomeUnknown(
            f"saving to {self.where} failed at the last step ({exc}); the change may or may "
            "not have been saved")
        if xid is None:
            raise unknown from exc
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                status = self._run(lambda c: c.execute(
                    "SELECT pg_xact_status(?::xid8)", [xid]).fetchone(),
                    "reading a transaction's outcome")
            except StorageError:
                raise unknown from exc
            state = status[0] if status else None
            if state == "committed":
                return
            if state == "aborted":
                raise _in_transaction_error(exc, "writing to the database",
                                            self.where) from exc
            # "in progress": the old session has not noticed its connection is gone yet.
            if state is None or time.monotonic() >= deadline:
                raise unknown from exc
            time.sleep(0.2)

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
            # Inside this thread's write transaction the measured offset is used as it is
            # (a read there would wait for the writers' lock and skew the measure; a second
            # pooled connection could wait for the pool while holding that lock).
            in_write = getattr(self._tx, "conn", None) is not None
            if self._offset is None or (time.monotonic() - self._offset_at > 5.0
                                        and not in_write):
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


def _rows(cur: PgCursor | psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    """A read's rows as dicts by column name (the hidden insertion-order column left out)."""
    cols = [c.name for c in cur.description] if cur.description else []
    return [{k: v for k, v in zip(cols, r, strict=True) if k != HIDDEN} for r in cur.fetchall()]


def _end_pipeline(pipe_cm: Any) -> None:
    """Leave pipeline mode (answers still on their way are read and dropped: the caller
    either committed already or rolls back next)."""
    if pipe_cm is None:
        return
    try:
        pipe_cm.__exit__(None, None, None)
    except psycopg.Error:  # an aborted pipeline or a lost connection
        pass


def _rollback(raw: psycopg.Connection[Any]) -> None:
    try:
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.execute("ROLLBACK")
    except psycopg.Error:  # the connection is gone; the server rolled back
        pass
