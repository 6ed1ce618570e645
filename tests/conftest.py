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


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / ".keepstep"


@pytest.fixture
def store(store_root: Path):
    s = SQLiteStore(store_root)
    yield s
    s.close()
