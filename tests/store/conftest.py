"""Fixtures of the Store contract suite: every test here runs once per backend.

A backend adds itself to BACKENDS and must pass tests/store/ unchanged. The PostgreSQL one
gets an empty database per test (tests/support/pg_fixtures.py); its runs are marked
``postgres`` (skipped with a reason locally when no server can be started, failed in CI).
No SQL and no backend internals in the contract tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore, Store
from tests.store.contract import RUN, FakeClock


def _postgres(root: Path, clock: FakeClock, url: str | None) -> Store:
    from keepstep.storage.postgres import PostgresStore

    assert url is not None
    return PostgresStore(root, url, clock=clock)


BACKENDS: dict[str, Callable[[Path, FakeClock, str | None], Store]] = {
    "sqlite": lambda root, clock, url: SQLiteStore(root, clock=clock),
    "postgres": _postgres,
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.postgres)
                        if name == "postgres" else name for name in sorted(BACKENDS)])
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def reopen(request: pytest.FixtureRequest, backend_name: str, tmp_path: Path,
           clock: FakeClock) -> Callable[[], Store]:
    """A fresh store of the same backend on the same data (as another process opens it)."""
    url = request.getfixturevalue("pg_url") if backend_name == "postgres" else None
    return lambda: BACKENDS[backend_name](tmp_path / ".keepstep", clock, url)


@pytest.fixture
def backend(reopen: Callable[[], Store]) -> Iterator[Store]:
    store = reopen()
    yield store
    store.close()


@pytest.fixture
def run(backend: Store) -> Store:
    backend.create_run(RUN, {"plan": "plan-v1", "unit/U1": {"status": "pending"}},
                       meta={"title": "market entry"}, limits={"model_calls": 3})
    return backend
