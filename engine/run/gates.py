"""Gates in the run loop: which gated units may run, asking again when a decision
no longer applies, and answering from the command line (``--approve gate=choice``).

``open_gates`` only reads; ``request_gates`` (called by the run loop, explicitly) writes
the approval requests and records ``--approve`` answers.

What a decision binds is declared per gate (``Gate.binds``): ``contract:<field>`` (that
field's value as the run recorded it: an audience gate asks again only when the audience
changes), ``artifact:<unit>`` (its output hashes), ``verdict:<unit>`` (its validators'
verdict, with the failing checks), ``plan`` (the plan version) and the legacy ``contract``
(plan version and the whole contract). A gate that holds a deliver unit also binds the
hashes of the files it delivers (``deliver:<unit>``): changed bytes need the gate again —
and the verdict of every audit of those files computed on those bytes (``audited:<unit>``,
``release_audits``). What was audited is what is released: the gate is not asked while an
audit of the bytes failed or has not run on them; bytes that changed in substance since
their audit (``core.changes.same_substance``: more than heading wording or formatting,
whatever the change was classified as) are audited again first (``reaudit``).
``bindings`` shows each with its current value, and whether it moved since the request.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.changes import Change, ChangeKind, same_substance
from keepstep.engine.core.plan import EdgeType, UnitKind
from keepstep.engine.core.state import RunFacts, UnitState, unit_key
from keepstep.engine.errors import ApprovalError
from keepstep.engine.run import approvals
from keepstep.engine.run.approvals import ApprovalOption
from keepstep.storage import CheckpointConflict, EventIn
from keepstep.storage.hashing import canonical_json

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Gate
    from keepstep.engine.run.runtime import Run
    from keepstep.storage import ApprovalRecord


class Binding(BaseModel):
    """One thing a gate's decision binds, as the run stands now."""

    ref: str = Field(description="contract:audience, artifact:D01, verdict:A01, plan, "
                     "deliver:X01 …")
    kind: str = Field(description="contract, artifact, verdict, plan or deliver")
    shown: str = Field(description="its current value for a person: a field's value, a "
                       "file's hash, a verdict")
    passed: bool | None = Field(default=None, description="a verdict: whether it passed")
    failing: list[str] = Field(default_factory=list, description="a verdict: the failing "
                               "checks, each with its detail")
    changed: bool = Field(default=False, description="it differs from what the gate's last "
                          "decision bound (what changed since a person last answered)")


class PendingApproval(BaseModel):
    """An open approval request as a person sees it: the question, what the decision would
    bind (``bindings``: each value and verdict now), and each option's reuse/redo/cost
    recomputed from the facts now (the figures recorded when the gate first asked stay in
    ``options_at_request``)."""

    gate: str
    unit: str = ""
    held_units: list[str] = Field(default_factory=list)
    question: str = ""
    request_id: str = ""
    created_at: str = ""
    bound_object: dict[str, Any] = Field(default_factory=dict)
    bindings: list[Binding] = Field(default_factory=list)
    options: list[ApprovalOption] = Field(default_factory=list)
    options_at_request: list[ApprovalOption] = Field(default_factory=list)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _legacy(gate: Gate) -> str | None:
    """The old single-string forms, whose bound objects keep their old shape."""
    binds = gate.bindings()
    if len(binds) == 1 and (binds[0] == "contract" or binds[0].startswith("artifact:")) \
            and isinstance(gate.binds, str):
        return binds[0]
    return None


def _deliver_held(run: Run, gate: Gate) -> list[Any]:
    units = run.plan.unit_map()
    return [units[u] for u in gate.held_units()
            if u in units and units[u].kind.value == "deliver"]


