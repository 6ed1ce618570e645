"""Backup, restore and garbage collection of a project's state (thin wrappers over storage).

The storage layer does the work and returns pydantic reports; these functions only
supply what the engine knows: the project's open store, its root and its clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from keepstep.storage import BackupReport, GcReport, RestoreReport, backup, gc, restore

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Project


def backup_project(project: Project, out: str | Path) -> BackupReport:
    """Back up the project's state (database + committed artifacts) to a folder or a .zip.

    Safe while a run is going: the database is copied through SQLite's online backup API.
    """
    return backup(project.root, Path(out), now=project.clock(), store=project.store)


def restore_project(path: str | Path, into: str | Path, *, force: bool = False) -> RestoreReport:
    """Verify a backup completely, then restore it into ``<into>/.keepstep``.

    Raises ``RestoreRefused`` (nothing written) when the backup does not verify or the
    target state folder is not empty (unless ``force``). ``into`` is usually a copy of
    the project folder: backups do not hold the project files. Resume the run afterwards;
    recovery redoes any unit the report lists in ``units_to_redo``.
    """
    return restore(Path(path), Path(into), force=force)


def gc_project(project: Project, older_than_days: float, *,
               now: float | None = None) -> GcReport:
    """Delete attempt folders past the window that nothing needs; strip old event payloads."""
    return gc(project.root, older_than_days, project.clock() if now is None else now,
              store=project.store)


__all__ = ["backup_project", "gc_project", "restore_project"]
