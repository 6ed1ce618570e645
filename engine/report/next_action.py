"""What needs a person, and the one next step, in words, from the status and decision.

Every command suggested here exists in the ``keepstep`` CLI and is written out in full as it
runs inside the project folder (DIR is then found from the working directory), with the run
id (plus ``--branch`` off the main branch), so it can be copied. A face that runs elsewhere
adds the project path (``keepstep.app.cli.output.commands_for``). No placeholder is ever
written: a value a person must choose is named in words after the command.
"""

from __future__ import annotations

import math
import shlex
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from keepstep.engine.core.decide import Decision, DecisionKind
from keepstep.engine.gateway.call_ledger import UNPRICED_WORDS


class Need(BaseModel):
    """One thing only a person can settle, with what to do about it.

    ``kind``: approval, budget, effect, expert, failed, blocked or recovery. ``action`` is
    what to do in words; ``command`` the CLI command that does it (empty when there is none).
    """

    kind: str
    unit: str | None = None
    units: list[str] = []
    message: str
    action: str
    command: str = ""
    key: str | None = None  # the effect's idempotency key, the gate id, …


def cmd(status: Any, verb: str, rest: str = "") -> str:
    """```keepstep VERB --run RUN [--branch B] [REST]``` as it runs inside the project."""
    branch = f" --branch {status.branch}" if getattr(status, "branch", "main") != "main" else ""
    tail = f" {rest}" if rest else ""
    return f"`keepstep {verb} --run {status.run_id}{branch}{tail}`"


def _gate_of(request: Any) -> tuple[str, str, str, str]:
    """(gate, unit, question, the option to suggest: the first one the gate accepts)."""
    if isinstance(request, dict):
        request = SimpleNamespace(gate=request.get("gate", "?"), unit=request.get("unit", ""),
                                  question=request.get("question", ""),
                                  options=request.get("options") or [])
    labels = [(o.get("label"), o.get("available", True)) if isinstance(o, dict)
              else (o.label, o.available) for o in request.options]
    choice = next((label for label, ok in labels if ok), labels[0][0] if labels else "approve")
    return request.gate, request.unit, request.question, str(choice)




def needs(status: Any, recovery_stopped: str | None = None,
          budget_limits: dict[str, float] | None = None) -> list[Need]:
    """What waits for a person, most urgent first: a stopped recovery, unknown external
    outcomes, approvals, the budget, held and failed units. Nothing else."""
    out: list[Need] = []
    effects = getattr(status, "external_unknown", None) or []
    if recovery_stopped:
        out.append(Need(kind="recovery", message=f"recovery stopped: {recovery_stopped}",
                        action="look at the events, then record a recovery reset",
                        command=cmd(status, "recovery reset", "--reason 'what you checked'")))
    for e in effects:
        if not (e.get("detail") or {}).get("needs_person"):
            continue
        key = e.get("idem_key", "")
        why = (e.get("detail") or {}).get("reason", "outcome unknown")
        out.append(Need(kind="effect", unit=e.get("unit"), key=key,
                        message=f"{e.get('unit')}: {e.get('action')} via {e.get('adapter')} — "
                        f"outcome unknown ({why})",
                        action="settle it: look it up again, or record whether it was sent",
                        command=cmd(status, "effects settle", key)))
    for req in status.pending_approvals:
        gate, unit, question, choice = _gate_of(req)
        out.append(Need(kind="approval", unit=unit, key=gate,
                        message=f"gate {gate}: {question}".rstrip(": "),
                        action="answer the approval",
                        command=cmd(status, "approve", f"{gate} --choice {shlex.quote(choice)}")))
    units = status.units
    budget = [u for u, v in units.items() if v.state == "blocked"
              and (v.reason or "").startswith("budget")]
    unpriced = [u for u in budget if UNPRICED_WORDS in (units[u].reason or "")]
    if unpriced:
        # Raising a limit cannot help a model with no price: it needs one (its message says
        # where), an api_base, or no cost limit.
        budget = [u for u in budget if u not in unpriced]
        out.append(Need(kind="blocked", unit=unpriced[0], units=unpriced,
                        message=f"{', '.join(unpriced)} blocked: {units[unpriced[0]].reason}",
                        action="give the model's price in keepstep.toml (model_settings), "
                        "then resume", command=cmd(status, "resume")))
    if budget:
        first = units[budget[0]]
        reason = first.reason or ""
        figures = getattr(first, "budget", None) or {}
        over = [k for k, f in sorted(figures.items())
                if f.get("used", 0) + f.get("requested", 0) > f.get("limit", 0)]
        counter = next(iter(over or sorted(figures)), None) or next(
            (k for k in ("calls", "tokens", "cost", "recoveries") if f"budget: {k}" in reason),
            "calls")
        limit = (budget_limits or {}).get(counter)
        requested = float((figures.get(counter) or {}).get("requested", 0))
        new, why = suggested_limit(status, counter, limit, requested)
        shown = f"${new}" if counter == "cost" else new
        out.append(Need(kind="budget", unit=budget[0], units=budget,
                        message=f"{', '.join(budget)} blocked: {reason}",
                        action=f"raise the {counter} limit to {shown} ({why}), then resume",
                        command=cmd(status, "budget raise",
                                    f"--{counter} {new} --reason 'approved more {counter}'")))
    effect_units = {n.unit for n in out if n.kind == "effect"}
    for uid, view in units.items():
        reason = view.reason or ""
        if uid in budget or uid in effect_units or uid in unpriced:
            continue
        if view.state == "blocked" and reason.startswith("marked for an expert"):
            out.append(Need(kind="expert", unit=uid, message=f"{uid} held: {reason}",
                            action="when the expert has looked, release it with a rerun",
                            command=cmd(status, "takeover", f"rerun {uid}")))
        elif view.state == "blocked" and reason.startswith("external outcome unknown"):
            out.append(Need(kind="effect", unit=uid, message=f"{uid} blocked: {reason}",
                            action="settle the external action",
                            command=cmd(status, "effects")))
        elif view.state == "failed":
            out.append(Need(kind="failed", unit=uid, message=f"{uid} failed: {reason}",
                            action="look at why, then retry it",
                            command=cmd(status, "retry", uid)))
        elif view.state == "blocked" and reason and not reason.startswith("out of scope"):
            out.append(Need(kind="blocked", unit=uid, message=f"{uid} blocked: {reason}",
                            action="fix the cause, then retry it",
                            command=cmd(status, "retry", uid)))
    return out


