"""Takeover previews: what each choice would reuse, invalidate, hold back and cost — computed
from stored facts before anything is recorded (DESIGN §10: "each shows what it reuses and
invalidates first, then records a decision event").

Every function reads only; the matching action (``engine.takeover`` or ``Run.branch``)
records. Estimates come from the call ledger (``engine.explain.estimate_costs``): a unit's
latest committed attempt, else the mean of its kind, else zero and marked unknown.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import networkx as nx
from pydantic import BaseModel, Field

from keepstep.engine.core.estimates import UnitCost
from keepstep.engine.core.explain import compact_ids
from keepstep.engine.core.invalidation import downstream_of
from keepstep.engine.core.state import Explanation, UnitRecord, UnitState, records_from_state
from keepstep.engine.errors import KeepstepError
from keepstep.engine.run.effects import compensation_preview
from keepstep.engine.run.takeover import (
    EXPERT_REASON,
    OUT_OF_SCOPE_REASON,
    check_units,
    out_of_scope,
    rerun_invalidation,
    scope_of,
)

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Plan
    from keepstep.engine.run.runtime import Run


class TakeoverPreview(BaseModel):
    """One takeover choice, dry-run. Unit lists are in plan order."""

    action: str
    summary: str
    reused: list[str] = Field(default_factory=list)  # current units kept as they are
    invalidated: dict[str, list[Explanation]] = Field(default_factory=dict)  # redone, with paths
    held: list[str] = Field(default_factory=list)  # held back (blocked) or left out
    to_run: list[str] = Field(default_factory=list)  # still to run after the choice
    waiting: list[str] = Field(default_factory=list)  # wait behind a held unit
    estimate: UnitCost = Field(default_factory=lambda: UnitCost(unit="total", basis="sum"))
    records: str = ""  # what confirming records
    notes: list[str] = Field(default_factory=list)


def _current(plan: Plan, records: dict[str, UnitRecord]) -> list[str]:
    return [u.id for u in plan.units
            if (rec := records.get(u.id)) is not None and rec.state == UnitState.succeeded]


def _in_plan_order(plan: Plan, ids: Iterable[str]) -> list[str]:
    wanted = set(ids)
    return [u.id for u in plan.units if u.id in wanted]


def _estimate(run: Run, plan: Plan, units: list[str],
              records: dict[str, UnitRecord]) -> tuple[UnitCost, list[str]]:
    """(summed estimate, units without figures)."""
    per_unit = run.estimate(units, plan, records)
    total = UnitCost(unit="total", basis="sum", calls=sum(c.calls for c in per_unit),
                     tokens=sum(c.tokens for c in per_unit),
                     cost=round(sum(c.cost for c in per_unit), 6),
                     seconds=round(sum(c.seconds for c in per_unit), 3))
    return total, [c.unit for c in per_unit if c.basis == "unknown"]


def _figures(cost: UnitCost, unknown: list[str]) -> str:
    text = f"~{cost.calls} calls, ~{cost.tokens} tokens, ${cost.cost:.2f}"
    return text + (f"; no figures yet for {compact_ids(unknown)}" if unknown else "")


def _ids(ids: Iterable[str]) -> str:
    return compact_ids(ids) or "none"


_check = check_units  # the same validation as the recorded decisions use


# -- narrow scope ------------------------------------------------------------------------------

def keep_for_drop(plan: Plan, drop: Iterable[str]) -> list[str]:
    """The units to keep so that ``drop`` (and everything that depends on it, which cannot
    run without it) leaves the scope: the last units of what remains, in plan order."""
    dropped = set(_check(plan, drop))
    dropped |= downstream_of(plan, dropped)
    remaining = [u.id for u in plan.units if u.id not in dropped]
    if not remaining:
        raise KeepstepError("dropping these leaves nothing in the run",
                            hint="drop fewer units, or cancel the run instead")
    left = set(remaining)
    g = plan.graph()
    return [u for u in remaining if not any(d in left for d in g.successors(u))]


def preview_narrow(run: Run, keep: Iterable[str]) -> TakeoverPreview:
    """Narrowing to ``keep`` (and what it depends on): which units are held back and no
    longer required, which stay and still have to run. Nothing is invalidated."""
    plan = run.plan
    keep = _check(plan, keep)
    records = run.facts_records()
    scope = scope_of(plan, keep)
    held = out_of_scope(run, keep)
    current = _current(plan, records)
    to_run = [u.id for u in plan.units if u.id in scope and u.id not in current]
    outside_current = [u for u in current if u not in scope]
    was_required = [u for u in held if plan.unit_map()[u].required_final]
    cost, unknown = _estimate(run, plan, to_run, records)
    notes = []
    if was_required:
        notes.append(f"{_ids(was_required)} {'was' if len(was_required) == 1 else 'were'} "
                     "required final: the run can finish without "
                     f"{'it' if len(was_required) == 1 else 'them'}")
    if outside_current:
        notes.append(f"already current outside the scope, kept as they are: "
                     f"{_ids(outside_current)}")
    notes.append(f"the run is done when {_ids(keep)} "
                 f"{'is' if len(keep) == 1 else 'are'} current")
    notes.append("a held-back unit comes back with a rerun or retry of it (a recorded decision)")
    return TakeoverPreview(
        action="narrow_scope",
        summary=(f"narrow the scope to {_ids(keep)}: no longer required {_ids(held)}; "
                 f"still to run {_ids(to_run)} ({_figures(cost, unknown)}); reuse "
                 f"{len(current)} current units; invalidate nothing"),
        reused=current, held=held, to_run=to_run, estimate=cost,
        records=(f"decision.takeover action=narrow_scope keep={','.join(keep)} "
                 f"dropped={','.join(held) or '-'}, then a blocked status "
                 f"({OUT_OF_SCOPE_REASON!r}) per held-back unit"),
        notes=notes)


# -- rerun -------------------------------------------------------------------------------------

def preview_rerun(run: Run, unit: str, *, who: str = "user") -> TakeoverPreview:
    """Rerunning ``unit``: what is invalidated (the unit and what uses its content, with
    paths), what is reused, the estimated cost."""
    plan = run.plan
    _check(plan, [unit])
    records = run.facts_records()
    result = rerun_invalidation(run, unit, who=who)
    statuses = run.store.unit_statuses(run.run_id, run.branch_id)
    status = statuses.get(unit)
    redo = list(result.affected) + [u for u in result.pending_affected if u not in result.affected]
    to_run = redo if unit in redo else [unit, *redo]
    cost, unknown = _estimate(run, plan, to_run, records)
    notes = []
    if status is not None and status.details.get("effect"):
        # The unknown outcome stays in the ledger: the rerun would block on it again.
        notes.append(f"{unit} is {status.status}: {status.reason}; a rerun does NOT settle "
                     "that external action — settle it first (`keepstep effects settle "
                     f"{status.details['effect']} --run {run.run_id}`)")
    elif status is not None and status.status in ("blocked", "failed", "cancelled"):
        notes.append(f"{unit} is {status.status}: {status.reason}; the rerun releases it")
        if status.details.get("kind") == "budget":
            notes.append("it is blocked by the budget: raise the limit first "
                         "(`keepstep budget raise`); the rerun is refused until then")
    if result.affected:
        notes.append(f"early cut-off: if {unit}'s new output is byte-identical, what depends "
                     "on it stays current and is not redone")
    gate = plan.gate_for(unit)
    if gate is not None:
        notes.append(f"gate {gate.id!r} guards {unit}: it runs only with a decision that applies")
    notes.append("the next resume runs it (`keepstep resume`)")
    state = records[unit].state.value if unit in records else "pending"
    return TakeoverPreview(
        action="rerun",
        summary=(f"rerun {unit} (now {status.status if status else state}): invalidate "
                 f"{_ids(result.affected)}; run {_ids(to_run)} ({_figures(cost, unknown)}); "
                 f"reuse {len(result.reused)} current units"),
        reused=list(result.reused), invalidated=dict(result.affected), to_run=to_run,
        estimate=cost,
        records=("a checkpoint commit (kind takeover) invalidating "
                 f"{_ids(result.affected)}, with decision.takeover action=rerun unit={unit}"
                 if result.affected else f"decision.takeover action=rerun unit={unit}")
        + (", then its runtime status cleared" if status is not None else ""),
        notes=notes)


# -- branch ------------------------------------------------------------------------------------

def records_at(run: Run, version: int) -> dict[str, UnitRecord]:
    """The unit records of the run's branch as they stood at checkpoint ``version``."""
    state: dict[str, object] = {}
    for cp in run.store.list_checkpoints(run.run_id, run.branch_id):
        if cp.version > version:
            break
        for key, value in cp.delta.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return records_from_state(state)


