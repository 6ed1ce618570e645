"""SQLiteStore: keepstep's embedded Store, composed of one class per capability."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.permissions import open_private
from keepstep.storage.sqlite.approvals import Approvals
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
        self.artifacts = ArtifactStore(self.root / "artifacts", durable=durable_files)
        db, self.migrated_from_backup = open_database(
            self.db_path, synchronous=synchronous, read_only=read_only,
            artifacts_root=self.artifacts.root)
        self._init_connections(db)

    def wait_for_change(self, run_id: str, timeout: float) -> bool:
        """SQLite cannot tell another process's commit as it happens: waits out the
        timeout (the caller then reads again, as after any poll)."""
        time.sleep(max(0.0, timeout))
        return False

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
