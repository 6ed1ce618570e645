"""Test-wide environment: no network, no keyring, deterministic litellm."""

from __future__ import annotations

import os

# Must be set before anything imports litellm (it fetches a price map otherwise).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.null.Keyring"
os.environ.pop("KEEPSTEP_CRASH_AT", None)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from keepstep.storage import SQLiteStore  # noqa: E402
from tests.support.hypothesis_profiles import register as _register_hypothesis  # noqa: E402

_register_hypothesis()  # HYPOTHESIS_PROFILE=ci|bench (tests/support/hypothesis_profiles.py)

# PostgreSQL servers and databases for the tests marked `postgres`.
pytest_plugins = ["tests.support.pg_fixtures"]


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / ".keepstep"


@pytest.fixture
def store(store_root: Path):
    s = SQLiteStore(store_root)
    yield s
    s.close()


ME042_PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"


@pytest.fixture(scope="session")
def me042_story(tmp_path_factory):
    """The ME-042 story run once per session: (StoryResult, printed lines)."""
    from keepstep.engine.drills.story import run_story

    lines: list[str] = []
    result = run_story(ME042_PACK, tmp_path_factory.mktemp("story") / "me042", say=lines.append)
    return result, lines


@pytest.fixture(scope="module")
def story_dir(me042_story, tmp_path_factory) -> Path:
    """A private copy of the finished ME-042 story project (tests may add events to it)."""
    import shutil

    result, _ = me042_story
    assert result.passed, [c for c in result.checks if not c.passed]
    target = tmp_path_factory.mktemp("story-copy") / "me042"
    shutil.copytree(result.project, target)
    return target