def preview_branch(run: Run, at: int, name: str) -> TakeoverPreview:
    """Forking at checkpoint ``at`` as branch ``name``: what the branch starts with, what
    it would have to run again, what the current branch keeps."""
    head = run.head().version
    if not 0 <= at <= head:
        raise KeepstepError(f"checkpoint {at} is not on {run.run_id}/{run.branch_id} "
                            f"(head {head})", hint=f"pick a version from 0 to {head}")
    if not name or any(c.isspace() for c in name):
        raise KeepstepError(f"{name!r} is not a branch id", hint="one word, e.g. alt")
    if any(b["branch_id"] == name for b in run.store.branches(run.run_id)):
        raise KeepstepError(f"branch {name} already exists in {run.run_id}",
                            hint="choose another branch id")
    plan = run.plan
    now = run.facts_records()
    then = records_at(run, at)
    reused = _current(plan, then)
    again = [u for u in _current(plan, now) if u not in reused
             or then[u].attempt != now[u].attempt]
    cost, unknown = _estimate(run, plan, again, now)
    later = run.store.list_checkpoints(run.run_id, run.branch_id, since_version=at + 1)
    notes = [f"{len(later)} later checkpoint(s) of {run.branch_id} are not in the branch; "
             f"{run.branch_id} is kept as it is"]
    if any(cp.kind == "plan-change" for cp in later):
        notes.append("the branch starts at the plan as it was then: the plan change after it "
                     "is detected again on its first resume")
    return TakeoverPreview(
        action="branch",
        summary=(f"fork {run.run_id}/{run.branch_id} at checkpoint {at} (head {head}) as "
                 f"{name}: it starts with {len(reused)} current units; units current now but "
                 f"not then ({_ids(again)}) would run again there ({_figures(cost, unknown)})"),
        reused=reused, to_run=again, estimate=cost,
        records=f"a new branch {name} with its own head at checkpoint {at}, and "
                f"decision.takeover action=branch on it",
        notes=notes)


