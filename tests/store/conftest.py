"""Fixtures of the Store contract suite: every test here runs once per backend.

A second backend (PostgreSQL) adds itself to BACKENDS and must pass tests/store/ unchanged.
No SQL and no backend internals in the contract tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore, Store
from tests.store.contract import RUN, FakeClock

BACKENDS: dict[str, Callable[[Path, FakeClock], Store]] = {
    "sqlite": lambda root, clock: SQLiteStore(root, clock=clock),
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=sorted(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def reopen(backend_name: str, tmp_path: Path, clock: FakeClock) -> Callable[[], Store]:
    """A fresh store of the same backend on the same data (as another process opens it)."""
    return lambda: BACKENDS[backend_name](tmp_path / ".keepstep", clock)


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
