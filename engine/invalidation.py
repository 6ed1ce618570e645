"""Typed invalidation: which units a change reaches, by which edges, and why.

Pure and storage-free: ``invalidate`` takes the plan, the detected changes and the committed unit
records, and returns what becomes invalidated, what runs for the first time under the new plan,
and what is reused — each reached unit with an explanation naming the origin and every edge.

What an edge type means
-----------------------
``D depends on P by an edge of type t`` says which aspect of P's output D uses: ``content`` (D
cites or computes from P's claims), ``presentation`` (D only re-formats or embeds P's output),
``audience`` (D takes P's audience framing), ``template`` (D builds on P's layout), ``structure``
(D uses P's shape, e.g. an evidence schema), ``policy`` (D follows P's policy outcome). A change
carries the label of the aspect it alters at its origin (see ``engine.changes``).

The walk (DESIGN §7: "walk only matching edges from the origin, then content edges downstream")
-------------------------------------------------------------------------------------------------
For a change of type ``t``:

1. Entry — the first hop, labelled ``t``:
   - an input origin (``source:X``, ``group:G``, ``contract:F``, ``template:N``, ``policy:N``)
     reaches every unit whose ``inputs`` name it; ``source:X`` also reaches the readers of
     ``group:<X's group>`` (from ``Change.groups`` or the ``source_groups`` argument);
     ``version:N`` reaches the readers of ``policy:N`` (a unit declares the versions it depends
     on; recovery fingerprints them the same way). Those units are *redone*.
   - a unit origin of kind ``unit_definition``, ``dependency_added/removed`` or
     ``artifact_lost``: the unit itself is redone (no hop).
   - a unit origin of kind ``unit_output`` (the unit's committed output changed in aspect ``t``;
     the unit is not redone): the hop goes to the dependents over edges of type ``t`` only —
     plus ``presentation`` edges when ``t`` is ``content``, since a document that embeds changed
     claims must re-render.
2. Downstream — from every redone unit, follow its outgoing edges of type ``content``,
   ``presentation`` or ``t``, transitively. A redone unit's output may differ in substance, so
   whatever uses its substance (content) or reproduces it (presentation) is redone; edges of the
   change's own type carry the same change further (an audience change reaches whatever takes its
   framing from a re-audienced unit). Edges of any other type are not followed: a source's content
   change does not reach a unit that uses another's ``structure`` only.

How this resolves "presentation" against "content": the edge type carries the meaning. A document
that only re-formats a synthesis depends on it by ``presentation``; one that cites its claims by
``content``. A format-only change to the synthesis (``unit_output``/presentation) re-renders the
re-formatting documents only; a claim-set change (``unit_output``/content) reaches the citing ones
and the re-formatting ones, and both then reach the cross-file audit by content. Documents that
consume a re-rendered document by content (the audit F01, the change notes U36) are redone too:
the audit checked the old bytes. No evidence or synthesis unit is upstream of a document, so a
template typo in the appendix never reaches them.

Results: a reached unit whose record is ``succeeded`` is ``affected`` (it becomes invalidated);
a reached unit without one (never run, or already invalidated) is ``pending_affected`` ("will
run under the new plan"); ``reused`` is every other succeeded unit. Each reached unit carries one
``Explanation`` per change that reaches it: the full path origin → [edge] unit → … → unit along
the fewest hops (ties broken by plan order), and a note with the change's detail plus every other
edge the change came in by ("also via U28 [content], U29 [content]"). So every edge that carried
the change into the unit is named, at a size proportional to the edges walked; enumerating every
path of a DAG would be exponential. Output order is plan order; the same inputs give the same
result.

``high_risk_rules`` (keepstep.toml) may widen, never narrow: the default walk is computed first
and left as it is; a matching rule adds units (``also``) or re-walks over every edge type
(``widen_to = "downstream_all_edges"``); units reached only that way say "widened by rule …".

Cost: the adjacency is built once per plan (``PlanIndex``; pass one to reuse it), and a walk
visits only what it reaches and those units' outgoing edges. Listing ``reused`` is one pass over
the plan. The dry run with cost estimates (``preview``) is in ``engine.explain``.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .changes import Change, ChangeKind
from .errors import ConfigError
from .plan import EdgeType, Plan
from .state import Explanation, ExplanationStep, UnitRecord, UnitState

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
        self.dependencies: dict[str, list[str]] = {}
        for u in plan.units:  # plan order, so every list below is in plan order
            self.dependencies[u.id] = [d.unit for d in u.depends_on]
            for d in u.depends_on:
                self.dependents.setdefault(d.unit, []).append((u.id, d.edge.value))
            for ref in dict.fromkeys(u.inputs):
                self.readers.setdefault(ref, []).append(u.id)


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


class InvalidationResult(BaseModel):
    """What a set of changes reaches. Dicts and lists are in plan order."""

    affected: dict[str, list[Explanation]]  # succeeded -> becomes invalidated
    pending_affected: dict[str, list[Explanation]] = Field(default_factory=dict)
    reused: list[str] = Field(default_factory=list)
    changes: list[Change] = Field(default_factory=list)

    @property
    def redo(self) -> list[str]:
        return list(self.affected) + list(self.pending_affected)


# -- the walk -------------------------------------------------------------------------------

Start = tuple[str, str | None, str]  # (unit, edge of the first hop or None for the origin, via)


def _walk(ix: PlanIndex, change: Change, starts: list[Start], follow: frozenset[str],
          note: str) -> dict[str, list[Explanation]]:
    """Breadth-first from ``starts`` over edges whose type is in ``follow``: one explanation
    per reached unit.

    The first route into a unit is its path (fewest hops, ties by plan order); every other
    edge the change came in by is named in the note ("also via U33 [content]"). A start with
    no edge is the origin unit itself (empty path). Steps are shared between paths, never
    mutated; only one step object is made per reached unit.
    """
    canon: dict[str, list[ExplanationStep]] = {}
    first: dict[str, str] = {}  # unit -> "U12 [content]", the route its path takes
    extra: dict[str, list[str]] = {}  # unit -> every other route in (strings: no GC tracking)
    queue: deque[str] = deque()
    for uid, edge, via in starts:
        if uid not in ix.order:
            continue
        if uid in canon:
            extra.setdefault(uid, []).append(f"{via} [{edge}]")
            continue
        canon[uid] = [] if edge is None else [
            ExplanationStep(source=change.origin, target=f"unit:{uid}", edge=edge)]
        first[uid] = f"{via} [{edge}]"
        queue.append(uid)
    dependents = ix.dependents
    while queue:
        uid = queue.popleft()
        base, src = canon[uid], f"unit:{uid}"
        for dep, edge in dependents.get(uid, ()):
            if edge not in follow:
                continue
            if dep in canon:
                more = extra.get(dep)
                if more is None:
                    extra[dep] = [f"{uid} [{edge}]"]
                else:
                    more.append(f"{uid} [{edge}]")
            else:
                canon[dep] = [*base, ExplanationStep(source=src, target=f"unit:{dep}", edge=edge)]
                first[dep] = f"{uid} [{edge}]"
                queue.append(dep)
    kind, origin = change.kind.value, change.origin
    out = {}
    for uid, path in canon.items():
        text = note
        more = extra.get(uid)
        if more:
            also = [x for x in dict.fromkeys(more) if x != first[uid]]
            if also:
                text = f"{note}; also via {', '.join(also)}"
        out[uid] = [Explanation(change_kind=kind, origin=origin, path=path, note=text)]
    return out


def _entry_refs(change: Change, source_groups: Mapping[str, str]) -> list[str]:
    prefix, _, name = change.origin.partition(":")
    if prefix == "version":
        return [f"policy:{name}"]
    refs = [change.origin]
    if prefix == "source":
        groups = change.groups or ([source_groups[name]] if source_groups.get(name) else [])
        refs += [f"group:{g}" for g in groups]
    return refs


def _default_reach(ix: PlanIndex, change: Change, source_groups: Mapping[str, str],
                   follow: frozenset[str] | None = None, note: str | None = None,
                   ) -> dict[str, list[Explanation]]:
    t = change.edge.value
    redone = follow or frozenset({EdgeType.content.value, EdgeType.presentation.value, t})
    note = change.detail if note is None else note
    if change.is_unit_origin:
        uid = change.origin.split(":", 1)[1]
        if uid not in ix.order:
            return {}  # a removed unit: its dependents carry their own dependency changes
        if change.kind in _REDONE_ORIGIN:
            return _walk(ix, change, [(uid, None, change.origin)], redone, note)
        hop = follow or ({t, EdgeType.presentation.value} if t == EdgeType.content.value
                         else {t})
        starts: list[Start] = [(dep, edge, change.origin)
                               for dep, edge in ix.dependents.get(uid, ()) if edge in hop]
        return _walk(ix, change, starts, redone, note)
    starts = [(uid, t, ref) for ref in _entry_refs(change, source_groups)
              for uid in ix.readers.get(ref, ())]
    return _walk(ix, change, starts, redone, note)


def _widened(ix: PlanIndex, change: Change, rules: list[HighRiskRule],
             source_groups: Mapping[str, str]) -> dict[str, list[Explanation]]:
    out: dict[str, list[Explanation]] = {}
    t = change.edge.value
    for n, rule in enumerate(rules, start=1):
        if not rule.matches(change):
            continue
        note = rule.describe(n)
        follow = _ALL_EDGES if rule.widen_to else frozenset(
            {EdgeType.content.value, EdgeType.presentation.value, t})
        parts = []
        if rule.widen_to:
            parts.append(_default_reach(ix, change, source_groups, follow=_ALL_EDGES, note=note))
        if rule.also:
            starts: list[Start] = [(uid, RULE_EDGE, change.origin) for uid in rule.also]
            parts.append(_walk(ix, change, starts, follow, note))
        for part in parts:
            for uid, exps in part.items():
                out.setdefault(uid, []).extend(exps)
    return out


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
    reached: dict[str, list[Explanation]] = {}
    widened: dict[str, list[Explanation]] = {}
    for change in changes:
        if change.cosmetic:
            continue
        default = _default_reach(ix, change, groups)
        for uid, exps in default.items():
            reached.setdefault(uid, []).extend(exps)
        if rules:
            for uid, exps in _widened(ix, change, rules, groups).items():
                if uid not in default:  # widen, never narrow or re-explain the default
                    widened.setdefault(uid, []).extend(exps)
    for uid, exps in widened.items():  # after every default explanation, which stay as they are
        reached.setdefault(uid, []).extend(exps)
    affected: dict[str, list[Explanation]] = {}
    pending: dict[str, list[Explanation]] = {}
    for uid in sorted(reached, key=ix.order.__getitem__):
        rec = records.get(uid)
        target = affected if rec is not None and rec.state == UnitState.succeeded else pending
        target[uid] = reached[uid]
    reused = [uid for uid in ix.ids if uid not in affected
              and (rec := records.get(uid)) is not None and rec.state == UnitState.succeeded]
    return InvalidationResult.model_construct(affected=affected, pending_affected=pending,
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


__all__ = ["HighRiskRule", "InvalidationResult", "PlanIndex", "cutoff", "cutoff_note",
           "downstream_of", "invalidate", "parse_rules"]
