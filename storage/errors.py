"""Storage-layer errors. One base class; each subclass says what to do next."""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error raised by keepstep.storage."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} — {self.hint}" if self.hint else base


class CheckpointConflict(StorageError):
    """The branch head moved since the caller read it (compare-and-swap failed)."""

    hint = "re-read the head and decide again; staged files of this attempt stay an orphan"


class StaleFencingToken(StorageError):
    """The caller's lease was taken over; its token is no longer current."""

    hint = "this executor lost its lease: stop, and leave its staged output as an orphan"


class SchemaTooNew(StorageError):
    """The database was written by a newer keepstep than this one."""

    hint = "upgrade keepstep (pip install -U keepstep); the database was not modified"


class SchemaMigrationFailed(StorageError):
    """Migrating an older database failed; the original is kept untouched."""


class StorageBusy(StorageError):
    """The database stayed locked by another writer for the whole busy timeout.

    Nothing was written by the call that raised it.
    """

    hint = "another keepstep process is writing to this project; wait for it, then retry"


class CommitOutcomeUnknown(StorageError):
    """The COMMIT statement itself failed: the transaction may or may not be durable.

    Never treat this as "failed": read the head (or the attempt's status) to
    learn whether the commit landed before retrying anything.
    """

    hint = "read the branch head to learn whether the commit landed; never assume it failed"


class CorruptDatabase(StorageError):
    """The SQLite file cannot be read or fails its integrity check."""

    hint = "restore from `keepstep backup` output, or move .keepstep/state.db aside and start again"


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
