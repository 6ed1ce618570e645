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

import difflib
import re
import tomllib
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

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
    default_outputs,
    document_output,
)
from keepstep.engine.errors import PlanValidationError, ProjectError

if TYPE_CHECKING:
    import networkx as nx

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
        """Edges point from a dependency to its dependent, labelled with ``edge``. (networkx
        is imported here, not with the plan: ~0.5 s that opening a project does not need;
        the checks and the scheduler walk ``core.plan_graph.DependencyIndex`` instead.)"""
        import networkx as nx

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
    line_no: int | None = Field(default=None, description="the line of plan.toml it is on "
                                "(the field's line, else its table's), when known")
    # Whether the line reads "field <f> <message>" (the message then follows the field name)
    # or the message names what it is about itself.
    say_field: bool = Field(default=True, exclude=True)

    def line(self) -> str:
        fld = f"field {self.field} " if self.field and self.say_field else ""
        text = f"{self.where}: {fld}{self.message}"
        return f"{text} — {self.hint}" if self.hint else text

    def located(self) -> str:
        """``line()`` followed by where it is in plan.toml, when known (what `keepstep
        validate` prints)."""
        text = self.line()
        return f"{text} (plan.toml line {self.line_no})" if self.line_no else text

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


def _near(word: Any, choices: Iterable[str]) -> str:
    near = difflib.get_close_matches(str(word), sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean {near[0]!r}?" if near else ""


def _fields_of(loc: list[Any]) -> list[str]:
    """The field names allowed where ``loc`` points (for "did you mean")."""
    models: dict[str, type[BaseModel]] = {"unit": Unit, "gate": Gate, "plan": PlanHeader}
    if len(loc) == 1:
        return ["plan", "unit", "gate"]
    model = models.get(str(loc[0]))
    if model is None:
        return []
    rest = [p for p in loc[1:] if not isinstance(p, int)]
    if len(rest) == 2 and model is Unit and rest[0] == "depends_on":
        model = Dependency
    elif len(rest) == 2 and model is Unit and rest[0] == "inputs":
        model = InputRef
    elif len(rest) != 1:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _shape_message(err: Any) -> tuple[str, str]:
    """(message, hint) for one pydantic error: the value, what is allowed (once) and the
    nearest allowed spelling."""
    loc = list(err["loc"])
    if err["type"] == "enum":
        expected = str(err.get("ctx", {}).get("expected", ""))
        allowed = [a.strip(" '") for a in expected.replace(" or ", ", ").split(",")]
        allowed = [a for a in allowed if a]
        what = "kind" if loc and loc[-1] == "kind" else "value"
        message = f"{err.get('input')!r} is not a {what} keepstep knows (allowed: " \
                  f"{', '.join(allowed)})"
        return message, _near(err.get("input"), allowed)
    if err["type"] == "extra_forbidden":
        near = _near(loc[-1], _fields_of(loc)) if loc else ""
        return "unknown field", near or "remove it or check its spelling"
    return err["msg"], ""


def _shape_problems(exc: ValidationError, raw: dict[str, Any], *, prefix: tuple[Any, ...] = ()
                    ) -> list[PlanProblem]:
    problems = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        where, uid, gid, fld = _fmt_loc(loc, raw)
        msg, hint = _shape_message({**err, "loc": loc})
        if not fld and uid is None and gid is None:
            problems.append(PlanProblem(where=where, message=msg, hint=hint, code="shape"))
        else:
            # "unit U2: field depends_on.0.edge: ..." (field named even when it is the unit)
            fld = fld or ("(unit)" if uid else "(gate)")
            problems.append(PlanProblem(where=where, unit=uid, gate=gid, field=fld,
                                        message=f"field {fld}: {msg}", hint=hint,
                                        code="shape", say_field=False))
    return problems


def _partial_plan(raw: dict[str, Any]) -> tuple[Plan, list[PlanProblem], set[str]]:
    """Every table that parses on its own, the shape problems of those that do not, and the
    ids of units that did not (so a dependency on one is not reported as unknown)."""
    problems: list[PlanProblem] = []
    failed_ids: set[str] = set()
    parts: dict[str, Any] = {}
    top = {k: v for k, v in raw.items() if k not in ("plan", "unit", "gate")}
    if top:
        try:
            Plan.model_validate(top)
        except ValidationError as exc:
            problems += _shape_problems(exc, raw)
    try:
        parts["plan"] = PlanHeader.model_validate(raw.get("plan", {}))
    except ValidationError as exc:
        problems += _shape_problems(exc, raw, prefix=("plan",))
        parts["plan"] = PlanHeader()
    for key, model in (("unit", Unit), ("gate", Gate)):
        tables = raw.get(key, [])
        if not isinstance(tables, list):
            try:
                Plan.model_validate({key: tables})
            except ValidationError as exc:
                problems += _shape_problems(exc, raw)
            tables = []
        ok: list[Any] = []
        for n, table in enumerate(tables):
            try:
                ok.append(model.model_validate(table))
            except ValidationError as exc:
                problems += _shape_problems(exc, raw, prefix=(key, n))
                if key == "unit" and isinstance(table, dict) and isinstance(table.get("id"), str):
                    failed_ids.add(table["id"])
        parts["units" if key == "unit" else "gates"] = ok
    return Plan(**parts), problems, failed_ids


def parse_plan(text: str, *, origin: str = "plan.toml") -> Plan:
    """Parse TOML into a Plan. A plan with shape errors raises PlanValidationError with every
    problem at once: the shape errors of the tables that do not parse and the plan checks of
    the rest (``core.plan_checks.find_problems``), each with its line in the file."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = plan_problem(f"{origin} is not valid TOML: {exc}", code="toml")
        raise PlanValidationError([problem.message], problems=[problem]) from exc
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        partial, problems, failed = _partial_plan(raw)
        if not problems:  # not reproduced table by table: report the errors as they are
            problems = _shape_problems(exc, raw)
        # Imported here: plan_checks imports this module.
        from keepstep.engine.core.plan_checks import find_problems

        # Plan-wide conclusions ("no required final unit", deliverables) would be wrong
        # while tables are missing; everything about the tables that parsed is reported.
        problems += [p for p in find_problems(partial, other_ids=failed)
                     if not (failed and p.code in ("no_final", "deliverable"))]
        problems = locate_lines(text, problems, raw)
        raise PlanValidationError([p.line() for p in problems], problems=problems) from exc


_TABLE_RE = re.compile(r"^\s*\[\[\s*(unit|gate)\s*\]\]\s*(#.*)?$")
_HEADER_RE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"-]+)\s*\]\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def locate_lines(text: str, problems: list[PlanProblem], raw: dict[str, Any] | None = None
                 ) -> list[PlanProblem]:
    """``problems`` with ``line_no`` set from plan.toml's ``text``: the line of the field
    (its first key), else of its ``[[unit]]``/``[[gate]]`` table, else of ``[plan]``. Tables
    are matched to ids in file order (the n-th ``[[unit]]`` is the n-th unit)."""
    if not problems:
        return problems
    tables: dict[str, list[dict[str, int]]] = {"unit": [], "gate": []}
    plan_keys: dict[str, int] = {}
    current: dict[str, int] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        m = _TABLE_RE.match(line)
        if m:
            current = {"": n}
            tables[m.group(1)].append(current)
            continue
        h = _HEADER_RE.match(line)
        if h:
            name = h.group(1)
            if name == "plan":
                current = plan_keys
                plan_keys.setdefault("", n)
            elif current is not None and name.split(".")[0] in ("unit", "gate") and \
                    len(name.split(".")) > 1:
                current.setdefault(name.split(".", 1)[1].split(".")[0], n)  # [unit.params]
            else:
                current = None
            continue
        k = _KEY_RE.match(line)
        if k and current is not None:
            current.setdefault(k.group(1), n)
    if raw is None:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return problems
    index: dict[tuple[str, str], dict[str, int]] = {}
    for key in ("unit", "gate"):
        entries = raw.get(key)
        for table, found in zip(entries if isinstance(entries, list) else [], tables[key],
                                strict=False):
            if isinstance(table, dict) and isinstance(table.get("id"), str):
                index.setdefault((key, table["id"]), found)
    out = []
    for p in problems:
        line_no = None
        if p.unit or p.gate:
            keys = index.get(("unit", p.unit) if p.unit else ("gate", str(p.gate)))
            if keys:
                line_no = keys.get(p.field.split(".")[0]) or keys.get("")
        elif p.where.startswith("plan."):  # a shape error in [plan]: "plan.titel"
            line_no = plan_keys.get(p.where.split(".")[1]) or plan_keys.get("")
        elif p.code == "deliverable":
            line_no = plan_keys.get("deliverables")
        out.append(p.model_copy(update={"line_no": line_no}) if line_no else p)
    return out


def load_plan(path: Path) -> Plan:
    if not path.is_file():
        raise ProjectError(f"{path} is missing", hint="create it with `keepstep init DIR`")
    try:  # a plan from someone else may not be UTF-8: a named error, not a crash
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProjectError(f"{path} is not valid UTF-8 text (byte {exc.start})",
                           hint="save it as UTF-8, then validate again") from None
    return parse_plan(text, origin=str(path))


def outputs_of(u: Unit) -> list[str]:
    """What a unit writes: its declared outputs, else its kind's defaults."""
    return list(u.outputs) or default_outputs(u)


# The checks moved to ``core.plan_checks``; these names still resolve here (loaded on use, so
# importing either module first works).
_MOVED = ("check_plan", "find_problems", "validate_plan")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from keepstep.engine.core import plan_checks

        return getattr(plan_checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_TIMEOUT_MINUTES", "INPUT_PREFIXES", "LOOP_KINDS", "MAX_ROUNDS_CAP",
           "MODEL_KINDS", "ROOT_EDGES", "UNIT_ID_RE", "Dependency", "EdgeType", "Gate",
           "InputRef", "Plan", "PlanHeader", "PlanProblem", "Unit", "UnitKind",
           "document_output", "load_plan", "locate_lines", "outputs_of", "parse_plan",
           "root_edges"]
