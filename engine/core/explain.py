"""What a person reads: the dry run of a change (``preview``) and why a unit is in its state
(``explain_unit``).

Both are pure functions over loaded facts — the plan, the committed unit records, runtime statuses
and leases (``RunFacts``) and the call ledger rows — so the TUI, the CLI and a notebook show the
same sentences, and tests need no database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from pydantic import BaseModel, Field, field_serializer

from keepstep.engine.core.changes import Change, natural_key
from keepstep.engine.core.invalidation import (
    HighRiskRule,
    InvalidationResult,
    PlanIndex,
    held_despite_change,
    invalidate,
    released_by_change,
)
from keepstep.engine.core.plan import MODEL_KINDS, Plan, Unit, UnitKind
from keepstep.engine.core.state import CallRow, Explanation, RunFacts, UnitRecord, UnitState

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


Figures = tuple[int, int, float, float]  # calls, tokens, cost, seconds


class _UnitCosts(Sequence[UnitCost]):
    """Per-unit estimates kept as plain columns of numbers and strings, which the garbage
    collector does not track; the ``UnitCost`` rows are built when first read, then kept."""

    __slots__ = ("unit", "calls", "tokens", "cost", "seconds", "basis", "_rows")

    def __init__(self) -> None:
        self.unit: list[str] = []
        self.calls: list[int] = []
        self.tokens: list[int] = []
        self.cost: list[float] = []
        self.seconds: list[float] = []
        self.basis: list[str] = []
        self._rows: list[UnitCost] | None = None

    def add(self, uid: str, figures: Figures, basis: str) -> None:
        self.unit.append(uid)
        self.calls.append(figures[0])
        self.tokens.append(figures[1])
        self.cost.append(figures[2])
        self.seconds.append(figures[3])
        self.basis.append(basis)

    def total(self, label: str, start: int = 0, stop: int | None = None) -> UnitCost:
        """The sum of rows ``start:stop`` (in row order; cost and seconds rounded)."""
        cut = slice(start, stop)
        return UnitCost(unit=label, calls=sum(self.calls[cut]), tokens=sum(self.tokens[cut]),
                        cost=round(sum(self.cost[cut]), 6),
                        seconds=round(sum(self.seconds[cut]), 3), basis="sum")

    def rows(self) -> list[UnitCost]:
        if self._rows is None:
            self._rows = [
                UnitCost(unit=uid, basis=basis) if basis == "unknown" else
                UnitCost(unit=uid, calls=n, tokens=tokens, cost=cost, seconds=seconds,
                         basis=basis)
                for uid, n, tokens, cost, seconds, basis in zip(
                    self.unit, self.calls, self.tokens, self.cost, self.seconds, self.basis,
                    strict=True)]
        return self._rows

    @overload
    def __getitem__(self, i: int) -> UnitCost: ...
    @overload
    def __getitem__(self, i: slice) -> list[UnitCost]: ...
    def __getitem__(self, i: int | slice) -> UnitCost | list[UnitCost]:
        return self.rows()[i]

    def __len__(self) -> int:
        return len(self.unit)

    def __iter__(self) -> Iterator[UnitCost]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return self.rows() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value like a list

    def __repr__(self) -> str:
        return repr(self.rows())


Calls = Iterable[CallRow] | Mapping[str, list[CallRow]]


def group_calls(calls: Iterable[CallRow]) -> dict[str, list[CallRow]]:
    """The call ledger grouped by unit; pass it to ``preview`` to look up only the units it
    needs (a caller that previews repeatedly groups once)."""
    out: dict[str, list[CallRow]] = {}
    for c in calls:
        out.setdefault(c.unit, []).append(c)
    return out


def _ledger_figures(calls: Iterable[CallRow], attempt: str | None) -> Figures:
    n = tokens = latency_ms = 0
    cost = 0.0
    for c in calls:
        if c.status == "settled" and (attempt is None or c.attempt_id == attempt):
            n += 1
            tokens += c.tokens_in + c.tokens_out
            cost += c.cost
            latency_ms += c.latency_ms
    return n, tokens, cost, latency_ms / 1000.0


def _settled(uid: str, calls: Iterable[CallRow], attempt: str | None, basis: str) -> UnitCost:
    n, tokens, cost, seconds = _ledger_figures(calls, attempt)
    return UnitCost(unit=uid, calls=n, tokens=tokens, cost=cost, seconds=seconds, basis=basis)


def expected_calls(unit: Unit, sources: int = 1, *, writes: bool = True) -> int:
    """The model calls one attempt of ``unit`` makes at the least, from its kind's steps:
    extract one per source it reads, verify one per batch (at least one), synthesize and the
    general model step one per round (at least one), rank a ranking and a check per round;
    render one per section a model writes (``prose`` and ``section`` fills) when ``writes``
    (its model writes prose; the offline one does not); every other kind none."""
    kind = unit.kind
    if kind == UnitKind.extract:
        return max(1, sources)
    if kind == UnitKind.rank:
        return 2
    if kind in MODEL_KINDS:
        return 1
    if kind == UnitKind.render and writes:
        params = unit.params or {}
        fills = params.get("fill") or {}
        sections = sum(1 for spec in fills.values()
                       if isinstance(spec, dict) and spec.get("part") == "section")
        return sections + (1 if params.get("prose") else 0)
    return 0


def unit_sources(unit: Unit, source_groups: Mapping[str, str]) -> int:
    """How many of the approved sources (id -> group) ``unit`` reads by its ``source:`` and
    ``group:`` inputs."""
    groups, named = set(unit.input_refs("group")), set(unit.input_refs("source"))
    return sum(1 for sid, group in source_groups.items() if sid in named or group in groups)


def _unit_costs(ix: PlanIndex, unit_ids: Iterable[str], records: Mapping[str, UnitRecord],
                calls: Calls, *, plan: Plan | None = None,
                source_groups: Mapping[str, str] | None = None,
                writers: Iterable[str] | None = None) -> _UnitCosts:
    by_unit = calls if isinstance(calls, Mapping) else group_calls(calls)
    means: dict[str, tuple[Figures, str] | None] = {}
    out = _UnitCosts()
    units: dict[str, Unit] | None = None
    writing = None if writers is None else set(writers)

    def known(uid: str) -> Figures | None:
        rec = records.get(uid)
        return None if rec is None else _ledger_figures(by_unit.get(uid, ()), rec.attempt)

    def mean(kind: str) -> tuple[Figures, str] | None:
        if kind not in means:
            seen = [c for uid in ix.ids if ix.kinds[uid] == kind and (c := known(uid))]
            k = len(seen)
            means[kind] = None if not seen else (
                (round(sum(c[0] for c in seen) / k), round(sum(c[1] for c in seen) / k),
                 sum(c[2] for c in seen) / k, sum(c[3] for c in seen) / k),
                f"mean of {k} {kind} units")
        return means[kind]

    def earlier(uid: str) -> tuple[Figures, str] | None:
        """The mean per attempt of the unit's own earlier (uncommitted) attempts."""
        rows = [c for c in by_unit.get(uid, ()) if c.status == "settled"]
        attempts = {c.attempt_id for c in rows}
        if not attempts:
            return None
        n, tokens, cost, seconds = _ledger_figures(rows, None)
        k = len(attempts)
        return ((round(n / k), round(tokens / k), cost / k, seconds / k),
                f"mean of its {k} earlier attempt{'s' if k > 1 else ''}")

    def floor(uid: str) -> int:
        nonlocal units
        if plan is None or ix.kinds.get(uid) not in _CALLING_KINDS:
            return 0
        if units is None:
            units = plan.unit_map()
        unit = units.get(uid)
        if unit is None:
            return 0
        return expected_calls(unit, unit_sources(unit, source_groups or {}),
                              writes=writing is None or uid in writing)

    for uid in unit_ids:
        rec = records.get(uid)
        if rec is not None:
            figures, basis = _ledger_figures(by_unit.get(uid, ()), rec.attempt), \
                f"ledger {rec.attempt}"
        elif (m := earlier(uid) or mean(ix.kinds.get(uid, ""))) is not None:
            figures, basis = m
        else:
            figures, basis = (0, 0, 0.0, 0.0), "unknown"
        # A unit that calls the model is never estimated below its kind's own steps (an
        # attempt whose calls were reused, or a kind not run yet, would say ~0 calls).
        least = floor(uid)
        if figures[0] < least:
            figures = (least, *figures[1:])
            basis = (f"its kind's steps: {least} call{'s' if least > 1 else ''}"
                     if basis == "unknown" else f"{basis}, at least its kind's {least}")
        out.add(uid, figures, basis)
    return out


