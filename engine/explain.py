"""What a person reads: the dry run of a change (``preview``) and why a unit is in its state
(``explain_unit``).

Both are pure functions over loaded facts — the plan, the committed unit records, runtime statuses
and leases (``RunFacts``) and the call ledger rows — so the TUI, the CLI and a notebook show the
same sentences, and tests need no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from keepstep.storage.models import ModelCall

from .changes import Change, natural_key
from .invalidation import HighRiskRule, InvalidationResult, PlanIndex, invalidate
from .plan import Plan
from .state import Explanation, RunFacts, UnitRecord, UnitState

# -- preview ---------------------------------------------------------------------------------

class UnitCost(BaseModel):
    unit: str
    calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    basis: str = "ledger"  # "ledger <attempt>", "mean of N <kind> units", "unknown"


class Estimate(BaseModel):
    total: UnitCost
    redo: UnitCost  # the invalidated units
    first_run: UnitCost  # units that will run under the new plan
    units: list[UnitCost]
    unknown: list[str] = Field(default_factory=list)


class Preview(BaseModel):
    """A dry run: what is reused, invalidated and run, and the estimated cost."""

    changes: list[Change]
    invalidated: dict[str, list[Explanation]]
    will_run: list[str]
    reused: list[str]
    estimate: Estimate
    summary: str


def _sum(label: str, items: list[UnitCost]) -> UnitCost:
    return UnitCost(unit=label, calls=sum(i.calls for i in items),
                    tokens=sum(i.tokens for i in items), cost=round(sum(i.cost for i in items), 6),
                    seconds=round(sum(i.seconds for i in items), 3), basis="sum")


Calls = Iterable[ModelCall] | Mapping[str, list[ModelCall]]


def group_calls(calls: Iterable[ModelCall]) -> dict[str, list[ModelCall]]:
    """The call ledger grouped by unit; pass it to ``preview`` to look up only the units it
    needs (a caller that previews repeatedly groups once)."""
    out: dict[str, list[ModelCall]] = {}
    for c in calls:
        out.setdefault(c.unit, []).append(c)
    return out


def _settled(uid: str, calls: Iterable[ModelCall], attempt: str | None, basis: str) -> UnitCost:
    n = tokens = latency_ms = 0
    cost = 0.0
    for c in calls:
        if c.status == "settled" and (attempt is None or c.attempt_id == attempt):
            n += 1
            tokens += c.tokens_in + c.tokens_out
            cost += c.cost
            latency_ms += c.latency_ms
    return UnitCost(unit=uid, calls=n, tokens=tokens, cost=cost, seconds=latency_ms / 1000.0,
                    basis=basis)


def estimate_costs(plan: Plan, unit_ids: list[str], records: Mapping[str, UnitRecord],
                   calls: Calls, *, index: PlanIndex | None = None) -> list[UnitCost]:
    """Per unit: its latest committed attempt's settled calls, else the mean of the units of
    the same kind that have one, else zeros marked ``unknown``."""
    ix = index or PlanIndex(plan)
    by_unit = calls if isinstance(calls, Mapping) else group_calls(calls)
    means: dict[str, UnitCost | None] = {}

    def known(uid: str) -> UnitCost | None:
        rec = records.get(uid)
        if rec is None:
            return None
        return _settled(uid, by_unit.get(uid, ()), rec.attempt, f"ledger {rec.attempt}")

    def mean(kind: str) -> UnitCost | None:
        if kind not in means:
            seen = [c for uid in ix.ids if ix.kinds[uid] == kind and (c := known(uid))]
            means[kind] = None if not seen else UnitCost(
                unit=kind, calls=round(sum(c.calls for c in seen) / len(seen)),
                tokens=round(sum(c.tokens for c in seen) / len(seen)),
                cost=sum(c.cost for c in seen) / len(seen),
                seconds=sum(c.seconds for c in seen) / len(seen),
                basis=f"mean of {len(seen)} {kind} units")
        return means[kind]

    out = []
    for uid in unit_ids:
        cost = known(uid)
        if cost is None:
            m = mean(ix.kinds.get(uid, ""))
            cost = m.model_copy(update={"unit": uid}) if m else UnitCost(unit=uid,
                                                                         basis="unknown")
        out.append(cost)
    return out


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


def _summary(result: InvalidationResult, est: Estimate) -> str:
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
    return text


def preview(plan: Plan, changes: list[Change], records: Mapping[str, UnitRecord],
            calls: Calls, *,
            high_risk_rules: Iterable[Mapping[str, Any] | HighRiskRule] = (),
            source_groups: Mapping[str, str] | None = None,
            index: PlanIndex | None = None) -> Preview:
    """A dry run of ``invalidate`` with the estimated re-do cost from the call ledger.

    Redo figures are the settled calls of each invalidated unit's latest committed attempt, so
    they equal the ledger sums; units that will run for the first time are estimated from the
    mean of their kind, or counted as 0 and listed in ``estimate.unknown``.
    """
    ix = index or PlanIndex(plan)
    result = invalidate(plan, changes, records, high_risk_rules=high_risk_rules,
                        source_groups=source_groups, index=ix)
    per_unit = estimate_costs(plan, result.redo, records, calls, index=ix)
    redo = per_unit[:len(result.affected)]
    first = per_unit[len(result.affected):]
    est = Estimate(total=_sum("total", per_unit), redo=_sum("redo", redo),
                   first_run=_sum("first run", first), units=per_unit,
                   unknown=[c.unit for c in per_unit if c.basis == "unknown"])
    return Preview(changes=list(changes), invalidated=result.affected,
                   will_run=list(result.pending_affected), reused=result.reused, estimate=est,
                   summary=_summary(result, est))


# -- one unit --------------------------------------------------------------------------------

_BLOCKED_HINTS = {
    "budget": "record a budget decision to raise the limit, then resume",
    "quota": "top up the provider account or switch model, then resume",
    "auth": "fix the provider key (`keepstep keys set PROVIDER`), then resume",
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

    def render(self) -> str:
        lines = [f"{self.unit} — {self.title} [{self.kind}] · {self.state.value}",
                 f"  {self.why}"]
        lines += [f"    - {e.render()}" for e in self.explanations]
        lines += [f"  {d}" for d in self.details]
        tail = f"  attempts: {self.attempts}"
        if self.ledger is not None:
            tail += (f" · ledger: {self.ledger.calls} calls, {_tokens(self.ledger.tokens)} tokens, "
                     f"${self.ledger.cost:.2f}")
        return "\n".join([*lines, tail])


def _flat(figures: Mapping[str, Any]) -> str:
    parts = []
    for key, value in figures.items():
        if isinstance(value, Mapping):
            parts.append(f"{key} " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in value.items()))
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
                 calls: Iterable[ModelCall] | None = None,
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
        details.append(f"to continue: look at the error, then `keepstep retry` {unit_id}")
    elif state == UnitState.cancelled and status is not None:
        why = f"cancelled: {status.reason}"
    else:
        nxt, details = _waiting(plan, facts, unit_id, approvals)
        why = f"pending (never succeeded): {nxt}"
    ledger = None
    if calls is not None:
        ledger = _settled(unit_id, own, None, "ledger, every attempt")
    return UnitExplanation(unit=unit_id, title=unit.title, kind=unit.kind.value, state=state,
                           why=why, explanations=explanations, details=details,
                           attempts=attempts, ledger=ledger)


__all__ = ["Estimate", "Preview", "UnitCost", "UnitExplanation", "compact_ids",
           "estimate_costs", "explain_unit", "group_calls", "preview"]
