"""The plan's own checks: every problem of a parsed plan, each naming the unit or gate, the
field and what to do (``find_problems``; ``check_plan`` raises PlanValidationError with all).

Every check is linear in the plan's size: the dependency graph is walked with plain
adjacency lists (``core.plan_graph.DependencyIndex``) — one Kahn pass finds a cycle, one
reverse traversal from all required final units finds what they need — instead of a
traversal per unit (per-unit ``nx.ancestors`` made a 10,000-unit plan take 98 s to open). Gates with
``artifact:``/``verdict:`` bindings walk upstream of their held units once each, stopping as
soon as every bound unit is found.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from keepstep.engine.core.plan import (
    INPUT_PREFIXES,
    LOOP_KINDS,
    MAX_ROUNDS_CAP,
    UNIT_ID_RE,
    UNIT_ID_RULE,
    EdgeType,
    Gate,
    Plan,
    PlanProblem,
    Unit,
    UnitKind,
    gate_problem,
    outputs_of,
    plan_problem,
    root_edges,
    unit_problem,
)
from keepstep.engine.core.plan_graph import DependencyIndex, gc_paused
from keepstep.engine.core.presets import (
    ANSWERS,
    CitedIdsCheck,
    FiguresCheck,
    ListsSourcesCheck,
    PresentCheck,
    SectionsCheck,
    evidence_output,
    params_model,
    parse_params,
    verified_output,
)
from keepstep.engine.errors import PlanValidationError


def _folded(word: str) -> str:
    """Case and leading zeros of numbers ignored: "u1", "U01" and "U001" fold alike."""
    return re.sub(r"\d+", lambda m: str(int(m.group())), word.casefold())


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"did you mean 'x'?" for the closest of ``choices``, else "": a choice equal but for
    case or leading zeros first, then the nearest by difflib."""
    options = sorted(set(choices))
    same = [c for c in options if _folded(c) == _folded(str(word)) and c != word]
    near = same or difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    return f"did you mean {near[0]!r}?" if near else ""


def _param_problems(u: Unit) -> list[PlanProblem]:
    try:
        parse_params(u.kind.value, u.params)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                model = params_model(u.kind.value)
                near = did_you_mean(loc.split(".")[-1], model.model_fields if model else ())
                msg = f"unknown param for a {u.kind.value} unit — " + (
                    near or "remove it or check its spelling")
            elif err["type"] == "missing":
                msg = f"a {u.kind.value} unit needs it"
            out.append(unit_problem(u.id, f"params.{loc}" if loc else "params", msg,
                                    "docs/plan-format.md lists every kind's params",
                                    code="params"))
        return out
    return []


def _input_problems(u: Unit, sources: dict[str, Any] | None, groups: set[str] | None,
                    contract_fields: set[str] | None) -> list[PlanProblem]:
    out: list[PlanProblem] = []
    for ref in u.inputs:
        prefix, _, name = ref.partition(":")
        if prefix not in INPUT_PREFIXES or not name:
            out.append(unit_problem(
                u.id, "inputs", f"input {ref!r} is not of the form <kind>:<name> with kind one "
                f"of {', '.join(INPUT_PREFIXES)}", code="input", say_field=False))
        elif prefix == "source" and sources is not None:
            if name not in sources:
                out.append(unit_problem(u.id, "inputs", f"input source {name!r} is not in "
                                        "sources.toml", "add it there (and approve it) or fix "
                                        "the id", code="source", say_field=False))
            elif not sources[name]:
                out.append(unit_problem(u.id, "inputs", f"input source {name!r} is not "
                                        "approved", f"approve it with `keepstep sources approve "
                                        f"{name}` or remove the input", code="source",
                                        say_field=False))
        elif prefix == "group" and groups is not None and name not in groups:
            out.append(unit_problem(u.id, "inputs", f"input group {name!r} has no approved "
                                    "source", "approve its sources or fix the group name",
                                    code="group", say_field=False))
        elif (prefix == "contract" and contract_fields is not None
              and name not in contract_fields):
            out.append(unit_problem(u.id, "inputs", f"input contract field {name!r} is not in "
                                    "contract.md's front matter (has: "
                                    f"{', '.join(sorted(contract_fields))})", code="contract",
                                    say_field=False))
    for ref, edges in u.input_edges.items():
        if ref not in u.inputs:
            out.append(unit_problem(u.id, "input_edges", f"names {ref!r}, which is not among "
                                    "its inputs", "add the input or remove the entry",
                                    code="input_edges"))
            continue
        emitted = {e.value for e in root_edges(ref)}
        for e in edges:
            if EdgeType(e).value not in emitted:
                out.append(unit_problem(
                    u.id, "inputs", f"{ref} is read through edge {EdgeType(e).value!r}, which "
                    f"it never emits (it emits {', '.join(sorted(emitted))})",
                    "use one of those edge types", code="input_edges"))
    return out


