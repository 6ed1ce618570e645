"""The plan: units, typed dependency edges, typed root inputs, gates — and its validation.

``plan.toml`` is read with tomllib (the TUI's plan builder edits it with tomlkit, keeping
comments). Validation collects every problem, each naming the unit and field and saying
what to do (``PlanProblem``), and raises PlanValidationError with all of them. The format
is written down in docs/plan-format.md, generated from the field descriptions below.

Root inputs (``inputs``) carry edge types like dependencies do: a plain ``"group:A"`` reads
what its prefix emits by default (``ROOT_EDGES``); ``{ ref = "group:A", edges =
["structure"] }`` reads only the sources' header lines and the set of files.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from keepstep.engine.core.hashing import canonical_json, sha256_hex
from keepstep.engine.core.presets import (
    ANSWERS,
    CitedIdsCheck,
    FiguresCheck,
    ListsSourcesCheck,
    PresentCheck,
    SectionsCheck,
    default_outputs,
    document_output,
    evidence_output,
    parse_params,
    verified_output,
)
from keepstep.engine.errors import PlanValidationError, ProjectError

MAX_ROUNDS_CAP = 10
DEFAULT_TIMEOUT_MINUTES = 45.0
# Unit ids become folder names, event fields and CLI arguments: no spaces, no shell
# metacharacters, no path separators.
UNIT_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
UNIT_ID_RULE = "a letter, then up to 63 letters, digits, '_' or '-'"


class EdgeType(StrEnum):
    content = "content"
    structure = "structure"
    policy = "policy"
    audience = "audience"
    template = "template"
    presentation = "presentation"


class UnitKind(StrEnum):
    intake = "intake"
    extract = "extract"
    verify = "verify"
    synthesize = "synthesize"
    rank = "rank"
    model = "model"  # the general model step: any prompt, one of the answer schemas
    render = "render"
    audit = "audit"
    notes = "notes"
    deliver = "deliver"  # an external action through the side-effect ledger, no model


LOOP_KINDS = {UnitKind.rank}
# Kinds that call models; tests/test_kinds.py checks the kind registry agrees.
MODEL_KINDS = {UnitKind.extract, UnitKind.verify, UnitKind.synthesize, UnitKind.rank,
               UnitKind.model}
INPUT_PREFIXES = ("source", "group", "contract", "template", "policy", "data")

# What a root input emits, by prefix, and what a plain ref reads by default. A source group
# emits content (a body changed) and structure (files added/removed/renamed, header lines
# changed); a template emits template (sections or placeholders) and presentation (only
# wording or formatting); the contract emits audience for its audience field, policy for
# every other field and the body; a pack data file emits content.
ROOT_EDGES: dict[str, tuple[EdgeType, ...]] = {
    "source": (EdgeType.content, EdgeType.structure),
    "group": (EdgeType.content, EdgeType.structure),
    "template": (EdgeType.template, EdgeType.presentation),
    "contract": (EdgeType.policy,),
    "contract:audience": (EdgeType.audience,),
    "policy": (EdgeType.policy,),
    "data": (EdgeType.content,),
    "prompt": (EdgeType.content,),
}


def root_edges(ref: str) -> tuple[EdgeType, ...]:
    """The edge types a root input ``ref`` emits (and a plain ref reads)."""
    if ref == "contract:audience":
        return ROOT_EDGES[ref]
    return ROOT_EDGES.get(ref.partition(":")[0], (EdgeType.content,))


class Dependency(BaseModel):
    """One edge from a dependency to this unit, typed by what this unit uses of it."""

    model_config = ConfigDict(extra="forbid")
    unit: str = Field(description="the unit depended on")
    edge: EdgeType = Field(default=EdgeType.content, description="what this unit uses of it: "
                           "content (its claims or figures), presentation (it re-formats or "
                           "delivers its bytes), audience, template, structure, policy")


class InputRef(BaseModel):
    """The long form of a root input: ``{ ref = "group:A", edges = ["structure"] }``."""

    model_config = ConfigDict(extra="forbid")
    ref: str = Field(description="<prefix>:<name>, e.g. group:A, template:memo")
    edges: list[EdgeType] = Field(min_length=1, description="the changes of this input that "
                                  "reach the unit (a subset of what the prefix emits)")


class Unit(BaseModel):
    """One unit of work: a kind (a preset over a general mechanism) with its inputs, outputs,
    dependencies and params."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description=f"the unit's id: {UNIT_ID_RULE}")
    title: str = Field(description="what the unit does, for people")
    phase: str = Field(description="a label grouping units in views (intake, synthesis, ...)")
    kind: UnitKind = Field(description="the preset: intake, extract, verify, synthesize, rank, "
                           "model, render, audit, notes, deliver")
    inputs: list[str] = Field(default_factory=list, description="root inputs "
                              "<prefix>:<name> (source, group, contract, template, policy, "
                              "data); a table {ref, edges} narrows the edge types read")
    input_edges: dict[str, list[EdgeType]] = Field(
        default_factory=dict, description="ref -> edge types, for inputs read through other "
        "edges than their prefix's default (written by the {ref, edges} form of inputs)")
    outputs: list[str] = Field(default_factory=list, description="the artifact names it writes")
    depends_on: list[Dependency] = Field(default_factory=list, description="dependencies: "
                                         "\"U01\" or {unit = \"U01\", edge = \"structure\"}")
    validators: list[str] = Field(default_factory=list, description="the validators its kind "
                                  "applies (informative; the kind decides)")
    max_rounds: int | None = Field(default=None, description=f"a loop's bound, 1 to "
                                   f"{MAX_ROUNDS_CAP}; required for rank units")
    on_last_round: Literal["fail", "unconverged"] = Field(
        default="fail", description="a loop still failing its check at max_rounds: fail, or "
        "go forward with its best answer flagged unconverged")
    required_final: bool = Field(default=False, description="the run is done when every "
                                 "required final unit is current and passed")
    timeout_minutes: float = Field(default=DEFAULT_TIMEOUT_MINUTES, description="the unit's "
                                   "time limit per attempt")
    params: dict[str, Any] = Field(default_factory=dict, description="the kind's params "
                                   "(docs/plan-format.md, Kinds)")

    @model_validator(mode="before")
    @classmethod
    def _long_inputs(cls, data: Any) -> Any:
        # {ref = "group:A", edges = ["structure"]} is shorthand for the ref in inputs plus
        # input_edges["group:A"] = ["structure"].
        if not isinstance(data, dict) or not isinstance(data.get("inputs"), list):
            return data
        if not any(isinstance(i, dict) for i in data["inputs"]):
            return data
        data = dict(data)
        edges = dict(data.get("input_edges") or {})
        refs = []
        for item in data["inputs"]:
            if isinstance(item, dict):
                spec = InputRef.model_validate(item)
                refs.append(spec.ref)
                edges[spec.ref] = [e.value for e in spec.edges]
            else:
                refs.append(item)
        data["inputs"], data["input_edges"] = refs, edges
        return data

    @field_validator("depends_on", mode="before")
    @classmethod
    def _short_deps(cls, value: Any) -> Any:
        # "U01" is shorthand for {unit = "U01", edge = "content"}
        if isinstance(value, list):
            return [{"unit": v} if isinstance(v, str) else v for v in value]
        return value

    def input_refs(self, prefix: str) -> list[str]:
        return [i.split(":", 1)[1] for i in self.inputs if i.startswith(prefix + ":")]

    def edges_of(self, ref: str) -> tuple[str, ...]:
        """The edge types through which the unit reads root input ``ref``."""
        given = self.input_edges.get(ref)
        if given:
            return tuple(e.value if isinstance(e, EdgeType) else str(e) for e in given)
        return tuple(e.value for e in root_edges(ref))

    def reads_content(self, ref: str) -> bool:
        """Whether the unit reads the bodies of the sources ``ref`` names (not only their
        header lines)."""
        return EdgeType.content.value in self.edges_of(ref)


