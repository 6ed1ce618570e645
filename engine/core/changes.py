"""Change detection: what differs between the last committed baseline and the project now.

Pure and storage-free. ``detect_changes`` compares the stored facts (the ``inputs``, ``plan``
and ``versions`` state values, the plan the run last committed) with what the project folder
holds now, and returns typed ``Change`` events in a deterministic order. What a change reaches
is decided by ``engine.invalidation``.

Every change carries the same kind of label as a dependency edge (DESIGN §7); ``labels`` is
every edge type a root change emits (a unit reads a root input through the edge types it
declares, ``Unit.edges_of``):

=================================  ====================  ==========  ===========================
kind                               labels                plan_level  origin
=================================  ====================  ==========  ===========================
source_content                     content               False       ``source:A3``
source_header                      structure             False       ``source:A3``
source_added/removed/renamed/moved structure, content    False       ``source:A3``
contract_audience                  audience              True        ``contract:audience``
contract_field                     policy                True        ``contract:goal``, ``…:body``
template                           template|presentation True        ``template:report``
data                               content               True        ``data:topics``
prompt                             content               True        ``prompt:extract``
unit_definition                    structure             True        ``unit:U07``
dependency_added/removed           structure             True        ``unit:<the dependent>``
version                            policy|content        True        ``version:policy``
tool                               content               True        ``converter:pdf``
artifact_lost                      content               False       ``unit:U07``
unit_output                        content|given         False       ``unit:U28``
=================================  ====================  ==========  ===========================

Decisions worth knowing:

- A source's *header lines* are its front matter plus its sources.toml title, kind and path
  (``core.inputs.split_header``): an edit there is ``structure`` (what a header-only inventory
  reads); an edit of the body is ``content``. A source added, removed, renamed (same bytes
  under a new id) or moved to another group changes the set of files: ``structure`` and
  ``content`` (a new file has a body to read). A baseline without header hashes (recorded
  before they were) makes any byte change ``content``.
- A template edit is ``template`` when its layout changed (sections or placeholders added,
  removed or reordered, or the substance of its fixed text: a sentence, figure, link or word
  added or removed outside the headings, ``core.templates.layout``), else ``presentation``
  (only heading wording, whitespace, emphasis, list/table formatting). A renamed heading is
  named in the detail, old and new, when both sides' headings were recorded. Added or removed
  templates, and a baseline without layouts, are ``template``.
- A contract field other than the audience (goal, scope, deliverables, the body …) is labelled
  ``policy``: it says *what* the pack must find and argue. The audience has its own edge type
  because it changes framing and ranking, not the evidence.
- ``plan_level`` is True for everything stored in the ``plan`` state value (contract, units,
  dependencies, gates, template and data hashes) and for versions, because recovery commits
  the ``plan`` and ``versions`` values together in one plan-change commit; a version change
  left at plan_level=False would never be recorded and would be detected again on every
  resume. It is False for sources (a new input snapshot) and for lost artifacts and unit
  outputs (a repair: neither plan nor inputs change).
- A unit whose only differences are in fields that never change what it produces (title, phase,
  timeout_minutes, required_final) yields a ``unit_definition`` change with ``cosmetic=True``: it
  is recorded with the plan change but invalidates nothing. A gate added, changed or removed is
  recorded the same way on its unit: a gate decides whether a unit may run, not what it produces
  (the approvals flow asks again when a decision no longer applies).
- A prompt template's hash is recorded in the ``versions`` state value as ``prompt:<name>``
  (``gateway.prompts.prompt_hashes``); an edited prompt is a ``prompt`` change labelled
  ``content``: it reaches exactly the units that use that prompt (``prompt_refs``, from the
  kind presets; ``revise`` is used by every model step) and what depends on their substance.
  A baseline that recorded no prompt hashes yet means "not recorded", not "every prompt
  changed". Pack data files (``data/<name>.toml``) work the same way through ``data:<name>``.
- A source converter's version is recorded in ``versions`` as ``converter:<format>``
  (``engine.files.convert.converter_versions``). An upgrade is a ``tool`` change labelled
  ``content``: it reaches exactly the units whose kind reads sources as converted text
  (``CONVERTED_TEXT_KINDS``: extract, verify) through a ``source:``/``group:`` input naming a
  source of that format (``converted_refs``), and what depends on their substance. With no
  source of that format it is recorded and changes nothing (cosmetic).
- ``unit_output`` is never detected here; it lets a caller say "U28's committed output changed
  in this aspect" (a claim-set change is ``content``, a format-only change ``presentation``).
  Unlike ``unit_definition`` and ``artifact_lost`` it does not redo the unit itself.
- An empty baseline (``{}`` for the contract fields, no ``sources`` key in old inputs, no old
  versions, ``old_plan=None``) means "nothing recorded yet", not "everything was added".
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, model_validator

from keepstep.engine.core.hashing import canonical_json, sha256_hex
from keepstep.engine.core.inputs import Contract, InputSnapshot
from keepstep.engine.core.plan import EdgeType, Plan, Unit
from keepstep.engine.core.presets import implicit_refs


class ChangeKind(StrEnum):
    contract_audience = "contract_audience"
    contract_field = "contract_field"
    template = "template"
    data = "data"
    prompt = "prompt"
    source_content = "source_content"
    source_header = "source_header"
    source_removed = "source_removed"
    source_added = "source_added"
    source_renamed = "source_renamed"
    source_moved = "source_moved"
    unit_definition = "unit_definition"
    dependency_added = "dependency_added"
    dependency_removed = "dependency_removed"
    version = "version"
    artifact_lost = "artifact_lost"
    unit_output = "unit_output"
    tool = "tool"


_EDGE: dict[ChangeKind, EdgeType] = {
    ChangeKind.contract_audience: EdgeType.audience,
    ChangeKind.contract_field: EdgeType.policy,
    ChangeKind.template: EdgeType.template,
    ChangeKind.data: EdgeType.content,
    ChangeKind.prompt: EdgeType.content,
    ChangeKind.source_content: EdgeType.content,
    ChangeKind.source_header: EdgeType.structure,
    ChangeKind.source_removed: EdgeType.structure,
    ChangeKind.source_added: EdgeType.structure,
    ChangeKind.source_renamed: EdgeType.structure,
    ChangeKind.source_moved: EdgeType.structure,
    ChangeKind.unit_definition: EdgeType.structure,
    ChangeKind.dependency_added: EdgeType.structure,
    ChangeKind.dependency_removed: EdgeType.structure,
    ChangeKind.version: EdgeType.content,  # version:policy is labelled policy, see _version_edge
    ChangeKind.artifact_lost: EdgeType.content,
    ChangeKind.unit_output: EdgeType.content,
    ChangeKind.tool: EdgeType.content,
}
_INPUT_LEVEL = {ChangeKind.source_content, ChangeKind.source_header, ChangeKind.source_removed,
                ChangeKind.source_added, ChangeKind.source_renamed, ChangeKind.source_moved}
# The set of files changed: both what reads the set (structure) and what reads bodies (content).
_SET_CHANGES = {ChangeKind.source_removed, ChangeKind.source_added, ChangeKind.source_renamed,
                ChangeKind.source_moved}
_REPAIR = {ChangeKind.artifact_lost, ChangeKind.unit_output}
_ORDER = {k: i for i, k in enumerate(ChangeKind)}

# Unit fields that never change what a unit produces (see the module docstring).
COSMETIC_FIELDS = frozenset({"title", "phase", "timeout_minutes", "required_final"})


class Change(BaseModel):
    """One detected change, labelled like a dependency edge.

    ``edge`` and ``plan_level`` default from ``kind`` when not given; ``labels`` (every edge
    type the change emits at a root input) defaults to ``[edge]``, plus ``content`` for a
    change of the set of source files. ``groups`` names the source groups whose content a
    source change alters, so that units reading ``group:<G>`` are reached.
    """

    kind: ChangeKind
    origin: str
    # Filled from ``kind`` by the validator below when not given (so optional to callers).
    edge: EdgeType = None  # type: ignore[assignment]
    labels: list[EdgeType] = Field(default_factory=list)
    detail: str
    old: str | None = None
    new: str | None = None
    plan_level: bool = None  # type: ignore[assignment]
    cosmetic: bool = False
    groups: list[str] = Field(default_factory=list)
    # A tool change: the approved sources the changed converter reads (their groups: groups).
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _defaults_from_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kind" in data:
            kind = ChangeKind(data["kind"])
            data = dict(data)
            if data.get("edge") is None:
                data["edge"] = (_version_edge(data.get("origin", "")) if kind == ChangeKind.version
                                else _EDGE[kind])
            if data.get("plan_level") is None:
                data["plan_level"] = kind not in _INPUT_LEVEL | _REPAIR
            if not data.get("labels"):
                edge = EdgeType(data["edge"])
                data["labels"] = [edge, EdgeType.content] if kind in _SET_CHANGES else [edge]
        return data

    def emits(self) -> set[str]:
        """The edge types this change fires at a root input."""
        return {e.value for e in self.labels} or {self.edge.value}

    @property
    def is_unit_origin(self) -> bool:
        return self.origin.startswith("unit:")

    @property
    def needs(self) -> str:
        """What the change must be committed as: 'plan', 'inputs' or 'repair'."""
        if self.kind in _INPUT_LEVEL:
            return "inputs"
        return "plan" if self.plan_level else "repair"


def artifact_lost(unit_id: str, detail: str) -> Change:
    """A committed output of ``unit_id`` is missing or changed on disk: the unit is redone."""
    return Change(kind=ChangeKind.artifact_lost, origin=f"unit:{unit_id}", detail=detail)


def unit_output_changed(unit_id: str, edge: EdgeType, detail: str) -> Change:
    """``unit_id``'s committed output changed in one aspect (content: its claims; presentation:
    only its format). Reaches the consumers of that aspect; the unit itself is not redone."""
    return Change(kind=ChangeKind.unit_output, origin=f"unit:{unit_id}", edge=edge, detail=detail)


def natural_key(text: str) -> tuple[Any, ...]:
    """Sort key that puts U2 before U10 and A3 before A12."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _order_key(c: Change) -> tuple[Any, ...]:
    return (_ORDER[c.kind], natural_key(c.origin), c.detail)


