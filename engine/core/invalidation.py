"""Typed invalidation: which units a change reaches, by which edges, and why.

Pure and storage-free: ``invalidate(plan, changes, records)`` returns what becomes invalidated
(``affected``), what runs for the first time under the new plan (``pending_affected``) and what
is reused, each reached unit with an ``Explanation`` naming the origin and every edge taken.
Same inputs, same result, in plan order. ``high_risk_rules`` widen, never narrow. The rules of
the walk, and why it is shaped for cost, are in docs/invalidation.md.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from keepstep.engine.core.changes import Change, ChangeKind, converted_refs, tool_refs
from keepstep.engine.core.plan import EdgeType, Plan
from keepstep.engine.core.presets import implicit_refs
from keepstep.engine.core.state import Explanation, ExplanationStep, UnitRecord, UnitState
from keepstep.engine.errors import ConfigError

_REDONE_ORIGIN = {ChangeKind.unit_definition, ChangeKind.dependency_added,
                  ChangeKind.dependency_removed, ChangeKind.artifact_lost}
_ALL_EDGES = frozenset(e.value for e in EdgeType)
RULE_EDGE = "rule"


class PlanIndex:
    """Adjacency built once per plan: dependents and dependencies per unit, readers per input
    ref. Build it once and pass it as ``index=`` to reuse it while the plan is unchanged."""

    def __init__(self, plan: Plan) -> None:
        self.ids: list[str] = [u.id for u in plan.units]
        self.order: dict[str, int] = {uid: i for i, uid in enumerate(self.ids)}
        self.kinds: dict[str, str] = {u.id: u.kind.value for u in plan.units}
        self.dependents: dict[str, list[tuple[str, str]]] = {}
        self.readers: dict[str, list[str]] = {}
        # ref -> unit -> the edge types it reads the ref through (typed root edges)
        self.read_edges: dict[str, dict[str, tuple[str, ...]]] = {}
        self.dependencies: dict[str, list[str]] = {}
        for u in plan.units:  # plan order, so every list below is in plan order
            self.dependencies[u.id] = [d.unit for d in u.depends_on]
            for d in u.depends_on:
                self.dependents.setdefault(d.unit, []).append((u.id, d.edge.value))
            for ref in dict.fromkeys([*u.inputs, *implicit_refs(u), *converted_refs(u)]):
                self.readers.setdefault(ref, []).append(u.id)
                self.read_edges.setdefault(ref, {})[u.id] = u.edges_of(ref)

    @cached_property
    def in_edges(self) -> dict[str, list[tuple[str, str]]]:
        """unit -> (dependency, edge) for each of its incoming edges: grouped by dependency in
        plan order, a dependency's edges in the order the unit declares them. Built on first
        use (only explanations need it)."""
        out: dict[str, list[tuple[str, str]]] = {}
        for uid in self.ids:
            for dep, edge in self.dependents.get(uid, ()):
                out.setdefault(dep, []).append((uid, edge))
        return out


class HighRiskRule(BaseModel):
    """A keepstep.toml rule that widens invalidation for some changes.

    ``when`` is a change kind, an edge type or ``*``; ``origin`` an optional glob
    (``source:A*``); then ``also`` (units redone as well) and/or ``widen_to``.
    """

    model_config = ConfigDict(extra="forbid")
    when: str
    origin: str | None = None
    also: list[str] = Field(default_factory=list)
    widen_to: Literal["downstream_all_edges"] | None = None

    def matches(self, change: Change) -> bool:
        if self.when not in ("*", change.kind.value, change.edge.value):
            return False
        return self.origin is None or fnmatch.fnmatchcase(change.origin, self.origin)

    def describe(self, n: int) -> str:
        parts = [f"when {self.when}" + (f" at {self.origin}" if self.origin else "")]
        if self.also:
            parts.append("also " + ", ".join(self.also))
        if self.widen_to:
            parts.append(f"widen_to {self.widen_to}")
        return f"widened by rule {n} ({'; '.join(parts)})"


def parse_rules(rules: Iterable[Mapping[str, Any] | HighRiskRule],
                plan: Plan) -> list[HighRiskRule]:
    """Validate keepstep.toml's ``high_risk_rules``; every problem names the rule."""
    rules = list(rules)
    if not rules:
        return []
    kinds = {k.value for k in ChangeKind} | _ALL_EDGES | {"*"}
    ids = {u.id for u in plan.units}
    out, problems = [], []
    for n, raw in enumerate(rules, start=1):
        try:
            rule = raw if isinstance(raw, HighRiskRule) else HighRiskRule.model_validate(raw)
        except ValidationError as exc:
            problems.append(f"rule {n}: " + "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
            continue
        if rule.when not in kinds:
            problems.append(f"rule {n}: when = {rule.when!r} is not a change kind or edge type")
        if not rule.also and not rule.widen_to:
            problems.append(f"rule {n}: it widens nothing — give it 'also' or 'widen_to'")
        unknown = [u for u in rule.also if u not in ids]
        if unknown:
            problems.append(f"rule {n}: also names units not in the plan: {', '.join(unknown)}")
        out.append(rule)
    if problems:
        raise ConfigError("keepstep.toml high_risk_rules: " + " | ".join(problems),
                          hint="each rule is {when = <change kind or edge>, also = [unit ids]} "
                          "or {when = ..., widen_to = \"downstream_all_edges\"}")
    return out


# -- the walk -------------------------------------------------------------------------------

# (unit, edge of the first hop or None for the origin, via, whether only presentation fired)
Start = tuple[str, str | None, str, bool]
_PRESENTATION = EdgeType.presentation.value


class _Walk:
    """One breadth-first walk of one change, kept as dicts of strings.

    ``parent`` maps each reached unit, in the order reached, to the unit its path comes from
    (None for a start) and ``edge`` to the type of that hop (None for the origin unit itself).
    A start's routes in are in ``via``. The other routes in are not recorded: they are the
    unit's incoming edges of a followed type from reached units, which ``explanation(uid)``
    lists in the order the walk came through them (the order it reached their sources). Steps
    are built once per unit and shared between paths.
    """

    __slots__ = ("kind", "origin", "note", "follow", "_ix", "parent", "edge", "via", "_rank",
                 "_steps", "presentation")

    def __init__(self, ix: PlanIndex, change: Change, follow: frozenset[str], note: str) -> None:
        self.kind, self.origin, self.note = change.kind.value, change.origin, note
        self.follow, self._ix = follow, ix
        self.parent: dict[str, str | None] = {}
        self.edge: dict[str, str | None] = {}
        self.via: dict[str, tuple[str, ...]] = {}  # a start -> "origin [edge]" for each entry
        # The units that emit only a presentation change (only presentation edges fired into
        # them): what they emit fires presentation edges only.
        self.presentation: set[str] = set()
        self._rank: dict[str, int] | None = None
        self._steps: dict[str, ExplanationStep | None] = {}  # the last step of a unit's path

    def _routes(self, uid: str) -> list[str]:
        """Every route the change came into ``uid`` by, its path's first."""
        if self._rank is None:
            self._rank = {u: i for i, u in enumerate(self.parent)}
        rank, follow = self._rank, self.follow
        hops = sorted(((dep, edge) for dep, edge in self._ix.in_edges.get(uid, ())
                       if edge in follow and dep in rank), key=lambda hop: rank[hop[0]])
        return [*self.via.get(uid, ()), *(f"{dep} [{edge}]" for dep, edge in hops)]

    def _path(self, uid: str) -> list[ExplanationStep]:
        """The steps from the origin to ``uid`` (none for the origin unit itself)."""
        path: list[ExplanationStep] = []
        u: str | None = uid
        while u is not None:
            up, edge = self.parent[u], self.edge[u]
            if u not in self._steps:
                self._steps[u] = None if edge is None else ExplanationStep(
                    source=self.origin if up is None else f"unit:{up}", target=f"unit:{u}",
                    edge=edge)
            step = self._steps[u]
            if step is not None:
                path.append(step)
            u = up
        path.reverse()
        return path

    def explanation(self, uid: str) -> Explanation:
        text = self.note
        also = list(dict.fromkeys(self._routes(uid)))[1:]
        if also:
            text = f"{text}; also via {', '.join(also)}"
        return Explanation(change_kind=self.kind, origin=self.origin, path=self._path(uid),
                           note=text)


def _walk(ix: PlanIndex, change: Change, starts: list[Start], follow: frozenset[str],
          note: str, *, typed: bool = True) -> _Walk:
    """Breadth-first from ``starts`` over edges whose type is in ``follow``.

    A unit into which only presentation edges fired (a start with only presentation fired,
    or reached over presentation edges only) emits a presentation change: from it only
    presentation edges are followed. When a later route fires another edge into it, it emits
    content after all and the walk goes on from it (``typed=False``: every reached unit
    emits content, for a rule that widens to every edge). The first route into a unit is its
    path (fewest hops, ties by plan order); every other edge the change came in by is named
    in the note ("also via U33 [content]") when the explanation is built. A start with no
    edge is the origin unit itself (empty path).
    """
    walk = _Walk(ix, change, follow, note)
    parent, edge_in, vias, pres = walk.parent, walk.edge, walk.via, walk.presentation
    order = ix.order
    for uid, edge, via, only_presentation in starts:
        if uid in order:
            if uid not in parent:
                parent[uid] = None
                edge_in[uid] = edge
                if typed and only_presentation:
                    pres.add(uid)
            elif not only_presentation:
                pres.discard(uid)
            # Tuples of strings: the collector stops tracking them at its first look.
            vias[uid] = (*vias.get(uid, ()), f"{via} [{edge}]")
    queue = deque(parent)
    dependents = ix.dependents
    while queue:
        uid = queue.popleft()
        narrow = uid in pres
        for dep, edge in dependents.get(uid, ()):
            if edge not in follow or (narrow and edge != _PRESENTATION):
                continue
            if dep not in parent:
                parent[dep] = uid
                edge_in[dep] = edge
                if typed and edge == _PRESENTATION:
                    pres.add(dep)
                queue.append(dep)
            elif edge != _PRESENTATION and dep in pres:
                # Reached before over presentation edges only; now content fires into it too.
                pres.discard(dep)
                queue.append(dep)
    return walk


class _Reach:
    """The walks of one ``invalidate`` call and each reached unit's explanations, built on
    first request and then kept (so repeated reads return the same list)."""

    __slots__ = ("_walks", "_owners", "_built")

    def __init__(self, walks: list[tuple[_Walk, _Walk | None]]) -> None:
        # (walk, the default walk of the same change when the walk is a rule's widening: a unit
        # the default reaches is explained by the default only). Defaults come first.
        self._walks = walks
        self._owners: dict[str, list[_Walk]] | None = None
        self._built: dict[str, list[Explanation]] = {}

    def units(self) -> Mapping[str, Any]:
        """Every reached unit (keys only; in no particular order)."""
        if len(self._walks) == 1:
            return self._walks[0][0].parent
        out: dict[str, Any] = {}
        for walk, _ in self._walks:
            out.update(walk.parent)
        return out

    def explanations(self, uid: str) -> list[Explanation]:
        built = self._built.get(uid)
        if built is None:
            if len(self._walks) == 1:
                owners = [self._walks[0][0]]
            else:
                if self._owners is None:
                    index: dict[str, list[_Walk]] = {}
                    for walk, default in self._walks:
                        for u in walk.parent:
                            if default is None or u not in default.parent:
                                index.setdefault(u, []).append(walk)
                    self._owners = index
                owners = self._owners[uid]
            built = self._built[uid] = [w.explanation(uid) for w in owners]
        return built


class _Explanations(Mapping[str, list[Explanation]]):
    """unit -> its explanations, in plan order; a unit's list is built when first read."""

    __slots__ = ("_units", "_reach")

    def __init__(self, units: dict[str, None], reach: _Reach) -> None:
        self._units, self._reach = units, reach

    def __getitem__(self, uid: str) -> list[Explanation]:
        if uid not in self._units:
            raise KeyError(uid)
        return self._reach.explanations(uid)

    def __iter__(self) -> Iterator[str]:
        return iter(self._units)

    def __len__(self) -> int:
        return len(self._units)

    def __contains__(self, uid: object) -> bool:
        return uid in self._units

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class InvalidationResult(BaseModel):
    """What a set of changes reaches, in plan order.

    ``affected`` and ``pending_affected`` are read-only mappings unit -> explanations; each
    unit's explanations are built when first read (``model_dump`` reads them all).
    """

    affected: Mapping[str, list[Explanation]]  # succeeded -> becomes invalidated
    pending_affected: Mapping[str, list[Explanation]] = Field(default_factory=dict)
    reused: list[str] = Field(default_factory=list)
    changes: list[Change] = Field(default_factory=list)

    @property
    def redo(self) -> list[str]:
        return list(self.affected) + list(self.pending_affected)

    @field_serializer("affected", "pending_affected")
    def _dump_explanations(self, value: Mapping[str, list[Explanation]],
                           ) -> dict[str, list[Explanation]]:
        return dict(value.items())


def _entry_refs(change: Change, source_groups: Mapping[str, str]) -> list[str]:
    prefix, _, name = change.origin.partition(":")
    if prefix == "version":
        return [f"policy:{name}"]
    if change.kind == ChangeKind.tool:
        return tool_refs(change)
    refs = [change.origin]
    if prefix == "source":
        groups = change.groups or ([source_groups[name]] if source_groups.get(name) else [])
        refs += [f"group:{g}" for g in groups]
        if change.kind == ChangeKind.source_renamed and change.old:
            refs.append(f"source:{change.old}")  # what read the old id reads the set too
    return refs


def _root_starts(ix: PlanIndex, change: Change, source_groups: Mapping[str, str]) -> list[Start]:
    """The readers of the change's root input that read it through an edge the change fires,
    each with the edge of the first hop and whether only presentation fired."""
    fired = change.emits()
    primary = change.edge.value
    starts: list[Start] = []
    for ref in _entry_refs(change, source_groups):
        edges_by_unit = ix.read_edges.get(ref, {})
        for uid in ix.readers.get(ref, ()):
            hit = fired & set(edges_by_unit.get(uid, (primary,)))
            if not hit:
                continue  # the unit reads another aspect of this input
            edge = primary if primary in hit else sorted(hit)[0]
            starts.append((uid, edge, ref if ref != change.origin else change.origin,
                           hit == {_PRESENTATION}))
    return starts


def _default_reach(ix: PlanIndex, change: Change, source_groups: Mapping[str, str],
                   follow: frozenset[str] | None = None, note: str | None = None) -> _Walk:
    t = change.edge.value
    carried = {EdgeType.content.value, EdgeType.presentation.value, t, *change.emits()}
    redone = follow or frozenset(carried)
    typed = follow is None or follow != _ALL_EDGES
    note = change.detail if note is None else note
    if change.is_unit_origin:
        uid = change.origin.split(":", 1)[1]
        if uid not in ix.order:
            # a removed unit: its dependents carry their own dependency changes
            return _walk(ix, change, [], redone, note, typed=typed)
        if change.kind in _REDONE_ORIGIN:
            return _walk(ix, change, [(uid, None, change.origin, False)], redone, note,
                         typed=typed)
        hop = follow or ({t, EdgeType.presentation.value} if t == EdgeType.content.value
                         else {t})
        starts: list[Start] = [(dep, edge, change.origin, edge == _PRESENTATION)
                               for dep, edge in ix.dependents.get(uid, ()) if edge in hop]
        return _walk(ix, change, starts, redone, note, typed=typed)
    return _walk(ix, change, _root_starts(ix, change, source_groups), redone, note, typed=typed)


def _widened(ix: PlanIndex, change: Change, rules: list[HighRiskRule],
             source_groups: Mapping[str, str]) -> list[_Walk]:
    """The rules' walks for ``change``, in rule order (``widen_to`` before ``also``)."""
    out = []
    t = change.edge.value
    for n, rule in enumerate(rules, start=1):
        if not rule.matches(change):
            continue
        note = rule.describe(n)
        follow = _ALL_EDGES if rule.widen_to else frozenset(
            {EdgeType.content.value, EdgeType.presentation.value, t})
        if rule.widen_to:
            out.append(_widen_all(ix, change, source_groups, note))
        if rule.also:
            starts: list[Start] = [(uid, RULE_EDGE, change.origin, False) for uid in rule.also]
            out.append(_walk(ix, change, starts, follow, note))
    return out


def _widen_all(ix: PlanIndex, change: Change, source_groups: Mapping[str, str],
               note: str) -> _Walk:
    """Every reader of the change's input (whatever edges it reads through), then every
    edge downstream."""
    if change.is_unit_origin:
        return _default_reach(ix, change, source_groups, follow=_ALL_EDGES, note=note)
    starts: list[Start] = [(uid, change.edge.value, ref, False)
                           for ref in _entry_refs(change, source_groups)
                           for uid in ix.readers.get(ref, ())]
    return _walk(ix, change, starts, _ALL_EDGES, note, typed=False)


def invalidate(
    plan: Plan,
    changes: list[Change],
    records: Mapping[str, UnitRecord],
    *,
    high_risk_rules: Iterable[Mapping[str, Any] | HighRiskRule] = (),
    source_groups: Mapping[str, str] | None = None,
    index: PlanIndex | None = None,
) -> InvalidationResult:
    """Propagate ``changes`` through ``plan`` (rules in the module docstring).

    ``source_groups`` (source id -> group) is used for source changes that carry no ``groups``.
    Cosmetic changes are kept in ``changes`` and reach nothing. Rules that name unknown units or
    kinds raise ConfigError.
    """
    ix = index or PlanIndex(plan)
    rules = parse_rules(high_risk_rules, plan)
    groups = source_groups or {}
    defaults: list[tuple[_Walk, _Walk | None]] = []
    widened: list[tuple[_Walk, _Walk | None]] = []
    for change in changes:
        if change.cosmetic:
            continue
        default = _default_reach(ix, change, groups)
        defaults.append((default, None))
        if rules:  # widen, never narrow or re-explain the default
            widened += [(walk, default) for walk in _widened(ix, change, rules, groups)]
    # Every default explanation first, left as it is; the rules' after them.
    reach = _Reach(defaults + widened)
    reached = reach.units()
    succeeded, get = UnitState.succeeded, records.get
    # Plan order: sorting is cheaper when few units are reached, one pass when many are.
    ordered = (sorted(reached, key=ix.order.__getitem__) if len(reached) * 8 < len(ix.ids)
               else [uid for uid in ix.ids if uid in reached])
    affected = dict.fromkeys([uid for uid in ordered
                              if (rec := get(uid)) is not None and rec.state == succeeded])
    pending = dict.fromkeys([uid for uid in ordered if uid not in affected])
    reused = [uid for uid in ix.ids if uid not in reached
              and (rec := get(uid)) is not None and rec.state == succeeded]
    return InvalidationResult.model_construct(
        affected=_Explanations(affected, reach), pending_affected=_Explanations(pending, reach),
        reused=reused, changes=list(changes))


def downstream_of(plan: Plan, unit_ids: Iterable[str], *, index: PlanIndex | None = None,
                  ) -> set[str]:
    """Every unit reachable from ``unit_ids`` over any edge (a start is included only when
    another start reaches it)."""
    ix = index or PlanIndex(plan)
    seen: set[str] = set()
    queue = deque(unit_ids)
    while queue:
        for dep, _ in ix.dependents.get(queue.popleft(), ()):
            if dep not in seen:
                seen.add(dep)
                queue.append(dep)
    return seen


# -- early cut-off ----------------------------------------------------------------------------

def cutoff_note(unit_id: str) -> str:
    return f"kept current: {unit_id}'s output is byte-identical to what it consumed"


def cutoff(plan: Plan, unit_id: str, new_outputs: Mapping[str, str],
           records: Mapping[str, UnitRecord], *, index: PlanIndex | None = None) -> list[str]:
    """Direct dependents of ``unit_id`` that stay current after it was re-executed.

    ``new_outputs`` maps output name -> sha256 of the re-executed unit. A dependent stays current
    when everything it consumed is byte-identical: what it consumed from ``unit_id``
    (``record.consumed[unit_id]``) equals ``new_outputs`` (same names, same bytes), every other
    dependency is current with the outputs it consumed, and no change reached it directly (an
    explanation with an empty path, or whose last hop comes from an input or a rule). Apply it
    again for each kept unit to carry the cut-off further down; mark kept units with
    ``cutoff_note(unit_id)``.
    """
    ix = index or PlanIndex(plan)
    wanted = dict(new_outputs)
    kept = []
    for dep in dict.fromkeys(d for d, _ in ix.dependents.get(unit_id, ())):
        rec = records.get(dep)
        if rec is None or rec.state not in (UnitState.succeeded, UnitState.invalidated):
            continue
        if rec.consumed.get(unit_id) != wanted:
            continue
        if any(_direct(e) for e in rec.explanations):
            continue
        if all(other == unit_id or _still_consumed(rec, other, records)
               for other in ix.dependencies[dep]):
            kept.append(dep)
    return kept


def _direct(exp: Explanation) -> bool:
    """Whether the change reached the unit itself: its definition, an input or a rule."""
    return (not exp.path or exp.path[-1].edge == RULE_EDGE
            or not exp.path[-1].source.startswith("unit:"))


def _still_consumed(rec: UnitRecord, dep: str, records: Mapping[str, UnitRecord]) -> bool:
    other = records.get(dep)
    return (other is not None and other.state == UnitState.succeeded
            and rec.consumed.get(dep) == {n: o.sha256 for n, o in other.outputs.items()})


def released_by_change(result: InvalidationResult, statuses: Mapping[str, Any]) -> list[str]:
    """The units a change reaches that had failed: the failure was on the old inputs, so the
    change releases them (their failed status is cleared in the change's commit) and they run
    again. The one rule both a preview's "then run …" and a resume's recovery follow, so the
    two agree. A blocked unit (budget, quota, a key, an unknown outcome) is not released: a
    change does not settle what it waits for. ``statuses``: unit -> its runtime status (an
    object with ``status``)."""
    return [uid for uid in result.redo
            if (st := statuses.get(uid)) is not None and str(st.status) == "failed"]


def held_despite_change(result: InvalidationResult, statuses: Mapping[str, Any]
                        ) -> dict[str, str]:
    """The units a change reaches that stay held by a blocked status -> its reason (they
    run once that is settled, not because of the change)."""
    return {uid: str(st.reason) for uid in result.redo
            if (st := statuses.get(uid)) is not None and str(st.status) == "blocked"}


__all__ = ["HighRiskRule", "InvalidationResult", "PlanIndex", "cutoff", "cutoff_note",
           "downstream_of", "held_despite_change", "invalidate", "parse_rules",
           "released_by_change"]
