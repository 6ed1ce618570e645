"""The one error base of keepstep, and the storage errors built on it.

``KeepstepError`` lives here, in the lowest layer, so that the engine and storage
share it (engine/errors.py re-exports it). Every error a user can cause or see is a
KeepstepError: a message, and a hint saying what to do next. This module imports
nothing from keepstep, so importing it loads no backend.
"""

from __future__ import annotations

import os
from pathlib import Path

HINT_PREFIX = "\n  → "


class KeepstepError(Exception):
    """Base of every keepstep error a user can cause or see: a message and what to do next.

    ``str(err)`` is the message, then (when there is a hint) a new line holding
    ``"  → <hint>"``; ``err.message`` is the message alone.
    """

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    @property
    def message(self) -> str:
        """The first line of the message, without the hint."""
        return (str(self.args[0]) if self.args else "").split("\n", 1)[0]

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}{HINT_PREFIX}{self.hint}" if self.hint else base


class StorageError(KeepstepError):
    """Base of every error raised by keepstep.storage."""


class CheckpointConflict(StorageError):
    """The branch head moved since the caller read it (compare-and-swap failed)."""

    hint = "re-read the head and decide again; staged files of this attempt stay an orphan"


class StaleFencingToken(StorageError):
    """The caller's lease was taken over; its token is no longer current."""

    hint = "this executor lost its lease: stop, and leave its staged output as an orphan"


class LeaseHeld(StorageError):
    """Another executor holds a live lease on the unit."""

    hint = "wait for the lease to expire (or for that executor to finish), then resume"


class BudgetLimitReached(StorageError):
    """A conditional budget increment would pass a limit; nothing was recorded.

    ``figures`` maps each counter over its limit to ``{"used", "requested", "limit"}``.
    """

    def __init__(self, message: str, figures: dict[str, dict[str, float]]):
        super().__init__(message)
        self.figures = figures


class ApprovalRefused(StorageError):
    """A decision, revocation or token use was refused; nothing was written.

    ``code`` is one of: ``no-request`` (no such request for that run and gate),
    ``not-open`` (the request is no longer ``requested``), ``not-decided``,
    ``token-unknown``, ``token-other`` (issued for another run or gate),
    ``token-used``, ``token-expired``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SchemaTooNew(StorageError):
    """The database was written by a newer keepstep than this one."""

    hint = "upgrade keepstep (pip install -U keepstep); the database was not modified"


class SchemaMigrationFailed(StorageError):
    """Migrating an older database failed; the original is kept untouched."""


class SchemaNeedsMigration(StorageError):
    """A read-only open met a database written by an older keepstep (nothing was changed)."""

    hint = ("run a command that writes (for example `keepstep resume`) once to bring the "
            "database up to date; a verified backup is taken first")


class StorageBusy(StorageError):
    """The database stayed locked by another writer for the whole busy timeout.

    Nothing was written by the call that raised it.
    """

    hint = "another keepstep process is writing to this project; wait for it, then retry"


class CommitOutcomeUnknown(StorageError):
    """The COMMIT statement itself failed: the transaction may or may not be durable.

    A caller must not treat this as "failed": it reads the head (or the attempt's
    status) to learn whether the commit landed before retrying anything.
    """

    hint = ("keepstep cannot tell yet whether the last change was saved: run `keepstep "
            "status` to read the branch head and learn whether the commit landed, then "
            "`keepstep resume` — do not redo the work by hand")


class DiskFull(StorageError):
    """The disk holding the project is full; the write that raised it did not happen
    (for a COMMIT, see CommitOutcomeUnknown: ``disk_full_at_commit``)."""


class StoragePermissionDenied(StorageError):
    """The project's state folder or database cannot be read or written by this user."""


class CorruptDatabase(StorageError):
    """The SQLite file cannot be read or fails its integrity check."""

    hint = ("restore from a backup with `keepstep restore BACKUP DIR`; if you have none, "
            "move .keepstep aside (do not delete it) and start again")


class DatabaseLost(StorageError):
    """state.db is missing or empty while the artifact store holds earlier work.

    Nothing was created: starting a new database there would hide that work.
    """

    hint = ("restore from a backup with `keepstep restore BACKUP DIR`, or move .keepstep "
            "aside deliberately (e.g. `mv .keepstep .keepstep.old`) to start over")


class ChainBroken(StorageError):
    """A checkpoint link or hash does not verify."""


class UnsafeArtifactName(StorageError):
    """An artifact name would escape its attempt directory."""

    hint = "use a plain relative name such as 'evidence.json' or 'tables/evidence.csv'"


class ArtifactImmutable(StorageError):
    """A committed artifact (or an existing staged file) would be overwritten."""

    hint = "write a new attempt instead; committed files are never overwritten"


class NotFound(StorageError):
    """A run, branch, checkpoint or row that the caller named does not exist."""


def mount_point(path: str | os.PathLike[str]) -> str:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return str(p)


def disk_full(path: str | os.PathLike[str], what: str = "") -> DiskFull:
    """The DiskFull error for a write at ``path``, worded for the person who must act."""
    at = mount_point(path)
    return DiskFull(
        f"the disk is full at {path}{f' ({what})' if what else ''}",
        hint=f"free space on {at}, then run `keepstep resume`; work already committed is kept")


def disk_full_at_commit(path: str | os.PathLike[str]) -> CommitOutcomeUnknown:
    """The CommitOutcomeUnknown for a COMMIT that failed because the disk is full."""
    return CommitOutcomeUnknown(
        f"the disk is full at {path}: the last change may or may not have been saved",
        hint=f"free space on {mount_point(path)}, then run `keepstep resume` — it reads the "
        "branch head to learn whether the commit landed; do not redo the work by hand")


def permission_denied(path: str | os.PathLike[str], doing: str) -> StoragePermissionDenied:
    """The StoragePermissionDenied for ``doing`` (e.g. "open for writing") at ``path``."""
    return StoragePermissionDenied(
        f"permission denied: cannot {doing} {path}",
        hint=f"check the owner and permissions of {path} and its folder (`ls -ld`); read "
        "commands such as `keepstep status` and `keepstep verify` only need read access")