def _version_edge(origin: str) -> EdgeType:
    return EdgeType.policy if origin == "version:policy" else EdgeType.content


def _short(h: str | None) -> str:
    return h[:12] if h else "none"


# -- detection ------------------------------------------------------------------------------

def _contract_changes(old_fields: dict[str, str], contract: Contract,
                      template_fields: dict[str, list[str]] | None = None) -> list[Change]:
    """Per changed field; a field (other than the audience) that a template names also
    changes that template's rendering: a ``template`` change per such template, so the
    documents that render it are redone without a contract intake dependency."""
    out = _contract_field_changes(old_fields, contract)
    for change in list(out):
        name = change.origin.partition(":")[2]
        if change.kind != ChangeKind.contract_field:
            continue
        for tname, names in sorted((template_fields or {}).items()):
            if name in names:
                out.append(Change(kind=ChangeKind.template, origin=f"template:{tname}",
                                  detail=f"template {tname!r} names contract field {name!r}, "
                                  f"which changed", old=change.old, new=change.new))
    return out


def _contract_field_changes(old_fields: dict[str, str], contract: Contract) -> list[Change]:
    if not old_fields:
        return []
    new_fields = contract.field_hashes()
    out = []
    for name in sorted(set(old_fields) | set(new_fields)):
        old, new = old_fields.get(name), new_fields.get(name)
        if old == new:
            continue
        if name == "audience":
            out.append(Change(kind=ChangeKind.contract_audience, origin="contract:audience",
                              detail=f"audience changed to {contract.audience!r}",
                              old=old, new=new))
            continue
        what = "added" if old is None else "removed" if new is None else "changed"
        out.append(Change(kind=ChangeKind.contract_field, origin=f"contract:{name}",
                          detail=f"contract field {name!r} {what}", old=old, new=new))
    return out


