"""synthesize and rank: findings over the verified evidence of the unit's dependencies.

The audience reaches a unit only through a ``contract:audience`` input (an audience
edge); without one the unit writes for a general reader, so an audience edit cannot
change its output. ``rank`` is the bounded loop: generate -> check claims -> revise,
at most ``max_rounds`` rounds, each round's calls tagged with its round number.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.kinds.common import (
    JSON,
    MARKDOWN,
    cite,
    dep_units,
    dump_json,
    evidence_index,
    natural_key,
    notices,
    result,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register

GENERAL_AUDIENCE = "general"

SYNTHESIZE = KindSpec(
    name="synthesize",
    uses_model=True,
    validators=["structure", "citations"],
    default_outputs=["synthesis.json", "synthesis.md"],
    description="One synthesize call over the verified evidence of the unit's dependencies; "
    "claims cite evidence ids.",
)
RANK = KindSpec(
    name="rank",
    uses_model=True,
    validators=["structure", "citations", "claim_check"],
    default_outputs=["ranking.json", "ranking.md"],
    description="Bounded loop: rank risks, check their claims, revise with the problems as "
    "feedback; stops when the check is clean or at max_rounds.",
)


def verified_evidence(ctx: UnitContext) -> tuple[list[dict[str, Any]], list[str]]:
    """Union of the verified evidence of the unit's verify dependencies, by id."""
    by_id: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    deps = dep_units(ctx, UnitKind.verify)
    if not deps:
        problems.append("no verification unit among the dependencies")
    for dep in deps:
        items = ctx.dep_json(dep.id, "verified.json").get("evidence")
        if not isinstance(items, list):
            problems.append(f"{dep.id}/verified.json has no evidence list")
            continue
        for item in items:
            if isinstance(item, dict) and item.get("id") is not None:
                by_id.setdefault(str(item["id"]), item)
    evidence = [by_id[k] for k in sorted(by_id, key=natural_key)]
    if not evidence and not problems:
        problems.append("the dependencies hold no verified evidence")
    return evidence, problems


def audience_for(ctx: UnitContext) -> str:
    if "audience" in ctx.unit.input_refs("contract"):
        return ctx.contract.audience
    return GENERAL_AUDIENCE


def question_for(ctx: UnitContext) -> str:
    return str(ctx.unit.params.get("question") or ctx.unit.title)


def _source_ids(ids: list[str], index: dict[str, dict[str, str]]) -> list[str]:
    return sorted({index[i]["source_id"] for i in ids if i in index}, key=natural_key)


# --- synthesize ------------------------------------------------------------------------
@register(SYNTHESIZE)
def run_synthesize(ctx: UnitContext) -> KindOutcome:
    evidence, shape = verified_evidence(ctx)
    index = evidence_index(evidence)
    audience, question = audience_for(ctx), question_for(ctx)
    response: dict[str, Any] = {}
    if evidence:
        ctx.safe_point(f"synthesize over {len(evidence)} statement(s)")
        response = ctx.call_model({"task": "synthesize", "question": question,
                                   "audience": audience, "evidence": evidence})
    raw = response.get("claims") if isinstance(response, dict) else None
    if evidence and not isinstance(raw, list):
        shape.append("the response has no claims list")
    claims: list[dict[str, Any]] = []
    for n, c in enumerate(raw if isinstance(raw, list) else [], start=1):
        c = c if isinstance(c, dict) else {}
        ids = [str(i) for i in c.get("evidence_ids") or []]
        if not str(c.get("text", "")).strip():
            shape.append(f"claim C{n} has no text")
        if not ids:
            shape.append(f"claim C{n} cites no evidence")
        claims.append({"id": f"C{n}", "text": str(c.get("text", "")).strip(),
                       "evidence_ids": ids, "source_ids": _source_ids(ids, index)})
    if evidence and not claims:
        shape.append("no claims were made")
    citations = [f"{c['id']} cites unknown evidence {i}" for c in claims
                 for i in c["evidence_ids"] if i not in index]

    notice = "; ".join(notices(response))
    doc = {"unit": ctx.unit.id, "title": ctx.unit.title, "question": question,
           "audience": audience, "claims": claims, "evidence": index, "notice": notice}
    lines = [f"# {ctx.unit.title}", "", f"Question: {question}", "",
             f"Written for: {audience}", ""]
    lines += [f"{n}. {c['text']} {cite(c['evidence_ids'], index)}"
              for n, c in enumerate(claims, start=1)] or ["No findings: no verified evidence."]
    if notice:
        lines += ["", f"_{notice}_"]
    sources = sorted({s for c in claims for s in c["source_ids"]}, key=natural_key)
    ctx.write("synthesis.json", dump_json(doc), media_type=JSON, source_ids=sources)
    ctx.write("synthesis.md", "\n".join(lines) + "\n", media_type=MARKDOWN, source_ids=sources)
    return KindOutcome(
        validators=[result("structure", shape, f"{len(claims)} claim(s)"),
                    result("citations", citations, "every cited id is in the given evidence")],
        facts={"claims": len(claims), "evidence_count": len(evidence), "audience": audience},
    )


