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
def backend(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    store = BACKENDS[request.param](tmp_path / ".keepstep", clock)
    yield store
    store.close()


@pytest.fixture
def run(backend: Store) -> Store:
    backend.create_run(RUN, {"plan": "plan-v1", "unit/U1": {"status": "pending"}},
                       meta={"title": "market entry"}, limits={"model_calls": 3})
    return backend