def _file_change(old: dict[str, str], new: dict[str, str], name: str) -> str:
    """How a hashed file changed: added, removed, or changed with both hashes."""
    if name not in old:
        return "added"
    if name not in new:
        return "removed"
    return f"changed (sha256 {_short(old[name])} → {_short(new[name])})"


def same_substance(old: str, new: str) -> bool:
    """Whether two renderings of a document differ only in presentation — heading wording,
    whitespace, emphasis, list/table formatting (``core.templates.fixed_text``): no sentence,
    figure, link or word added, removed or changed outside the headings, and no figure or
    link in a heading. What lets an audit's verdict on the old bytes stand for the new."""
    from keepstep.engine.core.templates import fixed_text

    return fixed_text(old) == fixed_text(new)


def heading_edits(old: list[str], new: list[str]) -> list[str]:
    """Each heading whose wording changed, ``'old' → 'new'`` (paired by position when the
    count is the same; else the removed and the added ones)."""
    if old == new:
        return []
    if len(old) == len(new):
        return [f"{a!r} → {b!r}" for a, b in zip(old, new, strict=True) if a != b]
    gone = [f"{h!r} removed" for h in old if h not in new]
    return gone + [f"{h!r} added" for h in new if h not in old]


def _template_changes(old: dict[str, str], new: dict[str, str],
                      old_layouts: dict[str, str] | None,
                      new_layouts: dict[str, str] | None,
                      old_headings: dict[str, list[str]] | None = None,
                      new_headings: dict[str, list[str]] | None = None) -> list[Change]:
    out = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        what = _file_change(old, new, name)
        edge = EdgeType.template
        if (name in old and name in new and old_layouts and new_layouts
                and name in old_layouts and old_layouts.get(name) == new_layouts.get(name)):
            # Same sections, placeholders and fixed text: only headings or formatting changed.
            edge = EdgeType.presentation
            what += (": heading wording or formatting only (same sections, placeholders and "
                     "text)")
        elif name in old and name in new and old_layouts and name in old_layouts:
            what += (": its sections, placeholders or fixed text changed (a sentence, figure, "
                     "link or placeholder added or removed)")
        if old_headings and new_headings and name in old_headings and name in new_headings:
            edits = heading_edits(old_headings[name], new_headings[name])
            if edits:
                what += "; heading " + ", ".join(edits)
        out.append(Change(kind=ChangeKind.template, origin=f"template:{name}", edge=edge,
                          detail=f"template {name!r} {what}", old=old.get(name),
                          new=new.get(name)))
    return out


