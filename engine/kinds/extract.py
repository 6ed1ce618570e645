"""extract: candidate evidence from each of the unit's approved sources (one model call each).

Sources are visited in id order with a safe point before every call, so a cancel, a lost
lease or a budget stop lands between sources. The citation check is a rule: the cited
source must be one of the unit's and the quote must occur in its text verbatim.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    dep_with_param,
    dump_json,
    natural_key,
    notices,
    quote_in_text,
    result,
    structure_problems,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register

OUTPUT = "evidence.json"

SPEC = KindSpec(
    name="extract",
    uses_model=True,
    validators=["structure", "citations"],
    default_outputs=[OUTPUT],
    description="One extract call per approved source of the unit; candidate evidence with "
    "verbatim quotes and figures.",
)


def required_fields(ctx: UnitContext) -> list[str]:
    """The evidence schema's required fields when a schema unit is a dependency."""
    schema_unit = dep_with_param(ctx, UnitKind.intake, "step", "schema")
    if schema_unit is None:
        return list(EVIDENCE_REQUIRED)
    required = ctx.dep_json(schema_unit.id, "evidence-schema.json").get("required")
    return [str(f) for f in required] if isinstance(required, list) else list(EVIDENCE_REQUIRED)


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    sources = sorted(ctx.sources_for_unit(), key=lambda s: natural_key(s.id))
    required = required_fields(ctx)
    evidence: list[Any] = []
    responses: list[dict[str, Any]] = []
    texts: dict[str, str] = {}
    shape: list[str] = [] if sources else ["the unit names no approved sources"]
    for n, source in enumerate(sources, start=1):
        ctx.safe_point(f"extract {source.id} ({n}/{len(sources)})")
        texts[source.id] = ctx.source_text(source.id)
        response = ctx.call_model(
            {"task": "extract", "source_id": source.id, "text": texts[source.id]})
        responses.append(response)
        items = response.get("evidence") if isinstance(response, dict) else None
        if not isinstance(items, list):
            shape.append(f"the response for {source.id} has no evidence list")
            continue
        for item in items:
            if isinstance(item, dict) and "group" not in item:
                item = {**item, "group": source.group}
            evidence.append(item)

    shape += structure_problems(evidence, required, "evidence")
    citations: list[str] = []
    for item in evidence:
        if not isinstance(item, dict):
            continue
        sid = str(item.get("source_id", ""))
        if sid not in texts:
            citations.append(f"{item.get('id')} cites {sid or 'no source'}, not a source of "
                             f"{ctx.unit.id}")
        elif not quote_in_text(str(item.get("quote", "")), texts[sid]):
            citations.append(f"{item.get('id')}: quote not found verbatim in {sid}")

    doc = {"sources": [s.id for s in sources], "evidence": evidence,
           "notice": "; ".join(notices(*responses))}
    ctx.write(OUTPUT, dump_json(doc), media_type=JSON, source_ids=doc["sources"])
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(evidence)} evidence item(s)"),
            result("citations", citations, "every quote found in its cited source"),
        ],
        facts={"evidence_count": len(evidence), "sources": len(sources)},
    )
