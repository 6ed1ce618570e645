"""The plan: units, typed dependency edges, gates — and its validation.

``plan.toml`` is read with tomllib and written with tomli-w (the TUI edits it).
Validation collects every problem, each naming the unit and field and saying
what to do, and raises PlanValidationError with all of them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

import networkx as nx
import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from keepstep.engine.core.hashing import canonical_json, sha256_hex
from keepstep.engine.errors import PlanValidationError, ProjectError

MAX_ROUNDS_CAP = 10
DEFAULT_TIMEOUT_MINUTES = 45.0


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
    render = "render"
    audit = "audit"
    notes = "notes"
    deliver = "deliver"  # an external action through the side-effect ledger, no model


LOOP_KINDS = {UnitKind.rank}
# Kinds that call models; tests/test_kinds.py checks the kind registry agrees.
MODEL_KINDS = {UnitKind.extract, UnitKind.verify, UnitKind.synthesize, UnitKind.rank}
INPUT_PREFIXES = ("source", "group", "contract", "template", "policy")


class Dependency(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit: str
    edge: EdgeType = EdgeType.content


class Unit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    phase: str
    kind: UnitKind
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    depends_on: list[Dependency] = Field(default_factory=list)
    validators: list[str] = Field(default_factory=list)
    max_rounds: int | None = None
    required_final: bool = False
    timeout_minutes: float = DEFAULT_TIMEOUT_MINUTES
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("depends_on", mode="before")
    @classmethod
    def _short_deps(cls, value: Any) -> Any:
        # "U01" is shorthand for {unit = "U01", edge = "content"}
        if isinstance(value, list):
            return [{"unit": v} if isinstance(v, str) else v for v in value]
        return value

    def input_refs(self, prefix: str) -> list[str]:
        return [i.split(":", 1)[1] for i in self.inputs if i.startswith(prefix + ":")]


class Gate(BaseModel):
    """An approval a person must give before ``unit`` may run."""

    model_config = ConfigDict(extra="forbid")
    id: str
    unit: str
    # Further units the same decision holds (e.g. every unit that reads the audience), so
    # nothing that depends on the answer runs before it is given.
    also: list[str] = Field(default_factory=list)
    question: str
    options: list[str] = Field(default_factory=list)
    binds: str = "contract"  # contract: plan version + contract hash; or "artifact:<unit>"
    expires_days: float = 7.0

    def held_units(self) -> list[str]:
        """The gated unit first, then the others the same decision holds."""
        return [self.unit, *[u for u in self.also if u != self.unit]]


class PlanHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = ""
    deliverables: list[str] = Field(default_factory=list)


class Plan(BaseModel):
    plan: PlanHeader = Field(default_factory=PlanHeader)
    units: list[Unit] = Field(default_factory=list, alias="unit")
    gates: list[Gate] = Field(default_factory=list, alias="gate")

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
        return data

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(tomli_w.dumps(self.to_toml_dict()).encode("utf-8"))
        tmp.replace(path)


def _fmt_loc(loc: Iterable[Any], raw: dict[str, Any]) -> str:
    loc = list(loc)
    if len(loc) >= 2 and loc[0] == "unit" and isinstance(loc[1], int):
        units = raw.get("unit", [])
        uid = units[loc[1]].get("id", f"#{loc[1] + 1}") if loc[1] < len(units) else "?"
        return f"unit {uid}: field {'.'.join(map(str, loc[2:])) or '(unit)'}"
    if len(loc) >= 2 and loc[0] == "gate" and isinstance(loc[1], int):
        gates = raw.get("gate", [])
        gid = gates[loc[1]].get("id", f"#{loc[1] + 1}") if loc[1] < len(gates) else "?"
        return f"gate {gid}: field {'.'.join(map(str, loc[2:])) or '(gate)'}"
    return ".".join(map(str, loc))


def parse_plan(text: str, *, origin: str = "plan.toml") -> Plan:
    """Parse TOML into a Plan; shape errors become PlanValidationError lines."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanValidationError([f"{origin} is not valid TOML: {exc}"]) from exc
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = _fmt_loc(err["loc"], raw)
            msg = err["msg"]
            if err["type"] == "enum":
                msg += " (allowed: " + str(err.get("ctx", {}).get("expected", "")) + ")"
            elif err["type"] == "extra_forbidden":
                msg = "unknown field — remove it or check its spelling"
            problems.append(f"{where}: {msg}")
        raise PlanValidationError(problems) from exc


def load_plan(path: Path) -> Plan:
    if not path.is_file():
        raise ProjectError(f"{path} is missing", hint="create it with `keepstep init DIR`")
    return parse_plan(path.read_text(encoding="utf-8"), origin=str(path))