def _data_changes(old: dict[str, str] | None, new: dict[str, str] | None) -> list[Change]:
    if old is None or new is None:
        return []  # not recorded yet
    out = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        what = _file_change(old, new, name)
        out.append(Change(kind=ChangeKind.data, origin=f"data:{name}",
                          detail=f"pack data file data/{name}.toml {what}", old=old.get(name),
                          new=new.get(name)))
    return out


def _source_changes(old_inputs: dict[str, Any], snap: InputSnapshot) -> list[Change]:
    if "sources" not in old_inputs:
        return []
    old_src: dict[str, str] = old_inputs.get("sources") or {}
    old_grp: dict[str, str] = old_inputs.get("groups") or {}
    # Header and body hashes (None: recorded before they were).
    old_hdr: dict[str, str] | None = old_inputs.get("headers")
    old_body: dict[str, str] | None = old_inputs.get("bodies")
    new_hdr, new_body = snap.headers or None, snap.bodies or None
    removed = [s for s in old_src if s not in snap.sources]
    added = [s for s in snap.sources if s not in old_src]
    # The same bytes under a new id: a rename, one change instead of a removal and an add.
    renamed: dict[str, str] = {}
    for new_id in sorted(added, key=natural_key):
        match = next((o for o in sorted(removed, key=natural_key)
                      if old_src[o] == snap.sources[new_id] and o not in renamed.values()), None)
        if match is not None:
            renamed[new_id] = match
    out = []
    for sid in sorted(set(old_src) | set(snap.sources), key=natural_key):
        old, new = old_src.get(sid), snap.sources.get(sid)
        og, ng = old_grp.get(sid, ""), snap.groups.get(sid, "")
        groups = sorted({g for g in (og, ng) if g})
        origin = f"source:{sid}"
        if sid in renamed.values():
            continue  # reported as the rename
        if new is None:
            out.append(Change(kind=ChangeKind.source_removed, origin=origin, groups=groups,
                              detail=f"source {sid} was removed or revoked", old=old))
        elif sid in renamed:
            was = renamed[sid]
            groups = sorted({g for g in (old_grp.get(was, ""), ng) if g})
            out.append(Change(kind=ChangeKind.source_renamed, origin=origin, groups=groups,
                              detail=f"source {was} was renamed {sid} (same bytes)", old=was,
                              new=new))
        elif old is None:
            out.append(Change(kind=ChangeKind.source_added, origin=origin, groups=groups,
                              detail=f"source {sid} was added" + (f" to group {ng}" if ng else ""),
                              new=new))
        elif og != ng:
            # Other group: both groups' sets of files changed.
            out.append(Change(kind=ChangeKind.source_moved, origin=origin, groups=groups,
                              detail=f"source {sid} moved from group {og or '(none)'} to "
                              f"{ng or '(none)'}", old=old, new=new))
        else:
            known = (old_hdr is not None and old_body is not None and new_hdr is not None
                     and new_body is not None and sid in old_hdr and sid in old_body
                     and sid in new_hdr and sid in new_body)
            if not known:
                if old != new:
                    out.append(Change(kind=ChangeKind.source_content, origin=origin,
                                      groups=groups, detail=f"source {sid} content changed "
                                      f"(sha256 {_short(old)} → {_short(new)})", old=old,
                                      new=new))
                continue
            assert old_hdr is not None and old_body is not None
            assert new_hdr is not None and new_body is not None
            if old_body[sid] != new_body[sid]:
                out.append(Change(kind=ChangeKind.source_content, origin=origin, groups=groups,
                                  detail=f"source {sid}: its body changed (sha256 "
                                  f"{_short(old)} → {_short(new)})", old=old_body[sid],
                                  new=new_body[sid]))
            if old_hdr[sid] != new_hdr[sid]:
                out.append(Change(kind=ChangeKind.source_header, origin=origin, groups=groups,
                                  detail=f"source {sid}: its header lines changed (title, type, "
                                  "date, or its sources.toml entry)", old=old_hdr[sid],
                                  new=new_hdr[sid]))
    return out


