"""Budget decisions: only a recorded decision raises a limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine.errors import BudgetDecisionError, BudgetExhausted
from keepstep.engine.gateway.call_ledger import StoreCallLedger
from keepstep.storage import Budget, BudgetLimitReached, EventIn

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run

KNOWN = ("calls", "tool_calls", "tokens", "cost", "wall_time_s", "retries", "recoveries",
         "storage_bytes")


def charge_retry(run: Run, unit: str) -> BudgetExhausted | None:
    """Charge one unit retry to the ``retries`` budget; the BudgetExhausted to block the unit
    with when that would pass the limit (nothing is charged then)."""

    ledger = StoreCallLedger(run.store, run.run_id, run.branch_id)
    try:
        run.store.add_usage(run.run_id, {"retries": 1}, branch_id=run.branch_id, enforce=True)
    except BudgetLimitReached as exc:
        return ledger._exhausted(unit, exc, "the unit was not retried")
    return None


def raise_budget(run: Run, *, reason: str, who: str,
                 limits: dict[str, float | None]) -> Budget:
    """Raise limits with a decision event; release units that the budget blocked.

    Raises BudgetDecisionError (nothing recorded) for an unknown counter, no limit, an empty
    reason, or a limit lower than the current one.
    """
    new = {k: float(v) for k, v in limits.items() if v is not None}
    unknown = sorted(set(new) - set(KNOWN))
    if unknown:
        raise BudgetDecisionError(f"unknown budget counter(s): {', '.join(unknown)}",
                            hint=f"use one of {', '.join(KNOWN)}")
    if not new:
        raise BudgetDecisionError("no limit given", hint="e.g. --calls 120 or --cost 5")
    if not reason.strip():
        raise BudgetDecisionError("a budget raise needs a reason", hint="pass --reason '...'")
    old = run.store.get_budget(run.run_id, run.branch_id)
    lowered = [k for k, v in new.items() if k in old.limits and v < old.limits[k]]
    if lowered:
        raise BudgetDecisionError(f"this would lower {', '.join(lowered)}",
                            hint="a raise only raises; lowering a limit is a plan decision")
    budget = run.store.set_budget_limits(
        run.run_id, new, branch_id=run.branch_id,
        event=EventIn(kind="decision.budget_raise", payload={
            "who": who, "reason": reason,
            "old": {k: old.limits.get(k) for k in new}, "new": new,
            "used": {k: old.used.get(k, 0) for k in new},
        }),
    )
    for unit, st in run.store.unit_statuses(run.run_id, run.branch_id).items():
        if st.status == "blocked" and st.details.get("kind") == "budget":
            run.store.clear_unit_status(run.run_id, run.branch_id, unit)
    return budget
