"""keepstep.storage loads lazily: its errors, hashes, rows and Protocols cost no backend."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import keepstep.storage as storage

REPO = Path(__file__).resolve().parent.parent
LIGHT = ["keepstep.storage", "keepstep.storage.errors", "keepstep.storage.hashing",
         "keepstep.storage.models", "keepstep.storage.store", "keepstep.storage.artifacts",
         "keepstep.storage.permissions", "keepstep.storage.faults"]


def test_the_light_storage_modules_do_not_load_sqlite_utils_or_the_backend() -> None:
    """In a fresh interpreter, importing the package, its errors, hashing, models, the Store
    Protocols or the artifact store loads neither sqlite_utils nor keepstep.storage.sqlite."""
    code = f"""
    import importlib, json, sys
    for name in {LIGHT!r}:
        importlib.import_module(name)
    from keepstep.storage import KeepstepError, StorageError, canonical_json, Store  # noqa
    print(json.dumps(sorted(m for m in sys.modules
                            if m.startswith(("sqlite_utils", "keepstep.storage.sqlite")))))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_every_public_name_resolves_and_unknown_names_raise_attribute_error() -> None:
    """Each name in keepstep.storage.__all__ loads on first use; a wrong name is an
    AttributeError, as for any module."""
    for name in storage.__all__:
        assert getattr(storage, name) is not None, name
    assert storage.backup.__module__ == "keepstep.storage.backups"  # the function, not a module
    assert storage.SQLiteStore.__module__ == "keepstep.storage.sqlite.store"
    with pytest.raises(AttributeError):
        storage.NoSuchName  # noqa: B018


def test_the_sqlite_backend_loads_without_numpy_and_numpy_still_imports_after() -> None:
    """sqlite-utils is imported with numpy hidden (its import cost every command's start);
    the name is restored right after, so a later ``import numpy`` works as usual."""
    code = """
    import json, sys
    from keepstep.storage.sqlite import SQLiteStore  # noqa: F401
    loaded = "numpy" in sys.modules
    import numpy
    print(json.dumps([loaded, numpy.__name__]))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [False, "numpy"]