def _definition(u: Unit) -> dict[str, Any]:
    return u.model_dump(mode="json", exclude={"depends_on"})


def _hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def _unit_changes(uid: str, old: Unit, new: Unit) -> list[Change]:
    out = []
    origin = f"unit:{uid}"
    old_def, new_def = _definition(old), _definition(new)
    differing = sorted(k for k in set(old_def) | set(new_def) if old_def.get(k) != new_def.get(k))
    if differing:
        cosmetic = set(differing) <= COSMETIC_FIELDS
        out.append(Change(
            kind=ChangeKind.unit_definition, origin=origin, cosmetic=cosmetic,
            detail=f"unit {uid} changed: {', '.join(differing)}"
            + (" (recorded; changes nothing it produces)" if cosmetic else ""),
            old=_hash(old_def), new=_hash(new_def)))
    old_deps = {(d.unit, d.edge.value) for d in old.depends_on}
    new_deps = {(d.unit, d.edge.value) for d in new.depends_on}
    for dep, edge in sorted(old_deps - new_deps, key=lambda p: (natural_key(p[0]), p[1])):
        out.append(Change(kind=ChangeKind.dependency_removed, origin=origin, old=f"{dep}:{edge}",
                          detail=f"{uid} no longer depends on {dep} [{edge}]"))
    for dep, edge in sorted(new_deps - old_deps, key=lambda p: (natural_key(p[0]), p[1])):
        out.append(Change(kind=ChangeKind.dependency_added, origin=origin, new=f"{dep}:{edge}",
                          detail=f"{uid} now depends on {dep} [{edge}]"))
    return out


