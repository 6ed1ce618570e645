"""Reaching the server, reading the schema version without writing, and migrating."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from keepstep.storage.errors import (
    SchemaMigrationFailed,
    SchemaNeedsMigration,
    SchemaTooNew,
    StorageError,
)
from keepstep.storage.postgres.connection import WRITE_LOCK_KEY, storage_error
from keepstep.storage.postgres.schema import MIGRATIONS, MIGRATIONS_TABLE, PG_SCHEMA_VERSION


def redacted(url: str) -> str:
    """The URL without a password (for messages and status)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def connect_once(url: str, password: str | None = None, *,
                 timeout: float = 10) -> psycopg.Connection[Any]:
    """One autocommit connection (validate, migrate). StorageBusy when unreachable."""
    kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, int(timeout)),
                              "application_name": "keepstep"}
    if password:
        kwargs["password"] = password
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.Error as exc:
        raise storage_error(exc, "connecting to the PostgreSQL store", redacted(url)) from exc


def read_schema_version(conn: psycopg.Connection[Any]) -> tuple[int, list[str]]:
    """(version, applied migration names); (0, []) for a database keepstep never used."""
    row = conn.execute("SELECT to_regclass(%s)", [MIGRATIONS_TABLE]).fetchone()
    if row is None or row[0] is None:
        return 0, []
    names = [r[0] for r in conn.execute(
        f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY applied_at, name").fetchall()]
    return len(names), names


def check_schema(conn: psycopg.Connection[Any], where: str, *, read_only: bool) -> int:
    """The found version; SchemaTooNew for a newer keepstep's schema, SchemaNeedsMigration
    for an older one when nothing may be written."""
    found, names = read_schema_version(conn)
    known = {name for name, _ in MIGRATIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SchemaTooNew(
            f"the store at {where} has schema version {found} but this keepstep supports up "
            f"to {PG_SCHEMA_VERSION} (unknown migrations: {', '.join(unknown)})",
            hint="upgrade keepstep on this machine to the version the team uses")
    if read_only and found < PG_SCHEMA_VERSION:
        raise SchemaNeedsMigration(
            f"the store at {where} has schema version {found}; this keepstep reads version "
            f"{PG_SCHEMA_VERSION}, and a read-only open does not migrate",
            hint="run a command that writes (e.g. `keepstep run`) to bring it up to date")
    return found


def migrate(conn: psycopg.Connection[Any], where: str) -> list[str]:
    """Apply pending migrations in one transaction under the writers' lock (two hosts
    opening a fresh database at once cannot both create the schema); returns their names."""
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [WRITE_LOCK_KEY])
            conn.execute(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
                         "name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
            check_schema(conn, where, read_only=False)
            done = {r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE}")}
            applied = []
            for name, step in MIGRATIONS:
                if name in done:
                    continue
                if callable(step):
                    step(conn)
                else:
                    conn.execute(step)
                conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) "
                             "VALUES (%s, %s)", [name, time.time()])
                applied.append(name)
            return applied
    except StorageError:
        raise
    except psycopg.Error as exc:
        err = storage_error(exc, f"migrating the store at {where}", where)
        if type(err) is not StorageError:
            raise err from exc
        raise SchemaMigrationFailed(
            f"migrating the store at {where} failed: {exc}",
            hint="nothing was changed (the migration is one transaction); report this") from exc
