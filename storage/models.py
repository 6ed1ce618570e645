"""Typed rows the storage layer returns. Plain data: no engine rules here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class AttemptStatus(StrEnum):
    """An attempt row's status (str-valued: the stored text is the value).

    ``claimed`` is the only status in flight; every other one is final except that
    recovery may move an ended-unseen attempt (``claimed`` or ``fenced``) to ``orphaned``."""

    claimed = "claimed"
    committed = "committed"
    failed = "failed"
    timed_out = "timed_out"
    blocked = "blocked"
    fenced = "fenced"
    cancelled = "cancelled"
    orphaned = "orphaned"


class UnitStatusKind(StrEnum):
    """A unit's runtime status (the ``unit_status`` row; a committed unit has none).

    Named ``…Kind`` because ``UnitStatus`` is the row model callers already import."""

    blocked = "blocked"
    failed = "failed"
    # No engine path sets it today (a cancelled attempt leaves its unit without a status);
    # the views (explain, status) still describe it, and tests build such rows.
    cancelled = "cancelled"


class Head(BaseModel):
    run_id: str
    branch_id: str
    version: int
    hash: str


class Checkpoint(BaseModel):
    run_id: str
    branch_id: str
    version: int
    parent_branch: str | None
    parent_version: int | None
    parent_hash: str
    kind: str
    schema_version: int
    unit: str | None = None
    attempt: str | None = None
    fencing_token: int | None = None
    delta: dict[str, Any]
    state_hash: str
    created_at: str
    hash: str


class ArtifactEntry(BaseModel):
    """One manifest row: a committed file of an attempt."""

    unit: str
    attempt_id: str
    name: str
    path: str  # relative to the artifact root
    media_type: str
    size: int
    sha256: str
    schema_version: int = 1
    source_ids: list[str] = Field(default_factory=list)
    validators: dict[str, Any] = Field(default_factory=dict)
    producer_version: str
    created_at: str
    checkpoint_version: int | None = None


class Claim(BaseModel):
    run_id: str
    branch_id: str
    unit: str
    attempt_id: str
    attempt_no: int
    fencing_token: int
    owner: str
    expires_at: float
    claimed_at_version: int


class Lease(BaseModel):
    run_id: str
    branch_id: str
    unit: str
    attempt_id: str
    owner: str
    fencing_token: int
    expires_at: float
    renewed_at: float
    progress: str | None
    progress_at: float


class Attempt(BaseModel):
    attempt_id: str
    run_id: str
    branch_id: str
    unit: str
    attempt_no: int
    executor: str
    fencing_token: int
    status: AttemptStatus
    claimed_at_version: int
    started_at: str
    ended_at: str | None = None
    error_class: str | None = None
    message: str | None = None


class UnitStatus(BaseModel):
    """A runtime status (blocked, failed, cancelled…): an event-backed row, not a checkpoint."""

    unit: str
    status: UnitStatusKind
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)
    updated_at: str


class Event(BaseModel):
    seq: int
    run_id: str
    branch_id: str
    ts: str
    kind: str
    unit: str | None = None
    attempt_id: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class EventIn(BaseModel):
    kind: str
    unit: str | None = None
    attempt_id: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class ModelCall(BaseModel):
    call_id: str
    run_id: str
    branch_id: str
    unit: str
    attempt_id: str
    round: int
    model: str
    request_hash: str
    status: str  # reserved | settled
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    latency_ms: int = 0
    outcome: str | None = None
    error_class: str | None = None
    safe_message: str | None = None
    response_artifact: str | None = None
    reserved_at: str
    settled_at: str | None = None


class Budget(BaseModel):
    limits: dict[str, float] = Field(default_factory=dict)
    used: dict[str, float] = Field(default_factory=dict)

    def left(self) -> dict[str, float]:
        return {k: v - self.used.get(k, 0) for k, v in self.limits.items()}


class RunOverlay(BaseModel):
    """What a scheduler reads besides the committed facts, in one read
    (``Store.run_overlay``): the branch head, the live leases, the runtime unit statuses and
    the budget."""

    head: Head
    leases: list[Lease]
    statuses: dict[str, UnitStatus]
    budget: Budget


class ChainProblem(BaseModel):
    version: int
    branch_id: str
    problem: str


class ChainReport(BaseModel):
    """The outcome of a chain check. ``verified_version``: with ``verify_since_last``, the
    newest version known good after this check (None when nothing verified yet)."""

    ok: bool
    checked: int
    problems: list[ChainProblem] = Field(default_factory=list)
    verified_version: int | None = None


class ArtifactProblem(BaseModel):
    path: str
    unit: str
    attempt_id: str
    problem: str  # "missing" | "changed"
    expected_sha256: str
    actual_sha256: str | None = None


class OrphanAttempt(BaseModel):
    """An attempt folder holding files no committed manifest row names, and no live lease.

    ``has_row`` is False for a stray folder (no attempt row at all: made by hand, or
    left from another database)."""

    run_id: str
    unit: str
    attempt_id: str
    directory: str
    files: list[str]
    has_row: bool = True


class CurrentChange(BaseModel):
    """A change of a unit's current attempt, made by the commit of ``version``.

    ``attempt_id`` None: from that version on the unit has no current attempt."""

    branch_id: str
    version: int
    unit: str
    attempt_id: str | None


class ApprovalRecord(BaseModel):
    """One approval request and, once answered, its decision (a row of ``approvals``)."""

    request_id: str
    run_id: str
    branch_id: str
    gate_id: str
    unit: str
    question: str
    options: list[dict[str, Any]] = Field(default_factory=list)
    status: str  # requested | decided | revoked | expired | superseded
    created_at: str
    bound_object: dict[str, Any] = Field(default_factory=dict)
    choice: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    scope: str | None = None
    expires_at: float | None = None
    revoked_by: str | None = None
    revoked_at: str | None = None
    revoke_reason: str | None = None
    token_hash: str | None = None
    token_expires_at: float | None = None
    token_used_at: float | None = None


class EffectRecord(BaseModel):
    """One external action in the side-effect ledger (a row of ``side_effects``)."""

    idem_key: str
    run_id: str
    branch_id: str
    unit: str
    attempt_id: str | None = None
    action: str
    adapter: str
    request_hash: str
    fencing_token: int | None = None
    plan_n: int
    status: str  # intent | committed | unknown | failed | compensated | compensation-intent
    remote_id: str | None = None
    created_at: str
    updated_at: str
    compensates: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


APPROVAL_STATUSES = ("requested", "decided", "revoked", "expired", "superseded")
EFFECT_STATUSES = ("intent", "committed", "unknown", "failed", "compensated",
                   "compensation-intent")


@dataclass(frozen=True, slots=True)
class UnitStatusChange:
    """The runtime status an attempt's ending gives its unit, with its event
    (``unit.<status>`` unless ``event_kind``; payload ``{"reason": …, **details}``)."""

    status: UnitStatusKind
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)
    event_kind: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How an attempt that did not commit ends: what ``Store.end_attempt`` writes at once.

    ``status``: the attempt's final status (never ``claimed`` or ``committed``: a commit
    ends its attempt itself). ``unit_status``: the unit's runtime status to set, if any.
    ``events``: appended after the unit status's event. ``usage``: added to the budget's
    used counters (never enforced). ``only_if``: the attempt must still be in one of these
    statuses, else nothing at all is written."""

    status: AttemptStatus
    error_class: str | None = None
    message: str | None = None
    unit_status: UnitStatusChange | None = None
    events: tuple[EventIn, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    only_if: tuple[AttemptStatus, ...] | None = None


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """One checkpoint commit, as ``Store.commit`` takes it (see its docstring).

    ``expected_version``: the head the commit is made on (compare-and-swap).
    ``fencing_token`` (needs ``unit``): the unit's lease must still carry it; the lease is
    released by the commit. ``attempt_id``: marked ``committed``. ``current``: unit -> its
    current attempt (None: no longer current). ``clear_unit_status``: units whose runtime
    status goes. ``usage``: added to the used counters (never enforced). ``budget_key``:
    the delta also records, under this key, the used counters as they stand once ``usage``
    is added (read in the commit's own transaction: the budget at this checkpoint)."""

    run_id: str
    branch_id: str
    expected_version: int
    delta: Mapping[str, Any]
    kind: str = "unit-success"
    manifest: tuple[ArtifactEntry, ...] = ()
    unit: str | None = None
    attempt_id: str | None = None
    fencing_token: int | None = None
    current: Mapping[str, str | None] = field(default_factory=dict)
    events: tuple[EventIn, ...] = ()
    clear_unit_status: tuple[str, ...] = ()
    usage: Mapping[str, float] = field(default_factory=dict)
    budget_key: str | None = None
