"""Takeover decisions: what a person chooses when they take a run over.

Each choice is a recorded ``decision.takeover`` event (and, where it holds units back, a
runtime ``blocked`` status with its reason) — never a hand edit of the database. The
TUI's takeover page and the CLI call these; resume, retry and branch themselves live on
``Run`` (``Run.run``, ``Run.retry``, ``Run.branch``), which record their own events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.changes import Change, ChangeKind
from keepstep.engine.core.invalidation import InvalidationResult, invalidate
from keepstep.engine.core.plan import EdgeType
from keepstep.engine.core.plan_graph import DependencyIndex
from keepstep.engine.core.state import UnitState, unit_key
from keepstep.engine.errors import KeepstepError
from keepstep.engine.run.commit import commit
from keepstep.storage import CommitRequest, EventIn

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Plan
    from keepstep.engine.run.runtime import Run

TAKEOVER_ACTIONS = ("resume", "narrow_scope", "rerun", "branch", "cancel", "mark_for_expert")
EXPERT_REASON = "marked for an expert"
OUT_OF_SCOPE_REASON = "out of scope (narrowed at a takeover)"


def record_takeover(run: Run, action: str, *, who: str = "user", unit: str | None = None,
                    **details: Any) -> int:
    """Append one ``decision.takeover`` event naming the action and who chose it.

    Returns the event's sequence number. Raises KeepstepError for an unknown action.
    """
    if action not in TAKEOVER_ACTIONS:
        raise KeepstepError(f"unknown takeover action {action!r}",
                            hint="one of: " + ", ".join(TAKEOVER_ACTIONS))
    return run.store.append_event(run.run_id, "decision.takeover", branch_id=run.branch_id,
                                  unit=unit, payload={"action": action, "who": who, **details})


def check_units(plan: Plan, units: Iterable[str]) -> list[str]:
    known = plan.unit_map()
    wanted = list(dict.fromkeys(units))
    unknown = [u for u in wanted if u not in known]
    if unknown or not wanted:
        raise KeepstepError(
            f"no unit {', '.join(unknown)} in the plan" if unknown else "name at least one unit",
            hint="units: " + ", ".join(u.id for u in plan.units))
    return wanted


def scope_of(plan: Plan, units: Iterable[str]) -> set[str]:
    """The units themselves and everything they depend on (what a narrowed run still needs):
    one traversal for all of them (an ancestor walk per unit was quadratic in the plan)."""
    wanted = set(units)
    return wanted | DependencyIndex(plan).upstream(wanted)


def out_of_scope(run: Run, units: Iterable[str]) -> list[str]:
    """Units (plan order) that narrowing to ``units`` would hold back: outside the scope and
    not current. Current units outside the scope are kept as they are."""
    plan = run.plan
    keep = scope_of(plan, check_units(plan, units))
    records = run.facts_records()
    return [u.id for u in plan.units if u.id not in keep and
            not (u.id in records and records[u.id].state.value == "succeeded")]


def narrow_scope(run: Run, units: Iterable[str], *, who: str = "user",
                 note: str = "") -> list[str]:
    """Keep only ``units`` (and what they depend on) in the run: record the decision, then
    block every other unit that is not current with reason OUT_OF_SCOPE_REASON.

    Returns the held-back units. ``Run.retry(unit)`` releases one again (a recorded decision).
    """
    keep = check_units(run.plan, units)
    dropped = out_of_scope(run, keep)
    record_takeover(run, "narrow_scope", who=who, keep=keep, dropped=dropped, note=note)
    for uid in dropped:
        run.store.set_unit_status(run.run_id, run.branch_id, uid, "blocked", OUT_OF_SCOPE_REASON,
                                  {"kind": "scope", "keep": keep})
    return dropped


def mark_for_expert(run: Run, unit: str, note: str = "", *, who: str = "user") -> None:
    """Record that ``unit`` needs an expert and hold it (blocked, EXPERT_REASON) until a
    recorded retry releases it; its dependents wait behind it."""
    check_units(run.plan, [unit])
    record_takeover(run, "mark_for_expert", who=who, unit=unit, note=note)
    run.store.set_unit_status(run.run_id, run.branch_id, unit, "blocked", EXPERT_REASON,
                              {"kind": "expert", "note": note})


# -- narrowed scope as the engine sees it -------------------------------------------------------

def narrowed_scope(run: Run) -> tuple[set[str], set[str]]:
    """(kept, dropped) from the branch's ``narrow_scope`` decisions, applied oldest first.

    ``dropped``: units a narrowing held back, less any a later retry or rerun released;
    ``kept``: the units a narrowing kept (the run's finals from then on). Both are empty
    when the scope was never narrowed.
    """
    kept: set[str] = set()
    dropped: set[str] = set()
    for event in run.store.events(run.run_id, branch_id=run.branch_id,
                                  kinds=["decision.takeover"]):
        action = event.payload.get("action")
        if action == "narrow_scope":
            new_drop = set(event.payload.get("dropped", []))
            new_keep = set(event.payload.get("keep", []))
            dropped = (dropped | new_drop) - new_keep
            kept = (kept - new_drop) | new_keep
        elif action in ("retry", "rerun") and event.unit:
            dropped.discard(event.unit)
    return kept, dropped


def scoped_plan(run: Run, plan: Plan) -> Plan:
    """``plan`` with the run's narrowed scope applied: a dropped unit is not required final,
    a kept unit is. The same plan when the scope was never narrowed, so change detection —
    which compares the plan as recorded — never sees a narrowing as a plan edit."""
    kept, dropped = narrowed_scope(run)
    if not kept and not dropped:
        return plan
    units = [u.model_copy(update={"required_final": (u.required_final or u.id in kept)
                                  and u.id not in dropped}) for u in plan.units]
    return plan.model_copy(update={"units": units})


# -- rerun -------------------------------------------------------------------------------------

RERUN = "rerun"


def rerun_change(unit: str, who: str, note: str = "") -> Change:
    """The change a rerun of ``unit`` stands for: the unit is redone and whatever uses its
    content (content and presentation edges, transitively) is redone after it."""
    detail = f"rerun of {unit} chosen at a takeover by {who}" + (f": {note}" if note else "")
    return Change(kind=ChangeKind.unit_definition, origin=f"unit:{unit}", edge=EdgeType.content,
                  detail=detail, plan_level=False)


def rerun_invalidation(run: Run, unit: str, *, who: str = "user",
                       note: str = "") -> InvalidationResult:
    """What a rerun of ``unit`` invalidates (nothing is written). Explanations are labelled
    ``rerun``: origin unit → edges → unit."""
    plan = run.plan
    check_units(plan, [unit])
    result = invalidate(plan, [rerun_change(unit, who, note)], run.facts_records())
    relabel = {uid: [e.model_copy(update={"change_kind": RERUN}) for e in exps]
               for uid, exps in result.affected.items()}
    pending = {uid: [e.model_copy(update={"change_kind": RERUN}) for e in exps]
               for uid, exps in result.pending_affected.items()}
    return result.model_copy(update={"affected": relabel, "pending_affected": pending})


def rerun_unit(run: Run, unit: str, *, who: str = "user", note: str = "") -> list[str]:
    """Run ``unit`` again at the next resume; returns the units invalidated.

    A current unit is invalidated with what uses its content, in one checkpoint commit (kind
    ``takeover``) carrying the ``decision.takeover`` event; early cut-off keeps a dependent
    current when the new output is byte-identical. A blocked, failed or held-back unit is
    released (its runtime status cleared). Refuses a unit blocked by the budget: that needs
    a budget decision first.
    """
    check_units(run.plan, [unit])
    status = run.store.unit_statuses(run.run_id, run.branch_id).get(unit)
    if status is not None and status.details.get("kind") == "budget":
        raise KeepstepError(f"{unit} is blocked by the budget",
                            hint="raise the limit with `keepstep budget raise` first")
    affected: list[str] = []

    def build() -> CommitRequest | None:
        nonlocal affected
        head = run.head()
        records = run.facts_records()
        result = rerun_invalidation(run, unit, who=who, note=note)
        affected = [u for u in result.affected if records[u].state == UnitState.succeeded]
        event = EventIn(kind="decision.takeover", unit=unit, payload={
            "action": RERUN, "who": who, "note": note, "invalidated": affected})
        if not affected:
            run.store.append_event(run.run_id, event.kind, branch_id=run.branch_id, unit=unit,
                                   payload=event.payload)
            return None
        delta: dict[str, Any] = {
            unit_key(u): records[u].model_copy(update={
                "state": UnitState.invalidated,
                "explanations": result.affected[u]}).model_dump(mode="json")
            for u in affected}
        return CommitRequest(run_id=run.run_id, branch_id=run.branch_id,
                             expected_version=head.version, delta=delta, kind="takeover",
                             budget_key="budget",
                             unit=unit, events=(event,), current=dict.fromkeys(affected))

    # Another executor committed meanwhile: recompute from the new head.
    commit(run.store, build, tries=20, gave_up=lambda: KeepstepError(
        f"the run kept moving; {unit} was not marked for a rerun",
        hint="stop the running executor, then try again"))
    if status is not None:
        run.store.clear_unit_status(run.run_id, run.branch_id, unit)
    return affected


__all__ = ["EXPERT_REASON", "OUT_OF_SCOPE_REASON", "RERUN", "TAKEOVER_ACTIONS",
           "mark_for_expert", "narrow_scope", "narrowed_scope",
           "out_of_scope", "record_takeover", "rerun_change", "rerun_invalidation",
           "rerun_unit", "scope_of", "scoped_plan"]
