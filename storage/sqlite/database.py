"""Opening the project database: the missing-or-empty guard, schema checks, backup-then-
migrate (never in read-only mode)."""

from __future__ import annotations

import datetime as _dt
import os
import sqlite3
from pathlib import Path

from keepstep.storage.errors import (
    CorruptDatabase,
    DatabaseLost,
    SchemaMigrationFailed,
    SchemaNeedsMigration,
    SchemaTooNew,
    StorageBusy,
    StorageError,
    StoragePermissionDenied,
    permission_denied,
)
from keepstep.storage.permissions import DIR_MODE, FILE_MODE, make_private_dir, open_private
from keepstep.storage.permissions import tighten as _tighten
from keepstep.storage.sqlite.connection import (
    BUSY_TIMEOUT_MS,
    connect,
    read_only_uri,
    sqlite_errors,
    storage_error,
    unreadable,
)
from keepstep.storage.sqlite.schema import MIGRATION_SET, SCHEMA_VERSION, migrations
from keepstep.storage.sqlite.sqlite_lib import Database


def read_schema_version(path: Path) -> tuple[int, list[str]]:
    """(user_version, applied migration names) read without writing anything."""
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise unreadable(path, exc, write=False) from exc
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
        raise unreadable(path, exc, write=False) from exc
    finally:
        conn.close()


def _backup(path: Path, found: int) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    target = path.with_name(f"{path.name}.v{found}-{stamp}.bak")
    os.close(open_private(target, os.O_WRONLY | os.O_EXCL))
    src = sqlite3.connect(str(path))
    dst = sqlite3.connect(str(target))
    try:
        with sqlite_errors(f"backing up {path} before migrating it", target):
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


def _earlier_work(artifacts_root: Path | None) -> int:
    """How many attempt folders (``<run>/<unit>/<attempt>``) the artifact store holds."""
    if artifacts_root is None or not artifacts_root.is_dir():
        return 0
    found = 0
    for run_dir in artifacts_root.iterdir():
        if not run_dir.is_dir():
            continue
        for unit_dir in run_dir.iterdir():
            if unit_dir.is_dir() and not unit_dir.name.startswith("_"):
                found += sum(1 for a in unit_dir.iterdir() if a.is_dir())
    return found


def _create_file(path: Path) -> None:
    """Create the state folder (0700) and an empty database file (0600) for SQLite to fill:
    its -wal and -shm files take the database file's mode."""
    try:
        make_private_dir(path.parent)
        os.close(open_private(path, os.O_WRONLY))
    except PermissionError as exc:
        raise permission_denied(path, "create") from exc


def open_database(path: Path, *, synchronous: str = "FULL", read_only: bool = False,
                  artifacts_root: Path | None = None) -> tuple[Database, Path | None]:
    """Open (creating if absent, unless ``read_only``) and bring the schema up to date.

    Returns the connection and, when an older database was migrated, the path of the
    verified backup that was taken first. Raises SchemaTooNew (newer keepstep; nothing
    modified), DatabaseLost (missing or empty file while ``artifacts_root`` holds attempt
    folders; nothing created), NotFound-like StorageError for a read-only open of a missing
    file, SchemaNeedsMigration (read-only open of an older database),
    StoragePermissionDenied, CorruptDatabase or SchemaMigrationFailed.
    """
    backup: Path | None = None
    known = {m.name for m in migrations.pending(Database(memory=True, execute_plugins=False))}
    try:
        empty = not path.exists() or path.stat().st_size == 0
    except PermissionError as exc:
        raise permission_denied(path, "read") from exc
    if empty:
        earlier = _earlier_work(artifacts_root)
        if earlier:
            state = "is empty" if path.exists() else "is missing"
            raise DatabaseLost(
                f"{path} {state}, but {artifacts_root} holds {earlier} attempt folder(s) of "
                "earlier work; keepstep will not start a new database over them")
        if read_only:
            raise StorageError(f"no keepstep database at {path}",
                               hint="start a run first (`keepstep run`), or pass the project "
                               "folder that holds .keepstep")
        _create_file(path)
    else:
        found, applied = read_schema_version(path)
        unknown = [n for n in applied if n not in known]
        if found > SCHEMA_VERSION or unknown:
            raise SchemaTooNew(
                f"{path} has schema version {found} but this keepstep supports up to "
                f"{SCHEMA_VERSION}"
                + (f" (unknown migrations: {', '.join(unknown)})" if unknown else "")
            )
        if read_only and (found < SCHEMA_VERSION or len(applied) < len(known)):
            raise SchemaNeedsMigration(
                f"{path} has schema version {found}; this keepstep reads version "
                f"{SCHEMA_VERSION}, and a read-only open does not migrate")
        if not read_only:
            _tighten(path.parent, DIR_MODE)
            for suffix in ("", "-wal", "-shm"):
                _tighten(path.with_name(path.name + suffix), FILE_MODE)
        if 0 < found < SCHEMA_VERSION:
            backup = _backup(path, found)
    db = connect(path, synchronous=synchronous, read_only=read_only)
    if read_only:
        return db, None
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
            err = storage_error(exc, f"migrating {path}", path)
            if isinstance(err, StorageBusy | CorruptDatabase | StoragePermissionDenied):
                raise err from exc
        raise SchemaMigrationFailed(
            f"migrating {path} failed: {exc}",
            hint=f"the original is unchanged{f' and a copy is at {backup}' if backup else ''}; "
            "report this with `keepstep verify` output",
        ) from exc
    return db, backup


