"""The SQLite backend's fast paths of issue 24 give exactly what the slow ones gave: the
checkpoint hash written field by field, and the manifest read by attempt or by unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore
from keepstep.storage.hashing import canonical_json, sha256_hex
from keepstep.storage.sqlite.chain import HASHED_FIELDS, checkpoint_hash, checkpoint_hash_encoded

RUN = "R1"
ROWS = [
    {"run_id": "R1", "branch_id": "main", "version": 3, "parent_branch": "main",
     "parent_version": 2, "parent_hash": "ab" * 32, "kind": "unit-success",
     "schema_version": 7, "unit": "U1", "attempt": "U1/a2", "fencing_token": 12,
     "state_hash": "cd" * 32, "created_at": "2030-01-01T00:00:00+00:00"},
    {"run_id": "Rün \"quoted\" \u2028 \x01 \\ /", "branch_id": "b-ä", "version": 0,
     "parent_branch": None, "parent_version": None, "parent_hash": "", "kind": "genesis",
     "schema_version": 1, "unit": None, "attempt": None, "fencing_token": None,
     "state_hash": "0" * 64, "created_at": "x"},
]
DELTAS = [{}, {"unit/U1": {"state": "succeeded", "é": [1, 2.5, None, True]}, "k": None},
          {"emoji": "🙂", "ctl": "\t\n"}]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("delta", DELTAS)
def test_the_field_by_field_checkpoint_hash_is_canonical_json(row: dict, delta: dict) -> None:
    expected = sha256_hex(canonical_json({**{k: row[k] for k in HASHED_FIELDS},
                                          "delta": delta}))
    assert checkpoint_hash_encoded(row, canonical_json(delta)) == expected
    assert checkpoint_hash({**row, "delta": delta}) == expected


def test_the_manifest_by_attempt_and_by_unit_is_what_the_full_listing_holds(
        tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / ".keepstep")
    try:
        store.create_run(RUN, {})
        head = 0
        for i in range(6):
            unit = f"U{i % 2}"
            claim = store.claim(RUN, "main", unit, expected_version=head, owner="o",
                                lease_seconds=60)
            entries = [store.artifacts.stage(RUN, claim.attempt_id, name, b"%d" % i,
                                             media_type="text/plain", producer_version="t",
                                             created_at="t") for name in ("b.txt", "a.txt")]
            head = store.commit_checkpoint(RUN, "main", head, {unit: i}, entries,
                                           claim.fencing_token, unit=unit,
                                           attempt_id=claim.attempt_id)
        everything = store.manifest(RUN)
        assert [(e.unit, e.attempt_id, e.name) for e in everything] == sorted(
            (e.unit, e.attempt_id, e.name) for e in everything)
        for unit in ("U0", "U1"):
            assert store.manifest(RUN, unit=unit) == [e for e in everything if e.unit == unit]
        for attempt in ("U0/a1", "U1/a3", "U1/a9"):
            want = [e for e in everything if e.attempt_id == attempt]
            assert store.manifest(RUN, attempt_id=attempt) == want
            assert store.manifest(RUN, unit=attempt[:2], attempt_id=attempt) == want
        assert store.manifest(RUN, unit="U0", attempt_id="U1/a2") == []
    finally:
        store.close()