class Gate(BaseModel):
    """An approval a person must give before ``unit`` (and ``also``) may run, bound to what
    the decision is about: it applies while those values are unchanged."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="the gate's id")
    unit: str = Field(description="the unit the gate holds")
    # Further units the same decision holds (e.g. every unit that reads the audience), so
    # nothing that depends on the answer runs before it is given.
    also: list[str] = Field(default_factory=list, description="further units the same "
                            "decision holds")
    question: str = Field(description="what the person is asked")
    options: list[str] = Field(default_factory=list, description="the answers offered "
                               "(none: a plain approve)")
    proceed: list[str] = Field(default_factory=list, description="the options that let the "
                               "held units run (default: every option); e.g. [\"release\"] "
                               "when \"hold\" is offered too")
    binds: str | list[str] = Field(
        default="contract", description="what a decision binds: contract:<field> (that "
        "field's value), artifact:<unit> (its output hashes), verdict:<unit> (its validators' "
        "verdict), plan (the plan version), or contract (plan version and the whole contract); "
        "a list binds all of them")
    expires_days: float = Field(default=7.0, description="a decision's lifetime in days")

    def held_units(self) -> list[str]:
        """The gated unit first, then the others the same decision holds."""
        return [self.unit, *[u for u in self.also if u != self.unit]]

    def bindings(self) -> list[str]:
        """``binds`` as a list."""
        return [self.binds] if isinstance(self.binds, str) else list(self.binds)

    def lets_run(self, choice: str) -> bool:
        """Whether a decision ``choice`` lets the held units run."""
        return not self.proceed or choice in self.proceed

    def binds_audience(self) -> bool:
        """Whether the options are audience values checked against contract.md."""
        return "contract:audience" in self.bindings() or (
            self.bindings() == ["contract"] and bool(self.options))


class PlanHeader(BaseModel):
    """The ``[plan]`` table."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(default="", description="the pack's title")
    deliverables: list[str] = Field(default_factory=list, description="output names that must "
                                    "be produced by a unit a required final unit depends on")


