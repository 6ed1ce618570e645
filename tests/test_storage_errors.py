"""sqlite3 errors never leave storage: busy, an uncertain COMMIT and damage get storage errors."""

from __future__ import annotations

import ast
import os
import sqlite3
from pathlib import Path

import pytest

from keepstep.storage import (
    CommitOutcomeUnknown,
    CorruptDatabase,
    DiskFull,
    SQLiteStore,
    StorageBusy,
    StorageError,
)

RUN = "R1"


@pytest.fixture
def run_store(store_root: Path):
    s = SQLiteStore(store_root)
    s.create_run(RUN, {"plan": "plan-v1"})
    yield s
    s.close()


def test_a_database_locked_past_the_busy_timeout_raises_storage_busy(
    run_store: SQLiteStore, store_root: Path
) -> None:
    """Another writer holding the lock past the timeout gives StorageBusy; nothing is written."""
    run_store.db.conn.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(store_root / "state.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StorageBusy) as info:
            run_store.commit_checkpoint(RUN, "main", 0, {"x": 1})
        assert "locked" in str(info.value) and info.value.hint
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert run_store.get_head(RUN).version == 0
    assert run_store.commit_checkpoint(RUN, "main", 0, {"x": 1}) == 1


class _FailingCommit:
    """A connection whose COMMIT statement fails, as with an I/O error at the last step."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def execute(self, sql: str, *args):
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)


def test_a_failing_commit_statement_raises_commit_outcome_unknown(
    run_store: SQLiteStore,
) -> None:
    """When COMMIT itself fails the caller is told the outcome is unknown (and to read the
    head); here SQLite rolled back, and the head says so."""
    db = run_store.db
    real = db.conn
    db.conn = _FailingCommit(real)  # type: ignore[assignment]
    try:
        with pytest.raises(CommitOutcomeUnknown) as info:
            run_store.commit_checkpoint(RUN, "main", 0, {"x": 1})
    finally:
        db.conn = real
    assert "read the branch head" in str(info.value)
    assert not real.in_transaction
    assert run_store.get_head(RUN).version == 0


def test_a_damaged_table_raises_corrupt_database_on_read_and_write(store_root: Path) -> None:
    """Malformed pages met after opening raise CorruptDatabase, never a sqlite3 error."""
    store = SQLiteStore(store_root)
    store.create_run(RUN, {f"k{i}": "x" * 200 for i in range(300)})
    store.close()
    db_path = store_root / "state.db"
    raw = sqlite3.connect(db_path)
    try:
        pages = [r[0] for r in raw.execute(
            "SELECT pageno FROM dbstat WHERE name = 'current_state'")]
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    finally:
        raw.close()
    with open(db_path, "r+b") as fh:
        for page in pages:
            fh.seek((page - 1) * page_size)
            fh.write(os.urandom(page_size))
    store = SQLiteStore(store_root)
    try:
        with pytest.raises(CorruptDatabase):
            store.read_state(RUN)
        with pytest.raises(CorruptDatabase):
            store.commit_checkpoint(RUN, "main", 0, {"k1": 1})
    finally:
        store.close()


def test_other_sqlite_errors_become_storage_errors(run_store: SQLiteStore) -> None:
    """Any other sqlite3 error leaves the store as a plain StorageError naming the cause."""
    with pytest.raises(StorageError, match="no such table"):
        run_store._q("SELECT * FROM no_such_table")


def test_no_engine_or_app_module_imports_sqlite3() -> None:
    """Only storage/ talks to sqlite3; the layers above see storage errors."""
    repo = Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("engine", "app"):
        for path in sorted((repo / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n == "sqlite3" or n.startswith("sqlite3.") for n in names):
                    offenders.append(str(path.relative_to(repo)))
    assert offenders == []


def test_every_storage_error_shares_the_one_keepstep_error_base_and_hint_format() -> None:
    """StorageError and its subclasses are KeepstepErrors (the engine's base is the same
    class); the hint follows the message on its own line after "  → "."""
    import inspect

    import keepstep.storage.errors as errors
    from keepstep.engine.errors import KeepstepError as EngineBase

    assert EngineBase is errors.KeepstepError
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, Exception) and c.__module__ == errors.__name__]
    assert all(issubclass(c, errors.StorageError) for c in classes
               if c is not errors.KeepstepError)
    err = errors.StorageBusy("the database stayed locked")
    assert str(err) == "the database stayed locked\n  → " + errors.StorageBusy.hint
    assert err.message == "the database stayed locked"
    assert str(errors.NotFound("no run R")) == "no run R"
    assert " — " not in str(errors.CheckpointConflict("head moved"))


def test_a_full_disk_during_a_write_is_named_with_where_to_free_space(
    run_store: SQLiteStore, store_root: Path
) -> None:
    """SQLite's "database or disk is full" becomes DiskFull: the disk is full at <path>,
    free space on <mount point>, then `keepstep resume`; nothing is written."""
    run_store.db.conn.execute("PRAGMA max_page_count = 1")  # every new page is "disk full"
    with pytest.raises(DiskFull) as info:
        run_store.commit_checkpoint(RUN, "main", 0, {f"k{i}": "x" * 500 for i in range(50)})
    message = str(info.value)
    assert f"the disk is full at {store_root / 'state.db'}" in message
    assert "free space on /" in message and "then run `keepstep resume`" in message
    assert "never assume" not in message
    assert run_store.get_head(RUN).version == 0


def test_a_full_disk_at_commit_still_says_the_outcome_must_be_read(
    run_store: SQLiteStore,
) -> None:
    """A COMMIT that fails for lack of space stays CommitOutcomeUnknown, worded as advice:
    free space, then `keepstep resume` (which reads the branch head to learn the outcome)."""
    db = run_store.db
    real = db.conn

    class FullAtCommit(_FailingCommit):
        def execute(self, sql: str, *args):
            if sql == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return real.execute(sql, *args)

    db.conn = FullAtCommit(real)  # type: ignore[assignment]
    try:
        with pytest.raises(CommitOutcomeUnknown) as info:
            run_store.commit_checkpoint(RUN, "main", 0, {"x": 1})
    finally:
        db.conn = real
    message = str(info.value)
    assert "the disk is full at" in message and "free space on" in message
    assert "keepstep resume" in message and "branch head" in message
    assert run_store.get_head(RUN).version == 0