def _plan_changes(old_plan: Plan | None, new_plan: Plan) -> list[Change]:
    if old_plan is None:
        return []
    old_units, new_units = old_plan.unit_map(), new_plan.unit_map()
    out: list[Change] = []
    for uid in sorted(set(old_units) | set(new_units), key=natural_key):
        origin = f"unit:{uid}"
        if uid not in old_units:
            out.append(Change(kind=ChangeKind.unit_definition, origin=origin,
                              detail=f"unit {uid} added", new=new_plan.unit_fingerprint(uid)))
        elif uid not in new_units:
            out.append(Change(kind=ChangeKind.unit_definition, origin=origin,
                              detail=f"unit {uid} removed (its record is kept, outside the plan)",
                              old=old_plan.unit_fingerprint(uid)))
        else:
            out.extend(_unit_changes(uid, old_units[uid], new_units[uid]))
    old_gates = {g.id: g for g in old_plan.gates}
    new_gates = {g.id: g for g in new_plan.gates}
    for gid in sorted(set(old_gates) | set(new_gates), key=natural_key):
        og, ng = old_gates.get(gid), new_gates.get(gid)
        if og == ng:
            continue
        what = "added" if og is None else "removed" if ng is None else "changed"
        unit = (ng or og).unit  # type: ignore[union-attr]
        out.append(Change(
            kind=ChangeKind.unit_definition, origin=f"unit:{unit}", cosmetic=True,
            detail=f"gate {gid} {what} (a gate decides whether {unit} may run, not what it "
            "produces; the approvals flow asks again)",
            old=_hash(og.model_dump(mode="json")) if og else None,
            new=_hash(ng.model_dump(mode="json")) if ng else None))
    return out


PROMPT_PREFIX = "prompt:"


def prompt_refs(unit: Unit) -> list[str]:
    """The ``prompt:<name>`` inputs a unit reads implicitly through its kind (its preset:
    ``core.presets.prompt_names``)."""
    return [r for r in implicit_refs(unit) if r.startswith(PROMPT_PREFIX)]


def _prompt_changes(old: dict[str, str], new: dict[str, str]) -> list[Change]:
    old = {k: v for k, v in old.items() if k.startswith(PROMPT_PREFIX)}
    new = {k: v for k, v in new.items() if k.startswith(PROMPT_PREFIX)}
    if not old:
        return []
    out = []
    for ref in sorted(set(old) | set(new)):
        if old.get(ref) == new.get(ref):
            continue
        name = ref[len(PROMPT_PREFIX):]
        what = ("added" if ref not in old else "removed" if ref not in new else
                f"changed (sha256 {_short(old[ref])} → {_short(new[ref])})")
        out.append(Change(kind=ChangeKind.prompt, origin=ref, detail=f"prompt {name!r} {what}",
                          old=old.get(ref), new=new.get(ref)))
    return out


def _version_changes(old: dict[str, str], new: dict[str, str]) -> list[Change]:
    changes = _prompt_changes(old, new)
    typed = (PROMPT_PREFIX, CONVERTER_PREFIX)  # each has its own change kind
    old = {k: v for k, v in old.items() if not k.startswith(typed)}
    new = {k: v for k, v in new.items() if not k.startswith(typed)}
    if not old:
        return changes
    out = changes
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        out.append(Change(kind=ChangeKind.version, origin=f"version:{name}",
                          detail=f"{name} version {old.get(name) or '(none)'} → "
                          f"{new.get(name) or '(none)'}", old=old.get(name), new=new.get(name)))
    return out


# -- source converters: the `tool` change ------------------------------------------------------
CONVERTER_PREFIX = "converter:"
CONVERTED_PREFIX = "converted:"
# Kinds whose units read their sources' converted text (UnitContext.source_text and
# converted_source): a converter upgrade reaches them.
CONVERTED_TEXT_KINDS = ("extract", "verify")


def converted_refs(unit: Unit) -> list[str]:
    """The ``converted:source:X`` / ``converted:group:G`` inputs a unit reads implicitly: one
    per ``source:``/``group:`` input, for the kinds that read converted text."""
    if unit.kind.value not in CONVERTED_TEXT_KINDS:
        return []
    return [f"{CONVERTED_PREFIX}{ref}" for ref in unit.inputs
            if ref.startswith(("source:", "group:"))]


