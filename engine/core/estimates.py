"""What running units is expected to cost, from the call ledger and the units' kinds: the one
estimate a preview, an approval's options, a takeover and the TUI show.

Per unit: its latest committed attempt's settled calls, else the mean of its own earlier
attempts, else the mean of the units of its kind; a unit that calls the model never below its
kind's own steps (``expected_calls``), so no face says "~0 calls" for a unit that calls the
model. Pure functions over the plan and the ledger rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

from pydantic import BaseModel

from keepstep.engine.core.invalidation import PlanIndex
from keepstep.engine.core.plan import MODEL_KINDS, Plan, Unit, UnitKind
from keepstep.engine.core.state import CallRow, UnitRecord


class UnitCost(BaseModel):
    unit: str
    calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    basis: str = "ledger"  # "ledger <attempt>", "mean of N <kind> units", "unknown"


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


def settled_cost(uid: str, calls: Iterable[CallRow], attempt: str | None, basis: str) -> UnitCost:
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


def unit_costs(ix: PlanIndex, unit_ids: Iterable[str], records: Mapping[str, UnitRecord],
                calls: Calls, *, plan: Plan | None = None,
                source_groups: Mapping[str, str] | None = None,
                writers: Iterable[str] | None = None) -> _UnitCosts:
    """``estimate_costs`` as columns (what ``preview`` sums without building a row per unit);
    without ``plan`` no kind's floor applies."""
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
    return unit_costs(index or PlanIndex(plan), unit_ids, records, calls, plan=plan,
                       source_groups=source_groups, writers=writers).rows()


__all__ = ["Calls", "Figures", "UnitCost", "estimate_costs", "expected_calls", "group_calls",
           "settled_cost", "unit_costs", "unit_sources"]
