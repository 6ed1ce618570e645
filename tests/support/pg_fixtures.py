"""PostgreSQL fixtures (a pytest plugin, registered in tests/conftest.py).

``pg_server``: the server's admin URL for the session: KEEPSTEP_TEST_PG_URL when set (.ci/run
starts a cluster and exports it), else a throwaway cluster started here. When none can be
had, tests that need it skip locally (saying why) and FAIL when ``CI`` is set.
``pg_url``: a fresh database for one test, copied from a template that already holds the
schema (fast), dropped afterwards.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

_count = itertools.count()


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL server here ({reason}); set KEEPSTEP_TEST_PG_URL or install "
                "postgresql to run the tests marked `postgres`")


def start_cluster(folder: Path) -> Any:
    """A throwaway cluster in ``folder`` (a Cluster), or skip/fail saying why."""
    from tests.support.pg_cluster import Cluster, ClusterUnavailable

    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:  # the postgres user must reach the cluster folder
        for parent in folder.parents:
            if parent == parent.parent:
                break
            if not os.stat(parent).st_mode & 0o001:
                os.chmod(parent, os.stat(parent).st_mode | 0o011)
    try:
        cluster = Cluster(folder / "cluster")
        cluster.start()
    except (ClusterUnavailable, OSError) as exc:
        _unavailable(str(exc))
    return cluster


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("KEEPSTEP_TEST_PG_URL")
    if url:
        yield url
        return
    cluster = start_cluster(tmp_path_factory.mktemp("pg"))
    try:
        yield cluster.url
    finally:
        cluster.stop("immediate")


@pytest.fixture
def pg_own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A cluster of this test's own (it may be restarted), with a ``keepstep`` database."""
    cluster = start_cluster(tmp_path_factory.mktemp("pg-own"))
    try:
        yield cluster
    finally:
        cluster.stop("immediate")


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    """A database holding keepstep's schema, copied by every ``pg_url``."""
    import psycopg

    from keepstep.storage.postgres.database import migrate

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"ks_tpl_{worker}_{os.getpid()}"
    admin = psycopg.connect(with_database(pg_server, "postgres"), autocommit=True)
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    finally:
        admin.close()
    conn = psycopg.connect(with_database(pg_server, name), autocommit=True)
    try:
        migrate(conn, name)
    finally:
        conn.close()
    return name


def create_database(pg_server: str, template: str) -> str:
    import psycopg

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"ks_{worker}_{os.getpid()}_{next(_count)}"
    admin = psycopg.connect(with_database(pg_server, "postgres"), autocommit=True)
    try:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    finally:
        admin.close()
    return with_database(pg_server, name)


def drop_database(pg_server: str, url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = psycopg.connect(with_database(pg_server, "postgres"), autocommit=True)
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        admin.close()


def empty_database(url: str) -> None:
    """Empty every keepstep table of the database at ``url`` (the schema stays)."""
    import psycopg

    from keepstep.storage.postgres.schema import MIGRATIONS_TABLE

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename <> %s", [MIGRATIONS_TABLE])]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        conn.execute("INSERT INTO fencing (id, last_token) VALUES (1, 0)")


@pytest.fixture(scope="session")
def pg_database(pg_server: str, pg_template: str) -> str:
    """This test process's database (its schema made once)."""
    return create_database(pg_server, pg_template)


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """An empty keepstep database for one test (tables truncated, tokens from 0)."""
    empty_database(pg_database)
    return pg_database
