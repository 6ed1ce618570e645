"""keepstep.storage — SQLite state and the artifact store. Knows no engine rules."""

from .artifacts import ArtifactStore, safe_name
from .errors import (
    ArtifactImmutable,
    ChainBroken,
    CheckpointConflict,
    CorruptDatabase,
    NotFound,
    SchemaMigrationFailed,
    SchemaTooNew,
    StaleFencingToken,
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
from .schema import SCHEMA_VERSION
from .sqlite_store import BudgetLimitReached, LeaseHeld, SQLiteStore
from .store import Store

__all__ = [
    "SCHEMA_VERSION", "ArtifactEntry", "ArtifactImmutable", "ArtifactProblem", "ArtifactStore",
    "Attempt", "Budget", "BudgetLimitReached", "ChainBroken", "ChainProblem", "ChainReport",
    "Checkpoint", "CheckpointConflict", "Claim", "CorruptDatabase", "Event", "EventIn", "Head",
    "Lease", "LeaseHeld", "ModelCall", "NotFound", "OrphanAttempt", "SQLiteStore",
    "SchemaMigrationFailed", "SchemaTooNew", "StaleFencingToken", "Store", "StorageError",
    "UnitStatus", "UnsafeArtifactName", "canonical_json", "crash_point", "safe_name",
    "sha256_hex",
]