def _delivered_files(unit: Any, records: dict[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for ref in unit.params.get("files") or []:
        dep, _, name = str(ref).partition(":")
        rec = records.get(dep)
        ok = rec is not None and rec.state.value == "succeeded" and name in rec.outputs
        out[str(ref)] = rec.outputs[name].sha256 if ok and rec is not None else None
    return out


class AuditOfBytes(BaseModel):
    """One audit of one file a gate's deliver unit delivers, as the run stands now."""

    file: str = Field(description="<unit>:<name> of the delivered file")
    sha256: str | None = Field(description="the bytes to be delivered now (None: not rendered)")
    audit: str = Field(description="the audit unit")
    state: str = Field(description="passed, failed, not run (not on these bytes yet) or "
                       "stale (the bytes changed in substance since it ran)")
    on: str | None = Field(default=None, description="the sha256 of the bytes it audited")
    detail: str = ""


def audits_of(plan: Any, unit_id: str) -> list[str]:
    """The audit units that read ``unit_id``'s output directly, in plan order."""
    return [u.id for u in plan.units if u.kind == UnitKind.audit
            and any(d.unit == unit_id for d in u.depends_on)]


def _bytes_of(run: Run, unit_id: str, name: str, sha256: str,
              path: str | None = None) -> str | None:
    """The text of ``unit_id``'s ``name`` with that sha256 (any attempt), or None."""
    root = run.store.artifacts.root
    paths = [path] if path else [e.path for e in run.store.manifest(run.run_id, unit=unit_id)
                                 if e.name == name and e.sha256 == sha256]
    for p in paths:
        try:
            return (root / p).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None


def release_audits(run: Run, gate: Gate, facts: RunFacts) -> list[AuditOfBytes]:
    """For each file the gate's deliver units deliver, each audit of it: did it pass on the
    exact bytes to be delivered? An audit that ran on other bytes counts for these only when
    the two differ in presentation alone (read back and compared, never assumed from how the
    change was classified); otherwise it is ``stale`` and must run again."""
    out: list[AuditOfBytes] = []
    records = facts.records
    for unit in _deliver_held(run, gate):
        for ref in unit.params.get("files") or []:
            dep, _, name = str(ref).partition(":")
            drec = records.get(dep)
            cur = (drec.outputs[name].sha256 if drec is not None and facts.is_current(dep)
                   and name in drec.outputs else None)
            for aid in audits_of(run.plan, dep):
                rec = records.get(aid)
                item = AuditOfBytes(file=str(ref), sha256=cur, audit=aid, state="not run")
                if cur is None or rec is None or not facts.is_current(aid) or \
                        facts.effective_state(aid) != UnitState.succeeded:
                    item.detail = f"{aid} has not audited {name} yet"
                    out.append(item)
                    continue
                item.on = (rec.consumed.get(dep) or {}).get(name)
                verdict = "passed" if rec.validators_passed else "failed"
                if item.on == cur:
                    item.state = verdict
                elif item.on is not None and drec is not None:
                    old = _bytes_of(run, dep, name, item.on)
                    new = _bytes_of(run, dep, name, cur, drec.outputs[name].path)
                    if old is not None and new is not None and same_substance(old, new):
                        item.state = verdict
                        item.detail = (f"{aid} audited bytes that differ from these only in "
                                       "presentation (heading wording or formatting)")
                    else:
                        item.state = "stale"
                if item.state == "failed":
                    failing = rec.facts.get("failing") or rec.facts.get("failed") or []
                    item.detail = "; ".join(str(f) for f in failing) or "its checks failed"
                elif item.state == "stale":
                    item.detail = (f"{name} changed (sha256 {str(item.on)[:12]} → {cur[:12]}) "
                                   f"since {aid} audited it")
                out.append(item)
    return out


def audit_hold(audits: list[AuditOfBytes]) -> str:
    """Why the gate is not asked ("" when it may be): an audit of the bytes failed, has not
    run on them, or must run again."""
    failed = [a for a in audits if a.state == "failed"]
    if failed:
        return "; ".join(f"{a.audit} failed on {a.file} ({a.detail})" for a in failed) + (
            " — nothing is asked or delivered: see `keepstep explain "
            f"{failed[0].audit}`, fix the document or its sources, then resume")
    waiting = [a for a in audits if a.state in ("not run", "stale")]
    return "; ".join(f"{a.audit} must audit {a.file} first ({a.detail})" for a in waiting)


def reaudit(run: Run, facts: RunFacts, stale: list[AuditOfBytes]) -> list[str]:
    """The bytes each stale audit read changed in substance: one ``unit_output`` change (its
    content) per changed file, invalidating the audit and what depends on its verdict (one
    ``repair`` commit, explained), so the audit runs again on the new bytes before the gate
    is asked. Returns the units invalidated ([] when another executor moved the head
    meanwhile: the loop's next round tries again)."""
    from keepstep.engine.core.invalidation import invalidate

    records = facts.records
    changes: dict[str, Change] = {}
    for item in stale:
        dep = item.file.partition(":")[0]
        changes.setdefault(item.file, Change(
            kind=ChangeKind.unit_output, origin=f"unit:{dep}", edge=EdgeType.content,
            detail=f"{item.detail}, in more than presentation: audited again before the "
            "release gate asks", old=item.on, new=item.sha256))
    result = invalidate(run.plan, list(changes.values()), records)
    delta: dict[str, Any] = {}
    current: dict[str, str | None] = {}
    explained: dict[str, list[str]] = {}
    for uid, explanations in sorted(result.affected.items()):
        rec = records.get(uid)
        if rec is None or rec.state != UnitState.succeeded:
            continue
        delta[unit_key(uid)] = rec.model_copy(update={
            "state": UnitState.invalidated, "explanations": explanations}).model_dump(mode="json")
        current[uid] = None
        explained[uid] = [e.render() for e in explanations]
    if not delta:
        return []
    store = run.store
    head = store.get_head(run.run_id, run.branch_id)
    if head.version != facts.head_version:
        return []
    try:
        store.commit_checkpoint(
            run.run_id, run.branch_id, head.version, delta, kind="repair", current=current,
            budget_key="budget",  # the budget as of the commit, read in its transaction
            events=[EventIn(kind="decision.repair", payload={
                "changes": [c.model_dump(mode="json") for c in changes.values()],
                "invalidated": explained, "reused": sorted(result.reused)})])
    except CheckpointConflict:
        return []
    run.facts_cache().refresh()  # the loop's facts share the cache's records: they see it now
    return sorted(explained)


def _value(run: Run, ref: str, records: dict[str, Any], info: dict[str, Any]) -> Any:
    kind, _, name = ref.partition(":")
    if ref == "plan":
        return int(info.get("n", 1))
    if ref == "contract":
        return {"plan_n": int(info.get("n", 1)), "contract_hash": info.get("contract_hash", "")}
    if kind == "contract":
        return (info.get("contract_fields") or {}).get(name)
    if kind in ("artifact", "verdict"):
        uid, _, output = name.partition(":")
        rec = records.get(uid)
        if rec is None or rec.state.value != "succeeded":
            return None
        if kind == "artifact":
            if output:
                return rec.outputs[output].sha256 if output in rec.outputs else None
            return sorted(o.sha256 for o in rec.outputs.values())
        return {"passed": bool(rec.validators_passed),
                "failed": list(rec.facts.get("failed", [])) if not rec.validators_passed else []}
    return None


def bound_object(run: Run, gate: Gate, facts: RunFacts | None = None) -> dict[str, Any]:
    """What an approval of this gate binds to, as the run stands now."""
    records = facts.records if facts is not None else run.facts_records()
    info = facts.plan_info if facts is not None else run.plan_info
    legacy = _legacy(gate)
    if legacy is not None and not _deliver_held(run, gate):
        if legacy.startswith("artifact:"):
            uid = legacy.split(":", 1)[1]
            rec = records.get(uid)
            return {"artifact_unit": uid,
                    "artifact": sorted(o.sha256 for o in rec.outputs.values()) if rec else None}
        return {"plan_n": int(info.get("n", 1)), "contract_hash": info.get("contract_hash", "")}
    binds = {ref: _value(run, ref, records, info) for ref in gate.bindings()}
    held = _deliver_held(run, gate)
    for unit in held:
        binds[f"deliver:{unit.id}"] = _delivered_files(unit, records)
    if held:
        facts = facts if facts is not None else run.facts()
        audited: dict[str, Any] = {}
        for a in release_audits(run, gate, facts):
            entry = audited.setdefault(a.file, {"sha256": a.sha256, "audits": {}})
            entry["audits"][a.audit] = {"state": a.state, "on": a.on}
        if audited:
            binds[f"audited:{held[0].id}"] = audited
    return {"binds": binds}


def _shown(run: Run, ref: str, value: Any, records: dict[str, Any]) -> Binding:
    kind, _, name = ref.partition(":")
    if ref in ("plan", "contract"):
        n = value["plan_n"] if isinstance(value, dict) else value
        return Binding(ref=ref, kind="plan", shown=f"plan-v{n}" + (
            ", the whole contract" if ref == "contract" else ""))
    if kind == "contract":
        contract = run.project.files.contract
        current = contract.field_hashes().get(name)
        shown = (repr(str(contract.fields.get(name, ""))) if name != "body" else "the body")
        if value is not None and current != value:
            shown += " in contract.md (edited since the run recorded it: resume to take it in)"
        return Binding(ref=ref, kind="contract", shown=f"{name} = {shown}")
    if kind == "artifact":
        uid = name.partition(":")[0]
        rec = records.get(uid)
        if value is None or rec is None:
            return Binding(ref=ref, kind="artifact", shown=f"{uid} has no current output yet")
        names = ", ".join(f"{n} {o.sha256[:12]}" for n, o in sorted(rec.outputs.items())
                          if not name.partition(":")[2] or n == name.partition(":")[2])
        return Binding(ref=ref, kind="artifact", shown=names)
    if kind == "verdict":
        rec = records.get(name)
        if value is None or rec is None:
            return Binding(ref=ref, kind="verdict", shown=f"{name} has no verdict yet")
        if value["passed"]:
            n = rec.facts.get("checks")
            return Binding(ref=ref, kind="verdict", passed=True,
                           shown=f"{name} passed" + (f" ({n} checks)" if n else ""))
        failing = [str(f) for f in rec.facts.get("failing", value.get("failed", []))]
        return Binding(ref=ref, kind="verdict", passed=False, failing=failing,
                       shown=f"{name} FAILED: {'; '.join(failing) or 'its validators failed'}")
    if kind == "audited":
        parts = []
        for file, entry in (value or {}).items():
            for aid, a in (entry.get("audits") or {}).items():
                parts.append(f"{aid} {a.get('state')} on {file} "
                             f"{str(entry.get('sha256') or 'not yet rendered')[:12]}")
        ok = all(a.get("state") == "passed" for e in (value or {}).values()
                 for a in (e.get("audits") or {}).values())
        return Binding(ref=ref, kind="audited", passed=ok,
                       shown="the audits of the delivered bytes: " + ("; ".join(parts) or
                                                                      "none reads them"))
    if kind == "deliver":
        files = value or {}
        shown = "; ".join(f"{f} {(h or 'not yet rendered')[:12]}" for f, h in files.items())
        return Binding(ref=ref, kind="deliver", shown=f"the files {name} delivers: {shown}")
    return Binding(ref=ref, kind=kind or ref, shown=str(value))


def last_decided(run: Run, gate: Gate) -> dict[str, Any] | None:
    """The bound object of the gate's last decision in this run and branch (None: never
    decided)."""
    rows = [r for r in run.store.approvals(run.run_id, branch_id=run.branch_id, gate_id=gate.id)
            if r.choice is not None]
    return rows[-1].bound_object if rows else None


def bindings(run: Run, gate: Gate, facts: RunFacts | None = None,
             asked: dict[str, Any] | None = None) -> list[Binding]:
    """What the gate's decision binds, each with its value and verdict now; ``changed`` when
    it differs from ``asked`` (the bound object of the gate's last decision)."""
    records = facts.records if facts is not None else run.facts_records()
    obj = bound_object(run, gate, facts)
    if "binds" not in obj:
        refs = {gate.bindings()[0]: obj}
        before = {gate.bindings()[0]: asked} if asked is not None else {}
        out = []
        for ref, value in refs.items():
            b = _shown(run, ref, obj.get("artifact") if ref.startswith("artifact:") else value,
                       records)
            b.changed = asked is not None and canonical_json(before.get(ref)) != \
                canonical_json(value)
            out.append(b)
        return out
    before = (asked or {}).get("binds", {}) if asked is not None else {}
    out = []
    for ref, value in obj["binds"].items():
        b = _shown(run, ref, value, records)
        b.changed = asked is not None and canonical_json(before.get(ref)) != canonical_json(value)
        out.append(b)
    return out


def release_hold(run: Run, gate: Gate, facts: RunFacts) -> str:
    """Why the deliver units this gate holds could not run even if approved ("" when they
    could): an upstream unit's failed validators (DESIGN §8, safe release)."""
    from keepstep.engine.core.decide import failed_upstream

    reasons = []
    for unit in _deliver_held(run, gate):
        found = failed_upstream(run.plan, facts, unit.id)
        reasons += [f"{uid} failed its checks ({detail})" for uid, detail in found]
    return "; ".join(dict.fromkeys(reasons))


def option_estimates(run: Run, gate: Gate, facts: RunFacts) -> list[ApprovalOption]:
    """Per option: what it reuses, what it redoes, and the estimated cost (from the ledger)."""
    from keepstep.engine.core.invalidation import downstream_of

    plan = run.plan
    held = gate.held_units()
    redo = sorted(downstream_of(plan, held) | set(held))
    current = sorted(u for u in plan.unit_map() if facts.is_current(u))
    # The same estimate as a preview's (engine.core.explain.estimate_costs): a unit that
    # calls the model is never counted at ~0 calls.
    per_unit = run.estimate(redo, plan, facts.records)
    est_calls = sum(c.calls for c in per_unit)
    est_cost = round(sum(c.cost for c in per_unit), 6)
    audience = run.project.files.contract.audience
    hold = release_hold(run, gate, facts)
    out = []
    for label in gate.options or ["approve"]:
        # An audience gate's option runs the gated units only when it matches contract.md's
        # audience (record_choice refuses the others) — unless the audience is none of the
        # options; a release gate's option runs them unless a failed validator holds them.
        available = True
        if gate.binds_audience() and gate.options:
            runs = available = audience not in gate.options or label == audience
            note = ("runs the gated unit and what follows" if runs else
                    f"needs contract.md's audience changed to {label!r} first (a plan change)")
        elif gate.lets_run(label):
            runs = not hold
            note = (f"runs {', '.join(held)} and what follows" if runs else
                    f"approves, but nothing is delivered while {hold}: fix that first")
        else:
            runs = False
            note = (f"{', '.join(held)} wait{'s' if len(held) == 1 else ''}: nothing runs or "
                    "is delivered (revoke the decision to be asked again)")
        out.append(ApprovalOption(
            label=label, reuse=current, redo=redo if runs else [],
            estimate={"calls": est_calls if runs else 0, "cost": est_cost if runs else 0.0},
            note=note,
            available=available))
    return out


def _waiting_units(run: Run, gate: Gate, facts: RunFacts,
                   out: dict[str, bool]) -> list[str]:
    units = run.plan.unit_map()
    held = [u for u in gate.held_units() if u in units]
    waiting = [u for u in held
               if facts.effective_state(u) in (UnitState.pending, UnitState.invalidated)]
    for u in held:
        out[u] = u not in waiting
    return waiting


def open_gates(run: Run, facts: RunFacts) -> dict[str, bool]:
    """unit id -> whether its gate currently has an applying approval. Reads only."""
    out: dict[str, bool] = {}
    for gate in run.plan.gates:
        waiting = _waiting_units(run, gate, facts, out)
        if waiting and approvals.gate_status(run.store, run.run_id, run.branch_id, gate,
                                             bound_object(run, gate, facts), facts.now).open:
            out.update({u: True for u in waiting})
    return out


def request_gates(run: Run, facts: RunFacts, *,
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
        if _deliver_held(run, gate):
            # What was audited is what is released: never ask about bytes whose audit failed,
            # did not run on them, or ran on bytes that differ from them in substance.
            audits = release_audits(run, gate, facts)
            stale = [a for a in audits if a.state == "stale"]
            if stale:
                reaudit(run, facts, stale)
                continue
            if audit_hold(audits):
                continue
        if status.request is None:
            request = approvals.request_gate(run.store, run.run_id, run.branch_id, gate,
                                             bound_object=obj,
                                             options=option_estimates(run, gate, facts),
                                             now=facts.now)
            keep_token(run, gate.id, request.resume_token)
        answer = (approve or {}).get(gate.id)
        if answer is not None:
            _answer_once(run, gate, obj, answer, facts)
            out.update({u: True for u in waiting})
    return out


def _answer_once(run: Run, gate: Gate, obj: dict[str, Any], answer: str,
                 facts: RunFacts) -> None:
    """Record an ``--approve`` answer. Another executor on the run may answer the same
    request between our status read and our answer (the gate is then open: nothing to do),
    or supersede it with its own request (answered once more, then any refusal stands)."""
    for last in (False, True):
        try:
            record_choice(run, gate, answer, who="command line (--approve)", facts=facts)
            return
        except ApprovalError:
            status = approvals.gate_status(run.store, run.run_id, run.branch_id, gate, obj,
                                           run.clock())
            if status.open:
                return
            if last or status.request is None:
                raise


def keep_token(run: Run, gate_id: str, token: str | None) -> None:
    """Hand a newly issued resume token to the run object that asked (``Run.resume_tokens``,
    in memory only): the database keeps its sha256, so this is the one chance to show it."""
    if token:
        run.resume_tokens[gate_id] = token


def issue_resume_token(run: Run, gate: Gate) -> str:
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


def record_choice(run: Run, gate: Gate, answer: str, *, who: str, token: str | None = None,
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
    if gate.binds_audience() and audience in gate.options and choice != audience:
        raise ApprovalError(
            f"contract.md says audience = {audience!r}; approving {choice!r} would not match it",
            hint=f"to change the audience, edit contract.md (audience = {choice!r}), resume to "
            "see the preview, then approve",
        )
    return approvals.decide(run.store, run.run_id, gate.id, choice, who=who,
                            bound_object=bound_object(run, gate, facts),
                            expires_days=gate.expires_days, token=token)


def revoke_choice(run: Run, gate: Gate, *, who: str, reason: str) -> ApprovalRecord:
    """Revoke the gate's current decision (an ``approval.revoked`` decision event).

    The gate then asks again the next time the run reaches it (a new request on resume)
    — unless its unit has already run: a revocation does not redo work. Raises
    ApprovalError when the gate has no decision to revoke or the reason is empty.
    """
    if not reason.strip():
        raise ApprovalError("a revocation needs a reason", hint="pass --reason '...'")
    return approvals.revoke(run.store, run.run_id, gate.id, who, reason)


def pending_approvals(run: Run, facts: RunFacts | None = None) -> list[PendingApproval]:
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
        bound = []
        if gate is not None:
            facts = facts if facts is not None else run.facts()
            bound = bindings(run, gate, facts, asked=last_decided(run, gate))
        out.append(PendingApproval(
            gate=req.gate_id, unit=req.unit,
            held_units=gate.held_units() if gate is not None else [req.unit],
            question=req.question, request_id=req.request_id, created_at=req.created_at,
            bound_object=req.bound_object, bindings=bound, options=options,
            options_at_request=recorded))
    return out
