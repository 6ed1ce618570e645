"""Opening the project database: pragmas, schema checks, backup-then-migrate."""

from __future__ import annotations

import datetime as _dt
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

from keepstep.storage.errors import (
    CorruptDatabase,
    SchemaMigrationFailed,
    SchemaTooNew,
    StorageBusy,
    StorageError,
)
from keepstep.storage.schema import MIGRATION_SET, SCHEMA_VERSION, migrations

BUSY_TIMEOUT_MS = 30_000
_CORRUPT_MARKERS = ("malformed", "not a database")
_BUSY_MARKERS = ("database is locked", "database is busy", "database table is locked")


def storage_error(exc: sqlite3.Error, what: str) -> StorageError:
    """The storage-level error for a sqlite3 error (the engine never sees sqlite3).

    Corruption wins over everything else, so that a damaged file is never
    reported as a transient "busy".
    """
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and any(m in text for m in _CORRUPT_MARKERS):
        return CorruptDatabase(f"{what}: the database file is damaged ({text})")
    if isinstance(exc, sqlite3.OperationalError) and any(m in text for m in _BUSY_MARKERS):
        return StorageBusy(f"{what}: the database stayed locked for "
                           f"{BUSY_TIMEOUT_MS / 1000:g} s ({text})")
    return StorageError(f"{what}: {type(exc).__name__}: {text}")


@contextmanager
def sqlite_errors(what: str) -> Iterator[None]:
    """Re-raise any sqlite3 error inside the block as the matching StorageError."""
    try:
        yield
    except sqlite3.Error as exc:
        raise storage_error(exc, what) from exc


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


def connect(path: Path, *, synchronous: str = "FULL") -> Database:
    """A new read-write connection with keepstep's pragmas (one per thread).

    ``isolation_level=None``: the driver opens no implicit transactions, so
    writers can take ``BEGIN IMMEDIATE`` themselves and ``db.atomic()`` nests
    savepoints inside it.
    """
    with sqlite_errors(f"opening {path}"):
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _set_wal(conn)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as exc:
        conn.close()
        err = storage_error(exc, f"opening {path}")
        if not isinstance(err, StorageBusy):  # anything else: not a database we can read
            err = CorruptDatabase(f"{path} is not a readable keepstep database: {exc}")
        raise err from exc
    return Database(conn, execute_plugins=False)


def read_schema_version(path: Path) -> tuple[int, list[str]]:
    """(user_version, applied migration names) read without writing anything."""
    uri = f"file:{path}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise CorruptDatabase(f"cannot open {path}: {exc}") from exc
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        names: list[str] = []
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='_sqlite_migrations'"
        ).fetchone()
        if has_table:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid",
                    [MIGRATION_SET],
                )
            ]
        return version, names
    except sqlite3.Error as exc:
        err = storage_error(exc, f"reading the schema version of {path}")
        if not isinstance(err, StorageBusy):  # anything else: not a database we can read
            err = CorruptDatabase(f"{path} is not a readable keepstep database: {exc}")
        raise err from exc
    finally:
        conn.close()


def _backup(path: Path, found: int) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    target = path.with_name(f"{path.name}.v{found}-{stamp}.bak")
    src = sqlite3.connect(str(path))
    dst = sqlite3.connect(str(target))
    try:
        with sqlite_errors(f"backing up {path} before migrating it"):
            src.backup(dst)
            ok = dst.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            raise SchemaMigrationFailed(
                f"backup {target} failed its integrity check ({ok}); nothing was migrated",
                hint="run `keepstep verify` on the original and restore from a known-good backup",
            )
    finally:
        dst.close()
        src.close()
    return target


def open_database(path: Path, *, synchronous: str = "FULL") -> tuple[Database, Path | None]:
    """Open (creating if absent) and bring the schema up to date.

    Returns the connection and, when an older database was migrated, the path
    of the verified backup that was taken first. A database written by a newer
    keepstep raises SchemaTooNew and is not modified.
    """
    backup: Path | None = None
    known = {m.name for m in migrations.pending(Database(memory=True, execute_plugins=False))}
    if path.exists() and path.stat().st_size > 0:
        found, applied = read_schema_version(path)
        unknown = [n for n in applied if n not in known]
        if found > SCHEMA_VERSION or unknown:
            raise SchemaTooNew(
                f"{path} has schema version {found} but this keepstep supports up to "
                f"{SCHEMA_VERSION}"
                + (f" (unknown migrations: {', '.join(unknown)})" if unknown else "")
            )
        if 0 < found < SCHEMA_VERSION:
            backup = _backup(path, found)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = connect(path, synchronous=synchronous)
    try:
        if migrations.pending(db):
            # Hold the write lock from the pending check to the last migration: two processes
            # opening a fresh project must not both create the schema ("table already exists").
            # One transaction for the batch also keeps "the original is unchanged" true.
            db.conn.execute("BEGIN IMMEDIATE")
            try:
                migrations.apply(db)
                # Each migration stamps its own number; one applied out of order (a database
                # that lost a middle migration) would leave a lower one behind, and every
                # later open would take another backup. All known migrations are in now.
                db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.conn.execute("COMMIT")
            except BaseException:
                if db.conn.in_transaction:
                    db.conn.execute("ROLLBACK")
                raise
    except Exception as exc:  # a failed migration rolled back; the backup stays
        db.close()
        if isinstance(exc, sqlite3.Error):
            err = storage_error(exc, f"migrating {path}")
            if isinstance(err, StorageBusy | CorruptDatabase):
                raise err from exc
        raise SchemaMigrationFailed(
            f"migrating {path} failed: {exc}",
            hint=f"the original is unchanged{f' and a copy is at {backup}' if backup else ''}; "
            "report this with `keepstep verify` output",
        ) from exc
    return db, backup