class Plan(BaseModel):
    """plan.toml: ``[plan]``, ``[[unit]]`` and ``[[gate]]`` tables."""

    plan: PlanHeader = Field(default_factory=PlanHeader, description="the [plan] table")
    units: list[Unit] = Field(default_factory=list, alias="unit", description="[[unit]] tables")
    gates: list[Gate] = Field(default_factory=list, alias="gate", description="[[gate]] tables")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # -- lookups -------------------------------------------------------------
    def unit_map(self) -> dict[str, Unit]:
        return {u.id: u for u in self.units}

    def gate_for(self, unit_id: str) -> Gate | None:
        return next((g for g in self.gates if unit_id in g.held_units()), None)

    def graph(self) -> nx.DiGraph:
        """Edges point from a dependency to its dependent, labelled with ``edge``."""
        g = nx.DiGraph()
        for u in self.units:
            g.add_node(u.id)
        for u in self.units:
            for d in u.depends_on:
                g.add_edge(d.unit, u.id, edge=d.edge.value)
        return g

    def required_units(self) -> set[str]:
        return {u.id for u in self.units if u.required_final}

    def documents(self) -> dict[str, str]:
        """document name -> the render unit producing it."""
        out: dict[str, str] = {}
        for u in self.units:
            if u.kind == UnitKind.render and u.params.get("document"):
                out.setdefault(str(u.params["document"]), u.id)
        return out

    def fingerprint(self) -> str:
        """A hash of the plan's meaning (unit order and formatting do not count)."""
        data = self.to_toml_dict()
        data["unit"] = sorted(data.get("unit", []), key=lambda u: u["id"])
        data["gate"] = sorted(data.get("gate", []), key=lambda g: g["id"])
        return sha256_hex(canonical_json(data))

    def unit_fingerprint(self, unit_id: str) -> str:
        return sha256_hex(canonical_json(self.unit_map()[unit_id].model_dump(mode="json")))

    # -- files -----------------------------------------------------------------
    def to_toml_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", by_alias=True, exclude_defaults=False)
        for u in data.get("unit", []):
            if u.get("max_rounds") is None:
                u.pop("max_rounds", None)
            if not u.get("params"):
                u.pop("params", None)
            if u.get("on_last_round") == "fail":
                u.pop("on_last_round", None)
            edges = u.pop("input_edges", None) or {}
            if edges:
                u["inputs"] = [{"ref": r, "edges": edges[r]} if r in edges else r
                               for r in u.get("inputs", [])]
        for g in data.get("gate", []):
            if not g.get("proceed"):
                g.pop("proceed", None)
        return data

    def save(self, path: Path) -> None:
        """Write the plan as plain TOML (comments are not kept; ``engine.files.plan_file.
        save_plan`` edits an existing plan.toml in place and keeps them)."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(tomli_w.dumps(self.to_toml_dict()).encode("utf-8"))
        tmp.replace(path)


class PlanProblem(BaseModel):
    """One reason a plan cannot run: where (a unit, a gate or the plan), which field, what is
    wrong and what to do."""

    where: str = Field(description="\"unit U07\", \"gate release\" or \"plan\"")
    unit: str | None = Field(default=None, description="the unit's id, when a unit")
    gate: str | None = Field(default=None, description="the gate's id, when a gate")
    field: str = Field(default="", description="the field, e.g. inputs or params.template")
    message: str = Field(description="what is wrong")
    hint: str = Field(default="", description="what to do")
    code: str = Field(default="", description="a stable name for the kind of problem")
    # Whether the line reads "field <f> <message>" (the message then follows the field name)
    # or the message names what it is about itself.
    say_field: bool = Field(default=True, exclude=True)

    def line(self) -> str:
        fld = f"field {self.field} " if self.field and self.say_field else ""
        text = f"{self.where}: {fld}{self.message}"
        return f"{text} — {self.hint}" if self.hint else text

    def __str__(self) -> str:
        return self.line()


def unit_problem(uid: str, fld: str, message: str, hint: str = "", code: str = "", *,
                 say_field: bool = True) -> PlanProblem:
    return PlanProblem(where=f"unit {uid}", unit=uid, field=fld, message=message, hint=hint,
                       code=code, say_field=say_field)


def gate_problem(gid: str, fld: str, message: str, hint: str = "", code: str = ""
                 ) -> PlanProblem:
    return PlanProblem(where=f"gate {gid}", gate=gid, field=fld, message=message, hint=hint,
                       code=code)


def plan_problem(message: str, hint: str = "", code: str = "") -> PlanProblem:
    return PlanProblem(where="plan", message=message, hint=hint, code=code)


def _fmt_loc(loc: Iterable[Any], raw: dict[str, Any]) -> tuple[str, str | None, str | None, str]:
    loc = list(loc)
    if len(loc) >= 2 and loc[0] == "unit" and isinstance(loc[1], int):
        units = raw.get("unit", [])
        uid = units[loc[1]].get("id", f"#{loc[1] + 1}") if loc[1] < len(units) else "?"
        return f"unit {uid}", str(uid), None, ".".join(map(str, loc[2:]))
    if len(loc) >= 2 and loc[0] == "gate" and isinstance(loc[1], int):
        gates = raw.get("gate", [])
        gid = gates[loc[1]].get("id", f"#{loc[1] + 1}") if loc[1] < len(gates) else "?"
        return f"gate {gid}", None, str(gid), ".".join(map(str, loc[2:]))
    return ".".join(map(str, loc)), None, None, ""


def _shape_problems(exc: ValidationError, raw: dict[str, Any]) -> list[PlanProblem]:
    problems = []
    for err in exc.errors():
        where, uid, gid, fld = _fmt_loc(err["loc"], raw)
        msg = err["msg"]
        if err["type"] == "enum":
            msg += " (allowed: " + str(err.get("ctx", {}).get("expected", "")) + ")"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field — remove it or check its spelling"
        if not fld and uid is None and gid is None:
            problems.append(PlanProblem(where=where, message=msg, code="shape"))
        else:
            # "unit U2: field depends_on.0.edge: ..." (field named even when it is the unit)
            fld = fld or ("(unit)" if uid else "(gate)")
            problems.append(PlanProblem(where=where, unit=uid, gate=gid, field=fld,
                                        message=f"field {fld}: {msg}", code="shape",
                                        say_field=False))
    return problems


def parse_plan(text: str, *, origin: str = "plan.toml") -> Plan:
    """Parse TOML into a Plan; shape errors become PlanValidationError lines."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = plan_problem(f"{origin} is not valid TOML: {exc}", code="toml")
        raise PlanValidationError([problem.message], problems=[problem]) from exc
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        problems = _shape_problems(exc, raw)
        raise PlanValidationError([p.line() for p in problems], problems=problems) from exc