def _reaching_evidence(units: dict[str, Unit]) -> set[str]:
    """The units that reach an evidence-producing unit through their dependencies (those
    ``presets.evidence_sources`` finds something for), in one traversal from every producer
    along its dependents: a walk up from each verify unit was quadratic in a chain of them."""
    dependents: dict[str, list[str]] = {uid: [] for uid in units}
    for u in units.values():
        for d in u.depends_on:
            if d.unit in units:
                dependents[d.unit].append(u.id)
    found: set[str] = set()
    todo = [uid for uid, u in units.items() if evidence_output(u)]
    while todo:
        for nxt in dependents[todo.pop()]:
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


def _kind_problems(u: Unit, units: dict[str, Unit], documents: dict[str, str],
                   reaching_evidence: set[str]) -> list[PlanProblem]:
    """What a kind needs of the plan around it (dependencies, documents, files)."""
    out: list[PlanProblem] = []
    kind = u.kind
    deps = [units[d.unit] for d in u.depends_on if d.unit in units]
    if kind == UnitKind.extract and not (u.input_refs("source") or u.input_refs("group")):
        out.append(unit_problem(u.id, "inputs", "an extract unit names no sources",
                                "add group:<G> or source:<id> inputs", code="extract_sources"))
    if kind == UnitKind.verify and not any(
            d.unit in reaching_evidence or evidence_output(upstream)
            for d in u.depends_on if (upstream := units.get(d.unit)) is not None):
        out.append(unit_problem(u.id, "depends_on", "a verify unit reaches no "
                                "evidence-producing unit through its dependencies", "depend "
                                "on an extract unit (or a unit that writes evidence.json), "
                                "directly or through other units", code="verify_evidence"))
    if kind in (UnitKind.synthesize, UnitKind.rank, UnitKind.model) and not any(
            verified_output(d) for d in deps):
        out.append(unit_problem(u.id, "depends_on", f"a {kind.value} unit has no verification "
                                "dependency: it would have no verified evidence to cite",
                                "depend on a verify unit", code="verified_evidence"))
    if kind == UnitKind.model and u.params.get("answer", "claims") not in ANSWERS:
        pass  # reported by the params model
    if kind == UnitKind.render:
        tname = u.params.get("template")
        if tname and str(tname) not in u.input_refs("template"):
            out.append(unit_problem(u.id, "params.template", f"template {tname!r} is not "
                                    "declared as an input", f"add \"template:{tname}\" to "
                                    "inputs", code="template_input"))
    if kind == UnitKind.audit:
        out += _audit_problems(u, units, deps)
    if kind == UnitKind.deliver:
        files = u.params.get("files")
        dep_ids = {d.unit for d in u.depends_on}
        for ref in files if isinstance(files, list) else []:
            dep, _, name = str(ref).partition(":")
            if not dep or not name:
                out.append(unit_problem(u.id, "params.files", f"{ref!r} is not of the form "
                                        "<unit>:<output name>", code="deliver_file"))
            elif dep not in units:
                out.append(unit_problem(u.id, "params.files", f"{ref!r} names unknown unit "
                                        f"{dep!r}", "name a unit of the plan", code="deliver_file"))
            elif dep not in dep_ids:
                out.append(unit_problem(u.id, "params.files", f"{ref!r}: {dep} is not in "
                                        "depends_on", f"add {dep} to depends_on (edge "
                                        "\"presentation\": the bytes are delivered)",
                                        code="deliver_file"))
            elif name not in outputs_of(units[dep]):
                out.append(unit_problem(u.id, "params.files", f"{ref!r}: {dep} writes no "
                                        f"{name!r} (it writes "
                                        f"{', '.join(outputs_of(units[dep])) or 'nothing'})",
                                        "name one of its outputs", code="deliver_file"))
    return out


