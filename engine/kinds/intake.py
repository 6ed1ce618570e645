"""intake: the four bookkeeping steps before any model call (no model).

``params.step`` picks one: inventory (approved ids, groups, sha256 — never text),
contract (the declared contract fields, audience excepted), questions (framed by rule
from the contract and the source groups) and schema (the evidence item schema).

An inventory unit that reads its sources only through ``structure`` edges (``{ ref =
"group:V", edges = ["structure"] }``) is a header-only inventory: it lists each source's
header lines (title, type, date …) and no hash of its bytes — a body edit never reaches it,
so nothing it writes may depend on a body.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.presets import INTAKE_OUTPUTS
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    dep_with_param,
    dump_json,
    natural_key,
    result,
)
from keepstep.engine.kinds.context import (
    KindOutcome,
    KindSpec,
    UnitContext,
    ValidatorResult,
    register,
)
from keepstep.storage.hashing import canonical_json, sha256_hex

STEP_OUTPUTS = INTAKE_OUTPUTS

SPEC = KindSpec(
    name="intake",
    uses_model=False,
    validators=["structure"],
    default_outputs=list(STEP_OUTPUTS.values()),
    description="Inventory and hash sources, parse the contract, frame questions, "
    "publish the evidence schema (params.step picks one; one output each).",
)


def _reads_bodies(ctx: UnitContext, source_id: str, group: str) -> bool:
    refs = [r for r in (f"source:{source_id}", f"group:{group}") if r in ctx.unit.inputs]
    return any(ctx.unit.reads_content(r) for r in refs) if refs else True


def _inventory(ctx: UnitContext) -> tuple[dict[str, Any], list[str]]:
    entries = sorted(ctx.sources_for_unit(), key=lambda s: natural_key(s.id))
    problems = [f"source {s.id} is not in the input snapshot" for s in entries
                if s.id not in ctx.snapshot.sources]
    if not entries:
        problems.append("the unit names no sources: add group:<G> or source:<id> inputs")
    sources: list[dict[str, Any]] = []
    for s in entries:
        row: dict[str, Any] = {"id": s.id, "group": s.group, "title": s.title, "kind": s.kind}
        if _reads_bodies(ctx, s.id, s.group):
            row["sha256"] = ctx.snapshot.sources.get(s.id, "")
        else:
            # Header lines only: what a structure edge carries (a body edit never reaches it).
            row["header"] = ctx.source_header(s.id)
            row["path"] = s.path
        sources.append(row)
    groups: dict[str, list[str]] = defaultdict(list)
    for listed in sources:
        groups[listed["group"]].append(listed["id"])
    return {"count": len(sources), "sources": sources, "groups": dict(groups)}, problems


def _contract(ctx: UnitContext) -> tuple[dict[str, Any], list[str]]:
    # Audience is left out on purpose: only units with a contract:audience input may
    # depend on it, so an audience edit reaches exactly those units.
    declared = sorted(f for f in ctx.unit.input_refs("contract") if f != "audience")
    fields: dict[str, Any] = {}
    problems: list[str] = []
    for name in declared:
        if name == "body":
            fields[name] = ctx.contract.body
        elif name in ctx.contract.fields:
            fields[name] = ctx.contract.fields[name]
        else:
            problems.append(f"contract field {name!r} is declared but missing from contract.md")
    if not declared:
        problems.append("the unit declares no contract:<field> inputs")
    hashes = ctx.contract.field_hashes()
    return {
        "fields": fields,
        "field_hashes": {k: hashes[k] for k in fields if k in hashes},
        # A hash over the declared fields only, so it changes exactly when they do.
        "fields_hash": sha256_hex(canonical_json(fields)),
    }, problems


def _questions(ctx: UnitContext) -> tuple[dict[str, Any], list[str]]:
    inv_unit = dep_with_param(ctx, UnitKind.intake, "step", "inventory")
    con_unit = dep_with_param(ctx, UnitKind.intake, "step", "contract")
    problems = []
    if inv_unit is None or con_unit is None:
        problems.append("questions needs the inventory and contract intake units as dependencies")
        return {"questions": []}, problems
    inventory = ctx.dep_json(inv_unit.id, STEP_OUTPUTS["inventory"])
    fields = ctx.dep_json(con_unit.id, STEP_OUTPUTS["contract"]).get("fields", {})
    goal = str(fields.get("goal", "")).strip().rstrip(".")
    scope = str(fields.get("scope", "")).strip().rstrip(".")
    by_id = {s["id"]: s for s in inventory.get("sources", [])}
    questions = [{
        "id": "Q0",
        "question": f"Goal: {goal}. What does the approved evidence support, and what does it "
                    "leave open?",
        "scope": scope,
        "groups": sorted(inventory.get("groups", {}), key=natural_key),
    }]
    groups = inventory.get("groups", {})
    for group, ids in sorted(groups.items(), key=lambda kv: natural_key(kv[0])):
        kinds = sorted({by_id[i]["kind"] for i in ids if by_id.get(i, {}).get("kind")})
        titles = "; ".join(by_id[i]["title"] for i in ids if by_id.get(i, {}).get("title"))
        questions.append({
            "id": f"Q-{group}",
            "group": group,
            "sources": ids,
            "question": f"Group {group} ({', '.join(kinds) or 'sources'}: {titles}): which "
                        "stated figures bear on the goal"
                        + (", within the scope" if scope else "") + "?",
        })
    if not goal:
        problems.append("the contract dependency carries no goal")
    return {"goal": goal, "scope": scope, "questions": questions}, problems


def _schema(ctx: UnitContext) -> tuple[dict[str, Any], list[str]]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "keepstep evidence item",
        "type": "object",
        "required": list(EVIDENCE_REQUIRED),
        "properties": {
            "id": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9]*-e[0-9]+$",
                   "description": "<source id>-e<n>, n counting from 1 in document order"},
            "source_id": {"type": "string", "description": "an approved source of the unit"},
            "quote": {"type": "string", "minLength": 1,
                      "description": "the statement, verbatim from the source"},
            "figures": {"type": "array", "items": {"type": "string"},
                        "description": "numeric tokens of the quote, in order"},
            "topic": {"type": "string"},
            "group": {"type": "string"},
        },
    }, []


_STEPS = {"inventory": _inventory, "contract": _contract, "questions": _questions,
          "schema": _schema}


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    step = str(ctx.unit.params.get("step", ""))
    if step not in _STEPS:
        return KindOutcome(validators=[ValidatorResult(
            name="structure", passed=False,
            detail=f"params.step is {step!r}; use one of {', '.join(_STEPS)}")])
    doc, problems = _STEPS[step](ctx)
    source_ids = [s["id"] for s in doc.get("sources", [])] if step == "inventory" else None
    ctx.write(STEP_OUTPUTS[step], dump_json(doc), media_type=JSON, source_ids=source_ids)
    facts: dict[str, Any] = {"step": step}
    if step == "inventory":
        facts["sources"] = doc["count"]
    elif step == "questions":
        facts["questions"] = len(doc["questions"])
    return KindOutcome(validators=[result("structure", problems, f"{step} written")], facts=facts)
