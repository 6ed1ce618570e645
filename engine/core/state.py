"""Facts loaded from storage, and the views derived from them.

Checkpoint state keys (the materialised state is a key -> JSON map):

``plan``      {"n", "label", "fingerprint", "contract_hash", "contract_fields": {field: hash},
               "snapshot": {"path", "sha256"}}  — the plan file is kept as an artifact
``inputs``    {"n", "label", "hash", "sources": {id: sha256}, "groups": {id: group}}
``versions``  {"code", "model", "prompt", "tool", "policy"}
``budget``    used counters at the time of the commit
``unit:<id>`` UnitRecord (only units that have ever succeeded have one)

A unit without a record is pending. Running / blocked / failed / cancelled are
runtime facts (leases and unit_status rows), overlaid here, never committed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.core.plan import Plan

UNIT_PREFIX = "unit:"


class UnitState(StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    blocked = "blocked"
    failed = "failed"
    invalidated = "invalidated"
    cancelled = "cancelled"


class OutputRef(BaseModel):
    sha256: str
    path: str


class ExplanationStep(BaseModel):
    """One hop of an invalidation path: from -> to over an edge of a type."""

    source: str  # "contract:audience", "source:A3", "template:report", "unit:U27"
    target: str  # "unit:U28"
    edge: str  # edge type taken (content, audience, ...)


class Explanation(BaseModel):
    """Why a unit is invalidated: the change's origin and every edge taken."""

    change_kind: str
    origin: str
    path: list[ExplanationStep] = Field(default_factory=list)
    note: str = ""

    def render(self) -> str:
        hops = " → ".join(
            [self.origin] + [f"[{s.edge}] {s.target.removeprefix('unit:')}" for s in self.path]
        )
        return f"{self.change_kind}: {hops}" + (f" ({self.note})" if self.note else "")


class UnitRecord(BaseModel):
    """The committed record of a unit's latest success (kept when invalidated)."""

    state: UnitState  # succeeded | invalidated
    attempt: str
    outputs: dict[str, OutputRef] = Field(default_factory=dict)
    consumed: dict[str, dict[str, str]] = Field(default_factory=dict)  # dep -> {name: sha256}
    inputs_fp: dict[str, str] = Field(default_factory=dict)  # input ref -> hash seen
    unit_fp: str = ""
    plan_n: int = 1
    facts: dict[str, Any] = Field(default_factory=dict)
    validators_passed: bool = True
    explanations: list[Explanation] = Field(default_factory=list)
    cutoff_note: str = ""


class LeaseFact(BaseModel):
    """A live claim on a unit (storage's lease row, as the core reads it)."""

    model_config = ConfigDict(from_attributes=True)
    unit: str
    attempt_id: str
    owner: str
    fencing_token: int
    expires_at: float
    renewed_at: float
    progress: str | None = None
    progress_at: float


class StatusFact(BaseModel):
    """A runtime unit status (blocked, failed, cancelled) with its reason and details."""

    model_config = ConfigDict(from_attributes=True)
    unit: str
    status: str
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)
    updated_at: str = ""


class BudgetFact(BaseModel):
    """Budget limits and what has been used, counter by counter."""

    model_config = ConfigDict(from_attributes=True)
    limits: dict[str, float] = Field(default_factory=dict)
    used: dict[str, float] = Field(default_factory=dict)

    def left(self) -> dict[str, float]:
        """counter -> limit minus used, for every counter that has a limit."""
        return {k: lim - self.used.get(k, 0.0) for k, lim in self.limits.items()}


class CallRow(Protocol):
    """What the core reads of a call-ledger row (storage's ModelCall satisfies it)."""

    unit: str
    attempt_id: str
    status: str
    tokens_in: int
    tokens_out: int
    cost: float
    latency_ms: int


class RunFacts(BaseModel):
    """Everything decide() and the views need, loaded in one go."""

    run_id: str
    branch_id: str
    head_version: int
    plan_info: dict[str, Any]
    inputs_info: dict[str, Any]
    records: dict[str, UnitRecord]
    statuses: dict[str, StatusFact]
    leases: dict[str, LeaseFact]
    budget: BudgetFact
    now: float
    gates_open: dict[str, bool] = Field(default_factory=dict)  # unit -> approval applies
    attempts_count: dict[str, int] = Field(default_factory=dict)

    def effective_state(self, unit_id: str) -> UnitState:
        lease = self.leases.get(unit_id)
        if lease is not None and lease.expires_at > self.now:
            return UnitState.running
        status = self.statuses.get(unit_id)
        if status is not None and status.status in ("blocked", "failed", "cancelled"):
            return UnitState(status.status)
        rec = self.records.get(unit_id)
        if rec is None:
            return UnitState.pending
        return rec.state

    def is_current(self, unit_id: str) -> bool:
        rec = self.records.get(unit_id)
        return rec is not None and rec.state == UnitState.succeeded


def records_from_state(state: dict[str, Any]) -> dict[str, UnitRecord]:
    return {
        k[len(UNIT_PREFIX):]: UnitRecord.model_validate(v)
        for k, v in state.items()
        if k.startswith(UNIT_PREFIX)
    }


def unit_key(unit_id: str) -> str:
    return f"{UNIT_PREFIX}{unit_id}"


def counts(facts: RunFacts, plan: Plan, ready: list[str]) -> dict[str, int]:
    by_state: dict[str, int] = {s.value: 0 for s in UnitState}
    for u in plan.units:
        by_state[facts.effective_state(u.id).value] += 1
    return {
        "current": sum(1 for u in plan.units if facts.is_current(u.id)),
        "invalidated": by_state["invalidated"],
        "ready": len(ready),
        "running": by_state["running"],
        "blocked": by_state["blocked"],
        "failed": by_state["failed"],
        "pending": by_state["pending"],
        "cancelled": by_state["cancelled"],
    }
