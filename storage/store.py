"""The Store interface the engine depends on, as one Protocol per capability.

``Store`` is their union. A second backend implements every capability and passes the
contract suite in tests/store/ unchanged. This module imports no backend.

Errors common to every method: StorageBusy (the database stayed locked for the whole
busy timeout; nothing was written), CorruptDatabase (the file is damaged), DiskFull,
StoragePermissionDenied (also: any write on a store opened read-only). A write whose
COMMIT fails raises CommitOutcomeUnknown: it may or may not have landed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.models import (
    ApprovalRecord,
    ArtifactEntry,
    Attempt,
    AttemptEnd,
    AttemptStatus,
    Budget,
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
    UnitStatusKind,
)


@runtime_checkable
class CheckpointStore(Protocol):
    """Runs, branches, the materialised state and the checkpoint chain."""

    def create_run(self, run_id: str, initial_state: Mapping[str, Any], *, branch_id: str = ...,
                   meta: Mapping[str, Any] | None = ..., limits: Mapping[str, float] | None = ...,
                   events: Iterable[EventIn] = ...) -> Head:
        """Create a run with its genesis checkpoint (version 0) holding ``initial_state``,
        its budget limits and a ``run.created`` event (plus ``events``); returns the head.
        StorageError if the run exists (nothing changed)."""
        ...

    def runs(self) -> list[str]:
        """Every run id, oldest first."""
        ...

    def run_exists(self, run_id: str) -> bool:
        """Whether a run with this id exists."""
        ...

    def run_meta(self, run_id: str) -> dict[str, Any]:
        """The meta given at create_run. NotFound for an unknown run."""
        ...

    def branches(self, run_id: str) -> list[dict[str, Any]]:
        """The run's branches, oldest first: dicts with branch_id, head_version, head_hash,
        forked_from, forked_at, created_at ([] for an unknown run)."""
        ...

    def get_head(self, run_id: str, branch_id: str = ...) -> Head:
        """The branch head (version and hash). NotFound for an unknown run or branch."""
        ...

    def read_state(self, run_id: str, branch_id: str = ...,
                   prefix: str = ...) -> dict[str, Any]:
        """The materialised state at the head (keys starting with ``prefix``), by key."""
        ...

    def read_key(self, run_id: str, key: str, branch_id: str = ...) -> Any | None:
        """One key of the materialised state, or None when absent."""
        ...

    def commit_checkpoint(self, run_id: str, branch_id: str, expected_version: int,
                          delta: Mapping[str, Any], manifest: Iterable[ArtifactEntry] = ...,
                          fencing_token: int | None = ..., *, kind: str = ...,
                          unit: str | None = ..., attempt_id: str | None = ...,
                          events: Iterable[EventIn] = ...,
                          clear_unit_status: Iterable[str] = ...,
                          current: Mapping[str, str | None] | None = ...,
                          usage: Mapping[str, float] | None = ...,
                          budget_key: str | None = ...) -> int:
        """Append checkpoint ``expected_version + 1`` atomically; returns its version.

        In the same transaction: the delta applied to the state (a None value deletes
        the key), the manifest rows, the current pointers (``current``: unit -> its
        current attempt id, or None for "no longer current"), the usage added to the
        budget's used counters (never enforced; with ``budget_key`` the delta also records
        the used counters as they then stand under that key), the attempt marked committed, the
        unit's lease released, the statuses cleared, and the events (after
        ``checkpoint.committed``). Nothing is written on failure.

        CheckpointConflict: the head is no longer ``expected_version``.
        StaleFencingToken: a token was given and the unit's lease no longer carries it.
        NotFound: no such run or branch. StorageError: a token without a unit.
        The same as ``commit`` with a CommitRequest of these fields.
        """
        ...

    def commit(self, request: CommitRequest) -> int:
        """Append checkpoint ``request.expected_version + 1`` atomically; returns its
        version. What is written and raised is said at ``commit_checkpoint``: this is the
        one commit, with its fields in one value (see CommitRequest)."""
        ...

    def get_checkpoint(self, run_id: str, version: int, branch_id: str = ...) -> Checkpoint:
        """Checkpoint ``version`` of the branch's lineage (ancestors' rows included).
        NotFound when there is none."""
        ...

    def list_checkpoints(self, run_id: str, branch_id: str = ..., *,
                         kinds: Iterable[str] | None = ..., since_version: int = ...,
                         limit: int | None = ...) -> list[Checkpoint]:
        """Checkpoints of the lineage in version order, filtered by kind and from
        ``since_version``; with ``limit``, only the newest ``limit`` (still oldest first).
        NotFound for an unknown branch."""
        ...

    def count_checkpoints(self, run_id: str, branch_id: str = ...) -> dict[str, int]:
        """Commits by kind along the lineage (genesis excluded), at a cost independent of
        the history. NotFound for an unknown branch."""
        ...

    def verify_head(self, run_id: str, branch_id: str = ...) -> ChainReport:
        """The quick check: the head row's hash, its parent link, and the materialised
        state against the head's state hash. Problems are reported, not raised."""
        ...

    def verify_chain(self, run_id: str, branch_id: str = ...) -> ChainReport:
        """Every link from the head back to genesis, then a replay of all deltas; each
        problem names the version where the chain breaks (newest first)."""
        ...

    def verify_since_last(self, run_id: str, branch_id: str = ...) -> ChainReport:
        """Verify every checkpoint committed since the newest version verified by an
        earlier call (its row hash, parent link and the head hash), and remember the head
        as verified when all is well: the cost follows the new commits. Problems name
        their version (oldest first); ``verified_version`` is the newest version known
        good. A read-only store verifies without remembering."""
        ...

    def fork_branch(self, run_id: str, from_branch: str, at_version: int,
                    new_branch: str) -> Head:
        """A new branch whose head is checkpoint ``at_version`` of ``from_branch``, with
        that version's state, budget, counters and current pointers. NotFound for an
        unknown checkpoint; StorageError when ``new_branch`` exists."""
        ...


