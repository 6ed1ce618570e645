"""What a person reads: the dry run of a change (``preview``) and why a unit is in its state
(``explain_unit``).

Both are pure functions over loaded facts — the plan, the committed unit records, runtime statuses
and leases (``RunFacts``) and the call ledger rows — so the TUI, the CLI and a notebook show the
same sentences, and tests need no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field, field_serializer

from keepstep.engine.core.changes import Change, natural_key
from keepstep.engine.core.estimates import Calls, UnitCost, settled_cost, unit_costs
from keepstep.engine.core.invalidation import (
    HighRiskRule,
    InvalidationResult,
    PlanIndex,
    held_despite_change,
    invalidate,
    released_by_change,
)
from keepstep.engine.core.plan import Plan
from keepstep.engine.core.state import CallRow, Explanation, RunFacts, UnitRecord, UnitState

# -- preview ---------------------------------------------------------------------------------

class Estimate(BaseModel):
    total: UnitCost
    redo: UnitCost  # the invalidated units
    first_run: UnitCost  # units that will run under the new plan
    units: Sequence[UnitCost]  # per unit, redo then first run; from preview: built when read
    unknown: list[str] = Field(default_factory=list)

    @field_serializer("units")
    def _dump_units(self, value: Sequence[UnitCost]) -> list[UnitCost]:
        return list(value)


class Preview(BaseModel):
    """A dry run: what is reused, invalidated and run, and the estimated cost.

    ``invalidated`` is ``InvalidationResult.affected``: each unit's explanations are built when
    first read, so a preview of a change that reaches 10,000 units costs little until someone
    reads all of them.
    """

    changes: list[Change]
    invalidated: Mapping[str, list[Explanation]]
    will_run: list[str]
    reused: list[str]
    estimate: Estimate
    summary: str

    @field_serializer("invalidated")
    def _dump_invalidated(self, value: Mapping[str, list[Explanation]],
                          ) -> dict[str, list[Explanation]]:
        return dict(value.items())

    def _repr_html_(self) -> str:  # Jupyter
        from keepstep.engine.core.html import preview_html

        return preview_html(self)


def compact_ids(ids: Iterable[str]) -> str:
    """'U27–U30, U33' for U27, U28, U29, U30, U33 (runs of three or more become a range)."""
    parsed, others = [], []
    for uid in ids:
        head = uid.rstrip("0123456789")
        digits = uid[len(head):]
        if digits:
            parsed.append((head, int(digits), len(digits), uid))
        else:
            others.append(uid)
    parsed.sort(key=lambda p: (p[0], p[1]))
    parts: list[str] = []
    i = 0
    while i < len(parsed):
        j = i
        while (j + 1 < len(parsed) and parsed[j + 1][0] == parsed[i][0]
               and parsed[j + 1][1] == parsed[j][1] + 1):
            j += 1
        if j - i >= 2:
            parts.append(f"{parsed[i][3]}–{parsed[j][3]}")
        else:
            parts.extend(p[3] for p in parsed[i:j + 1])
        i = j + 1
    return ", ".join(parts + sorted(others, key=natural_key))


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{round(n / 1000)}k" if n >= 1000 else str(n)


def _figures(c: UnitCost) -> str:
    return f"~{c.calls} calls, ~{_tokens(c.tokens)} tokens, ${c.cost:.2f}"


def _summary(result: InvalidationResult, est: Estimate,
             statuses: Mapping[str, Any] | None = None) -> str:
    real = [c for c in result.changes if not c.cosmetic]
    head = "; ".join(c.detail for c in real[:3]) + (f"; and {len(real) - 3} more" if
                                                    len(real) > 3 else "")
    if not real:
        head = "no change reaches any unit" if result.changes else "no changes"
    parts = [f"reuse {len(result.reused)} units"]
    if result.affected:
        parts.append(f"redo {compact_ids(result.affected)} ({_figures(est.redo)})")
    else:
        parts.append("redo nothing")
    unknown = set(est.unknown)  # only first-run units can lack figures
    if result.pending_affected:
        first = set(result.pending_affected)
        if unknown >= first:
            figures = "no figures yet: no unit of their kinds has run"
            unknown -= first
        else:
            figures = _figures(est.first_run)
        parts.append(f"then run {compact_ids(first)} under the new plan ({figures})")
    text = f"{head}: " + " · ".join(parts) + "."
    if unknown:
        text += f" No figures yet for {compact_ids(sorted(unknown))} (counted as 0)."
    released = released_by_change(result, statuses or {})
    if released:
        text += (f" {compact_ids(released)} failed before; the change reaches "
                 f"{'it, so it runs' if len(released) == 1 else 'them, so they run'} again.")
    for uid, why in held_despite_change(result, statuses or {}).items():
        text += f" {uid} stays blocked until that is settled ({why})."
    return text


def preview(plan: Plan, changes: list[Change], records: Mapping[str, UnitRecord],
            calls: Calls, *,
            high_risk_rules: Iterable[Mapping[str, Any] | HighRiskRule] = (),
            source_groups: Mapping[str, str] | None = None,
            index: PlanIndex | None = None,
            writers: Iterable[str] | None = None,
            statuses: Mapping[str, Any] | None = None) -> Preview:
    """A dry run of ``invalidate`` with the estimated re-do cost from the call ledger.

    Redo figures are the settled calls of each invalidated unit's latest committed attempt, so
    they equal the ledger sums; units that will run for the first time are estimated from the
    mean of their own earlier attempts or of their kind, never below their kind's own steps
    (``expected_calls``; ``writers`` as in ``estimate_costs``), or counted as 0 and listed in
    ``estimate.unknown``. ``statuses`` (unit -> runtime status) names the failed units the
    change releases and the blocked ones it does not (``released_by_change``, the rule a
    resume follows); a held unit is left out of ``will_run``.
    """
    ix = index or PlanIndex(plan)
    result = invalidate(plan, changes, records, high_risk_rules=high_risk_rules,
                        source_groups=source_groups, index=ix)
    per_unit = unit_costs(ix, result.redo, records, calls, plan=plan,
                           source_groups=source_groups, writers=writers)
    n_redo = len(result.affected)
    # model_construct: every value is built above from validated models, and the lazy
    # ``invalidated`` / ``units`` must not be copied (validation would build every row).
    est = Estimate.model_construct(
        total=per_unit.total("total"), redo=per_unit.total("redo", 0, n_redo),
        first_run=per_unit.total("first run", n_redo), units=per_unit,
        unknown=[uid for uid, basis in zip(per_unit.unit, per_unit.basis, strict=True)
                 if basis == "unknown"])
    held = held_despite_change(result, statuses or {})
    return Preview.model_construct(
        changes=list(changes), invalidated=result.affected,
        will_run=[u for u in result.pending_affected if u not in held],
        reused=list(result.reused), estimate=est, summary=_summary(result, est, statuses))


# -- one unit --------------------------------------------------------------------------------

_BLOCKED_HINTS = {
    "budget": "record a budget decision to raise the limit (`keepstep status` suggests the new "
              "limit and the command), then resume",
    "quota": "top up the provider account or switch model, then resume",
    "auth": "fix the provider key (`keepstep keys set PROVIDER`), then resume",
    "provider_outage": "check the provider's status or your network, then resume",
}


class UnitExplanation(BaseModel):
    """Why a unit is in its state, from stored facts only."""

    unit: str
    title: str
    kind: str
    state: UnitState
    why: str
    explanations: list[Explanation] = Field(default_factory=list)
    details: list[str] = Field(default_factory=list)
    attempts: int = 0
    ledger: UnitCost | None = None
    # The last failed attempt's validator problems (field, rule, message, value) and the
    # recorded rejected answers (paths under .keepstep/artifacts/).
    problems: list[dict[str, Any]] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)

    def render(self) -> str:
        lines = [f"{self.unit} — {self.title} [{self.kind}] · {self.state.value}",
                 f"  {self.why}"]
        lines += [f"    - {e.render()}" for e in self.explanations]
        lines += [f"  {d}" for d in self.details]
        if self.problems:
            lines.append(f"  problems ({len(self.problems)}):")
            lines += [f"    - {p.get('field')} [{p.get('rule')}]: {p.get('message')}"
                      + (f" (got {p['value']})" if p.get("value") else "")
                      for p in self.problems]
        lines += [f"  rejected answer: .keepstep/artifacts/{a}" for a in self.answers]
        tail = f"  attempts: {self.attempts}"
        if self.ledger is not None:
            tail += (f" · ledger: {self.ledger.calls} calls, {_tokens(self.ledger.tokens)} tokens, "
                     f"${self.ledger.cost:.2f}")
        return "\n".join([*lines, tail])

    def _repr_html_(self) -> str:  # Jupyter
        from keepstep.engine.core.html import explanation_html

        return explanation_html(self)


def _flat(figures: Mapping[str, Any]) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, Mapping):
            money = key == "cost"  # money with $, as everywhere else
            parts.append(f"{key} " + ", ".join(
                f"{k} ${v:.4f}" if money and isinstance(v, int | float) else
                f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items()))
        else:
            parts.append(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}")
    return "; ".join(parts)


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def _waiting(plan: Plan, facts: RunFacts, unit_id: str,
             approvals: Iterable[Any] | None) -> tuple[str, list[str]]:
    """(sentence, details) for a unit that is not current and not running/blocked/failed."""
    unit = plan.unit_map()[unit_id]
    behind = [f"{d.unit} ({facts.effective_state(d.unit)})" for d in unit.depends_on
              if not facts.is_current(d.unit)]
    if behind:
        return "waits for dependencies that are not current: " + ", ".join(behind), []
    gate = plan.gate_for(unit_id)
    if gate is not None and not facts.gates_open.get(unit_id, False):
        details = []
        for a in approvals or ():
            if _get(a, "gate") != gate.id and _get(a, "unit") != unit_id:
                continue
            choice = _get(a, "choice", _get(a, "decision", ""))
            applies = _get(a, "applies")
            state = "" if applies is None else (" — applies" if applies else
                                                " — no longer applies (its object changed)")
            details.append(f"approval of {gate.id}: {choice!r}{state}")
        sentence = (f"every dependency is current; waits for approval of gate {gate.id} "
                    f"({gate.question!r})")
        return sentence, details
    return "ready: every dependency is current" + (
        f" and gate {gate.id} is approved" if gate else ""), []


def explain_unit(plan: Plan, facts: RunFacts, unit_id: str, *,
                 calls: Iterable[CallRow] | None = None,
                 approvals: Iterable[Any] | None = None) -> UnitExplanation:
    """Why ``unit_id`` is in its state. ``calls`` (the run's ledger rows) adds figures;
    ``approvals`` (rows with gate/unit, choice and ``applies``) adds the gate's decisions."""
    unit = plan.unit_map()[unit_id]
    state = facts.effective_state(unit_id)
    rec = facts.records.get(unit_id)
    status = facts.statuses.get(unit_id)
    own = [c for c in calls or () if c.unit == unit_id]
    attempts = facts.attempts_count.get(unit_id) or len({c.attempt_id for c in own}) or (
        1 if rec else 0)
    explanations: list[Explanation] = []
    details: list[str] = []
    diagnosis = (status.details.get("diagnosis") if status is not None else None) or {}
    if state == UnitState.running:
        lease = facts.leases[unit_id]
        why = (f"running as {lease.attempt_id} on {lease.owner} (fencing token "
               f"{lease.fencing_token}); its lease expires in "
               f"{max(0, int(lease.expires_at - facts.now))} s")
        if lease.progress:
            details.append(f"progress: {lease.progress}")
    elif state == UnitState.succeeded and rec is not None:
        why = f"current since attempt {rec.attempt} was committed under plan-v{rec.plan_n}"
        if rec.facts.get("checkpoint"):
            why += f" (checkpoint {rec.facts['checkpoint']})"
        if rec.cutoff_note:
            why += f"; {rec.cutoff_note}"
        if not rec.validators_passed:
            why += "; its validators did not pass"
        details += [f"output {name}: sha256 {o.sha256[:12]}" for name, o in
                    sorted(rec.outputs.items())]
    elif state == UnitState.invalidated and rec is not None:
        why = (f"invalidated: its last success ({rec.attempt}, plan-v{rec.plan_n}) is kept but "
               "stale, because:" if rec.explanations else
               f"invalidated: its last success ({rec.attempt}) is kept but stale (no explanation "
               "was stored)")
        explanations = list(rec.explanations)
        nxt, extra = _waiting(plan, facts, unit_id, approvals)
        details += [f"next: {nxt}", *extra]
    elif state == UnitState.blocked and status is not None:
        kind = status.details.get("kind", "")
        why = f"blocked ({kind or 'needs a person'}): {status.reason}; retrying cannot help"
        if status.details.get("figures"):
            details.append("figures: " + _flat(status.details["figures"]))
        if kind in _BLOCKED_HINTS:
            details.append(f"to continue: {_BLOCKED_HINTS[kind]}")
    elif state == UnitState.failed and status is not None:
        kind = status.details.get("kind", "error")
        tries = status.details.get("attempts")
        why = (f"failed{f' after {tries} attempt(s)' if tries else ''}: error class {kind}: "
               f"{status.reason}")
        details += [f"validator {v.get('name')}: {v.get('detail')}"
                    for v in diagnosis.get("validators", [])]
        details.append(f"to continue: look at the error, then `keepstep retry` {unit_id}")
    elif state == UnitState.cancelled and status is not None:
        why = f"cancelled: {status.reason}"
    else:
        nxt, details = _waiting(plan, facts, unit_id, approvals)
        why = f"pending (never succeeded): {nxt}"
    ledger = None
    if calls is not None:
        ledger = settled_cost(unit_id, own, None, "ledger, every attempt")
    return UnitExplanation(unit=unit_id, title=unit.title, kind=unit.kind.value, state=state,
                           why=why, explanations=explanations, details=details,
                           attempts=attempts, ledger=ledger,
                           problems=list(diagnosis.get("problems", [])),
                           answers=list(diagnosis.get("answers", [])))


__all__ = ["Estimate", "Preview", "UnitExplanation", "compact_ids", "explain_unit", "preview"]
