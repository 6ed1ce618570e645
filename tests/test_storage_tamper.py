"""Tampering with the database or the artifact files is detected and located."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from keepstep.storage import ArtifactEntry, SQLiteStore

RUN = "R1"


@pytest.fixture
def chain(store: SQLiteStore) -> SQLiteStore:
    """A run with checkpoints 0..3 on main, each of 1..3 committing one artifact."""
    store.create_run(RUN, {"plan": "plan-v1"})
    for v in range(1, 4):
        unit = f"U{v}"
        claim = store.claim(RUN, "main", unit, expected_version=v - 1, owner="t",
                            lease_seconds=60)
        entry = store.artifacts.stage(RUN, claim.attempt_id, "out.json", f'{{"v":{v}}}'.encode(),
                                      media_type="application/json", producer_version="t",
                                      created_at="2024-01-01T00:00:00+00:00")
        store.commit_checkpoint(RUN, "main", v - 1, {f"unit/{unit}": v}, [entry],
                                claim.fencing_token, unit=unit, attempt_id=claim.attempt_id)
        store.artifacts.seal([entry])
    assert store.verify_chain(RUN).ok and store.verify_head(RUN).ok
    return store


@contextmanager
def raw_db(store: SQLiteStore) -> Iterator[sqlite3.Connection]:
    """A plain connection that bypasses keepstep, the way a hand edit would."""
    conn = sqlite3.connect(store.db_path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        yield conn
    finally:
        conn.close()


def _versions(report) -> set[int]:
    return {p.version for p in report.problems}


def test_an_edited_checkpoint_delta_is_reported_at_its_version(chain: SQLiteStore) -> None:
    """Rewriting one checkpoint's delta makes verify_chain fail at exactly that version."""
    with raw_db(chain) as conn:
        conn.execute("UPDATE checkpoints SET delta = ? WHERE run_id = ? AND version = 2",
                     ['{"unit/U2":999}', RUN])
    report = chain.verify_chain(RUN)
    assert not report.ok
    assert _versions(report) == {2}
    assert any("edited" in p.problem for p in report.problems)


def test_an_edited_state_hash_is_reported_at_its_version(chain: SQLiteStore) -> None:
    """Rewriting a stored state hash is caught by the row hash and by the delta replay."""
    with raw_db(chain) as conn:
        conn.execute("UPDATE checkpoints SET state_hash = ? WHERE run_id = ? AND version = 1",
                     ["f" * 64, RUN])
    report = chain.verify_chain(RUN)
    # The replay re-synchronises on the stored (forged) hash, so the next link may be flagged
    # too; the break itself is the lowest reported version, and only that row reads "edited".
    assert min(_versions(report)) == 1
    assert [p.version for p in report.problems if "edited" in p.problem] == [1]


def test_a_deleted_parent_checkpoint_is_reported_where_the_chain_breaks(
    chain: SQLiteStore,
) -> None:
    """Deleting a middle checkpoint row is reported as missing at that version."""
    with raw_db(chain) as conn:
        conn.execute("DELETE FROM checkpoints WHERE run_id = ? AND version = 1", [RUN])
    report = chain.verify_chain(RUN)
    assert not report.ok
    assert _versions(report) == {1}
    assert "missing" in report.problems[0].problem
    assert chain.verify_head(RUN).ok  # the quick check only looks at the head and its parent


def test_a_deleted_head_parent_fails_the_quick_head_check(chain: SQLiteStore) -> None:
    """verify_head reports a head whose parent row is gone."""
    with raw_db(chain) as conn:
        conn.execute("DELETE FROM checkpoints WHERE run_id = ? AND version = 2", [RUN])
    report = chain.verify_head(RUN)
    assert not report.ok
    assert [(p.version, p.problem) for p in report.problems] == [
        (3, "parent checkpoint 2 is missing")
    ]
    assert 2 in _versions(chain.verify_chain(RUN))


