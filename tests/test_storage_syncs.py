"""Durable syncs per unit, and what a power cut between a claim and its commit leaves.

A unit is claim -> stage -> commit. The claim commits without a sync of its own (the commit,
or a model call's reservation, syncs the log with it); a staged file costs one fsync (of the
file after its rename: bytes and name); the commit is one synced SQLite transaction.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore

RUN = "R1"


class SyncCounter:
    """Counts file fsyncs (every os.fsync: files and folders) and SQLite commits made with
    synchronous=FULL (each one syncs the write-ahead log) on the store's connection."""

    def __init__(self) -> None:
        self.files = 0
        self.commits = 0
        self._sync = "FULL"

    def trace(self, sql: str) -> None:
        if sql.startswith("PRAGMA synchronous = "):
            self._sync = sql.rsplit("= ", 1)[1].upper()
        elif sql == "COMMIT" and self._sync == "FULL":
            self.commits += 1

    @property
    def total(self) -> int:
        return self.files + self.commits


@pytest.fixture
def counted(store_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        tuple[SQLiteStore, SyncCounter]]:
    store = SQLiteStore(store_root)
    store.create_run(RUN, {"plan": "p"})
    counter = SyncCounter()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        counter.files += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.db.conn.set_trace_callback(counter.trace)
    yield store, counter
    store.db.conn.set_trace_callback(None)
    store.close()


def _unit(store: SQLiteStore, i: int, calls: int) -> None:
    unit = f"U{i:03d}"
    claim = store.claim(RUN, "main", unit, expected_version=i, owner="t", lease_seconds=60)
    entries = []
    for c in range(calls):
        call = store.reserve_call(RUN, branch_id="main", unit=unit, attempt_id=claim.attempt_id,
                                  round=1, model="m", request_hash=f"h{c}",
                                  budget_delta={"calls": 1})
        entries.append(store.artifacts.stage(RUN, claim.attempt_id, f"calls/r1-{c:03d}.json",
                                             b"{}", media_type="application/json",
                                             producer_version="t", created_at="t"))
        store.settle_call(call, tokens_in=1, tokens_out=1, cost=0.0, latency_ms=1,
                          outcome="ok")
    entries.append(store.artifacts.stage(RUN, claim.attempt_id, "out.json", b'{"x": 1}',
                                         media_type="application/json", producer_version="t",
                                         created_at="t"))
    store.commit_checkpoint(RUN, "main", i, {f"unit:{unit}": {"a": claim.attempt_id}}, entries,
                            claim.fencing_token, unit=unit, attempt_id=claim.attempt_id,
                            current={unit: claim.attempt_id}, usage={"wall_time_s": 0.1})


@pytest.mark.parametrize(("calls", "per_unit"), [(0, 2), (1, 4), (3, 8)])
def test_durable_syncs_per_unit(counted: tuple[SQLiteStore, SyncCounter], calls: int,
                                per_unit: int) -> None:
    """A unit with no model call: 2 syncs (its file, its commit; the claim rides on the
    commit). Each model call adds its reservation and its recorded response (the settlement
    rides on the next sync). Unit folders are prepared once, outside the count."""
    store, counter = counted
    n = 12
    store.artifacts.prepare_units(RUN, [f"U{i:03d}" for i in range(n)])
    counter.files = counter.commits = 0
    for i in range(n):
        _unit(store, i, calls)
    assert counter.files == n * (1 + calls)
    assert counter.commits == n * (1 + calls)
    assert counter.total == n * per_unit
    assert store.get_head(RUN).version == n


def _snapshot(db: Path, to: Path) -> None:
    src, dst = sqlite3.connect(db), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def test_a_claim_lost_with_a_power_cut_leaves_its_folder_set_aside(store_root: Path) -> None:
    """A power cut after a claim staged its file (synced) but before any durable commit: the
    database comes back without the claim, the attempt's folder with its file. The next
    claim takes the same attempt id; the leftover folder is moved aside (named, recorded in
    an event, listed as an orphan for recovery to quarantine), the new attempt stages and
    commits its own file, and nothing is overwritten."""
    store = SQLiteStore(store_root)
    store.create_run(RUN, {"plan": "p"})
    store.artifacts.prepare_units(RUN, ["U1"])
    db = store.db_path
    before_claim = store_root / "before-claim.db"
    _snapshot(db, before_claim)
    lost = store.claim(RUN, "main", "U1", expected_version=0, owner="t", lease_seconds=60)
    store.artifacts.stage(RUN, lost.attempt_id, "out.json", b'"lost"',
                          media_type="application/json", producer_version="t", created_at="t")
    store.close()
    # The power cut: what was never synced (the claim in the log) is gone; the file is not.
    shutil.copyfile(before_claim, db)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)

    store = SQLiteStore(store_root)
    try:
        assert store.attempts(RUN) == []
        claim = store.claim(RUN, "main", "U1", expected_version=0, owner="t", lease_seconds=60)
        assert claim.attempt_id == lost.attempt_id == "U1/a1"
        aside = f"U1/a1.lost-t{claim.fencing_token}"
        [event] = [e for e in store.events(RUN) if e.kind == "attempt.set_aside"]
        assert event.attempt_id == "U1/a1" and event.payload["folder"] == aside
        unit_dir = store.artifacts.root / RUN / "U1"
        assert (unit_dir / aside.split("/")[1] / "out.json").read_bytes() == b'"lost"'
        assert not store.artifacts.attempt_dir(RUN, claim.attempt_id).exists()
        entry = store.artifacts.stage(RUN, claim.attempt_id, "out.json", b'"new"',
                                      media_type="application/json", producer_version="t",
                                      created_at="t")
        store.commit_checkpoint(RUN, "main", 0, {"unit:U1": 1}, [entry], claim.fencing_token,
                                unit="U1", attempt_id=claim.attempt_id)
        assert store.artifacts.read(entry) == b'"new"' and store.artifacts.verify([entry]) == []
        [orphan] = store.orphaned_attempts(RUN)
        assert (orphan.attempt_id, orphan.files, orphan.has_row) == (aside, ["out.json"], False)
    finally:
        store.close()
