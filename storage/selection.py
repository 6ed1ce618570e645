"""Which store a project uses, and opening it: the one place above the backends that knows
there are two.

``KEEPSTEP_STORE_URL`` wins over keepstep.toml's ``[store] url``; neither means the embedded
SQLite file. A PostgreSQL password never comes from keepstep.toml: libpq reads PGPASSWORD and
~/.pgpass itself, else the caller passes the OS keyring's entry (``keepstep keys set
postgres``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from keepstep.storage.errors import StorageError

ENV_URL = "KEEPSTEP_STORE_URL"
SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class StoreChoice:
    """The store a project uses: ``url`` None is SQLite at ``<project>/.keepstep``."""

    url: str | None
    source: str  # "KEEPSTEP_STORE_URL" | "keepstep.toml" | "default"

    @property
    def backend(self) -> str:
        return "sqlite" if self.url is None else "postgres"

    def describe(self) -> str:
        if self.url is None:
            return "SQLite (.keepstep/state.db in the project folder)"
        from keepstep.storage.postgres.database import redacted

        return f"PostgreSQL at {redacted(self.url)} (from {self.source})"


def check_url(url: str, *, allow_password: bool) -> str:
    """A PostgreSQL URL, or StorageError saying what is wrong (never echoing a password)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise StorageError(f"the store URL must look like postgresql://user@host:5432/db "
                           f"(got a {parts.scheme or 'schemeless'} URL)",
                           hint="remove [store] url to use the embedded SQLite store")
    if parts.password is not None and not allow_password:
        raise StorageError(
            f"keepstep.toml's [store] url carries a password ({parts.scheme}://"
            f"{parts.username or ''}:…@{parts.hostname}/…); keepstep.toml must hold none",
            hint="remove it from the URL; use PGPASSWORD, ~/.pgpass or "
                 "`keepstep keys set postgres`")
    return url


def choose_store(configured: str | None, *,
                 env: Mapping[str, str] = os.environ) -> StoreChoice:
    """The store to open: the environment's URL, else keepstep.toml's, else SQLite."""
    if env.get(ENV_URL):
        return StoreChoice(check_url(env[ENV_URL], allow_password=True), ENV_URL)
    if configured:
        return StoreChoice(check_url(configured, allow_password=False), "keepstep.toml")
    return StoreChoice(None, "default")


def password_source(choice: StoreChoice, keyring_password: str | None,
                    env: Mapping[str, str] = os.environ) -> str:
    """Where the PostgreSQL password comes from (never the password itself)."""
    if choice.url is None:
        return "none needed"
    if urlsplit(choice.url).password is not None:
        return "the URL in KEEPSTEP_STORE_URL"
    if env.get("PGPASSWORD"):
        return "PGPASSWORD"
    pgpass = Path(env.get("PGPASSFILE") or Path.home() / ".pgpass")
    if pgpass.is_file():
        return f"{pgpass}"
    if keyring_password:
        return "the OS keyring (`keepstep keys set postgres`)"
    return "none (the server must trust this host, or set PGPASSWORD)"


def open_store(root: Path, choice: StoreChoice | None = None, *,
               clock: Callable[[], float] | None = None, synchronous: str = "FULL",
               read_only: bool = False, password: str | None = None) -> Any:
    """Open the chosen store with its local folder ``root`` (``<project>/.keepstep``).

    ``clock`` None is the store's own clock: the system clock for SQLite, the database
    server's for PostgreSQL (leases agree across hosts)."""
    if choice is None or choice.url is None:
        from keepstep.storage.sqlite import SQLiteStore

        return SQLiteStore(root, clock=clock or time.time, synchronous=synchronous,
                           read_only=read_only)
    from keepstep.storage.postgres import PostgresStore

    return PostgresStore(root, choice.url, clock=clock, read_only=read_only,
                         password=password)


@dataclass(frozen=True)
class StoreCheck:
    """What ``keepstep validate`` learns about a store without writing to it."""

    ok: bool
    message: str
    hint: str = ""


def check_store(choice: StoreChoice, password: str | None = None) -> StoreCheck:
    """Reach the server and read its schema version; nothing is written (SQLite: its file
    is checked when a command opens it)."""
    if choice.url is None:
        return StoreCheck(True, choice.describe())
    from keepstep.storage.errors import KeepstepError
    from keepstep.storage.postgres.database import (
        check_schema,
        connect_once,
        read_schema_version,
        redacted,
    )
    from keepstep.storage.postgres.schema import PG_SCHEMA_VERSION

    where = redacted(choice.url)
    try:
        conn = connect_once(choice.url, password, timeout=5)
    except KeepstepError as exc:
        return StoreCheck(False, exc.message, exc.hint)
    try:
        check_schema(conn, where, read_only=False)
        found, _ = read_schema_version(conn)
    except KeepstepError as exc:
        return StoreCheck(False, exc.message, exc.hint)
    except Exception as exc:  # psycopg errors while reading the catalogue
        return StoreCheck(False, f"reading the schema version at {where} failed: {exc}",
                          "check the role's rights on the database (docs/team.md)")
    finally:
        conn.close()
    if found == 0:
        return StoreCheck(True, f"{choice.describe()}: reachable, no keepstep schema yet "
                          "(the first run creates it)")
    if found < PG_SCHEMA_VERSION:
        return StoreCheck(True, f"{choice.describe()}: reachable, schema version {found} "
                          f"(the next run migrates it to {PG_SCHEMA_VERSION})")
    return StoreCheck(True, f"{choice.describe()}: reachable, schema version {found}")
