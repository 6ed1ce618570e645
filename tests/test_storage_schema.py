"""Opening the database: schema version, too-new refusal, migration with backup, corruption."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlite_utils import Database, Migrations

import keepstep.storage.sqlite.database as storage_db
from keepstep.storage import (
    SCHEMA_VERSION,
    CorruptDatabase,
    SchemaMigrationFailed,
    SchemaTooNew,
    SQLiteStore,
)
from keepstep.storage.sqlite.schema import MIGRATION_SET, migrations


def _registered() -> list[str]:
    return [m.name for m in migrations.pending(Database(memory=True))]


def _fingerprint(db_path: Path) -> dict[str, str | None]:
    """sha256 of the database file and of its -wal (None when absent or empty).

    SQLite's read-only open of a WAL database may create an empty -wal (and a -shm index);
    an empty log holds no frames, so it counts as absent.
    """
    out: dict[str, str | None] = {}
    for suffix in ("", "-wal"):
        p = Path(f"{db_path}{suffix}")
        data = p.read_bytes() if p.exists() else b""
        out[suffix or "db"] = hashlib.sha256(data).hexdigest() if data else None
    return out


@pytest.fixture
def db_path(store_root: Path) -> Path:
    """A closed, current-version project database holding one run."""
    s = SQLiteStore(store_root)
    s.create_run("R1", {"k": 1})
    s.close()
    return store_root / "state.db"


def test_schema_version_matches_migrations_and_user_version(store: SQLiteStore) -> None:
    """SCHEMA_VERSION = number of registered migrations = PRAGMA user_version of a fresh db."""
    assert SCHEMA_VERSION == len(_registered())
    assert store.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    applied = [r[0] for r in store.db.conn.execute(
        "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid",
        [MIGRATION_SET])]
    assert applied == _registered()
    store.create_run("R1", {})
    assert store.get_checkpoint("R1", 0).schema_version == SCHEMA_VERSION


def test_reopening_a_current_database_takes_no_backup(db_path: Path) -> None:
    """A database already at SCHEMA_VERSION opens as is: no migration, no backup file."""
    s = SQLiteStore(db_path.parent)
    try:
        assert s.migrated_from_backup is None
        assert s.runs() == ["R1"]
    finally:
        s.close()
    assert not list(db_path.parent.glob("*.bak"))


@pytest.mark.parametrize("wal_open", [False, True], ids=["checkpointed", "with-wal"])
def test_a_newer_user_version_raises_schema_too_new_and_leaves_the_file(
    db_path: Path, wal_open: bool
) -> None:
    """A database stamped by a newer keepstep is refused, naming both versions, bytes unchanged."""
    newer = SCHEMA_VERSION + 1
    writer = sqlite3.connect(db_path, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute(f"PRAGMA user_version = {newer}")
    if not wal_open:
        writer.close()
    try:
        if wal_open:
            assert Path(f"{db_path}-wal").stat().st_size > 0
        before = _fingerprint(db_path)
        with pytest.raises(SchemaTooNew) as info:
            SQLiteStore(db_path.parent)
        message = str(info.value)
        assert f"schema version {newer}" in message
        assert f"supports up to {SCHEMA_VERSION}" in message
        assert "not modified" in message
        assert _fingerprint(db_path) == before
    finally:
        writer.close()


def test_an_unknown_applied_migration_raises_schema_too_new(db_path: Path) -> None:
    """A migration name this code does not know means a newer schema: refused, file unchanged."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
                 "VALUES (?, 'm999_from_the_future', '2099-01-01')", [MIGRATION_SET])
    conn.close()
    before = _fingerprint(db_path)
    with pytest.raises(SchemaTooNew, match="m999_from_the_future"):
        SQLiteStore(db_path.parent)
    assert _fingerprint(db_path) == before


def _next_version_migrations(*, fail: bool = False) -> Migrations:
    """A test-local copy of the real migrations plus one more (nothing registered globally)."""
    local = Migrations(MIGRATION_SET)
    for m in migrations.pending(Database(memory=True)):
        local(name=m.name, transactional=m.transactional)(m.fn)
    newer = SCHEMA_VERSION + 1

    @local(name=f"m{newer:03d}_test_notes")
    def add_test_notes(db: Database) -> None:
        db.execute("CREATE TABLE test_notes (id INTEGER PRIMARY KEY, note TEXT)")
        if fail:
            raise RuntimeError(f"boom in migration {newer}")
        db.execute(f"PRAGMA user_version = {newer}")

    return local