def validate_plan(
    plan: Plan,
    *,
    sources: dict[str, Any] | None = None,
    groups: set[str] | None = None,
    contract_fields: set[str] | None = None,
) -> list[str]:
    """Every problem of the plan, each naming unit and field and what to do.

    ``sources`` maps source id -> approved flag; when given, inputs naming
    unknown or unapproved sources are reported.
    """
    problems: list[str] = []
    seen: dict[str, int] = {}
    for u in plan.units:
        seen[u.id] = seen.get(u.id, 0) + 1
    for uid, n in sorted(seen.items()):
        if n > 1:
            problems.append(f"unit {uid}: id is used {n} times — give each unit its own id")
    ids = set(seen)
    for u in plan.units:
        for d in u.depends_on:
            if d.unit not in ids:
                problems.append(
                    f"unit {u.id}: depends_on names unknown unit {d.unit!r} — add that unit or "
                    "remove the dependency"
                )
            elif d.unit == u.id:
                problems.append(f"unit {u.id}: depends_on names itself — remove it")
        if u.kind in LOOP_KINDS or u.max_rounds is not None:
            if u.max_rounds is None:
                problems.append(
                    f"unit {u.id}: field max_rounds is required for a {u.kind.value} (loop) unit "
                    f"— set a bound from 1 to {MAX_ROUNDS_CAP}; unbounded loops are rejected"
                )
            elif not 1 <= u.max_rounds <= MAX_ROUNDS_CAP:
                problems.append(
                    f"unit {u.id}: field max_rounds is {u.max_rounds} — it must be between 1 and "
                    f"{MAX_ROUNDS_CAP}"
                )
        if u.timeout_minutes <= 0:
            problems.append(f"unit {u.id}: field timeout_minutes must be positive")
        for ref in u.inputs:
            prefix, _, name = ref.partition(":")
            if prefix not in INPUT_PREFIXES or not name:
                problems.append(
                    f"unit {u.id}: input {ref!r} is not of the form <kind>:<name> with kind one "
                    f"of {', '.join(INPUT_PREFIXES)}"
                )
            elif prefix == "source" and sources is not None:
                if name not in sources:
                    problems.append(
                        f"unit {u.id}: input source {name!r} is not in sources.toml — add it "
                        "there (and approve it) or fix the id"
                    )
                elif not sources[name]:
                    problems.append(
                        f"unit {u.id}: input source {name!r} is not approved — approve it with "
                        f"`keepstep sources DIR approve {name}` or remove the input"
                    )
            elif prefix == "group" and groups is not None and name not in groups:
                problems.append(
                    f"unit {u.id}: input group {name!r} has no approved source — approve its "
                    "sources or fix the group name"
                )
            elif (prefix == "contract" and contract_fields is not None
                  and name not in contract_fields):
                problems.append(
                    f"unit {u.id}: input contract field {name!r} is not in contract.md's front "
                    f"matter (has: {', '.join(sorted(contract_fields))})"
                )
    g = plan.graph()
    try:
        cycle = nx.find_cycle(g)
        path = " -> ".join([e[0] for e in cycle] + [cycle[-1][1]])
        problems.append(
            f"dependency cycle: {path} — remove one of these dependencies so the plan is a DAG"
        )
    except nx.NetworkXNoCycle:
        pass
    gate_ids: dict[str, int] = {}
    for gate in plan.gates:
        gate_ids[gate.id] = gate_ids.get(gate.id, 0) + 1
        if gate.unit not in ids:
            problems.append(
                f"gate {gate.id}: field unit names unknown unit {gate.unit!r} — point the gate at "
                "an existing unit"
            )
        for extra in gate.also:
            if extra not in ids:
                problems.append(f"gate {gate.id}: field also names unknown unit {extra!r} — "
                                "remove it or add that unit")
        if gate.binds != "contract" and not (
            gate.binds.startswith("artifact:") and gate.binds.split(":", 1)[1] in ids
        ):
            problems.append(
                f"gate {gate.id}: field binds is {gate.binds!r} — use 'contract' or "
                "'artifact:<unit id>'"
            )
    for gid, n in sorted(gate_ids.items()):
        if n > 1:
            problems.append(f"gate {gid}: id is used {n} times — give each gate its own id")
    required = plan.required_units()
    if plan.units and not required:
        problems.append(
            "plan: no unit has required_final = true — mark the final units, otherwise a run "
            "can never be done"
        )
    needed: set[str] = set()
    for r in required & set(g.nodes):
        needed |= nx.ancestors(g, r) | {r}
    producers: dict[str, str] = {}
    for u in plan.units:
        for out in u.outputs:
            producers.setdefault(out, u.id)
    for deliverable in plan.plan.deliverables:
        if deliverable not in producers:
            problems.append(
                f"plan: deliverable {deliverable!r} is produced by no unit — add it to a unit's "
                "outputs"
            )
        elif producers[deliverable] not in needed:
            problems.append(
                f"plan: deliverable {deliverable!r} is produced by {producers[deliverable]}, which "
                "no required final unit depends on — mark it required_final or add a dependency"
            )
    return problems


def check_plan(plan: Plan, **context: Any) -> Plan:
    problems = validate_plan(plan, **context)
    if problems:
        raise PlanValidationError(problems)
    return plan
