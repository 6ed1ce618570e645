"""Moving a project's whole state between the SQLite file and a PostgreSQL server.

The two schemas hold the same tables with the same columns (storage/postgres/schema.py
mirrors storage/sqlite/schema.py), so a move is a copy of every row in insertion order,
plus the committed files: into the server's blobs (SQLite -> PostgreSQL) or materialised
into the local artifact folder (PostgreSQL -> SQLite). Every chain is verified before
(refusing a broken one) and after (refusing to point the project at a copy that differs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keepstep.storage.errors import ChainBroken, StorageError
from keepstep.storage.hashing import file_sha256

# Parents before children (foreign keys); the hidden insertion order kept where it matters.
TABLES = ("runs", "branches", "checkpoints", "current_state", "state_meta", "attempts",
          "leases", "fencing", "unit_status", "artifacts", "events", "model_calls", "budgets",
          "approvals", "side_effects", "attempt_counters", "checkpoint_counts",
          "current_attempts", "current_changes", "chain_verified")
ORDER = {"events": "seq", "approvals": "rowid", "model_calls": "rowid",
         "side_effects": "rowid", "artifacts": "rowid"}


@dataclass
class TransferReport:
    runs: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    blobs: int = 0
    files: int = 0
    checked_versions: int = 0


def _verify_all(store: Any, what: str) -> tuple[dict[tuple[str, str], tuple[int, str]], int]:
    heads: dict[tuple[str, str], tuple[int, str]] = {}
    checked = 0
    for run_id in store.runs():
        for b in store.branches(run_id):
            report = store.verify_chain(run_id, b["branch_id"])
            if not report.ok:
                first = report.problems[0]
                raise ChainBroken(
                    f"{what}: run {run_id} branch {b['branch_id']} breaks at version "
                    f"{first.version} ({first.problem}); nothing was moved",
                    hint="run `keepstep verify` and restore from a backup first")
            checked += report.checked
            head = store.get_head(run_id, b["branch_id"])
            heads[(run_id, b["branch_id"])] = (head.version, head.hash)
    return heads, checked


def copy_state(src: Any, dst: Any) -> TransferReport:
    """Copy every row of ``src`` into the empty ``dst`` (both stores of this package) and
    the committed files; verify every chain before and after. Nothing is written to
    ``src``. StorageError when ``dst`` already holds a run; ChainBroken for a broken chain
    (before) or a copy that differs (after)."""
    if dst.runs():
        raise StorageError("the target store already holds runs "
                           f"({', '.join(dst.runs())}); keepstep moves a project only into "
                           "an empty store",
                           hint="use a new database (or an empty project folder)")
    heads, _ = _verify_all(src, "the source store")
    report = TransferReport(runs=src.runs())
    dst_is_server = hasattr(dst, "sync_artifacts")
    src_is_server = hasattr(src, "sync_artifacts")
    blobs: list[tuple[str, int, bytes]] = []
    if src_is_server:  # every committed file present locally first (read from the blobs)
        for run_id in report.runs:
            report.files += src.sync_artifacts(run_id)
    if dst_is_server:
        seen: set[str] = set()
        for run_id in report.runs:
            for entry in src.manifest(run_id):
                if entry.sha256 in seen:
                    continue
                path = src.artifacts.path_of(entry)
                if not path.is_file() or file_sha256(str(path)) != entry.sha256:
                    raise StorageError(
                        f"committed file {entry.path} is missing or changed; nothing was moved",
                        hint="run `keepstep verify` and restore the file from a backup")
                seen.add(entry.sha256)
                data = path.read_bytes()
                blobs.append((entry.sha256, len(data), data))
    tables: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        order = f" ORDER BY {ORDER[table]}" if table in ORDER else ""
        tables[table] = src._q(f"SELECT * FROM {table}{order}")
    with dst._write() as db:
        conn = db.conn
        conn.execute("DELETE FROM fencing")
        for table, rows in tables.items():
            report.rows[table] = len(rows)
            if not rows:
                continue
            cols = list(rows[0])
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(cols)}) "
                f"VALUES ({', '.join('?' * len(cols))})",
                [[r[c] for c in cols] for r in rows])
        if dst_is_server:
            conn.executemany("INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) "
                             "ON CONFLICT (sha256) DO NOTHING", blobs)
            conn.execute("SELECT setval(pg_get_serial_sequence('events', 'seq'), "
                         "GREATEST((SELECT MAX(seq) FROM events), 1))")
    report.blobs = len(blobs)
    after, checked = _verify_all(dst, "the copy")
    if after != heads:
        raise ChainBroken("the copy's heads differ from the source's; the project still "
                          "uses its old store",
                          hint="report this; the source was not changed")
    report.checked_versions = checked
    if not dst_is_server:
        for run_id in report.runs:
            problems = src.artifacts.verify(dst.manifest(run_id))
            if problems:
                raise StorageError(f"committed file {problems[0].path} is "
                                   f"{problems[0].problem} after the move",
                                   hint="report this; the source was not changed")
    return report