def _audit_problems(u: Unit, units: dict[str, Unit], deps: list[Unit]) -> list[PlanProblem]:
    out: list[PlanProblem] = []
    try:
        params = parse_params("audit", u.params)
    except ValidationError:
        return out  # reported by _param_problems
    docs = {str(d.params.get("document")): d for d in deps
            if d.kind == UnitKind.render and d.params.get("document")}
    for n, check in enumerate(params.checks):
        named: list[str] = []
        if isinstance(check, PresentCheck | CitedIdsCheck) or hasattr(check, "documents"):
            named += list(getattr(check, "documents", []))
        if hasattr(check, "document"):
            named.append(check.document)
        if isinstance(check, ListsSourcesCheck):
            named.append(check.of)
        if isinstance(check, CitedIdsCheck | FiguresCheck) and check.against != "evidence":
            named.append(check.against)
        for doc in dict.fromkeys(named):
            if doc not in docs:
                out.append(unit_problem(
                    u.id, f"params.checks.{n}", f"{check.check} check names document {doc!r}, "
                    "which no render dependency produces (known: "
                    f"{', '.join(sorted(docs)) or 'none'})",
                    "depend on the render unit of that document, or fix the name",
                    code="unknown_document"))
        if isinstance(check, SectionsCheck) and check.template and \
                check.template not in u.input_refs("template"):
            out.append(unit_problem(u.id, f"params.checks.{n}.template", f"template "
                                    f"{check.template!r} is not an input of the audit",
                                    f"add {{ ref = \"template:{check.template}\", edges = "
                                    "[\"template\"] } to inputs", code="template_input"))
    return out


def _binding_problems(gate: Gate, ids: set[str], index: DependencyIndex | None,
                      contract_fields: set[str] | None) -> list[PlanProblem]:
    """The gate's ``binds``; an ``artifact:``/``verdict:`` unit must be upstream of what the
    gate holds (not checked when the plan has a cycle: ``index`` None)."""
    bound = {b.partition(":")[2].partition(":")[0] for b in gate.bindings()
             if b.partition(":")[0] in ("artifact", "verdict")} & ids
    if index is None or not bound:
        ancestors = ids
    elif gate.unit not in index.deps:
        ancestors = set()
    else:
        ancestors = index.upstream(gate.held_units(), stop_when=bound)
    out = []
    for b in gate.bindings():
        kind, _, name = b.partition(":")
        if b in ("contract", "plan"):
            continue
        if kind == "contract" and name:
            if contract_fields is not None and name not in contract_fields:
                out.append(gate_problem(gate.id, "binds", f"binds contract field {name!r}, "
                                        "which contract.md does not have", code="binds"))
            continue
        if kind in ("artifact", "verdict") and name:
            uid = name.partition(":")[0]
            if uid not in ids:
                out.append(gate_problem(gate.id, "binds", f"{b!r} names unknown unit {uid!r}",
                                        _or_hint(did_you_mean(uid, ids),
                                                 "name a unit of the plan"), code="binds"))
            elif uid not in ancestors:
                out.append(gate_problem(gate.id, "binds", f"{b!r}: {uid} is not upstream of "
                                        f"{gate.unit}, so its value may not exist when the "
                                        "gate asks", f"make {gate.unit} depend on {uid}",
                                        code="binds"))
            continue
        out.append(gate_problem(gate.id, "binds", f"{b!r} is not a binding", "use "
                                "contract:<field>, artifact:<unit>, verdict:<unit>, plan or "
                                "contract (a list binds several)", code="binds"))
    return out