def tool_refs(change: Change) -> list[str]:
    """The implicit inputs a ``tool`` change alters: its sources' and their groups'."""
    return ([f"{CONVERTED_PREFIX}source:{s}" for s in change.sources]
            + [f"{CONVERTED_PREFIX}group:{g}" for g in change.groups])


def converter_changes(old: dict[str, str], new: dict[str, str],
                      source_formats: dict[str, str],
                      source_groups: dict[str, str]) -> list[Change]:
    """A ``tool`` change per ``converter:<format>`` version recorded in both ``old`` and
    ``new`` that differs; ``source_formats`` (approved source -> format) names the sources it
    reads again. A version recorded on one side only is not a change: the baseline did not
    record it yet, or no source needed it."""
    out = []
    for key in sorted(set(old) & set(new)):
        if not key.startswith(CONVERTER_PREFIX) or old[key] == new[key]:
            continue
        fmt = key[len(CONVERTER_PREFIX):]
        sources = sorted((sid for sid, f in source_formats.items() if f == fmt), key=natural_key)
        groups = sorted({source_groups[s] for s in sources if source_groups.get(s)})
        what = (f"{', '.join(sources)} converted again" if sources else
                f"no approved source is {fmt.upper()} (recorded; changes nothing)")
        out.append(Change(kind=ChangeKind.tool, origin=key, old=old[key], new=new[key],
                          detail=f"converter for {fmt.upper()} changed ({old[key]} → "
                          f"{new[key]}): {what}", sources=sources, groups=groups,
                          cosmetic=not sources))
    return out


def detect_changes(
    *,
    old_inputs: dict[str, Any],
    new_snapshot: InputSnapshot,
    old_contract_fields: dict[str, str],
    new_contract: Contract,
    old_plan: Plan | None,
    new_plan: Plan,
    old_templates: dict[str, str],
    new_templates: dict[str, str],
    old_versions: dict[str, str],
    new_versions: dict[str, str],
    source_formats: dict[str, str] | None = None,
    old_layouts: dict[str, str] | None = None,
    new_layouts: dict[str, str] | None = None,
    old_data: dict[str, str] | None = None,
    new_data: dict[str, str] | None = None,
    old_headings: dict[str, list[str]] | None = None,
    new_headings: dict[str, list[str]] | None = None,
    template_fields: dict[str, list[str]] | None = None,
) -> list[Change]:
    """Every change between the recorded baseline and the project now.

    ``source_formats`` (approved source id -> format) is what converter changes need to know
    which sources they reach; without it converter versions are not compared. ``*_layouts``
    are template name -> ``core.templates.layout_hash`` (None: not recorded, every template
    edit is a ``template`` change); ``*_data`` pack data file name -> sha256 (None: not
    recorded); ``*_headings`` template name -> its headings (a rename is named in the
    detail); ``template_fields`` template name -> the names it reads (a contract field it
    names reaches its documents). Ordered by kind (the ``ChangeKind`` declaration order),
    then origin in natural order (U7 before U10), then detail — the same inputs always give
    the same list.
    """
    changes = (
        _contract_changes(old_contract_fields, new_contract, template_fields)
        + _template_changes(old_templates, new_templates, old_layouts, new_layouts,
                            old_headings, new_headings)
        + _data_changes(old_data, new_data)
        + _source_changes(old_inputs, new_snapshot)
        + _plan_changes(old_plan, new_plan)
        + _version_changes(old_versions, new_versions)
    )
    if source_formats is not None:
        changes += converter_changes(old_versions, new_versions, source_formats,
                                     new_snapshot.groups)
    return sorted(changes, key=_order_key)


__all__ = ["CONVERTED_TEXT_KINDS", "CONVERTER_PREFIX", "COSMETIC_FIELDS",
           "Change", "ChangeKind", "artifact_lost", "converted_refs", "converter_changes",
           "detect_changes", "heading_edits", "natural_key", "prompt_refs",
           "same_substance", "tool_refs", "unit_output_changed"]
