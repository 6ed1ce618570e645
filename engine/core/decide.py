"""decide(plan, facts) -> Decision: the pure heart of scheduling and recovery.

No I/O: everything it needs is in RunFacts, so it can be tested exhaustively.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, Field

from keepstep.engine.core.plan import MODEL_KINDS, Plan, Unit, UnitKind
from keepstep.engine.core.plan_graph import DependencyIndex
from keepstep.engine.core.state import RunFacts, UnitRecord, UnitState


class DecisionKind(StrEnum):
    claim = "claim"  # claim ``unit`` next
    done = "done"  # every required final unit is current and the final validator passed
    waiting = "waiting"  # nothing to claim now, but another executor holds a live lease
    blocked = "blocked"  # nothing can move without a person (reasons say why)


class Decision(BaseModel):
    kind: DecisionKind
    unit: str | None = None
    ready: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


# Keyed by what the order depends on — unit ids in plan order, each followed by its
# dependencies and a None — not by the plan's fingerprint (a hash of the whole plan: ~0.3 s
# on 10,000 units, against ~6 ms for this key) nor by object identity (a caller may edit a
# plan in place).
_ORDER_CACHE: dict[tuple[str | None, ...], list[str]] = {}


def _order_key(plan: Plan) -> tuple[str | None, ...]:
    key: list[str | None] = []
    for u in plan.units:
        key.append(u.id)
        key.extend([d.unit for d in u.depends_on])
        key.append(None)
    return tuple(key)


def topo_order(plan: Plan) -> list[str]:
    """Units in dependency order, ties broken by plan order (deterministic)."""
    key = _order_key(plan)
    order = _ORDER_CACHE.get(key)
    if order is None:
        try:
            order = DependencyIndex(plan).topo_order()
        except ValueError as exc:  # the type networkx raised here before
            import networkx as nx  # only on this error: its import costs ~0.5 s

            raise nx.NetworkXUnfeasible(str(exc)) from None
        if len(_ORDER_CACHE) > 32:
            _ORDER_CACHE.clear()
        _ORDER_CACHE[key] = order
    return list(order)


# Safe release (DESIGN §8): a deliver unit never runs while a unit it depends on, however
# far up, has failed validators (an audit commits its verdict even when it fails). Ancestor
# sets per deliver unit are cached by the plan's order key, like topo_order.
_ANCESTORS: dict[tuple[str | None, ...], dict[str, frozenset[str]]] = {}


def _deliver_ancestors(plan: Plan) -> dict[str, frozenset[str]]:
    key = _order_key(plan)
    found = _ANCESTORS.get(key)
    if found is None:
        index = DependencyIndex(plan)
        found = {u.id: frozenset(index.upstream([u.id])) for u in plan.units
                 if u.kind == UnitKind.deliver}
        if len(_ANCESTORS) > 32:
            _ANCESTORS.clear()
        _ANCESTORS[key] = found
    return found


def failed_upstream(plan: Plan, facts: RunFacts, unit_id: str) -> list[tuple[str, str]]:
    """(unit, what failed) for every unit upstream of deliver unit ``unit_id`` that is
    current with failed validators, in plan order; empty for any other unit."""
    ancestors = _deliver_ancestors(plan).get(unit_id)
    if not ancestors:
        return []
    out = []
    for u in plan.units:
        rec = facts.records.get(u.id)
        if u.id in ancestors and rec is not None and rec.state == UnitState.succeeded \
                and not rec.validators_passed:
            failing = rec.facts.get("failing") or rec.facts.get("failed") or ["its validators"]
            out.append((u.id, "; ".join(str(f) for f in failing)))
    return out


def held_for_release(plan: Plan, facts: RunFacts) -> dict[str, str]:
    """Deliver units held by a failed upstream verdict -> why (for decide's reasons)."""
    out = {}
    for uid in _deliver_ancestors(plan):
        found = failed_upstream(plan, facts, uid)
        if found:
            out[uid] = "; ".join(f"{u} failed its checks ({d})" for u, d in found)
    return out


def _gated(plan: Plan) -> set[str]:
    """The units some gate holds (``plan.gate_for`` is not None), found once per call
    instead of a scan of the gates per unit."""
    return {uid for g in plan.gates for uid in g.held_units()}


def waiting_on_gate(plan: Plan, facts: RunFacts) -> list[str]:
    """Units whose dependencies are current but whose gate has no applying approval."""
    out = []
    units = plan.unit_map()
    gated = _gated(plan)
    for uid in topo_order(plan):
        if uid not in gated or facts.gates_open.get(uid, False):
            continue
        if facts.effective_state(uid) not in (UnitState.pending, UnitState.invalidated):
            continue
        if all(facts.is_current(d.unit) for d in units[uid].depends_on):
            out.append(uid)
    return out


MODEL_BUDGETS = ("calls", "tokens", "cost")


def exhausted_budgets(facts: RunFacts) -> dict[str, tuple[float, float]]:
    """Model budgets with nothing left: counter -> (used, limit)."""
    b = facts.budget
    return {k: (b.used.get(k, 0.0), b.limits[k]) for k in MODEL_BUDGETS
            if k in b.limits and b.used.get(k, 0.0) >= b.limits[k]}


# The budget, the provider's quota and the API key are shared by every unit that calls a
# model: while one of them blocks a unit, the others would only open more blocked attempts.
RUN_WIDE_BLOCKS = ("budget", "quota", "auth", "provider_outage")


def model_calls_blocked(facts: RunFacts) -> bool:
    return any(st.status == "blocked" and st.details.get("kind") in RUN_WIDE_BLOCKS
               for st in facts.statuses.values())


def ready_units(plan: Plan, facts: RunFacts) -> list[str]:
    """Units that may be claimed now: not current, not running/blocked/failed, deps current,
    gate (if any) approved, and — for units that call models — budget left."""
    units = plan.unit_map()
    # A stored budget, quota or key block means model calls are not available: other model
    # units wait for the decision (a raise, a retry) instead of each opening a blocked attempt.
    no_budget = model_calls_blocked(facts)
    gated = _gated(plan)
    out = []
    for uid in topo_order(plan):
        if facts.effective_state(uid) not in (UnitState.pending, UnitState.invalidated):
            continue
        if not all(facts.is_current(d.unit) for d in units[uid].depends_on):
            continue
        if uid in gated and not facts.gates_open.get(uid, False):
            continue
        if no_budget and units[uid].kind in MODEL_KINDS:
            continue
        if units[uid].kind == UnitKind.deliver and failed_upstream(plan, facts, uid):
            continue
        out.append(uid)
    return out


def final_passed(plan: Plan, facts: RunFacts) -> bool:
    return all(
        facts.is_current(uid) and facts.records[uid].validators_passed
        for uid in plan.required_units()
    )


def decide(plan: Plan, facts: RunFacts, *, ready: list[str] | None = None) -> Decision:
    """The next step; ``ready``: ``ready_units(plan, facts)`` when the caller has it already."""
    if ready is None:
        ready = ready_units(plan, facts)
    if ready:
        return Decision(kind=DecisionKind.claim, unit=ready[0], ready=ready)
    if plan.required_units() and final_passed(plan, facts):
        return Decision(kind=DecisionKind.done, reasons=["every required final unit is current "
                                                         "and the final validator passed"])
    running = sorted(u.id for u in plan.units if facts.effective_state(u.id) == UnitState.running)
    units = plan.unit_map()  # once: per status or held unit it made decide quadratic
    reasons: list[str] = []
    for uid in sorted(facts.statuses):
        st = facts.statuses[uid]
        if uid in units and st.status in ("blocked", "failed", "cancelled"):
            reasons.append(f"{uid} {st.status}: {st.reason}")
    held = held_for_release(plan, facts)
    for uid, why in held.items():
        if facts.effective_state(uid) in (UnitState.pending, UnitState.invalidated) and all(
                facts.is_current(d.unit) for d in units[uid].depends_on):
            first = why.split(" ", 1)[0]
            reasons.append(f"{uid} (deliver) is held: {why} — nothing is asked or delivered "
                           f"until it passes: see `keepstep explain {first}`, fix the document "
                           "or its sources, then resume")
    for uid in waiting_on_gate(plan, facts):
        if uid in held:
            continue  # its gate is not asked while it is held (engine.run.gates)
        gate = plan.gate_for(uid)
        reasons.append(f"{uid} waits for approval of gate {gate.id!r}" if gate else uid)
    spent = exhausted_budgets(facts)
    if spent:
        figures = ", ".join(f"{k} ${u:.4f}/${lim:.4f}" if k == "cost" else f"{k} {u:g}/{lim:g}"
                            for k, (u, lim) in sorted(spent.items()))
        reasons.append(f"budget exhausted ({figures}): units that call models wait for a "
                       "recorded budget decision")
    for uid in plan.required_units():
        rec = facts.records.get(uid)
        if rec is not None and rec.state == UnitState.succeeded and not rec.validators_passed:
            reasons.append(f"{uid} is current but its final validator did not pass")
    if running:
        return Decision(kind=DecisionKind.waiting,
                        reasons=[f"running elsewhere: {', '.join(running)}"] + reasons)
    if not reasons:
        reasons = ["nothing is ready but the run is not done"]
    return Decision(kind=DecisionKind.blocked, reasons=reasons)


# -- the incremental view the run loop schedules from ---------------------------------------

def unit_weight(unit: Unit) -> float:
    """Estimated model calls of one unit, for critical-path ordering: a model unit counts
    its rounds (a rank round is a call and a check), anything else a small epsilon so that
    longer chains still win ties."""
    if unit.kind not in MODEL_KINDS:
        return 0.001
    rounds = float(unit.max_rounds or 1)
    return 2.0 * rounds if unit.kind == UnitKind.rank else rounds


def critical_path(plan: Plan, weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """unit id -> the longest chain of estimated calls from it to the end of the plan (itself
    included). ``weights`` overrides ``unit_weight`` per unit (e.g. an extract unit's source
    count, which only the project files know)."""
    units = plan.unit_map()
    dependents: dict[str, list[str]] = {uid: [] for uid in units}
    for u in plan.units:
        for d in u.depends_on:
            if d.unit in dependents:
                dependents[d.unit].append(u.id)
    out: dict[str, float] = {}
    for uid in reversed(topo_order(plan)):
        w = weights.get(uid) if weights is not None else None
        own = float(w) if w is not None else unit_weight(units[uid])
        out[uid] = own + max((out[d] for d in dependents[uid]), default=0.0)
    return out


class ReadySet:
    """The units whose dependencies are all current and which are not current themselves,
    kept up to date from record changes (``update``) — O(dependents) per commit, never a
    walk of the plan. ``ready(facts)`` overlays the runtime facts (leases, statuses, gates,
    run-wide model blocks) on that frontier, in a stable order:

    - ``order="plan"``: the order ``decide`` uses (``topo_order``), so ``ready(facts)[0]``
      is ``decide(plan, facts).unit`` whenever the decision is a claim;
    - ``order="critical"``: longest remaining chain of estimated calls first (see
      ``critical_path``), ties by ``topo_order``.
    """

    def __init__(self, plan: Plan, records: Mapping[str, UnitRecord], *, order: str = "plan",
                 weights: Mapping[str, float] | None = None) -> None:
        topo = topo_order(plan)
        position = {uid: i for i, uid in enumerate(topo)}
        if order == "critical":
            cp = critical_path(plan, weights)
            self.rank: dict[str, tuple[float, int]] = {
                uid: (-cp[uid], position[uid]) for uid in topo}
        elif order == "plan":
            self.rank = {uid: (0.0, position[uid]) for uid in topo}
        else:
            raise ValueError(f"unknown order {order!r}")
        self.deps: dict[str, list[str]] = {}
        self.dependents: dict[str, list[str]] = {uid: [] for uid in topo}
        self.model_units: set[str] = set()
        self.gated: set[str] = set()
        self.plan = plan
        self.deliver_units = {u.id for u in plan.units if u.kind == UnitKind.deliver}
        for u in plan.units:
            self.deps[u.id] = [d.unit for d in u.depends_on]
            for d in u.depends_on:
                self.dependents.setdefault(d.unit, []).append(u.id)
            if u.kind in MODEL_KINDS:
                self.model_units.add(u.id)
        for g in plan.gates:
            self.gated.update(g.held_units())
        self.current = {uid for uid, rec in records.items()
                        if uid in self.deps and rec.state == UnitState.succeeded}
        self.missing = {uid: sum(1 for d in deps if d not in self.current)
                        for uid, deps in self.deps.items()}
        self.candidates = {uid for uid, n in self.missing.items()
                           if n == 0 and uid not in self.current}
        # The candidates in rank order, so ``ready`` stops at the first units it needs
        # instead of scanning (and sorting) a frontier that can hold thousands of units.
        self._ordered = sorted((self.rank[uid], uid) for uid in self.candidates)

    def _add(self, uid: str) -> None:
        if uid not in self.candidates:
            self.candidates.add(uid)
            bisect.insort(self._ordered, (self.rank[uid], uid))

    def _remove(self, uid: str) -> None:
        if uid in self.candidates:
            self.candidates.discard(uid)
            key = (self.rank[uid], uid)
            i = bisect.bisect_left(self._ordered, key)
            if i < len(self._ordered) and self._ordered[i] == key:
                del self._ordered[i]

    def update(self, unit_id: str, record: UnitRecord | None) -> None:
        """A unit's committed record changed (``None``: it left the state)."""
        if unit_id not in self.deps:
            return
        now = record is not None and record.state == UnitState.succeeded
        if now == (unit_id in self.current):
            return
        if now:
            self.current.add(unit_id)
            self._remove(unit_id)
            for dep in self.dependents.get(unit_id, ()):
                self.missing[dep] -= 1
                if self.missing[dep] == 0 and dep not in self.current:
                    self._add(dep)
        else:
            self.current.discard(unit_id)
            for dep in self.dependents.get(unit_id, ()):
                if self.missing[dep] == 0:
                    self._remove(dep)
                self.missing[dep] += 1
            if self.missing[unit_id] == 0:
                self._add(unit_id)

    def ready(self, facts: RunFacts, *, exclude: set[str] | frozenset[str] = frozenset(),
              limit: int | None = None) -> list[str]:
        """What ``ready_units`` returns, from the frontier only, in rank order (``exclude``:
        units this executor already has in flight; ``limit``: stop after that many)."""
        no_model = model_calls_blocked(facts)
        out: list[str] = []
        for _rank, uid in self._ordered:
            if limit is not None and len(out) >= limit:
                break
            if uid in exclude:
                continue
            if facts.effective_state(uid) not in (UnitState.pending, UnitState.invalidated):
                continue
            if uid in self.gated and not facts.gates_open.get(uid, False):
                continue
            if no_model and uid in self.model_units:
                continue
            if uid in self.deliver_units and failed_upstream(self.plan, facts, uid):
                continue  # safe release: an upstream verdict failed
            out.append(uid)
        return out
