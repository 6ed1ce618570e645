"""Takeover decisions: what a person chooses when they take a run over.

Each choice is a recorded ``decision.takeover`` event (and, where it holds units back, a
runtime ``blocked`` status with its reason) — never a hand edit of the database. The
TUI's takeover page and the CLI call these; resume, retry and branch themselves live on
``Run`` (``Run.run``, ``Run.retry``, ``Run.branch``), which record their own events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import networkx as nx

from .errors import KeepstepError

if TYPE_CHECKING:
    from .plan import Plan
    from .project import Run

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


def _check_units(plan: Plan, units: Iterable[str]) -> list[str]:
    known = plan.unit_map()
    wanted = list(dict.fromkeys(units))
    unknown = [u for u in wanted if u not in known]
    if unknown or not wanted:
        raise KeepstepError(
            f"no unit {', '.join(unknown)} in the plan" if unknown else "name at least one unit",
            hint="units: " + ", ".join(u.id for u in plan.units))
    return wanted


def scope_of(plan: Plan, units: Iterable[str]) -> set[str]:
    """The units themselves and everything they depend on (what a narrowed run still needs)."""
    g = plan.graph()
    keep: set[str] = set()
    for uid in units:
        keep |= nx.ancestors(g, uid) | {uid}
    return keep


def out_of_scope(run: Run, units: Iterable[str]) -> list[str]:
    """Units (plan order) that narrowing to ``units`` would hold back: outside the scope and
    not current. Current units outside the scope are kept as they are."""
    plan = run.plan
    keep = scope_of(plan, _check_units(plan, units))
    records = run.facts_records()
    return [u.id for u in plan.units if u.id not in keep and
            not (u.id in records and records[u.id].state.value == "succeeded")]


def narrow_scope(run: Run, units: Iterable[str], *, who: str = "user", note: str = "") -> list[str]:
    """Keep only ``units`` (and what they depend on) in the run: record the decision, then
    block every other unit that is not current with reason OUT_OF_SCOPE_REASON.

    Returns the held-back units. ``Run.retry(unit)`` releases one again (a recorded decision).
    """
    keep = _check_units(run.plan, units)
    dropped = out_of_scope(run, keep)
    record_takeover(run, "narrow_scope", who=who, keep=keep, dropped=dropped, note=note)
    for uid in dropped:
        run.store.set_unit_status(run.run_id, run.branch_id, uid, "blocked", OUT_OF_SCOPE_REASON,
                                  {"kind": "scope", "keep": keep})
    return dropped


def mark_for_expert(run: Run, unit: str, note: str = "", *, who: str = "user") -> None:
    """Record that ``unit`` needs an expert and hold it (blocked, EXPERT_REASON) until a
    recorded retry releases it; its dependents wait behind it."""
    _check_units(run.plan, [unit])
    record_takeover(run, "mark_for_expert", who=who, unit=unit, note=note)
    run.store.set_unit_status(run.run_id, run.branch_id, unit, "blocked", EXPERT_REASON,
                              {"kind": "expert", "note": note})


__all__ = ["EXPERT_REASON", "OUT_OF_SCOPE_REASON", "TAKEOVER_ACTIONS", "mark_for_expert",
           "narrow_scope", "out_of_scope", "record_takeover", "scope_of"]
