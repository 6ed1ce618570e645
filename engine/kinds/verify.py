"""verify: rule checks, then one model claim check over the extraction units it depends on.

Rules first (cheap, certain): the evidence must cite a source its extraction unit was
given, and the quote must occur in that source. Only the survivors go to the model, in
one call, each with its source text as the passage. The passage is never written out:
``verified.json`` keeps the quote and nothing more of the source.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    dep_units,
    dump_json,
    natural_key,
    notices,
    quote_in_text,
    result,
    structure_problems,
    unit_source_ids,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register

OUTPUT = "verified.json"
DEFAULT_MIN_SUPPORTED = 0.5
_KEPT_FIELDS = ("id", "source_id", "group", "topic", "quote", "figures")

SPEC = KindSpec(
    name="verify",
    uses_model=True,
    validators=["structure", "citations", "claim_check"],
    default_outputs=[OUTPUT],
    description="Rule checks (approved source, verbatim quote) then one model claim check "
    "over the evidence of the extraction units it depends on.",
)


def _gather(ctx: UnitContext) -> tuple[list[tuple[dict[str, Any], set[str]]], list[str]]:
    """(evidence item, sources it may cite) from every extraction dependency, first id wins."""
    own = {s.id for s in ctx.sources_for_unit()}
    gathered: list[tuple[dict[str, Any], set[str]]] = []
    seen: set[str] = set()
    problems: list[str] = []
    deps = dep_units(ctx, UnitKind.extract)
    if not deps:
        problems.append("no extraction unit among the dependencies")
    for dep in deps:
        allowed = unit_source_ids(dep, ctx.snapshot.groups)
        # A verify unit that declares its sources may only check those; one that declares
        # none trusts its dependencies' approved inputs.
        allowed = allowed & own if own else allowed
        items = ctx.dep_json(dep.id, "evidence.json").get("evidence")
        if not isinstance(items, list):
            problems.append(f"{dep.id}/evidence.json has no evidence list")
            continue
        for item in items:
            key = str(item.get("id")) if isinstance(item, dict) else ""
            if key and key in seen:
                continue
            seen.add(key)
            gathered.append((item, allowed))
    return gathered, problems


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    gathered, shape = _gather(ctx)
    texts: dict[str, str] = {}
    candidates: list[dict[str, Any]] = []
    rejected: list[dict[str, str]] = []

    def reject(item: Any, stage: str, reason: str) -> None:
        item = item if isinstance(item, dict) else {}
        rejected.append({"id": str(item.get("id", "?")),
                         "source_id": str(item.get("source_id", "")),
                         "stage": stage, "reason": reason})

    for item, allowed in gathered:
        if structure_problems([item], EVIDENCE_REQUIRED, "evidence"):
            reject(item, "rule", "malformed evidence item")
            continue
        sid = str(item["source_id"])
        if sid not in allowed:
            reject(item, "rule", f"cites {sid}, not a source its extraction unit was given")
            continue
        if sid not in texts:
            texts[sid] = ctx.source_text(sid)
        if not quote_in_text(str(item["quote"]), texts[sid]):
            reject(item, "rule", f"quote not found verbatim in {sid}")
            continue
        candidates.append({k: item[k] for k in _KEPT_FIELDS if k in item})
    candidates.sort(key=lambda e: natural_key(str(e["id"])))

    verdicts: dict[str, dict[str, Any]] = {}
    responses: list[dict[str, Any]] = []
    if candidates:
        ctx.safe_point(f"claim check of {len(candidates)} statement(s)")
        response = ctx.call_model({"task": "verify", "claims": [
            {"id": e["id"], "quote": e["quote"], "passage": texts[e["source_id"]]}
            for e in candidates]})
        responses.append(response)
        results = response.get("results") if isinstance(response, dict) else None
        if not isinstance(results, list):
            shape.append("the claim check response has no results list")
            results = []
        verdicts = {str(r.get("id")): r for r in results if isinstance(r, dict)}

    supported: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for e in candidates:
        verdict = verdicts.get(str(e["id"]))
        if verdict is None:
            unanswered.append(f"no verdict for {e['id']}")
            reject(e, "model", "no verdict returned")
        elif verdict.get("supported") is True:
            supported.append(e)
        else:
            reject(e, "model", str(verdict.get("reason") or "not supported"))
    rejected.sort(key=lambda r: natural_key(r["id"]))

    checked = len(gathered)
    fraction = round(len(supported) / checked, 3) if checked else 0.0
    minimum = float(ctx.unit.params.get("min_supported", DEFAULT_MIN_SUPPORTED))
    claim_problems = list(unanswered)
    if fraction < minimum:
        claim_problems.append(f"only {fraction:.0%} of {checked} statement(s) supported "
                              f"(minimum {minimum:.0%})")
    shape += structure_problems(supported, EVIDENCE_REQUIRED, "verified evidence")
    own = {s.id for s in ctx.sources_for_unit()} or set(texts)
    citations = [f"{e['id']} cites {e['source_id']}, not a source of {ctx.unit.id}"
                 for e in supported if e["source_id"] not in own]

    source_ids = sorted({e["source_id"] for e in supported}, key=natural_key)
    doc = {
        "from_units": [d.id for d in dep_units(ctx, UnitKind.extract)],
        "checked": checked,
        "evidence": supported,
        "rejected": rejected,
        "notice": "; ".join(notices(*responses)),
    }
    ctx.write(OUTPUT, dump_json(doc), media_type=JSON, source_ids=source_ids)
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(supported)} verified, {len(rejected)} rejected"),
            result("citations", citations, "every verified item cites a source of the unit"),
            result("claim_check", claim_problems, f"{fraction:.0%} of {checked} supported"),
        ],
        facts={"checked": checked, "supported": len(supported), "rejected": len(rejected),
               "supported_fraction": fraction},
    )