_CALLING_KINDS = frozenset({k.value for k in MODEL_KINDS} | {UnitKind.render.value})


def estimate_costs(plan: Plan, unit_ids: list[str], records: Mapping[str, UnitRecord],
                   calls: Calls, *, index: PlanIndex | None = None,
                   source_groups: Mapping[str, str] | None = None,
                   writers: Iterable[str] | None = None) -> list[UnitCost]:
    """Per unit: its latest committed attempt's settled calls, else the mean of its own
    earlier attempts, else the mean of the units of the same kind that have one; a unit that
    calls the model never below its kind's steps (``expected_calls``: ``source_groups``
    counts an extract unit's sources, ``writers`` are the render units whose model writes
    prose, None: all); else zeros marked ``unknown``."""
    return _unit_costs(index or PlanIndex(plan), unit_ids, records, calls, plan=plan,
                       source_groups=source_groups, writers=writers).rows()


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
    per_unit = _unit_costs(ix, result.redo, records, calls, plan=plan,
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
        ledger = _settled(unit_id, own, None, "ledger, every attempt")
    return UnitExplanation(unit=unit_id, title=unit.title, kind=unit.kind.value, state=state,
                           why=why, explanations=explanations, details=details,
                           attempts=attempts, ledger=ledger,
                           problems=list(diagnosis.get("problems", [])),
                           answers=list(diagnosis.get("answers", [])))


__all__ = ["Estimate", "Preview", "UnitCost", "UnitExplanation", "compact_ids",
           "estimate_costs", "expected_calls", "explain_unit", "group_calls", "preview",
           "unit_sources"]