# -- cancel ------------------------------------------------------------------------------------

def preview_cancel(run: Run) -> TakeoverPreview:
    """Cancelling: what stops, what stays; nothing is invalidated, deleted or undone."""

    plan = run.plan
    records = run.facts_records()
    facts = run.facts()
    current = _current(plan, records)
    running = [u.id for u in plan.units if facts.effective_state(u.id) == UnitState.running]
    open_units = [u.id for u in plan.units if u.id not in current and u.id not in running]
    effects = compensation_preview(run.store, run.run_id, branch_id=run.branch_id)
    notes = ["committed work is kept; a later `keepstep resume` continues the run (a new "
             "decision)"]
    if running:
        notes.append(f"running now: {_ids(running)} — stop its executor with Ctrl-C (it stops "
                     "at the next safe point); this record does not signal another process")
    if effects:
        notes.append(f"{len(effects)} committed external action(s) are not undone")
    return TakeoverPreview(
        action="cancel",
        summary=(f"cancel {run.run_id}/{run.branch_id}: keep {len(current)} current units; "
                 f"leave {_ids(open_units)} unrun; invalidate nothing; cost none"),
        reused=current, held=open_units, records="decision.takeover action=cancel",
        notes=notes)


# -- mark for an expert ------------------------------------------------------------------------

def preview_expert(run: Run, unit: str) -> TakeoverPreview:
    """Marking ``unit`` for an expert: it is held (blocked) and what depends on it waits."""
    plan = run.plan
    _check(plan, [unit])
    records = run.facts_records()
    current = _current(plan, records)
    waiting = _in_plan_order(plan, (u for u in nx.descendants(plan.graph(), unit)
                                    if u not in current))
    notes = [f"a rerun of it (`keepstep takeover --run {run.run_id} rerun {unit}`) releases it"]
    if unit in current:
        notes.insert(0, f"{unit} is current and stays so; the hold applies if it has to "
                        "run again")
    return TakeoverPreview(
        action="mark_for_expert",
        summary=(f"hold {unit} for an expert (blocked, {EXPERT_REASON!r}); waiting behind it: "
                 f"{_ids(waiting)}; reuse {len(current)} current units; invalidate nothing; "
                 "cost none"),
        reused=current, held=[unit], waiting=waiting,
        records=f"decision.takeover action=mark_for_expert unit={unit} (with the note), then "
                f"a blocked status ({EXPERT_REASON!r})",
        notes=notes)


__all__ = ["TakeoverPreview", "keep_for_drop", "preview_branch", "preview_cancel",
           "preview_expert", "preview_narrow", "preview_rerun", "records_at"]