def load_plan(path: Path) -> Plan:
    if not path.is_file():
        raise ProjectError(f"{path} is missing", hint="create it with `keepstep init DIR`")
    return parse_plan(path.read_text(encoding="utf-8"), origin=str(path))


# -- validation ---------------------------------------------------------------------------------

def _param_problems(u: Unit) -> list[PlanProblem]:
    try:
        parse_params(u.kind.value, u.params)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = f"unknown param for a {u.kind.value} unit — remove it or check its spelling"
            elif err["type"] == "missing":
                msg = f"a {u.kind.value} unit needs it"
            out.append(unit_problem(u.id, f"params.{loc}" if loc else "params", msg,
                                    "docs/plan-format.md lists every kind's params",
                                    code="params"))
        return out
    return []


def outputs_of(u: Unit) -> list[str]:
    """What a unit writes: its declared outputs, else its kind's defaults."""
    return list(u.outputs) or default_outputs(u)


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
                                        "approved", f"approve it with `keepstep sources DIR "
                                        f"approve {name}` or remove the input", code="source",
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


def _kind_problems(u: Unit, units: dict[str, Unit], documents: dict[str, str]) -> list[PlanProblem]:
    """What a kind needs of the plan around it (dependencies, documents, files)."""
    out: list[PlanProblem] = []
    kind = u.kind
    deps = [units[d.unit] for d in u.depends_on if d.unit in units]
    if kind == UnitKind.extract and not (u.input_refs("source") or u.input_refs("group")):
        out.append(unit_problem(u.id, "inputs", "an extract unit names no sources",
                                "add group:<G> or source:<id> inputs", code="extract_sources"))
    if kind == UnitKind.verify and not any(evidence_output(d) or verified_output(d)
                                           for d in deps):
        out.append(unit_problem(u.id, "depends_on", "a verify unit has no evidence-producing "
                                "dependency", "depend on an extract unit (or a unit that "
                                "writes evidence.json)", code="verify_evidence"))
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


