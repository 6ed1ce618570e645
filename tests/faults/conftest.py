"""Session fixtures of the fault suite: the zygote (preloaded fork server) and the templates."""

from __future__ import annotations

import pytest

from .harness import Templates
from .zygote import Zygote


@pytest.fixture(scope="session")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.fixture(scope="session")
def templates(tmp_path_factory, zygote) -> Templates:
    return Templates(tmp_path_factory.mktemp("fault-templates"), zygote)
