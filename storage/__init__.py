"""keepstep.storage — SQLite state and the artifact store. Knows no engine rules."""

from .artifacts import ArtifactStore, safe_name
from .backup import (
    BackupReport,
    Baseline,
    RestoreRefused,
    RestoreReport,
    backup,
    restore,
)
from .errors import (
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
from .faults import crash_point
from .hashing import canonical_json, sha256_hex
from .models import (
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
from .retention import GcItem, GcReport, gc
from .schema import SCHEMA_VERSION
from .sqlite_ledgers import ApprovalRecord, ApprovalRefused, EffectRecord
from .sqlite_store import BudgetLimitReached, LeaseHeld, SQLiteStore
from .store import Store

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