def test_an_older_database_is_migrated_after_a_verified_backup(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Meeting an older schema, open takes a checked backup copy, then migrates the original."""
    monkeypatch.setattr(storage_db, "migrations", _next_version_migrations())
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    s = SQLiteStore(db_path.parent)
    try:
        backup = s.migrated_from_backup
        assert s.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert s.db.conn.execute("SELECT COUNT(*) FROM test_notes").fetchone()[0] == 0
        assert s.runs() == ["R1"]
    finally:
        s.close()
    assert backup is not None and backup.exists() and backup.parent == db_path.parent
    copy = sqlite3.connect(backup)
    try:
        assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert copy.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert copy.execute("SELECT run_id FROM runs").fetchall() == [("R1",)]
        assert not copy.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'test_notes'").fetchall()
    finally:
        copy.close()
    assert len(_registered()) == SCHEMA_VERSION  # the global set was not touched


def test_a_failing_migration_rolls_back_and_keeps_the_backup(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that raises leaves the original at its old version and says where the copy is."""
    monkeypatch.setattr(storage_db, "migrations", _next_version_migrations(fail=True))
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(SchemaMigrationFailed, match="boom in migration") as info:
        SQLiteStore(db_path.parent)
    assert ".bak" in str(info.value)
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'test_notes'").fetchall()
    finally:
        conn.close()
    assert len(list(db_path.parent.glob(f"state.db.v{SCHEMA_VERSION}-*.bak"))) == 1


def test_a_garbage_file_raises_corrupt_database(store_root: Path) -> None:
    """A state.db that is not SQLite raises CorruptDatabase naming the file and what to do."""
    store_root.mkdir(parents=True)
    path = store_root / "state.db"
    path.write_bytes(b"this is not a database, just some bytes\n" * 200)
    before = _fingerprint(path)
    with pytest.raises(CorruptDatabase) as info:
        SQLiteStore(store_root)
    message = str(info.value)
    assert str(path) in message
    assert "not a readable keepstep database" in message
    assert "restore" in message  # the hint says what to do next
    assert _fingerprint(path) == before


def _pragmas(conn: sqlite3.Connection) -> tuple:
    return tuple(conn.execute(f"PRAGMA {p}").fetchone()[0]
                 for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout"))


def test_connections_use_wal_full_sync_foreign_keys_and_busy_timeout(store: SQLiteStore) -> None:
    """Every connection (the opener's and each thread's own) has keepstep's pragmas in effect."""
    expected = ("wal", 2, 1, storage_db.BUSY_TIMEOUT_MS)
    assert _pragmas(store.db.conn) == expected
    seen: list[tuple] = []
    t = threading.Thread(target=lambda: seen.append(_pragmas(store.db.conn)))
    t.start()
    t.join()
    assert seen == [expected]


_OPENER = """
import sys
from pathlib import Path
from keepstep.storage import SQLiteStore
print("ready", flush=True)
sys.stdin.readline()
store = SQLiteStore(Path(sys.argv[1]))
print(store.db.conn.execute("PRAGMA user_version").fetchone()[0], flush=True)
store.close()
"""


def test_processes_opening_a_fresh_project_at_once_all_succeed(tmp_path: Path) -> None:
    """Concurrent first opens create the schema once; none fails with 'table already exists'."""
    for trial in range(4):
        root = tmp_path / f"p{trial}" / ".keepstep"
        procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(root)], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for _ in range(4)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert out.strip() == str(SCHEMA_VERSION)
        conn = sqlite3.connect(root / "state.db")
        try:
            names = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations")]
        finally:
            conn.close()
        assert names == _registered()


def test_m004_backfills_current_pointers_from_the_records_already_committed(
    store_root: Path,
) -> None:
    """A schema-3 database gets its current pointers and their history from the unit
    records committed before the migration (succeeded = current, anything else = not)."""
    s = SQLiteStore(store_root)
    s.create_run("R1", {"plan": "p"})
    ok = {"state": "succeeded", "attempt": "U1/a1", "outputs": {}}
    s.commit_checkpoint("R1", "main", 0, {"unit:U1": ok})
    s.commit_checkpoint("R1", "main", 1, {"unit:U2": {**ok, "attempt": "U2/a1"}})
    s.commit_checkpoint("R1", "main", 2, {"unit:U1": {**ok, "state": "invalidated"},
                                          "unit:U3": {**ok, "attempt": "U3/a2"}})
    s.close()
    conn = sqlite3.connect(store_root / "state.db", isolation_level=None)
    for table in ("current_attempts", "current_changes", "chain_verified"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name LIKE 'm004%'")
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    s = SQLiteStore(store_root)
    try:
        assert s.migrated_from_backup is not None
        assert s.current_attempts("R1") == {"U2": "U2/a1", "U3": "U3/a2"}
        assert [(c.version, c.unit, c.attempt_id) for c in s.current_history("R1")] == [
            (1, "U1", "U1/a1"), (2, "U2", "U2/a1"), (3, "U1", None), (3, "U3", "U3/a2")]
        assert s.verify_chain("R1").ok
    finally:
        s.close()
