"""Opening damaged or protected state: a lost database over earlier work, read-only mode,
and permission problems named as such."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from keepstep.storage import (
    DatabaseLost,
    SchemaNeedsMigration,
    SQLiteStore,
    StorageError,
    StoragePermissionDenied,
)

RUN = "R1"


def _project(root: Path) -> None:
    """A closed store holding one run with one committed attempt folder."""
    s = SQLiteStore(root)
    s.create_run(RUN, {"plan": "p"})
    c = s.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    entry = s.artifacts.stage(RUN, c.attempt_id, "out.json", b"{}",
                              media_type="application/json", producer_version="test",
                              created_at="2024-01-01T00:00:00+00:00")
    s.commit_checkpoint(RUN, "main", 0, {"unit:U1": {"attempt": c.attempt_id}}, [entry],
                        c.fencing_token, unit="U1", attempt_id=c.attempt_id,
                        current={"U1": c.attempt_id})
    s.close()


@pytest.mark.parametrize("damage", ["zero bytes", "missing"])
def test_a_lost_database_next_to_attempt_folders_is_not_recreated(
    store_root: Path, damage: str
) -> None:
    """An empty or missing state.db beside an artifact store holding attempt folders
    raises DatabaseLost (restore, or move .keepstep aside) and creates nothing."""
    _project(store_root)
    db = store_root / "state.db"
    if damage == "zero bytes":
        db.write_bytes(b"")
    else:
        db.unlink()
    with pytest.raises(DatabaseLost) as info:
        SQLiteStore(store_root)
    message = str(info.value)
    assert str(db) in message and "1 attempt folder" in message
    assert "keepstep restore" in message and "move .keepstep aside" in message
    assert (db.stat().st_size == 0) if damage == "zero bytes" else not db.exists()
    assert sorted(p.name for p in store_root.iterdir()) == (
        ["artifacts", "state.db"] if damage == "zero bytes" else ["artifacts"])


def test_an_empty_database_with_no_earlier_work_is_started_fresh(store_root: Path) -> None:
    """A zero-byte state.db with no attempt folders beside it is simply a new project."""
    store_root.mkdir(parents=True)
    (store_root / "state.db").write_bytes(b"")
    s = SQLiteStore(store_root)
    try:
        assert s.runs() == []
    finally:
        s.close()


def test_a_read_only_store_reads_without_migrating_or_writing(store_root: Path) -> None:
    """read_only=True reads runs, checkpoints and the chain; every write raises
    StoragePermissionDenied and the file is not changed."""
    _project(store_root)
    db = store_root / "state.db"
    before = db.read_bytes()
    s = SQLiteStore(store_root, read_only=True)
    try:
        assert s.runs() == [RUN] and s.get_head(RUN).version == 1
        assert s.verify_chain(RUN).ok
        assert s.current_attempts(RUN) == {"U1": "U1/a1"}
        report = s.verify_since_last(RUN)  # verifies; nothing can be remembered
        assert report.ok and report.verified_version == 1
        with pytest.raises(StoragePermissionDenied, match="read-only"):
            s.append_event(RUN, "x")
        with pytest.raises(StoragePermissionDenied):
            s.commit_checkpoint(RUN, "main", 1, {"x": 1})
    finally:
        s.close()
    assert db.read_bytes() == before


def test_a_read_only_open_neither_creates_nor_migrates(store_root: Path) -> None:
    """No database: a read-only open says so and creates nothing; an older schema is
    refused with SchemaNeedsMigration instead of being migrated."""
    with pytest.raises(StorageError, match="no keepstep database"):
        SQLiteStore(store_root, read_only=True)
    assert not store_root.exists()
    _project(store_root)
    import sqlite3

    conn = sqlite3.connect(store_root / "state.db")
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    with pytest.raises(SchemaNeedsMigration):
        SQLiteStore(store_root, read_only=True)


_CHILD = """
import ctypes, json, os, sys
from pathlib import Path
if os.geteuid() == 0:
    # Root ignores permission bits: drop DAC override/read-search/fowner for this process,
    # so that the folder's modes apply as they would to any other user.
    libc = ctypes.CDLL(None, use_errno=True)
    class Head(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    head, data = Head(0x20080522, 0), (Data * 2)()
    assert libc.capget(ctypes.byref(head), data) == 0
    drop = (1 << 1) | (1 << 2) | (1 << 3)
    data[0].effective &= ~drop
    data[0].permitted &= ~drop
    assert libc.capset(ctypes.byref(head), data) == 0
from keepstep.storage import SQLiteStore
root = Path(sys.argv[1])
out = {}
try:
    s = SQLiteStore(root, read_only=True)
    out["read_only"] = [s.runs(), s.get_head("R1").version, s.verify_chain("R1").ok]
    s.close()
except Exception as exc:
    out["read_only"] = f"{type(exc).__name__}: {exc}"
try:
    SQLiteStore(root).close()
    out["read_write"] = "opened"
except Exception as exc:
    out["read_write"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def test_a_read_only_state_folder_opens_read_only_and_names_the_permission_problem(
    store_root: Path,
) -> None:
    """With .keepstep and its files read-only (as another user would see them), a read-only
    open works, and a read-write open says "permission denied" with the path — not "not a
    readable keepstep database"."""
    _project(store_root)
    folders = [store_root, *(p for p in store_root.rglob("*") if p.is_dir())]
    files = [p for p in store_root.rglob("*") if p.is_file()]
    for f in files:
        f.chmod(0o400)
    for d in sorted(folders, key=lambda p: -len(p.parts)):
        d.chmod(0o500)
    try:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), str(store_root)],
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        for d in folders:
            d.chmod(0o700)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["read_only"] == [[RUN], 1, True]
    kind, message = out["read_write"]
    assert kind == "StoragePermissionDenied"
    assert "permission denied" in message and str(store_root) in message
    assert "not a readable keepstep database" not in message
    assert os.access(store_root, os.W_OK)