def _binding_problems(plan: Plan, gate: Gate, ids: set[str], ancestors: set[str],
                      contract_fields: set[str] | None) -> list[PlanProblem]:
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
                                        "name a unit of the plan", code="binds"))
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
) -> list[PlanProblem]:
    """Every problem of the plan itself (pure: no files read). ``sources`` maps source id ->
    approved flag; ``groups`` the groups with an approved source; ``contract_fields`` the
    contract's fields (plus ``body``)."""
    problems: list[PlanProblem] = []
    seen: dict[str, int] = {}
    for u in plan.units:
        seen[u.id] = seen.get(u.id, 0) + 1
    for uid, n in sorted(seen.items()):
        if n > 1:
            problems.append(PlanProblem(where=f"unit {uid}", unit=uid, message=f"id is used {n} "
                                        "times", hint="give each unit its own id", code="dup"))
    ids = set(seen)
    units = plan.unit_map()
    documents = plan.documents()
    for u in plan.units:
        if not UNIT_ID_RE.fullmatch(u.id):
            problems.append(unit_problem(u.id, "id", f"{u.id!r} is not a safe unit id",
                                         f"use {UNIT_ID_RULE}", code="unit_id"))
        for d in u.depends_on:
            if d.unit not in ids:
                problems.append(PlanProblem(
                    where=f"unit {u.id}", unit=u.id, message=f"depends_on names unknown unit "
                    f"{d.unit!r}", hint="add that unit or remove the dependency",
                    code="unknown_dep"))
            elif d.unit == u.id:
                problems.append(PlanProblem(where=f"unit {u.id}", unit=u.id,
                                            message="depends_on names itself",
                                            hint="remove it", code="self_dep"))
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
        problems += _kind_problems(u, units, documents)
    for doc, n in _duplicates([str(u.params.get("document")) for u in plan.units
                               if u.kind == UnitKind.render and u.params.get("document")]):
        problems.append(plan_problem(f"document {doc!r} is rendered by {n} units", "give each "
                                     "render unit its own params.document", code="dup_document"))
    g = plan.graph()
    try:
        cycle = nx.find_cycle(g)
        path = " -> ".join([e[0] for e in cycle] + [cycle[-1][1]])
        problems.append(plan_problem(f"dependency cycle: {path}", "remove one of these "
                                     "dependencies so the plan is a DAG", code="cycle"))
        acyclic = False
    except nx.NetworkXNoCycle:
        acyclic = True
    gate_ids: dict[str, int] = {}
    for gate in plan.gates:
        gate_ids[gate.id] = gate_ids.get(gate.id, 0) + 1
        if gate.unit not in ids:
            problems.append(gate_problem(gate.id, "unit", f"names unknown unit {gate.unit!r}",
                                         "point the gate at an existing unit", code="gate_unit"))
        for extra in gate.also:
            if extra not in ids:
                problems.append(gate_problem(gate.id, "also", f"names unknown unit {extra!r}",
                                             "remove it or add that unit", code="gate_unit"))
        for choice in gate.proceed:
            if gate.options and choice not in gate.options:
                problems.append(gate_problem(gate.id, "proceed", f"{choice!r} is not one of "
                                             "its options", "list options that exist",
                                             code="gate_proceed"))
        ancestors: set[str] = set()
        if acyclic and gate.unit in g:
            for held in gate.held_units():
                if held in g:
                    ancestors |= nx.ancestors(g, held)
        problems += _binding_problems(plan, gate, ids, ancestors if acyclic else ids,
                                      contract_fields)
    for gid, n in sorted(gate_ids.items()):
        if n > 1:
            problems.append(PlanProblem(where=f"gate {gid}", gate=gid, message=f"id is used {n} "
                                        "times", hint="give each gate its own id", code="dup"))
    required = plan.required_units()
    if plan.units and not required:
        problems.append(plan_problem("no unit has required_final = true", "mark the final "
                                     "units, otherwise a run can never be done",
                                     code="no_final"))
    needed: set[str] = set()
    if acyclic:
        for r in required & set(g.nodes):
            needed |= nx.ancestors(g, r) | {r}
    producers: dict[str, str] = {}
    for u in plan.units:
        for out in outputs_of(u):
            producers.setdefault(out, u.id)
    for deliverable in plan.plan.deliverables:
        if deliverable not in producers:
            problems.append(plan_problem(f"deliverable {deliverable!r} is produced by no unit",
                                         "add it to a unit's outputs", code="deliverable"))
        elif acyclic and producers[deliverable] not in needed:
            problems.append(plan_problem(
                f"deliverable {deliverable!r} is produced by {producers[deliverable]}, which no "
                "required final unit depends on", "mark it required_final or add a dependency",
                code="deliverable"))
    return problems


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


__all__ = ["DEFAULT_TIMEOUT_MINUTES", "INPUT_PREFIXES", "LOOP_KINDS", "MAX_ROUNDS_CAP",
           "MODEL_KINDS", "ROOT_EDGES", "UNIT_ID_RE", "Dependency", "EdgeType", "Gate",
           "InputRef", "Plan", "PlanHeader", "PlanProblem", "Unit", "UnitKind", "check_plan",
           "document_output", "find_problems", "load_plan", "outputs_of", "parse_plan",
           "root_edges", "validate_plan"]
