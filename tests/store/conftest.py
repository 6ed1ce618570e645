"""Fixtures of the Store contract suite: every test here runs once per backend.

A backend adds itself to BACKENDS and must pass tests/store/ unchanged. The PostgreSQL one
gets a fresh database per test (tests/support/pg_fixtures.py); its runs are marked
``postgres`` (skipped with a reason locally when no server can be started, failed in CI).
No SQL and no backend internals in the contract tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore, Store
from tests.store.contract import RUN, FakeClock


def _postgres(root: Path, clock: FakeClock, url: str) -> Store:
    from keepstep.storage.postgres import PostgresStore

    return PostgresStore(root, url, clock=clock)


BACKENDS: dict[str, Callable[..., Store]] = {
    "sqlite": lambda root, clock, url: SQLiteStore(root, clock=clock),
    "postgres": _postgres,
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.postgres)
                        if name == "postgres" else name for name in sorted(BACKENDS)])
def backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    store = BACKENDS[request.param](tmp_path / ".keepstep", clock, url)
    yield store
    store.close()


@pytest.fixture
def run(backend: Store) -> Store:
    backend.create_run(RUN, {"plan": "plan-v1", "unit/U1": {"status": "pending"}},
                       meta={"title": "market entry"}, limits={"model_calls": 3})
    return backend