# --- rank ------------------------------------------------------------------------------
def _rule_problems(risks: list[dict[str, Any]]) -> list[str]:
    """What a ranking must satisfy whatever the model says: ids unique, scores 1-25, sorted."""
    problems: list[str] = []
    seen: set[str] = set()
    previous: int | None = None
    for risk in risks:
        rid, score = str(risk.get("id")), risk.get("score")
        if rid in seen:
            problems.append(f"{rid} is listed twice")
        seen.add(rid)
        if not isinstance(score, int) or not 1 <= score <= 25:
            problems.append(f"{rid} score {score!r} is outside 1-25")
            continue
        if previous is not None and score > previous:
            problems.append(f"{rid} scores higher than the risk ranked above it")
        previous = score
    return problems


def _risks_of(response: Any, index: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    raw = response.get("risks") if isinstance(response, dict) else None
    risks = []
    for r in raw if isinstance(raw, list) else []:
        if isinstance(r, dict):
            ids = [str(i) for i in r.get("evidence_ids") or []]
            risks.append({"id": str(r.get("id", "")), "title": str(r.get("title", "")),
                          "score": r.get("score"), "evidence_ids": ids,
                          "source_ids": _source_ids(ids, index)})
    return risks


def _ranking_md(ctx: UnitContext, doc: dict[str, Any], index: dict[str, dict[str, str]]) -> str:
    lines = [f"# {ctx.unit.title}", "", f"Written for: {doc['audience']}", "",
             "| Rank | Risk | Score (likelihood × impact) | Evidence |", "|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['title']} | {r['score']} | {cite(r['evidence_ids'], index)} |"
              for r in doc["risks"]]
    lines += ["", f"Settled after {len(doc['rounds'])} round(s): {doc['stop']}.", ""]
    for rnd in doc["rounds"]:
        found = "; ".join(rnd["problems"]) or "no problems"
        lines.append(f"- Round {rnd['round']}: {len(rnd['risk_ids'])} risk(s); check: {found}"
                     + (f"; revised: {'; '.join(rnd['revisions'])}" if rnd["revisions"] else ""))
    if doc["notice"]:
        lines += ["", f"_{doc['notice']}_"]
    return "\n".join(lines) + "\n"


@register(RANK)
def run_rank(ctx: UnitContext) -> KindOutcome:
    evidence, shape = verified_evidence(ctx)
    index = evidence_index(evidence)
    known = sorted(index, key=natural_key)
    audience, question = audience_for(ctx), question_for(ctx)
    max_rounds = ctx.unit.max_rounds or 1
    risks: list[dict[str, Any]] = []
    problems: list[str] = []
    rounds: list[dict[str, Any]] = []
    responses: list[Any] = []
    stop = "no verified evidence"
    for rnd in range(1, max_rounds + 1) if evidence else ():
        ctx.safe_point(f"rank round {rnd}/{max_rounds}")
        ranked = ctx.call_model({"task": "rank", "question": question, "audience": audience,
                                 "evidence": evidence, "round": rnd, "feedback": problems},
                                round=rnd)
        risks = _risks_of(ranked, index)
        ctx.safe_point(f"check round {rnd}/{max_rounds}")
        checked = ctx.call_model({"task": "check", "evidence_ids_known": known, "claims": [
            {"id": r["id"], "evidence_ids": r["evidence_ids"]} for r in risks]}, round=rnd)
        responses += [ranked, checked]
        found = checked.get("problems") if isinstance(checked, dict) else None
        problems = [str(p) for p in found] if isinstance(found, list) else [
            "the check response has no problems list"]
        problems += _rule_problems(risks)
        revisions = ranked.get("revisions") if isinstance(ranked, dict) else None
        rounds.append({"round": rnd, "risk_ids": [r["id"] for r in risks], "problems": problems,
                       "revisions": [str(x) for x in revisions or []]})
        if not problems:
            stop = "checks passed"
            break
        stop = "max_rounds reached"

    if evidence and not risks:
        shape.append("the ranking has no risks")
    for r in risks:
        if not r["id"] or not r["title"]:
            shape.append(f"a risk lacks an id or title: {r}")
    citations = [f"{r['id']} cites unknown evidence {i}" for r in risks
                 for i in r["evidence_ids"] if i not in index]
    doc = {"unit": ctx.unit.id, "title": ctx.unit.title, "question": question,
           "audience": audience, "risks": risks, "rounds": rounds, "stop": stop,
           "evidence": index, "notice": "; ".join(notices(*responses))}
    sources = sorted({s for r in risks for s in r["source_ids"]}, key=natural_key)
    ctx.write("ranking.json", dump_json(doc), media_type=JSON, source_ids=sources)
    ctx.write("ranking.md", _ranking_md(ctx, doc, index), media_type=MARKDOWN, source_ids=sources)
    claim_problems = problems if evidence else ["nothing was ranked"]
    if stop == "max_rounds reached":
        claim_problems = [f"still failing after max_rounds = {max_rounds}"] + problems
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(risks)} risk(s)"),
            result("citations", citations, "every cited id is in the given evidence"),
            result("claim_check", claim_problems, f"checks passed in round {len(rounds)}"),
        ],
        facts={"rounds": len(rounds), "stop": stop, "risks": len(risks)},
        rounds=max(1, len(rounds)),
    )
