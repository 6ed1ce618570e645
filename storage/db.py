"""Opening the project database: pragmas, schema checks, backup-then-migrate."""

from __future__ import annotations

import datetime as _dt
import sqlite3
from pathlib import Path

from sqlite_utils import Database

from .errors import CorruptDatabase, SchemaMigrationFailed, SchemaTooNew
from .schema import MIGRATION_SET, SCHEMA_VERSION, migrations

BUSY_TIMEOUT_MS = 30_000


def connect(path: Path, *, synchronous: str = "FULL") -> Database:
    """A new read-write connection with keepstep's pragmas (one per thread).

    ``isolation_level=None``: the driver opens no implicit transactions, so
    writers can take ``BEGIN IMMEDIATE`` themselves and ``db.atomic()`` nests
    savepoints inside it.
    """
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise CorruptDatabase(f"{path} is not a readable keepstep database: {exc}") from exc
    return Database(conn, execute_plugins=False)


def read_schema_version(path: Path) -> tuple[int, list[str]]:
    """(user_version, applied migration names) read without writing anything."""
    uri = f"file:{path}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.OperationalError as exc:
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
    except sqlite3.DatabaseError as exc:
        raise CorruptDatabase(f"{path} is not a readable keepstep database: {exc}") from exc
    finally:
        conn.close()


def _backup(path: Path, found: int) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    target = path.with_name(f"{path.name}.v{found}-{stamp}.bak")
    src = sqlite3.connect(str(path))
    dst = sqlite3.connect(str(target))
    try:
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
                f"{SCHEMA_VERSION}" + (f" (unknown migrations: {', '.join(unknown)})" if unknown else "")
            )
        if 0 < found < SCHEMA_VERSION:
            backup = _backup(path, found)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = connect(path, synchronous=synchronous)
    try:
        migrations.apply(db)
    except Exception as exc:  # a failed migration rolled back; the backup stays
        db.close()
        raise SchemaMigrationFailed(
            f"migrating {path} failed: {exc}",
            hint=f"the original is unchanged{f' and a copy is at {backup}' if backup else ''}; "
            "report this with `keepstep verify` output",
        ) from exc
    return db, backup
