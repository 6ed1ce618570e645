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
    """The ME-042 story run once per test session: (StoryResult, printed lines).

    Under pytest-xdist the first worker that needs it runs it (the others wait on a file
    lock) into the folder all workers share, and writes the result beside it; the others read
    that result. Tests use the project only through ``story_dir``'s private copies."""
    import fcntl
    import json

    from keepstep.engine.drills.story import StoryResult, run_story

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / "me042-story.json"
    with open(shared / "me042-story.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.is_file():
            lines: list[str] = []
            result = run_story(ME042_PACK, shared / "me042-story" / "me042", say=lines.append)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps({"result": result.model_dump(mode="json"),
                                       "lines": lines}))
            tmp.replace(done)
    saved = json.loads(done.read_text())
    return StoryResult.model_validate(saved["result"]), saved["lines"]


@pytest.fixture(scope="module")
def story_dir(me042_story, tmp_path_factory) -> Path:
    """A private copy of the finished ME-042 story project (tests may add events to it)."""
    import shutil

    result, _ = me042_story
    assert result.passed, [c for c in result.checks if not c.passed]
    target = tmp_path_factory.mktemp("story-copy") / "me042"
    shutil.copytree(result.project, target)
    return target