def test_a_changed_materialised_state_is_reported_by_verify_head(chain: SQLiteStore) -> None:
    """Editing current_state makes both verify_head and verify_chain fail at the head."""
    with raw_db(chain) as conn:
        changed = conn.execute(
            "UPDATE current_state SET value = '12345' WHERE run_id = ? AND key = 'unit/U1'", [RUN]
        ).rowcount
    assert changed == 1
    head = chain.verify_head(RUN)
    assert not head.ok
    assert [p.version for p in head.problems] == [3]
    assert "materialised state" in head.problems[0].problem
    assert _versions(chain.verify_chain(RUN)) == {3}


def test_a_moved_branch_head_is_reported(chain: SQLiteStore) -> None:
    """A branch pointer whose hash does not match its checkpoint fails verify_head."""
    with raw_db(chain) as conn:
        conn.execute("UPDATE branches SET head_hash = ? WHERE run_id = ?", ["0" * 64, RUN])
    report = chain.verify_head(RUN)
    assert not report.ok
    assert "branch head hash" in report.problems[0].problem
    assert not chain.verify_chain(RUN).ok


def _entry(store: SQLiteStore, unit: str) -> ArtifactEntry:
    (entry,) = store.manifest(RUN, unit=unit)
    return entry


def test_one_changed_byte_in_a_committed_artifact_is_reported_with_both_hashes(
    chain: SQLiteStore,
) -> None:
    """ArtifactStore.verify reports 'changed' with the path, expected and actual sha256."""
    entry = _entry(chain, "U2")
    path = chain.artifacts.path_of(entry)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)  # committed files are sealed read-only
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    (problem,) = chain.artifacts.verify(chain.manifest(RUN))
    assert problem.problem == "changed"
    assert (problem.path, problem.unit, problem.attempt_id) == (entry.path, "U2", entry.attempt_id)
    assert problem.expected_sha256 == entry.sha256
    assert problem.actual_sha256 == hashlib.sha256(bytes(data)).hexdigest()
    assert problem.actual_sha256 != problem.expected_sha256


def test_a_deleted_committed_artifact_is_reported_missing(chain: SQLiteStore) -> None:
    """ArtifactStore.verify reports 'missing' for a committed file that is gone."""
    entry = _entry(chain, "U3")
    Path(chain.artifacts.path_of(entry)).unlink()
    (problem,) = chain.artifacts.verify(chain.manifest(RUN))
    assert (problem.problem, problem.path, problem.expected_sha256) == (
        "missing", entry.path, entry.sha256
    )
    assert problem.actual_sha256 is None


def test_an_edited_row_since_the_last_verification_is_reported_with_its_version(
    chain: SQLiteStore,
) -> None:
    """verify_since_last remembers the verified head; a row edited by SQL among the later
    commits is reported at its version and the remembered version does not move."""
    assert chain.verify_since_last(RUN).verified_version == 3
    for v in range(4, 7):
        chain.commit_checkpoint(RUN, "main", v - 1, {f"k{v}": v})
    with raw_db(chain) as conn:
        conn.execute("UPDATE checkpoints SET delta = ? WHERE run_id = ? AND version = 5",
                     ['{"k5":999}', RUN])
    report = chain.verify_since_last(RUN)
    assert not report.ok and report.verified_version == 3
    assert _versions(report) == {5} and "edited" in report.problems[0].problem
    assert report.checked == 4  # the remembered checkpoint 3 and the three commits after it
    assert not chain.verify_since_last(RUN).ok  # still broken: the break is not forgotten


def test_an_edit_to_the_last_verified_checkpoint_is_caught_too(chain: SQLiteStore) -> None:
    """The remembered checkpoint is re-checked against the hash it had when verified."""
    chain.verify_since_last(RUN)
    with raw_db(chain) as conn:
        conn.execute("UPDATE checkpoints SET delta = ? WHERE run_id = ? AND version = 3",
                     ['{"unit/U3":0}', RUN])
    assert _versions(chain.verify_since_last(RUN)) == {3}