def suggested_limit(status: Any, counter: str, limit: float | None,
                    requested: float = 0.0) -> tuple[str, str]:
    """The one suggested new limit (every face shows this number: the dashboard's Needs, the
    next action, the TUI's budget form), and why: what was used so far, plus this run's own
    rate per finished unit times the units still to do (a quarter more for the unforeseen);
    without a finished unit yet, half as much again as the limit. Never less than what lets
    the refused call through (used + ``requested``)."""
    used = float(((getattr(status, "budget", None) or {}).get("used") or {}).get(counter, 0))
    views = list((getattr(status, "units", None) or {}).values())
    done = sum(1 for v in views if v.state in ("succeeded", "current"))
    left = len(views) - done
    if done and left and used:
        rate = used / done
        need = used + rate * left * 1.25
        shown_rate = f"${rate:.4f}" if counter == "cost" else f"{rate:.1f}"
        why = f"{shown_rate} {counter} per finished unit so far, {left} unit(s) to go"
    else:
        need = (limit or used or 1) * 1.5
        why = "half as much again"
    need = max(need, (limit or 0) * 1.1, used + (0.01 if counter == "cost" else 1),
               used + requested)
    shown = f"{math.ceil(need * 100) / 100:.2f}" if counter == "cost" else str(math.ceil(need))
    return shown, why


def next_action(status: Any, decision: Decision) -> str:
    """The one next step: what the run needs now, with the command that does it."""
    resume = cmd(status, "resume")
    if decision.kind == DecisionKind.done:
        # Not "or the handover": this line is also in the handover's own narrative.
        return (f"done: export the deliverables ({cmd(status, 'export')}; add --format docx "
                "for Word files with charts)")
    if decision.kind == DecisionKind.claim:
        return f"resume: {decision.unit} is ready ({resume})"
    if decision.kind == DecisionKind.waiting:
        return ("wait: another executor holds a live lease (" + "; ".join(decision.reasons)
                + f"); check it with {cmd(status, 'status')}")
    limits = (getattr(status, "budget", None) or {}).get("limits", {})
    found = needs(status, budget_limits=limits)
    first = found[0] if found else None
    if first is not None and first.kind == "budget":
        return (f"raise the budget ({first.command}), then resume ({resume}) "
                f"({first.message})")
    if first is not None and first.kind == "approval":
        return f"answer the approval for gate {first.key!r} ({first.command}), then resume"
    if first is not None and first.kind == "effect" and first.key:
        return (f"settle the external action of {first.unit} ({first.command}: it looks the "
                f"key up first), then resume ({resume})")
    if status.external_unknown:
        return (f"resume: recovery asks the adapters about {len(status.external_unknown)} "
                f"external action(s) without a receipt ({resume}); list them with "
                f"{cmd(status, 'effects')}")
    if first is not None and first.kind in ("failed", "blocked", "expert"):
        u = first.unit
        return f"look at {u} ({cmd(status, 'explain', u or '')}), then {first.action} " \
               f"({first.command})"
    return "blocked: " + "; ".join(decision.reasons)


__all__ = ["Need", "cmd", "needs", "next_action"]