def find_problems(
    plan: Plan,
    *,
    sources: dict[str, Any] | None = None,
    groups: set[str] | None = None,
    contract_fields: set[str] | None = None,
    other_ids: Iterable[str] = (),
) -> list[PlanProblem]:
    """Every problem of the plan itself (pure: no files read). ``sources`` maps source id ->
    approved flag; ``groups`` the groups with an approved source; ``contract_fields`` the
    contract's fields (plus ``body``); ``other_ids`` units the file has whose tables did not
    parse (reported on their own, so a dependency on one is not "unknown"). Collections are
    paused meanwhile (``plan_graph.gc_paused``)."""
    with gc_paused():
        return _find_problems(plan, sources, groups, contract_fields, set(other_ids))


def _find_problems(plan: Plan, sources: dict[str, Any] | None, groups: set[str] | None,
                   contract_fields: set[str] | None, other_ids: set[str]) -> list[PlanProblem]:
    problems: list[PlanProblem] = []
    seen: dict[str, int] = {}
    for u in plan.units:
        seen[u.id] = seen.get(u.id, 0) + 1
    for uid, n in sorted(seen.items()):
        if n > 1:
            problems.append(PlanProblem(where=f"unit {uid}", unit=uid, message=f"id is used {n} "
                                        "times", hint="give each unit its own id", code="dup"))
    ids = set(seen)
    known = ids | set(other_ids)
    units = plan.unit_map()
    documents = plan.documents()
    reaching_evidence = _reaching_evidence(units)
    for u in plan.units:
        if not UNIT_ID_RE.fullmatch(u.id):
            problems.append(unit_problem(u.id, "id", f"{u.id!r} is not a safe unit id",
                                         f"use {UNIT_ID_RULE}", code="unit_id"))
        for d in u.depends_on:
            if d.unit not in known:
                problems.append(PlanProblem(
                    where=f"unit {u.id}", unit=u.id, message=f"depends_on names unknown unit "
                    f"{d.unit!r}", hint=_or_hint(did_you_mean(d.unit, ids),
                                                 "add that unit or remove the dependency"),
                    code="unknown_dep", field="depends_on", say_field=False))
            elif d.unit == u.id:
                problems.append(PlanProblem(where=f"unit {u.id}", unit=u.id,
                                            message="depends_on names itself",
                                            hint="remove it", code="self_dep",
                                            field="depends_on", say_field=False))
        if u.kind in LOOP_KINDS or u.max_rounds is not None:
            if u.max_rounds is None:
                problems.append(unit_problem(
                    u.id, "max_rounds", f"is required for a {u.kind.value} (loop) unit",
                    f"set a bound from 1 to {MAX_ROUNDS_CAP}; unbounded loops are rejected",
                    code="max_rounds"))
            elif not 1 <= u.max_rounds <= MAX_ROUNDS_CAP:
                problems.append(unit_problem(u.id, "max_rounds", f"is {u.max_rounds}",
                                             f"it must be between 1 and {MAX_ROUNDS_CAP}",
                                             code="max_rounds"))
        if u.timeout_minutes <= 0:
            problems.append(unit_problem(u.id, "timeout_minutes", "must be positive",
                                         code="timeout"))
        problems += _input_problems(u, sources, groups, contract_fields)
        problems += _param_problems(u)
        problems += _kind_problems(u, units, documents, reaching_evidence)
    for doc, n in _duplicates([str(u.params.get("document")) for u in plan.units
                               if u.kind == UnitKind.render and u.params.get("document")]):
        problems.append(plan_problem(f"document {doc!r} is rendered by {n} units", "give each "
                                     "render unit its own params.document", code="dup_document"))
    index: DependencyIndex | None = DependencyIndex(plan)
    cycle = index.cycle() if index is not None else None
    if cycle:
        problems.append(plan_problem(f"dependency cycle: {' -> '.join(cycle)}", "remove one of "
                                     "these dependencies so the plan is a DAG", code="cycle"))
        index = None  # upstream sets mean nothing on a cycle: those checks are skipped
    gate_ids: dict[str, int] = {}
    for gate in plan.gates:
        gate_ids[gate.id] = gate_ids.get(gate.id, 0) + 1
        if gate.unit not in known:
            problems.append(gate_problem(gate.id, "unit", f"names unknown unit {gate.unit!r}",
                                         _or_hint(did_you_mean(gate.unit, ids),
                                                  "point the gate at an existing unit"),
                                         code="gate_unit"))
        for extra in gate.also:
            if extra not in known:
                problems.append(gate_problem(gate.id, "also", f"names unknown unit {extra!r}",
                                             _or_hint(did_you_mean(extra, ids),
                                                      "remove it or add that unit"),
                                             code="gate_unit"))
        for choice in gate.proceed:
            if gate.options and choice not in gate.options:
                problems.append(gate_problem(gate.id, "proceed", f"{choice!r} is not one of "
                                             "its options", _or_hint(
                                                 did_you_mean(choice, gate.options),
                                                 "list options that exist"),
                                             code="gate_proceed"))
        problems += _binding_problems(gate, ids, index, contract_fields)
    for gid, n in sorted(gate_ids.items()):
        if n > 1:
            problems.append(PlanProblem(where=f"gate {gid}", gate=gid, message=f"id is used {n} "
                                        "times", hint="give each gate its own id", code="dup"))
    required = plan.required_units()
    if plan.units and not required:
        problems.append(plan_problem("no unit has required_final = true", "mark the final "
                                     "units, otherwise a run can never be done",
                                     code="no_final"))
    # One reverse traversal from every required final unit at once (linear in the plan).
    needed = required | index.upstream(required) if index is not None else set()
    producers: dict[str, str] = {}
    for u in plan.units:
        for out in outputs_of(u):
            producers.setdefault(out, u.id)
    for deliverable in plan.plan.deliverables:
        if deliverable not in producers:
            problems.append(plan_problem(f"deliverable {deliverable!r} is produced by no unit",
                                         _or_hint(did_you_mean(deliverable, producers),
                                                  "add it to a unit's outputs"),
                                         code="deliverable"))
        elif index is not None and producers[deliverable] not in needed:
            problems.append(plan_problem(
                f"deliverable {deliverable!r} is produced by {producers[deliverable]}, which no "
                "required final unit depends on", "mark it required_final or add a dependency",
                code="deliverable"))
    return problems


def _or_hint(near: str, hint: str) -> str:
    """"did you mean 'x'? (else: hint)" when there is a near match, else the hint."""
    return f"{near} (else: {hint})" if near else hint


def _duplicates(values: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return sorted((v, n) for v, n in counts.items() if n > 1)


def validate_plan(plan: Plan, **context: Any) -> list[str]:
    """``find_problems`` as lines ("unit U1: field inputs: ... — what to do")."""
    return [p.line() for p in find_problems(plan, **context)]


def check_plan(plan: Plan, **context: Any) -> Plan:
    problems = find_problems(plan, **context)
    if problems:
        raise PlanValidationError([p.line() for p in problems], problems=problems)
    return plan




__all__ = ["check_plan", "did_you_mean", "find_problems", "validate_plan"]
