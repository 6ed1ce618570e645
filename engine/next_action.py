"""The one next step a person can take, in words, from the status and decision."""

from __future__ import annotations

from typing import Any

from .decide import Decision, DecisionKind


def next_action(status: Any, decision: Decision) -> str:
    if decision.kind == DecisionKind.done:
        return "done: export the handover (`keepstep handover`)"
    if decision.kind == DecisionKind.claim:
        return f"resume: {decision.unit} is ready (`keepstep resume`)"
    if decision.kind == DecisionKind.waiting:
        return "wait: another executor holds a live lease (" + "; ".join(decision.reasons) + ")"
    budget_units = [u for u, v in status.units.items() if v.state == "blocked"
                    and (v.reason or "").startswith("budget")]
    if budget_units:
        return (f"raise the budget, then resume ({', '.join(budget_units)} blocked: "
                f"{status.units[budget_units[0]].reason})")
    if status.pending_approvals:
        gate = status.pending_approvals[0]
        return (f"answer the approval for gate {gate['gate']!r} "
                f"(`keepstep approve DIR --run {status.run_id} {gate['gate']} --choice ...`)")
    if status.external_unknown:
        return "decide the unknown external outcomes (`keepstep effects`), then resume"
    blocked = [u for u, v in status.units.items() if v.state in ("blocked", "failed")]
    if blocked:
        u = blocked[0]
        return f"look at {u} (`keepstep explain DIR --run {status.run_id} {u}`), then retry it"
    return "blocked: " + "; ".join(decision.reasons)
