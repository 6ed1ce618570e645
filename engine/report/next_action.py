"""The one next step a person can take, in words, from the status and decision.

Every command suggested here exists in the ``keepstep`` CLI and is written out in full with
the placeholder ``DIR`` for the project folder (the engine does not know how the person
spelled it) and the run id (plus ``--branch`` off the main branch), so it can be copied.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.core.decide import Decision, DecisionKind


def _cmd(status: Any, verb: str, rest: str = "") -> str:
    branch = f" --branch {status.branch}" if getattr(status, "branch", "main") != "main" else ""
    tail = f" {rest}" if rest else ""
    return f"`keepstep {verb} DIR --run {status.run_id}{branch}{tail}`"


def next_action(status: Any, decision: Decision) -> str:
    resume = _cmd(status, "resume")
    if decision.kind == DecisionKind.done:
        return (f"done: export the handover "
                f"({_cmd(status, 'handover', f'--out handover-{status.run_id}.zip')})")
    if decision.kind == DecisionKind.claim:
        return f"resume: {decision.unit} is ready ({resume})"
    if decision.kind == DecisionKind.waiting:
        return ("wait: another executor holds a live lease (" + "; ".join(decision.reasons)
                + f"); check it with {_cmd(status, 'status')}")
    budget_units = [u for u, v in status.units.items() if v.state == "blocked"
                    and (v.reason or "").startswith("budget")]
    if budget_units:
        reason = status.units[budget_units[0]].reason or ""
        exact = reason.split("raise with `", 1)[1].split("`", 1)[0] if "raise with `" in reason \
            else None
        command = f"`{exact}`" if exact else _cmd(status, "budget raise", "--calls N --reason ...")
        return (f"raise the budget ({command}), "
                f"then resume ({resume}) ({', '.join(budget_units)} blocked: "
                f"{status.units[budget_units[0]].reason})")
    if status.pending_approvals:
        first = status.pending_approvals[0]
        gate = first["gate"] if isinstance(first, dict) else first.gate
        return (f"answer the approval for gate {gate!r} "
                f"({_cmd(status, 'approve', gate + ' --choice ...')}), then resume")
    if status.external_unknown:
        return (f"settle the unknown external outcomes (list them with "
                f"{_cmd(status, 'effects')}), then resume ({resume})")
    blocked = [u for u, v in status.units.items() if v.state in ("blocked", "failed")]
    if blocked:
        u = blocked[0]
        return (f"look at {u} ({_cmd(status, 'explain', u)}), then retry it "
                f"({_cmd(status, 'retry', u)})")
    return "blocked: " + "; ".join(decision.reasons)