@runtime_checkable
class ClaimStore(Protocol):
    """Claims, leases and fencing tokens, attempts, and runtime unit statuses."""

    def claim(self, run_id: str, branch_id: str, unit: str, *, expected_version: int,
              owner: str, lease_seconds: float) -> Claim:
        """At head ``expected_version``, atomically: a new attempt (numbered per run and
        unit), a lease, the next fencing token, a ``unit.claimed`` event. An expired
        lease on the unit is fenced first. CheckpointConflict: the head moved (no attempt
        recorded). LeaseHeld: another live lease holds the unit. NotFound: no branch."""
        ...

    def renew_lease(self, run_id: str, branch_id: str, unit: str, *, fencing_token: int,
                    lease_seconds: float, progress: str | None = ...) -> float:
        """Extend the lease (and record progress); returns the new expiry.
        StaleFencingToken when the lease is gone or carries another token."""
        ...

    def release_lease(self, run_id: str, branch_id: str, unit: str, fencing_token: int) -> None:
        """Drop the unit's lease if it still carries ``fencing_token`` (else nothing)."""
        ...

    def leases(self, run_id: str, branch_id: str | None = ...) -> list[Lease]:
        """Leases held (live or expired, not yet fenced), by unit."""
        ...

    def fence_expired_leases(self, run_id: str, branch_id: str = ...) -> list[Lease]:
        """Take away every expired lease (its attempt becomes ``fenced``, event
        ``lease.fenced``); returns the leases taken."""
        ...

    def fence_lease(self, run_id: str, branch_id: str, unit: str, fencing_token: int,
                    reason: str) -> bool:
        """Take a lease away before expiry (its owner is known to be dead); False when no
        lease carries that token any more."""
        ...

    def current_token(self) -> int:
        """The newest fencing token handed out (tokens only grow)."""
        ...

    def set_attempt_status(self, run_id: str, attempt_id: str, status: AttemptStatus | str, *,
                           error_class: str | None = ..., message: str | None = ...,
                           only_if: Iterable[AttemptStatus | str] | None = ...) -> bool:
        """Set an attempt's status (and end time, unless it is still in flight); with
        ``only_if``, only from one of those statuses. Returns whether a row changed.
        ValueError for a status that is not an AttemptStatus. (Recovery's quarantine uses
        it; an attempt's own ending is ``end_attempt``.)"""
        ...

    def end_attempt(self, claim: Claim, end: AttemptEnd) -> bool:
        """End an attempt that did not commit, all in ONE transaction or not at all: the
        attempt row gets ``end.status`` (with error class, message and end time), the unit's
        lease is released if it still carries ``claim.fencing_token``, the unit's runtime
        status is set (``end.unit_status``, with its event), ``end.usage`` is added to the
        used counters (never enforced) and ``end.events`` are appended (after the status's
        event). With ``end.only_if`` and the attempt in none of those statuses, nothing at
        all is written: False. Else True. StorageError for a status that does not end an
        attempt (``claimed``, ``committed``). A crash at any point leaves all or nothing."""
        ...

    def attempts(self, run_id: str, unit: str | None = ...) -> list[Attempt]:
        """Attempts of a run (or one unit), by unit and attempt number."""
        ...

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        """Attempts ever claimed per unit (all branches), at a cost independent of the
        history."""
        ...

    def get_attempt(self, run_id: str, attempt_id: str) -> Attempt | None:
        """One attempt, or None."""
        ...

    def set_unit_status(self, run_id: str, branch_id: str, unit: str,
                        status: UnitStatusKind | str, reason: str,
                        details: Mapping[str, Any] | None = ..., *, event_kind: str | None = ...,
                        attempt_id: str | None = ...) -> None:
        """Record a runtime status (blocked, failed, …) and its event (``unit.<status>``
        unless ``event_kind``) in one transaction; no checkpoint is made."""
        ...

    def clear_unit_status(self, run_id: str, branch_id: str, unit: str) -> None:
        """Remove a unit's runtime status (nothing when it has none)."""
        ...

    def unit_statuses(self, run_id: str, branch_id: str = ...) -> dict[str, UnitStatus]:
        """Runtime statuses by unit."""
        ...

    def wait_for_change(self, run_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a change to ``run_id`` that may make work
        ready for this executor (a commit, an attempt ending, a lease given back, by any
        executor); True as soon as one (may have) happened. A backend that cannot be told
        waits out the timeout and returns False; either way the caller reads again."""
        ...

    def run_overlay(self, run_id: str, branch_id: str = ...) -> RunOverlay:
        """The branch's head, its leases, runtime unit statuses and budget, read together
        (one round trip on a server): what a scheduler reads besides the committed facts
        before each decision. Each part is what its own method returns."""
        ...


@runtime_checkable
class EventStore(Protocol):
    """The append-only event log."""

    def append_event(self, run_id: str, kind: str, *, branch_id: str = ..., unit: str | None = ...,
                     attempt_id: str | None = ...,
                     payload: Mapping[str, Any] | None = ...) -> int:
        """Append one event; returns its sequence number (increasing across the store)."""
        ...

    def events(self, run_id: str, *, branch_id: str | None = ..., after_seq: int = ...,
               kinds: Iterable[str] | None = ..., kind_prefix: str | None = ...,
               unit: str | None = ..., limit: int | None = ...,
               newest_first: bool = ...) -> list[Event]:
        """Events of a run in sequence order (newest first on request), filtered; a kind
        filter costs what it matches, not the history."""
        ...

    def strip_event_payloads(self, run_id: str, before_ts: str) -> int:
        """Retention: empty the payload of events older than ``before_ts`` (metadata
        stays); returns how many changed."""
        ...


@runtime_checkable
class CallStore(Protocol):
    """Budgets and the model-call ledger."""

    def get_budget(self, run_id: str, branch_id: str = ...) -> Budget:
        """Limits and used counters (empty for an unknown run)."""
        ...

    def add_usage(self, run_id: str, delta: Mapping[str, float], *, branch_id: str = ...,
                  enforce: bool = ...) -> Budget:
        """Add to the used counters; returns the budget after. With ``enforce``,
        BudgetLimitReached (nothing recorded) when a positive increment passes a limit."""
        ...

    def set_budget_limits(self, run_id: str, limits: Mapping[str, float], *, branch_id: str = ...,
                          event: EventIn | None = ...) -> Budget:
        """Merge new limits over the old ones, with ``event``, in one transaction."""
        ...

    def reserve_call(self, run_id: str, *, branch_id: str, unit: str, attempt_id: str, round: int,
                     model: str, request_hash: str, budget_delta: Mapping[str, float],
                     enforce: bool = ...) -> str:
        """Record a call about to be made and reserve its budget, atomically and durably;
        returns the call id. BudgetLimitReached: nothing recorded, no call may be made."""
        ...

    def settle_call(self, call_id: str, *, tokens_in: int, tokens_out: int, cost: float,
                    latency_ms: int, outcome: str, error_class: str | None = ...,
                    safe_message: str | None = ..., response_artifact: str | None = ...,
                    budget_delta: Mapping[str, float] | None = ...) -> None:
        """Record a call's figures and correct the budget. It survives a process crash;
        after a power cut it may be lost until the next durable commit, which leaves the
        call ``reserved`` with its estimate spent. NotFound for an unknown call."""
        ...

    def calls(self, run_id: str, *, unit: str | None = ...) -> list[ModelCall]:
        """Calls of a run (or one unit) in reservation order."""
        ...


@runtime_checkable
class ApprovalStore(Protocol):
    """Approval requests and decisions; resume tokens are stored only as hashes."""

    def create_approval_request(self, *, request_id: str, run_id: str, branch_id: str,
                                gate_id: str, unit: str, question: str,
                                options: list[dict[str, Any]], bound_object: Mapping[str, Any],
                                token_hash: str | None, token_expires_at: float | None,
                                retire: Mapping[str, str] | None = ...) -> ApprovalRecord:
        """Insert a ``requested`` row and, in the same transaction, retire older rows
        (``retire``: request id -> ``superseded`` | ``expired``; only rows still requested
        or decided change), each with its event. StorageError for another retire status."""
        ...

    def get_approval(self, request_id: str) -> ApprovalRecord | None:
        """One request, or None."""
        ...

    def approval_by_token_hash(self, token_hash: str) -> ApprovalRecord | None:
        """The request a resume token (by its hash) belongs to, or None."""
        ...

    def approvals(self, run_id: str, *, branch_id: str | None = ..., gate_id: str | None = ...,
                  statuses: Iterable[str] | None = ...) -> list[ApprovalRecord]:
        """Requests of a run, oldest first, filtered."""
        ...

    def check_resume_token(self, token_hash: str, run_id: str, gate_id: str,
                           now: float) -> str | None:
        """Read-only: the ApprovalRefused code consume_resume_token would raise, or None."""
        ...

    def consume_resume_token(self, token_hash: str, run_id: str, gate_id: str,
                             now: float) -> ApprovalRecord:
        """Use a token once (it must exist, match run and gate, be unused and unexpired);
        returns the request. ApprovalRefused (nothing written) otherwise."""
        ...

    def decide_approval(self, run_id: str, gate_id: str, request_id: str, *, choice: str,
                        decided_by: str, scope: str, expires_at: float | None,
                        bound_object: Mapping[str, Any], now: float,
                        token_hash: str | None = ...) -> ApprovalRecord:
        """Record the decision on a ``requested`` row (event ``approval.decided``),
        consuming ``token_hash`` in the same transaction when given; returns the row.
        ApprovalRefused (nothing written): no such request, not open, or a bad token."""
        ...

    def revoke_approval(self, request_id: str, *, who: str, reason: str,
                        now: float) -> ApprovalRecord:
        """Revoke a decided approval (event ``approval.revoked``); returns the row.
        ApprovalRefused: no such request, or not decided."""
        ...


@runtime_checkable
class EffectStore(Protocol):
    """The side-effect ledger: one row per external action, keyed by its idempotency key."""

    def get_effect(self, idem_key: str) -> EffectRecord | None:
        """One ledger row, or None."""
        ...

    def effects(self, run_id: str, status: str | Iterable[str] | None = ..., *,
                unit: str | None = ..., branch_id: str | None = ...) -> list[EffectRecord]:
        """Ledger rows of a run, oldest first, filtered by status (one or several)."""
        ...

    def record_effect_intent(self, *, idem_key: str, run_id: str, branch_id: str, unit: str,
                             attempt_id: str | None, action: str, adapter: str,
                             request_hash: str, fencing_token: int | None, plan_n: int,
                             compensates: str | None = ...,
                             detail: Mapping[str, Any] | None = ...
                             ) -> tuple[EffectRecord, bool]:
        """Insert an ``intent`` row, or return the existing row for the key unchanged:
        (row, created). StaleFencingToken (nothing written) when a token is given and the
        lease no longer carries it. A compensation moves its original from ``committed``
        to ``compensation-intent`` in the same transaction; StorageError when the original
        is not committed."""
        ...

    def mark_effect(self, idem_key: str, status: str, *, remote_id: str | None = ...,
                    detail: Mapping[str, Any] | None = ..., only_if: Iterable[str] | None = ...,
                    event: EventIn | None = ...) -> EffectRecord | None:
        """Move an effect to ``status`` (event ``effect.<status>``, plus ``event``), merging
        ``detail`` and keeping ``remote_id`` when not given; returns the row, or None when
        ``only_if`` refused. A committed compensation marks its original ``compensated``.
        NotFound: unknown key. StorageError: unknown status."""
        ...


@runtime_checkable
class ManifestStore(Protocol):
    """Committed files (manifest rows), current pointers, and orphaned attempts."""

    def manifest(self, run_id: str, *, unit: str | None = ...,
                 attempt_id: str | None = ...) -> list[ArtifactEntry]:
        """Manifest rows of a run by (unit, attempt, name), each with the checkpoint
        version that committed it."""
        ...

    def current_attempts(self, run_id: str, branch_id: str = ...) -> dict[str, str]:
        """unit -> its current attempt on the branch, as stated by the commits' ``current``."""
        ...

    def current_history(self, run_id: str, branch_id: str = ...) -> list[CurrentChange]:
        """Every change of a current pointer along the branch's lineage, in version order.
        NotFound for an unknown branch."""
        ...

    def orphaned_attempts(self, run_id: str, *, full: bool = ...,
                          max_folders: int | None = ...) -> list[OrphanAttempt]:
        """Attempt folders holding files that no manifest row names, by (unit, folder).

        Candidates come from the attempt rows (not committed, no live lease) plus stray
        folders found by name (no attempt row: ``has_row`` False) with one listing per
        unit folder, so the cost follows the uncommitted attempts, not the history. No
        attempt folder is walked unless ``full``: an exhaustive walk of every attempt
        folder (at most ``max_folders``), for audits."""
        ...


@runtime_checkable
class Store(CheckpointStore, ClaimStore, EventStore, CallStore, ApprovalStore, EffectStore,
            ManifestStore, Protocol):
    """Everything the engine needs from storage: all capabilities, a root folder and its
    artifact store."""

    root: Path
    artifacts: ArtifactStore

    def now(self) -> float:
        """The store's clock in seconds (leases and timestamps use it)."""
        ...

    def close(self) -> None:
        """Release connections; the store is not used afterwards. Idempotent."""
        ...


CAPABILITIES: tuple[type, ...] = (CheckpointStore, ClaimStore, EventStore, CallStore,
                                  ApprovalStore, EffectStore, ManifestStore)
