"""keepstep.storage — SQLite state and the artifact store. Knows no engine rules.

Names are loaded on first use (PEP 562), so ``import keepstep.storage.errors`` or
``keepstep.storage.hashing`` does not load sqlite-utils or the SQLite backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "keepstep.storage.artifacts": "ArtifactStore safe_name",
    "keepstep.storage.backups": "BackupReport backup",
    "keepstep.storage.errors": "ApprovalRefused ArtifactImmutable BudgetLimitReached ChainBroken "
                               "CheckpointConflict CommitOutcomeUnknown CorruptDatabase "
                               "DatabaseLost DiskFull KeepstepError LeaseHeld NotFound "
                               "SchemaMigrationFailed SchemaNeedsMigration SchemaTooNew "
                               "StaleFencingToken StorageBusy StorageError "
                               "StoragePermissionDenied UnsafeArtifactName",
    "keepstep.storage.faults": "crash_point",
    "keepstep.storage.hashing": "canonical_json sha256_hex",
    "keepstep.storage.models": "ApprovalRecord ArtifactEntry ArtifactProblem Attempt "
                               "AttemptEnd AttemptStatus Budget ChainProblem ChainReport "
                               "Checkpoint Claim CommitRequest CurrentChange EffectRecord Event "
                               "EventIn Head Lease ModelCall OrphanAttempt RunOverlay UnitStatus "
                               "UnitStatusChange UnitStatusKind",
    "keepstep.storage.restores": "Baseline RestoreRefused RestoreReport restore",
    "keepstep.storage.retention": "GcItem GcReport gc",
    "keepstep.storage.sqlite.schema": "SCHEMA_VERSION",
    "keepstep.storage.sqlite": "SQLiteStore",
    "keepstep.storage.store": "ApprovalStore CallStore CheckpointStore ClaimStore EffectStore "
                              "EventStore ManifestStore Store",
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}

__all__ = [
    "ApprovalRecord", "ApprovalRefused", "ApprovalStore", "ArtifactEntry", "ArtifactImmutable",
    "ArtifactProblem", "ArtifactStore", "Attempt", "AttemptEnd", "AttemptStatus", "BackupReport",
    "Baseline", "Budget", "BudgetLimitReached", "CallStore", "ChainBroken", "ChainProblem",
    "ChainReport", "Checkpoint", "CheckpointConflict", "CheckpointStore", "Claim", "ClaimStore",
    "CommitOutcomeUnknown", "CommitRequest", "CorruptDatabase", "CurrentChange", "DatabaseLost",
    "DiskFull", "EffectRecord", "EffectStore", "Event", "EventIn", "EventStore", "GcItem",
    "GcReport", "Head", "KeepstepError", "Lease", "LeaseHeld", "ManifestStore", "ModelCall",
    "NotFound", "OrphanAttempt", "RestoreRefused", "RunOverlay", "RestoreReport", "SCHEMA_VERSION",
    "SQLiteStore", "SchemaMigrationFailed", "SchemaNeedsMigration", "SchemaTooNew",
    "StaleFencingToken", "StorageBusy", "StorageError", "StoragePermissionDenied", "Store",
    "UnitStatus", "UnitStatusChange", "UnitStatusKind", "UnsafeArtifactName", "backup",
    "canonical_json", "crash_point", "gc", "restore", "safe_name", "sha256_hex"
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'keepstep.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from keepstep.storage.artifacts import ArtifactStore, safe_name
    from keepstep.storage.backups import BackupReport, backup
    from keepstep.storage.errors import (
        ApprovalRefused,
        ArtifactImmutable,
        BudgetLimitReached,
        ChainBroken,
        CheckpointConflict,
        CommitOutcomeUnknown,
        CorruptDatabase,
        DatabaseLost,
        DiskFull,
        KeepstepError,
        LeaseHeld,
        NotFound,
        SchemaMigrationFailed,
        SchemaNeedsMigration,
        SchemaTooNew,
        StaleFencingToken,
        StorageBusy,
        StorageError,
        StoragePermissionDenied,
        UnsafeArtifactName,
    )
    from keepstep.storage.faults import crash_point
    from keepstep.storage.hashing import canonical_json, sha256_hex
    from keepstep.storage.models import (
        ApprovalRecord,
        ArtifactEntry,
        ArtifactProblem,
        Attempt,
        AttemptEnd,
        AttemptStatus,
        Budget,
        ChainProblem,
        ChainReport,
        Checkpoint,
        Claim,
        CommitRequest,
        CurrentChange,
        EffectRecord,
        Event,
        EventIn,
        Head,
        Lease,
        ModelCall,
        OrphanAttempt,
        RunOverlay,
        UnitStatus,
        UnitStatusChange,
        UnitStatusKind,
    )
    from keepstep.storage.restores import Baseline, RestoreRefused, RestoreReport, restore
    from keepstep.storage.retention import GcItem, GcReport, gc
    from keepstep.storage.sqlite import SQLiteStore
    from keepstep.storage.sqlite.schema import SCHEMA_VERSION
    from keepstep.storage.store import (
        ApprovalStore,
        CallStore,
        CheckpointStore,
        ClaimStore,
        EffectStore,
        EventStore,
        ManifestStore,
        Store,
    )
