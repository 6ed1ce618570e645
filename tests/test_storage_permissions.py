"""State is private whatever the umask: folders 0700, files 0600, sealed files 0400."""

from __future__ import annotations

import os
import sqlite3
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore, backup, restore


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: any mode left to it would be world-readable."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _project(project: Path) -> SQLiteStore:
    s = SQLiteStore(project / ".keepstep")
    s.create_run("R1", {"plan": "p"})
    c = s.claim("R1", "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    entries = [s.artifacts.stage("R1", c.attempt_id, name, b"{}", media_type="application/json",
                                 producer_version="test", created_at="2024-01-01T00:00:00Z")
               for name in ("out.json", "calls/r1-001.json")]
    s.commit_checkpoint("R1", "main", 0, {"unit:U1": {"attempt": c.attempt_id}}, entries,
                        c.fencing_token, unit="U1", attempt_id=c.attempt_id,
                        current={"U1": c.attempt_id})
    s.artifacts.seal(entries[:1])
    return s


def test_state_folder_database_and_artifacts_are_private(tmp_path: Path,
                                                         open_umask: None) -> None:
    """.keepstep and every artifact folder are 0700; state.db, -wal and -shm 0600; a staged
    file 0600 and a sealed one 0400."""
    s = _project(tmp_path)
    state = tmp_path / ".keepstep"
    try:
        assert _mode(state) == 0o700
        for suffix in ("", "-wal", "-shm"):
            assert _mode(state / f"state.db{suffix}") == 0o600, suffix
        folders = [state / "artifacts", *(p for p in (state / "artifacts").rglob("*")
                                          if p.is_dir())]
        assert len(folders) == 5  # artifacts, run, unit, attempt, calls
        assert {_mode(d) for d in folders} == {0o700}
        attempt = state / "artifacts" / "R1" / "U1" / "a1"
        assert _mode(attempt / "out.json") == 0o400
        assert _mode(attempt / "calls" / "r1-001.json") == 0o600
    finally:
        s.close()


def test_opening_an_existing_world_readable_state_tightens_it(tmp_path: Path) -> None:
    """A state folder and database left 0755/0644 by an older keepstep become 0700/0600."""
    _project(tmp_path).close()
    state = tmp_path / ".keepstep"
    state.chmod(0o755)
    (state / "state.db").chmod(0o644)
    SQLiteStore(state).close()
    assert (_mode(state), _mode(state / "state.db")) == (0o700, 0o600)


def test_backups_and_restored_state_are_private(tmp_path: Path, open_umask: None) -> None:
    """A backup folder (0700 folders, 0600 files), a backup zip (0600) and a restored
    .keepstep (0700, database 0600, committed files 0400)."""
    _project(tmp_path / "p").close()
    folder = tmp_path / "backup"
    backup(tmp_path / "p", folder)
    assert {_mode(p) for p in [folder, *folder.rglob("*")] if p.is_dir()} == {0o700}
    assert {_mode(p) for p in folder.rglob("*") if p.is_file()} == {0o600}
    zipped = tmp_path / "backup.zip"
    backup(tmp_path / "p", zipped)
    assert _mode(zipped) == 0o600
    with zipfile.ZipFile(zipped) as zf:
        assert {(i.external_attr >> 16) & 0o777 for i in zf.infolist()} == {0o600}
    restore(zipped, tmp_path / "q")
    state = tmp_path / "q" / ".keepstep"
    assert _mode(state) == 0o700 and _mode(state / "state.db") == 0o600
    assert {_mode(p) for p in (state / "artifacts").rglob("*") if p.is_file()} == {0o400}
    assert {_mode(p) for p in (state / "artifacts").rglob("*") if p.is_dir()} == {0o700}


def test_the_copy_taken_before_a_migration_is_private(tmp_path: Path, open_umask: None) -> None:
    """The verified backup an older database gets before migrating is 0600."""
    _project(tmp_path).close()
    db = tmp_path / ".keepstep" / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    s = SQLiteStore(db.parent)
    try:
        assert s.migrated_from_backup is not None
        assert _mode(s.migrated_from_backup) == 0o600
    finally:
        s.close()
