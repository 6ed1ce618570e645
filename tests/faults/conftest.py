"""Session fixtures of the fault suite: the zygote (preloaded fork server) and the templates."""

from __future__ import annotations

import pytest

from .harness import Templates
from .zygote import close_shared, shared


@pytest.fixture(scope="session")
def zygote():
    """The test process's zygote (the engine tests' workers fork from the same one)."""
    yield shared()
    close_shared()


@pytest.fixture(scope="session")
def templates(tmp_path_factory, zygote) -> Templates:
    return Templates(tmp_path_factory.mktemp("fault-templates"), zygote)
