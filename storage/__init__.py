"""keepstep.storage — SQLite state and the artifact store. Knows no engine rules."""

from keepstep.storage.artifacts import ArtifactStore, safe_name
from keepstep.storage.backup import (
    BackupReport,
    Baseline,
    RestoreRefused,
    RestoreReport,
    backup,
    restore,
)
from keepstep.storage.errors import (
    ArtifactImmutable,
    ChainBroken,
    CheckpointConflict,
    CommitOutcomeUnknown,
    CorruptDatabase,
    NotFound,
    SchemaMigrationFailed,
    SchemaTooNew,
    StaleFencingToken,
    StorageBusy,
    StorageError,
    UnsafeArtifactName,
)
from keepstep.storage.faults import crash_point
from keepstep.storage.hashing import canonical_json, sha256_hex
from keepstep.storage.models import (
    ArtifactEntry,
    ArtifactProblem,
    Attempt,
    Budget,
    ChainProblem,
    ChainReport,
    Checkpoint,
    Claim,
    Event,
    EventIn,
    Head,
    Lease,
    ModelCall,
    OrphanAttempt,
    UnitStatus,
)
from keepstep.storage.retention import GcItem, GcReport, gc
from keepstep.storage.schema import SCHEMA_VERSION
from keepstep.storage.sqlite_ledgers import ApprovalRecord, ApprovalRefused, EffectRecord
from keepstep.storage.sqlite_store import BudgetLimitReached, LeaseHeld, SQLiteStore
from keepstep.storage.store import Store

__all__ = [
    "SCHEMA_VERSION", "ApprovalRecord", "ApprovalRefused", "ArtifactEntry", "ArtifactImmutable",
    "ArtifactProblem", "ArtifactStore", "Attempt", "BackupReport", "Baseline", "Budget",
    "BudgetLimitReached", "ChainBroken", "ChainProblem", "ChainReport", "Checkpoint",
    "CheckpointConflict", "Claim", "CommitOutcomeUnknown", "CorruptDatabase", "EffectRecord",
    "Event", "EventIn", "GcItem", "GcReport", "Head",
    "Lease", "LeaseHeld", "ModelCall", "NotFound", "OrphanAttempt", "RestoreRefused",
    "RestoreReport", "SQLiteStore", "SchemaMigrationFailed", "SchemaTooNew", "StaleFencingToken",
    "Store", "StorageBusy", "StorageError", "UnitStatus", "UnsafeArtifactName", "backup",
    "canonical_json", "crash_point", "gc", "restore", "safe_name", "sha256_hex",
]
