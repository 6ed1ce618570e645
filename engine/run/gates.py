"""Gates in the run loop: which gated units may run, asking again when a decision
no longer applies, and answering from the command line (``--approve gate=choice``).

``open_gates`` only reads; ``request_gates`` (called by the run loop, explicitly) writes
the approval requests and records ``--approve`` answers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.state import RunFacts, UnitState
from keepstep.engine.errors import ApprovalError
from keepstep.engine.run import approvals
from keepstep.engine.run.approvals import ApprovalOption

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Gate
    from keepstep.engine.run.handle import RunHandle
    from keepstep.storage import ApprovalRecord


class PendingApproval(BaseModel):
    """An open approval request as a person sees it: the question, what the decision would
    bind, and each option's reuse/redo/cost recomputed from the facts now (the figures
    recorded when the gate first asked stay in ``options_at_request``)."""

    gate: str
    unit: str = ""
    held_units: list[str] = Field(default_factory=list)
    question: str = ""
    request_id: str = ""
    created_at: str = ""
    bound_object: dict[str, Any] = Field(default_factory=dict)
    options: list[ApprovalOption] = Field(default_factory=list)
    options_at_request: list[ApprovalOption] = Field(default_factory=list)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def bound_object(run: RunHandle, gate: Gate, facts: RunFacts | None = None) -> dict[str, Any]:
    """What an approval of this gate binds to, as the run stands now."""
    if gate.binds.startswith("artifact:"):
        uid = gate.binds.split(":", 1)[1]
        records = facts.records if facts is not None else run.facts_records()
        rec = records.get(uid)
        return {"artifact_unit": uid,
                "artifact": sorted(o.sha256 for o in rec.outputs.values()) if rec else None}
    info = facts.plan_info if facts is not None else run.plan_info
    return {"plan_n": int(info.get("n", 1)), "contract_hash": info.get("contract_hash", "")}


def option_estimates(run: RunHandle, gate: Gate, facts: RunFacts) -> list[ApprovalOption]:
    """Per option: what it reuses, what it redoes, and the estimated cost (from the ledger)."""
    from keepstep.engine.core.invalidation import downstream_of

    plan = run.plan
    held = gate.held_units()
    redo = sorted(downstream_of(plan, held) | set(held))
    current = sorted(u for u in plan.unit_map() if facts.is_current(u))
    calls = run.store.calls(run.run_id)
    per_unit: dict[str, list] = {}
    for c in calls:
        per_unit.setdefault(c.unit, []).append(c)
    kinds = {u.id: u.kind.value for u in plan.units}
    by_kind: dict[str, list[int]] = {}
    for uid, cs in per_unit.items():
        by_kind.setdefault(kinds.get(uid, ""), []).append(len(cs))
    est_calls = sum(
        len(per_unit[u]) if u in per_unit else
        round(sum(by_kind.get(kinds[u], [0])) / max(1, len(by_kind.get(kinds[u], [0]))))
        for u in redo
    )
    audience = run.project.files.contract.audience
    out = []
    for label in gate.options or ["approve"]:
        # record_choice refuses an option that contradicts contract.md's audience (when the
        # audience is one of the options); every other option runs the gated units.
        keeps = not gate.options or audience not in gate.options or label == audience
        out.append(ApprovalOption(
            label=label, reuse=current, redo=redo if keeps else [],
            estimate={"calls": est_calls if keeps else 0, "cost": 0.0},
            note="runs the gated unit and what follows" if keeps else
            f"needs contract.md's audience changed to {label!r} first (a plan change)",
            available=keeps,
        ))
    return out


def _waiting_units(run: RunHandle, gate: Gate, facts: RunFacts,
                   out: dict[str, bool]) -> list[str]:
    units = run.plan.unit_map()
    held = [u for u in gate.held_units() if u in units]
    waiting = [u for u in held
               if facts.effective_state(u) in (UnitState.pending, UnitState.invalidated)]
    for u in held:
        out[u] = u not in waiting
    return waiting


def open_gates(run: RunHandle, facts: RunFacts) -> dict[str, bool]:
    """unit id -> whether its gate currently has an applying approval. Reads only."""
    out: dict[str, bool] = {}
    for gate in run.plan.gates:
        waiting = _waiting_units(run, gate, facts, out)
        if waiting and approvals.gate_status(run.store, run.run_id, run.branch_id, gate,
                                             bound_object(run, gate, facts), facts.now).open:
            out.update({u: True for u in waiting})
    return out


def request_gates(run: RunHandle, facts: RunFacts, *,
                  approve: dict[str, str] | None = None) -> dict[str, bool]:
    """Like ``open_gates``, and ask: a gate whose units are otherwise ready gets an approval
    request (a new one when the old decision no longer applies), and an ``approve`` answer
    (``--approve gate=choice``) is recorded as a decision. The run loop calls this."""
    out: dict[str, bool] = {}
    units = run.plan.unit_map()
    for gate in run.plan.gates:
        waiting = _waiting_units(run, gate, facts, out)
        if not waiting:
            continue
        obj = bound_object(run, gate, facts)
        status = approvals.gate_status(run.store, run.run_id, run.branch_id, gate, obj, facts.now)
        if status.open:
            out.update({u: True for u in waiting})
            continue
        if not any(all(facts.is_current(d.unit) for d in units[u].depends_on) for u in waiting):
            continue
        if status.request is None:
            request = approvals.request_gate(run.store, run.run_id, run.branch_id, gate,
                                             bound_object=obj,
                                             options=option_estimates(run, gate, facts),
                                             now=facts.now)
            keep_token(run, gate.id, request.resume_token)
        answer = (approve or {}).get(gate.id)
        if answer is not None:
            record_choice(run, gate, answer, who="command line (--approve)", facts=facts)
            out.update({u: True for u in waiting})
    return out


def keep_token(run: RunHandle, gate_id: str, token: str | None) -> None:
    """Hand a newly issued resume token to the run object that asked (``Run.resume_tokens``,
    in memory only): the database keeps its sha256, so this is the one chance to show it."""
    tokens = getattr(run, "resume_tokens", None)
    if token and isinstance(tokens, dict):
        tokens[gate_id] = token


def issue_resume_token(run: RunHandle, gate: Gate) -> str:
    """Ask ``gate`` again about the same object and return the new request's resume token.

    The open request is superseded (a token issued with it stops working); the options are
    recomputed now. ApprovalError when the gate has no open request to re-issue."""
    facts = run.facts()
    obj = bound_object(run, gate, facts)
    status = approvals.gate_status(run.store, run.run_id, run.branch_id, gate, obj, facts.now)
    if status.open or status.request is None or status.request.status != "requested":
        raise ApprovalError(f"gate {gate.id!r} has no open request to issue a token for",
                            hint="a token is issued when the run reaches the gate; resume first")
    request = approvals.request_gate(run.store, run.run_id, run.branch_id, gate,
                                     bound_object=obj,
                                     options=option_estimates(run, gate, facts), now=facts.now)
    assert request.resume_token is not None
    keep_token(run, gate.id, request.resume_token)
    return request.resume_token


def record_choice(run: RunHandle, gate: Gate, answer: str, *, who: str, token: str | None = None,
                  facts: RunFacts | None = None) -> ApprovalRecord:
    """Record a person's answer to ``gate`` (an ``approval.decided`` decision event).

    Raises ApprovalError, recording nothing, for an option the gate does not offer, an
    answer that contradicts contract.md, or a refused resume token."""
    labels = {slug(o): o for o in gate.options}
    choice = labels.get(slug(answer), answer if not gate.options else None)
    if choice is None:
        raise ApprovalError(f"gate {gate.id!r} has no option {answer!r}",
                            hint="choose one of: " + ", ".join(gate.options))
    audience = run.project.files.contract.audience
    if gate.options and audience in gate.options and choice != audience:
        raise ApprovalError(
            f"contract.md says audience = {audience!r}; approving {choice!r} would not match it",
            hint=f"to change the audience, edit contract.md (audience = {choice!r}), resume to "
            "see the preview, then approve",
        )
    return approvals.decide(run.store, run.run_id, gate.id, choice, who=who,
                            bound_object=bound_object(run, gate, facts),
                            expires_days=gate.expires_days, token=token)


def revoke_choice(run: RunHandle, gate: Gate, *, who: str, reason: str) -> ApprovalRecord:
    """Revoke the gate's current decision (an ``approval.revoked`` decision event).

    The gate then asks again the next time the run reaches it (a new request on resume)
    — unless its unit has already run: a revocation does not redo work. Raises
    ApprovalError when the gate has no decision to revoke or the reason is empty.
    """
    if not reason.strip():
        raise ApprovalError("a revocation needs a reason", hint="pass --reason '...'")
    return approvals.revoke(run.store, run.run_id, gate.id, who, reason)


def pending_approvals(run: RunHandle, facts: RunFacts | None = None) -> list[PendingApproval]:
    """Open approval requests, oldest first, with each option recomputed from the facts now."""
    out = []
    gates = {g.id: g for g in run.plan.gates}
    for req in approvals.pending_requests(run.store, run.run_id, run.branch_id):
        gate = gates.get(req.gate_id)
        recorded = [ApprovalOption.model_validate(o) for o in req.options]
        options = recorded
        if gate is not None:
            facts = facts if facts is not None else run.facts()
            options = option_estimates(run, gate, facts)
        out.append(PendingApproval(
            gate=req.gate_id, unit=req.unit,
            held_units=gate.held_units() if gate is not None else [req.unit],
            question=req.question, request_id=req.request_id, created_at=req.created_at,
            bound_object=req.bound_object, options=options, options_at_request=recorded))
    return out
