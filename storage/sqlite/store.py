"""SQLiteStore: keepstep's embedded Store, composed of one class per capability."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from keepstep.storage.artifacts import KEPT_MAX, ArtifactStore
from keepstep.storage.hashing import sha256_hex
from keepstep.storage.models import ArtifactEntry
from keepstep.storage.permissions import open_private
from keepstep.storage.sqlite.approvals import Approvals
from keepstep.storage.sqlite.boot import boot_id
from keepstep.storage.sqlite.calls import Calls
from keepstep.storage.sqlite.checkpoints import Checkpoints
from keepstep.storage.sqlite.claims import Claims
from keepstep.storage.sqlite.connection import sqlite_errors
from keepstep.storage.sqlite.database import open_database
from keepstep.storage.sqlite.effects import Effects
from keepstep.storage.sqlite.events import Events
from keepstep.storage.sqlite.manifests import Manifests


class SQLiteStore(Checkpoints, Claims, Events, Calls, Approvals, Effects, Manifests):
    """keepstep's embedded store: ``<root>/state.db`` and ``<root>/artifacts``.

    Safe to share across threads (each thread gets its own connection). Writers take
    ``BEGIN IMMEDIATE``, so the compare-and-swap on a branch head and the fencing-token
    check see the state they change. ``read_only=True`` opens the database with
    ``mode=ro``: no migration, no file created, every write raises
    StoragePermissionDenied. See storage/store.py for what each method guarantees.
    """

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "FULL",
        durable_files: bool = True,
        read_only: bool = False,
    ) -> None:
        self.root = Path(root)
        self.db_path = self.root / "state.db"
        self.clock = clock
        self.read_only = read_only
        self._synchronous = synchronous
        # Small files are staged without syncs: the commit that names them keeps their bytes
        # (``blobs``), covered by its one WAL sync (see storage/artifacts.py).
        self.artifacts = ArtifactStore(self.root / "artifacts", durable=durable_files,
                                       kept_max=KEPT_MAX if boot_id() else 0,
                                       kept=self._kept_before_this_boot)
        db, self.migrated_from_backup = open_database(
            self.db_path, synchronous=synchronous, read_only=read_only,
            artifacts_root=self.artifacts.root)
        self._init_connections(db)

    # -- committed files' bytes ------------------------------------------------------------
    def _kept_bytes(self, manifest: list[ArtifactEntry]) -> list[tuple[str, int, bytes]]:
        """The small files of a commit's manifest (those ``stage`` did not sync), read back
        and checked against their manifest hash. A file that is missing or no longer
        matches is left out: the commit names it as before, and recovery's hash audit of
        current outputs finds it (the engine re-hashes staged files before committing)."""
        rows: dict[str, tuple[str, int, bytes]] = {}
        for entry in manifest:
            if entry.size > self.artifacts.kept_max or entry.sha256 in rows:
                continue
            try:
                data = self.artifacts.path_of(entry).read_bytes()
            except OSError:
                continue
            if sha256_hex(data) == entry.sha256:
                rows[entry.sha256] = (entry.sha256, len(data), data)
        return list(rows.values())

    def _keep_bytes(self, conn: sqlite3.Connection, kept: list[tuple[str, int, bytes]]) -> None:
        # The newest boot wins: what matters is whether the machine restarted since the
        # last commit of these bytes (see _kept_before_this_boot).
        conn.executemany(
            "INSERT INTO blobs (sha256, size, data, boot_id) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (sha256) DO UPDATE SET boot_id = excluded.boot_id",
            [(*row, boot_id() or "") for row in kept])

    def blob(self, sha256: str) -> bytes | None:
        """A committed file's bytes kept in the database, by content hash, or None."""
        row = self._q1("SELECT data FROM blobs WHERE sha256 = ?", [sha256])
        return None if row is None else bytes(row["data"])

    def drop_kept_copies(self, needed: set[str]) -> int:
        """Delete the kept bytes of every sha256 not in ``needed`` (gc: the files they back
        are gone); returns how many were deleted."""
        unneeded = [(r["sha256"],) for r in self._q("SELECT sha256 FROM blobs")
                    if r["sha256"] not in needed]
        if unneeded:
            with self._write() as db:
                db.conn.executemany("DELETE FROM blobs WHERE sha256 = ?", unneeded)
        return len(unneeded)

    def _kept_before_this_boot(self, sha256: str) -> bytes | None:
        """The kept bytes of ``sha256`` when they were last committed before the machine
        restarted, else None. Only an operating-system crash or power cut loses a written
        but unsynced file, and either restarts the machine: a committed file found damaged
        in the boot that committed it was changed by someone, which recovery reports and
        redoes (never papers over by rewriting it)."""
        now = boot_id()
        if now is None:
            return None
        row = self._q1("SELECT data FROM blobs WHERE sha256 = ? AND boot_id != ?",
                       [sha256, now])
        return None if row is None else bytes(row["data"])

    # -- maintenance (SQLite only; not part of the Store interface) -----------------------
    def backup_to(self, target: Path) -> None:
        """A consistent copy (SQLite's online backup API) into a new 0600 file ``target``."""
        os.close(open_private(target, os.O_WRONLY))
        with sqlite_errors(f"backing up the database to {target}", target):
            dst = sqlite3.connect(str(target))
            try:
                self.db.conn.backup(dst)
            finally:
                dst.close()
