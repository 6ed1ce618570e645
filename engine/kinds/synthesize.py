"""synthesize, rank and model: model steps over the verified evidence of the dependencies.

``synthesize`` is the model step with answer ``claims`` (prompt ``synthesize``), ``rank`` the
bounded loop with answer ``risks`` (prompts ``rank`` and ``check``), and ``model`` the general
step: any prompt template (``params.prompt``, e.g. the pack's ``prompts/<name>.md``) with one
of those two answer schemas and its rules. Verified evidence comes from every dependency
that writes verified evidence (``verified.json``), whatever its kind.

The audience reaches a unit only through a ``contract:audience`` input (an audience
edge); without one the unit writes for a general reader, so an audience edit cannot
change its output. The pack's vocabulary goes into the INPUT block: the topics and the
audience's reading order and headings (``data/topics.toml``, ``data/audiences.toml``) for
claims, the risk checklist (``data/risks.toml``, each impact weighed for the audience) for
risks. The loop is generate -> check claims -> revise, at most ``max_rounds`` rounds, each
round's calls tagged with its round number; the check sees each risk with the quotes it
cites, so a model can judge more than the rules can. A loop still failing at its last
round fails the unit, unless ``on_last_round = "unconverged"``: then its last answer goes
forward flagged (``converged: false`` and the open problems in ranking.json), so a later
unit can record the risk.

Every claim must cite evidence ids of the given evidence, and every figure a claim states
must appear in the evidence it cites or come from a checked calculation (``kinds.claims``):
what a model writes stays grounded, and the rules say exactly which claim broke which rule
when it does not. A claims answer that passes the rules is then checked against its quotes
(the support check) and revised where they do not support it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from keepstep.engine.gateway.answers import Problem, json_schema_of, problem
from keepstep.engine.kinds.citable import citable_conflicts, conflict_evidence, expand
from keepstep.engine.kinds.claims import (
    SupportAnswer,
    calculation_problems,
    claim_rules,
    figure_problems,
    support_inputs,
    support_problems,
)
from keepstep.engine.kinds.common import (
    JSON,
    MARKDOWN,
    cite,
    dump_json,
    evidence_index,
    natural_key,
    notices,
    reading_hints,
    result,
    risk_checklist,
    shown_calculation,
    verified_deps,
    writer_evidence,
)
from keepstep.engine.kinds.conflicts import run_id
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.extract import REGISTER
from keepstep.engine.kinds.model_step import StepResult, known_ids, run_model_step
from keepstep.engine.kinds.stale import label_for, stale_labels, stated_before

GENERAL_AUDIENCE = "general"


# How a derived figure's arithmetic is written (the Claim schema of synthesize and render;
# kinds.claims checks exactly this).
CALCULATION_RULE = (
    "for a derived figure (a price, margin, break-even): the arithmetic, e.g. "
    "\"1200 * (1 - 15%) = 1020\". Operands are figures stated in the cited quotes or records, "
    "as written there with their scale (\"18 million\" is 18 or 18000000), or 1, 100, 1000, "
    "7, 12, 24, 52, 60, 365 to convert periods; an intermediate result is never an operand: "
    "write each step over quoted figures and separate the steps with ';' (\"2600 * 140 = "
    "364000; 2600 * (140 - 120) = 52000\"). Every result after '=' is a figure the text "
    "states. Code recomputes every step")


class Claim(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str = Field(description="one or two sentences")
    evidence_ids: list[str] = Field(description="the ids from INPUT it rests on: evidence "
                                    "ids (the quote that holds each figure it states) and, "
                                    "where INPUT gives \"conflicts\", the id (K1, ...) of "
                                    "each disagreement whose record it restates (which value "
                                    "holds, and why)")
    calculation: str | None = Field(default=None, description=CALCULATION_RULE)
    confidence: Literal["high", "medium", "low"] | None = Field(
        default=None, description="how firmly the cited evidence carries the claim")
    confidence_reason: str | None = Field(
        default=None, description="for medium or low confidence: why, in a few words from "
        "the evidence (a document shows the confidence only with its reason)")


class SynthesisAnswer(BaseModel):
    """The synthesize step's answer: findings, each citing evidence ids."""

    model_config = ConfigDict(extra="allow")

    claims: list[Claim]
    summary: str = ""
    gaps: list[str] = Field(default_factory=list, description="what the question needs and "
                            "the evidence does not answer, one short sentence each")


class Risk(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(description="R1, R2, ... from the top")
    title: str = Field(description="what is ranked: the risk, option, vendor or price point")
    score: int = Field(description="risks: likelihood (1-5) x impact (1-5); other rankings: "
                       "1-25 on the question's criteria, higher is better")
    evidence_ids: list[str]
    criteria: dict[str, str] = Field(default_factory=dict, description="the value of each "
                                     "criterion INPUT names (its columns), as stated or "
                                     "derived from the cited quotes")
    likelihood: int | None = Field(default=None, description="risks: 1-5")
    impact: int | None = Field(default=None, description="risks: 1-5")
    rationale: str = Field(default="", description="why it ranks here, from the quotes")
    owner: str = Field(default="", description="who should own it, when INPUT asks")
    mitigation: str = Field(default="", description="what reduces it, when INPUT asks")
    calculation: str | None = Field(default=None, description=CALCULATION_RULE)


# The integer scale of an option's points on one criterion; code adds them into its score.
POINTS = (1, 5)


class RankedOption(BaseModel):
    """One ranked option (vendor, price point, course of action ...): its value and points on
    each criterion; code computes its score from the points (never the model)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="R1, R2, ... from the top")
    title: str = Field(description="the item ranked")
    criteria: dict[str, str] = Field(default_factory=dict, description="the item's value on "
                                     "each criterion INPUT names, as the cited quotes state it "
                                     "(\"not stated\" when they say nothing on it)")
    points: dict[str, int] = Field(default_factory=dict, description=(
        f"per criterion, an integer resting on the value given: {POINTS[1]} = the best value "
        f"among the items ranked, {POINTS[0]} = the worst; a value \"not stated\" gets no more "
        "than the lowest a stated value gets (an unknown is never scored as good); equal "
        "values, or items resting on the same quoted values, get equal points"))
    rationale: str = Field(default="", description="why each criterion gets its points, from "
                           "the quotes")
    evidence_ids: list[str]
    calculation: str | None = Field(default=None, description=CALCULATION_RULE)
    # A total stated by an answer recorded before options had points (not asked any more).
    score: int | None = None


class OptionsAnswer(BaseModel):
    """The rank step's answer for a ranking of anything but risks: the ranked items from the
    highest score down. An answer of the earlier shape (its items under "risks", a stated
    score, no points) parses too, marked ``legacy``: recorded runs replay."""

    model_config = ConfigDict(extra="allow")

    items: list[RankedOption]
    round: int | None = None
    revisions: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _earlier_shape(cls, data: Any) -> Any:
        if isinstance(data, dict) and "items" not in data and isinstance(data.get("risks"),
                                                                          list):
            return {**{k: v for k, v in data.items() if k != "risks"},
                    "items": data["risks"], "legacy": True}
        return data


class RankAnswer(BaseModel):
    """The rank step's answer: what the unit ranks (risks, options, vendors, ...) from the
    highest score down."""

    model_config = ConfigDict(extra="allow")

    risks: list[Risk]
    round: int | None = None
    revisions: list[str] = Field(default_factory=list)


class CheckAnswer(BaseModel):
    """The claim check's answer: the problems found (empty: none)."""

    model_config = ConfigDict(extra="allow")

    problems: list[str]


# Tokens of one support verdict: its keys and punctuation, the claim's id and the verdict
# (~25), and a reason of one full sentence (~55; the model remarks of the recorded run said
# 50 a claim was too tight: reasons shrank to a few words), and the answer's frame. It sizes
# the request's max_tokens as other requests are sized (gateway.profile.max_tokens_for).
SUPPORT_ANSWER_TOKENS, SUPPORT_FRAME_TOKENS = 80, 20


def support_answer_tokens(claims: int) -> int:
    """Tokens a support check's answer over ``claims`` claims is expected to take."""
    return SUPPORT_FRAME_TOKENS + SUPPORT_ANSWER_TOKENS * claims


def support_judge(ctx: UnitContext, field_name: str, quotes: Mapping[str, str],
                  record: dict[str, Any], headers: Mapping[str, str] | None = None) -> Any:
    """The support check of a claims answer (see ``kinds.claims``): its verdicts go into
    ``record`` (claim -> verdict), its calls into ``record["steps"]``."""

    def judge(answer: Any) -> list[Problem]:
        claims = getattr(answer, field_name)
        # Asked of every model, the offline heuristic too (one code path: it answers the same
        # request by its own rule, and what it finds is revised like a model's verdict).
        if not claims:
            return []
        ctx.safe_point(f"check {len(claims)} claim(s) against their quotes")
        step = run_model_step(ctx, prompt="support", schema=SupportAnswer,
                              inputs=support_inputs(field_name, claims, quotes, headers),
                              label="support check",
                              answer_tokens=support_answer_tokens(len(claims)))
        record.setdefault("steps", []).append(step)
        if not step.ok:
            record["verdicts"] = {}
            return []
        record["verdicts"] = {v.claim: v.verdict for v in step.value.verdicts}
        return support_problems(field_name, claims, step.value)

    return judge


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
MODEL = KindSpec(
    name="model",
    uses_model=True,
    validators=["structure", "citations"],
    default_outputs=["synthesis.json", "synthesis.md"],
    description="A general model step: any prompt template (params.prompt) answering claims "
    "(synthesis.json/.md) or risks (ranking.json/.md, a bounded loop with max_rounds).",
)


def verified_evidence(ctx: UnitContext) -> tuple[list[dict[str, Any]], list[str]]:
    """Union of the verified evidence of the unit's verification dependencies, by id."""
    by_id: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    deps = verified_deps(ctx)
    if not deps:
        problems.append("no verification unit among the dependencies")
    for dep, name in deps:
        items = ctx.dep_json(dep.id, name).get("evidence")
        if not isinstance(items, list):
            problems.append(f"{dep.id}/{name} has no evidence list")
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


def decision_for(ctx: UnitContext) -> dict[str, str]:
    """INPUT's ``decision`` (the contract's goal) when the unit declares ``contract:goal``:
    only a declared input reaches a request, so an edit of the goal reaches exactly the
    units that were told it."""
    if "goal" in ctx.unit.input_refs("contract"):
        goal = str(ctx.contract.fields.get("goal") or "").strip()
        if goal:
            return {"decision": goal}
    return {}


META_FIELDS = ("title", "kind", "date", "publisher")


def recorded_source_meta(ctx: UnitContext) -> dict[str, Any]:
    """source id -> its metadata as the verify dependencies recorded it (``source_meta``)."""
    meta: dict[str, Any] = {}
    for dep, name in verified_deps(ctx):
        given = ctx.dep_json(dep.id, name).get("source_meta")
        if isinstance(given, dict):
            meta.update(given)
    return meta


def cited_source_meta(ctx: UnitContext, sources: Any) -> dict[str, Any]:
    """``source_meta`` and ``source_meta_from`` of the sources a synthesis or ranking cites,
    as its verify dependencies recorded them: a document drawn from it lists its sources'
    title, kind, date and publisher and where each came from (the ``sources`` part) without
    depending on the verify units itself. Empty when none were recorded."""
    wanted = {str(sid) for sid in sources}
    meta: dict[str, Any] = {}
    origins: dict[str, Any] = {}
    for dep, name in verified_deps(ctx):
        doc = ctx.dep_json(dep.id, name)
        for key, into in (("source_meta", meta), ("source_meta_from", origins)):
            given = doc.get(key)
            for sid, info in (given.items() if isinstance(given, dict) else []):
                if str(sid) in wanted and isinstance(info, dict):
                    into.setdefault(str(sid), info)
    out: dict[str, Any] = {}
    if meta:
        out["source_meta"] = dict(sorted(meta.items(), key=lambda kv: natural_key(kv[0])))
    if origins:
        out["source_meta_from"] = dict(sorted(origins.items(),
                                              key=lambda kv: natural_key(kv[0])))
    return out


def sources_for(ctx: UnitContext, evidence: list[dict[str, Any]]) -> dict[str, Any]:
    """INPUT's ``sources``: each source the evidence comes from with its title, kind, date
    and publisher as the verify dependencies recorded them (the register's, else the
    document's own header), so a writer can say how old or whose a statement is without
    inferring it; empty fields are left out, and nothing when no source has any."""
    meta = recorded_source_meta(ctx)
    wanted = {str(e.get("source_id", "")) for e in evidence}
    out: dict[str, dict[str, Any]] = {
        sid: {k: str(m[k]) for k in META_FIELDS if isinstance(m, dict) and m.get(k)}
        for sid, m in sorted(meta.items(), key=lambda kv: natural_key(kv[0]))
        if sid in wanted}
    out = {sid: m for sid, m in out.items() if m}
    for sid, fields in register_only(ctx, out, recorded_origins(ctx)).items():
        out[sid]["from_register"] = fields
    return {"sources": out} if out else {}


# The fields a sentence may rest on that only the source register may give (a source's
# title names it, whichever file gives it).
REGISTER_FIELDS = ("date", "publisher")


def recorded_origins(ctx: UnitContext) -> dict[str, Any]:
    """source id -> where each metadata field came from, as the verify dependencies recorded
    it (``source_meta_from``)."""
    origins: dict[str, Any] = {}
    for dep, name in verified_deps(ctx):
        given = ctx.dep_json(dep.id, name).get("source_meta_from")
        for sid, info in (given.items() if isinstance(given, dict) else []):
            if isinstance(info, dict):
                origins.setdefault(str(sid), info)
    return origins


def register_only(ctx: UnitContext, meta: Mapping[str, Mapping[str, Any]],
                  origins: Mapping[str, Any]) -> dict[str, list[str]]:
    """source id -> its date and publisher fields that come from the project's source register
    (``sources.toml``, by ``origins``: where each field came from) and that the document's
    own header lines do not state: a writer says so when a
    sentence rests on one ("dated 1 February 2025 in the source register") instead of
    writing it as the document's. Sources with none are left out."""
    out: dict[str, list[str]] = {}
    for sid, fields in meta.items():
        registered = [f for f in REGISTER_FIELDS if fields.get(f)
                      and (origins.get(sid) or {}).get(f) == REGISTER]
        if not registered:
            continue
        try:
            header = {k.lower(): str(v).strip() for k, v in ctx.source_header(sid).items()}
        except Exception:  # noqa: BLE001 - an unreadable header states nothing
            header = {}
        shown = set(header.values())
        registered = [f for f in registered if str(fields[f]).strip() not in shown]
        if registered:
            out[sid] = registered
    return out


def _source_ids(ids: list[str], index: dict[str, dict[str, str]]) -> list[str]:
    return sorted({index[i]["source_id"] for i in ids if i in index}, key=natural_key)


def _prompt(ctx: UnitContext, default: str, key: str = "prompt") -> str:
    return str(ctx.unit.params.get(key) or default)


# --- synthesize ------------------------------------------------------------------------
def conflicts_of(ctx: UnitContext, quotes: Mapping[str, str]) -> list[dict[str, Any]]:
    """The disagreements the verify dependencies recorded that touch the evidence of
    ``quotes``, as a prompt carries them: each side's value, evidence and quote, the class
    and the value that holds."""
    evidence_ids = set(quotes)
    out = []
    taken: set[str] = set()
    seen: set[frozenset[str]] = set()
    for dep, name in verified_deps(ctx):
        for c in ctx.dep_json(dep.id, name).get("conflicts") or []:
            if not isinstance(c, dict):
                continue
            sides = [s for s in c.get("sides") or [] if isinstance(s, dict)]
            ids = {str(s.get("evidence_id")) for s in sides} or {str(i) for i in c.get("ids", [])}
            if not ids & evidence_ids or frozenset(ids) in seen:
                continue
            seen.add(frozenset(ids))
            # Ids unique across the verify units (each numbers its own K1, K2 ...).
            cid = run_id(str(c.get("id") or ""), str(c.get("verify_unit") or dep.id), taken) \
                if c.get("id") else None
            out.append({k: v for k, v in {
                "id": cid, "metric": c.get("metric"), "entity": c.get("entity"),
                "period": c.get("period"),
                "class": c.get("class") or c.get("status"), "holds": c.get("holds"),
                "holds_ids": c.get("holds_ids"), "reason": c.get("reason"),
                "applies": c.get("applies"),
                "about": "advice" if c.get("about") == "advice" else None,
                "sides": [{**{k: s[k] for k in ("evidence_id", "value", "source_id", "quote",
                                                "locator", "source_title", "source_date")
                              if s.get(k) not in (None, "")},
                           **({} if s.get("quote") or str(s.get("evidence_id")) not in quotes
                              else {"quote": quotes[str(s.get("evidence_id"))]})}
                          for s in sides]}.items()
                if v not in (None, "", [])})
    return out


def source_titles(ctx: UnitContext, evidence: list[dict[str, Any]],
                  ids: set[str]) -> dict[str, str]:
    """The title of each source ``ids`` come from, so a document can name it: the verify
    dependencies' source metadata (``source_meta``), else the evidence's own, else the
    source's header lines."""
    meta = recorded_source_meta(ctx)
    out: dict[str, str] = {}
    for e in evidence:
        sid = str(e.get("source_id", ""))
        if str(e.get("id")) not in ids or not sid or sid in out:
            continue
        title = str((meta.get(sid) or {}).get("title") or e.get("source_title") or "")
        if not title:
            try:
                title = str(ctx.source_header(sid).get("title") or "")
            except Exception:  # noqa: BLE001 - a title is a courtesy; the id still cites it
                title = ""
        if title:
            out[sid] = title
    return dict(sorted(out.items()))


def models_of(*steps: StepResult | None) -> list[str]:
    return sorted({m for s in steps if s is not None for m in s.models})


@register(SYNTHESIZE)
def run_synthesize(ctx: UnitContext) -> KindOutcome:
    evidence, shape = verified_evidence(ctx)
    index = evidence_index(evidence)
    audience, question = audience_for(ctx), question_for(ctx)
    response: dict[str, Any] = {}
    step: StepResult | None = None
    support: dict[str, Any] = {}
    quotes = {str(e["id"]): str(e.get("quote", "")) for e in evidence}
    conflicts = conflicts_of(ctx, quotes)
    # A disagreement is citable beside the evidence (its id, sides, class, the value used and
    # why, the sources' dates): a claim that says which value holds rests on it.
    records = conflict_evidence(conflicts)
    citable = {**quotes, **citable_conflicts(conflicts)}
    # A figure its source gave before the figure's period ended (kinds.stale): the request
    # says so beside the item, and a finding stating it without saying so is labelled.
    stale = stale_labels(evidence, recorded_source_meta(ctx), recorded_origins(ctx))
    if evidence:
        ctx.safe_point(f"synthesize over {len(evidence)} statement(s)")
        step = run_model_step(ctx, prompt=_prompt(ctx, "synthesize"), inputs={
            "task": "synthesize", "question": question, "audience": audience,
            **decision_for(ctx), **sources_for(ctx, evidence),
            "evidence": writer_evidence(evidence),
            **({"stated_before_period_end": stated_before(stale)}
               if stale else {}),
            **({"conflicts": conflicts} if conflicts else {}),
            **reading_hints(ctx, audience)}, schema=SynthesisAnswer,
            rules=claim_rules("claims", citable),
            judge=support_judge(ctx, "claims", citable, support, {
                str(e["id"]): str(e["table_header"]) for e in evidence
                if e.get("table_header")}))
        response = step.parsed
        shape += [p.line() for p in step.problems if p.rule != "known_id"]
    raw = response.get("claims") if isinstance(response, dict) else None
    if evidence and not isinstance(raw, list):
        shape.append("the response has no claims list")
    verdicts = support.get("verdicts", {})
    claims: list[dict[str, Any]] = []
    for n, c in enumerate(raw if isinstance(raw, list) else [], start=1):
        c = c if isinstance(c, dict) else {}
        ids, conflict_ids = expand([str(i) for i in c.get("evidence_ids") or []], records)
        if not str(c.get("text", "")).strip():
            shape.append(f"claim C{n} has no text")
        if not ids:
            shape.append(f"claim C{n} cites no evidence")
        claim = {"id": f"C{n}", "text": str(c.get("text", "")).strip(),
                 "evidence_ids": ids, "source_ids": _source_ids(ids, index)}
        for key in ("calculation", "confidence", "confidence_reason"):
            if c.get(key):
                claim[key] = str(c[key])
        if conflict_ids:
            claim["conflict_ids"] = conflict_ids
        label = label_for(str(c.get("text", "")).strip(), ids, stale)
        if label:
            claim["stated_before"] = label.strip()[1:-1]
        if f"claims[{n - 1}]" in verdicts:
            claim["support"] = verdicts[f"claims[{n - 1}]"]
        claims.append(claim)
    if evidence and not claims:
        shape.append("no claims were made")
    citations = [f"{c['id']} cites unknown evidence {i}" for c in claims
                 for i in c["evidence_ids"] if i not in index]
    gaps = [str(g) for g in (response.get("gaps") or []) if str(g).strip()] \
        if isinstance(response, dict) and isinstance(response.get("gaps"), list) else []
    checks: list[StepResult] = support.get("steps", [])
    models = models_of(step, *checks)
    notice = "; ".join(notices(response))
    cited = {i for c in claims for i in c["evidence_ids"]}
    doc: dict[str, Any] = {"unit": ctx.unit.id, "title": ctx.unit.title, "question": question,
           "audience": audience, "claims": claims, "evidence": index, "notice": notice,
           "quotes": {i: quotes[i] for i in sorted(cited, key=natural_key) if i in quotes},
           "gaps": gaps, "conflicts": conflicts, "models": models,
           "sources": source_titles(ctx, evidence, cited)}
    marked = {i: {"label": label, "figures": figures} for i, (label, figures) in stale.items()
              if i in cited}
    if marked:  # a document reading this synthesis marks them too (kinds.stale)
        doc["stated_before_period_end"] = marked
    doc.update(cited_source_meta(ctx, doc["sources"]))
    lines = [f"# {ctx.unit.title}", "", f"Question: {question}", "",
             f"Written for: {audience}", ""]
    lines += [f"{n}. {c['text']}" + (f" ({c['stated_before']})" if c.get("stated_before")
                                      else "") + f" {cite(c['evidence_ids'], index)}"
              for n, c in enumerate(claims, start=1)] or ["No findings: no verified evidence."]
    if gaps:
        lines += ["", "Not answered by the sources:", *[f"- {g}" for g in gaps]]
    if notice:
        lines += ["", f"_{notice}_"]
    sources = sorted({s for c in claims for s in c["source_ids"]}, key=natural_key)
    ctx.write("synthesis.json", dump_json(doc), media_type=JSON, source_ids=sources)
    ctx.write("synthesis.md", "\n".join(lines) + "\n", media_type=MARKDOWN, source_ids=sources)
    return KindOutcome(
        validators=[result("structure", shape, f"{len(claims)} claim(s)"),
                    result("citations", citations, "every cited id is in the given evidence")],
        facts={"claims": len(claims), "evidence_count": len(evidence), "audience": audience},
        problems=[p.model_dump() for p in (step.problems if step else [])],
        answers=list(step.answers if step else []) + [a for s in checks for a in s.answers],
    )


# --- rank ------------------------------------------------------------------------------
def item_figure_problems(at: str, fields: Mapping[str, str], ids: list[str],
                         quotes: Mapping[str, str], calculation: str | None) -> list[Problem]:
    """Every figure of a ranked item's fields (title, criterion values, rationale) in a quote
    the item cites, or given by its checked ``calculation`` (one for the whole item: its
    results may stand in any field), or the difference of a range of cited figures written in
    the same field (``kinds.claims``); a problem names each other figure and its field."""
    out: list[Problem] = []
    derived: set[str] = set()
    if calculation:
        whole = " | ".join(fields.values())
        out, derived = calculation_problems(at, whole, calculation, ids, quotes)
        if out:
            derived = set()
    for name, text in fields.items():
        out += [p for p in figure_problems(at, text, ids, quotes, ranges=True, field=name)
                if p.value not in derived]
    return out


def _common_rules(at: str, item: Any, seen: set[str], known: set[str],
                  quotes: Mapping[str, str], asks: Mapping[str, Any]) -> list[Problem]:
    """What every ranked item must satisfy: a value for every criterion and every field the
    unit asks for, a unique id, known cited ids, and every figure grounded."""
    problems = [problem(f"{at}.criteria", "criterion", "gives no value for the criterion "
                        "(write \"not stated\" when no quote gives one)", c)
                for c in asks.get("criteria", []) if not str(item.criteria.get(c, "")).strip()]
    problems += [problem(f"{at}.{f}", "asked", "the unit asks for it")
                 for f in asks.get("ask", []) if getattr(item, f, None) in (None, "")]
    if item.id in seen:
        problems.append(problem(f"{at}.id", "unique", "is listed twice", item.id))
    seen.add(item.id)
    problems += known_ids(f"{at}.evidence_ids", item.evidence_ids, known)
    fields = {"title": item.title, **{f"criteria.{c}": str(v) for c, v in item.criteria.items()},
              "rationale": item.rationale}
    return problems + item_figure_problems(at, fields, item.evidence_ids, quotes,
                                           item.calculation)


def weights_of(asks: Mapping[str, Any]) -> dict[str, int]:
    """Each criterion's weight in an option's score: the unit's ``weights`` (criterion ->
    integer), 1 for a criterion it does not weigh."""
    declared = asks.get("weights") or {}
    return {str(c): int(declared.get(c, 1)) for c in asks.get("criteria") or []}


def points_score(points: Mapping[str, Any], asks: Mapping[str, Any]) -> int | None:
    """An option's score from its points: the sum over the criteria of weight × points; None
    when a criterion has no points on the scale."""
    weights = weights_of(asks)
    if not weights or not all(_on_scale(points.get(c)) for c in weights):
        return None
    return sum(w * int(points[c]) for c, w in weights.items())


def _on_scale(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and \
        POINTS[0] <= value <= POINTS[1]


# A criterion value that says the evidence gives none ("not stated", "Not stated: the 2026
# price list is not in the evidence"): points rest on the value shown, so it gets the lowest.
_NOT_STATED_RE = re.compile(r"\s*[(\[\"'“]*\s*(not stated|unknown|not given|not known)\b",
                            re.IGNORECASE)


def not_stated(value: str) -> bool:
    """Whether a criterion value says (or starts by saying) that the evidence gives none."""
    return bool(_NOT_STATED_RE.match(value))


def unknown_floors(items: list[RankedOption]) -> dict[str, int]:
    """Per criterion, the most points a value that is "not stated" may get: the lowest points
    a stated value gets on it among ``items`` (the lowest of the scale when none states one)."""
    floors: dict[str, int] = {}
    for item in items:
        for c, value in item.criteria.items():
            if not not_stated(str(value)) and _on_scale(item.points.get(c)):
                floors[c] = min(floors.get(c, POINTS[1]), int(item.points[c]))
    return floors


def unknown_scored(at: str, item: RankedOption,
                   floors: Mapping[str, int] | None = None) -> list[Problem]:
    """A criterion whose value is "not stated" (or starts so) given more points than the
    lowest a stated value gets on it (``unknown_floors``; the lowest of the scale when no
    item states one): points rest on the value shown, and an unknown is never scored above a
    known value. The feedback names the item and the criterion."""
    floors = floors or {}
    out = []
    for c, value in item.criteria.items():
        most = floors.get(c, POINTS[0])
        lowest = "a stated value gets on it" if c in floors else "of the scale"
        if not_stated(str(value)) and _on_scale(item.points.get(c)) \
                and int(item.points[c]) > most:
            out.append(problem(
                f"{at}.points", "unknown_scored",
                f"{item.title or item.id}: its value on \"{c}\" is \"{value.strip()}\", "
                f"yet it gets {item.points[c]} points: a value the cited evidence does not "
                f"state gets {most} here at most, the lowest {lowest} (an unknown is never "
                "scored above a known value); lower its points, or state the value the cited "
                "quotes give", c))
    return out


def _options_rules(known: set[str], quotes: Mapping[str, str],
                   asks: Mapping[str, Any]) -> Any:
    """What a ranking of options must satisfy: the common rules, points on the scale for
    every criterion (code computes the score from them), and the items listed from the
    highest computed score down. An answer of the earlier shape (``legacy``: a stated score,
    no points) is held to the 1-25 range and order of its stated scores."""

    def rules(answer: OptionsAnswer, inputs: Mapping[str, Any]) -> list[Problem]:
        legacy = bool((answer.model_extra or {}).get("legacy"))
        problems: list[Problem] = []
        seen: set[str] = set()
        previous: int | None = None
        floors = unknown_floors(answer.items)
        for n, item in enumerate(answer.items):
            at = f"items[{n}]"
            problems += _common_rules(at, item, seen, known, quotes, asks)
            if legacy and not item.points and item.score is not None:
                score: int | None = item.score
                if not 1 <= item.score <= 25:
                    problems.append(problem(f"{at}.score", "range", "must be 1-25", item.score))
                    continue
            else:
                problems += [problem(f"{at}.points", "points", f"gives no points from "
                                     f"{POINTS[0]} to {POINTS[1]} (an integer) for the "
                                     "criterion", c)
                             for c in weights_of(asks) if not _on_scale(item.points.get(c))]
                problems += unknown_scored(at, item, floors)
                score = points_score(item.points, asks)
            if score is None:
                continue
            if previous is not None and score > previous:
                problems.append(problem(f"{at}.points", "order", "its points add up to a "
                                        f"higher score ({score}) than the item ranked above it "
                                        f"({previous}): list the items from the highest score "
                                        "down", score))
            previous = score
        return problems

    return rules


def _rank_rules(known: set[str], quotes: Mapping[str, str],
                asks: Mapping[str, Any] | None = None) -> Any:
    """What a ranking of risks must satisfy whatever the model says: the common rules
    (``_common_rules``: ids unique, cited ids known, every figure grounded, criteria and
    asked fields given), scores 1-25 and sorted, and a risk's score its likelihood × impact
    when it gives both. (Whether the evidence bears an item out is the claim check's
    question.)"""
    asks = asks or {}

    def rules(answer: RankAnswer, inputs: Mapping[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        seen: set[str] = set()
        previous: int | None = None
        for n, risk in enumerate(answer.risks):
            at = f"risks[{n}]"
            problems += _common_rules(at, risk, seen, known, quotes, asks)
            if risk.likelihood and risk.impact and risk.likelihood * risk.impact != risk.score:
                problems.append(problem(f"{at}.score", "product", f"is not likelihood × impact "
                                        f"({risk.likelihood} × {risk.impact})", risk.score))
            if not 1 <= risk.score <= 25:
                problems.append(problem(f"{at}.score", "range", "must be 1-25", risk.score))
                continue
            if previous is not None and risk.score > previous:
                problems.append(problem(f"{at}.score", "order",
                                        "scores higher than the risk ranked above it",
                                        risk.score))
            previous = risk.score
        return problems

    return rules


RANK_FIELDS = ("likelihood", "impact", "rationale", "owner", "mitigation")


def _risks_of(response: Any, index: dict[str, dict[str, str]],
              asks: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The ranked items of an answer (``items``, or ``risks``: a risk ranking's and the
    earlier shape's), each option's score computed from its points (``points_score``); a
    score the answer states is kept only for a risk (checked as likelihood × impact) or an
    item of the earlier shape, which has no points (marked ``score_from: "stated"``)."""
    asks = asks or {}
    options = bool(asks.get("ranks"))
    raw = None
    if isinstance(response, dict):
        raw = response.get("items") if isinstance(response.get("items"), list) else \
            response.get("risks")
    risks = []
    for r in raw if isinstance(raw, list) else []:
        if isinstance(r, dict):
            ids = [str(i) for i in r.get("evidence_ids") or []]
            item = {"id": str(r.get("id", "")), "title": str(r.get("title", "")),
                    "score": r.get("score"), "evidence_ids": ids,
                    "source_ids": _source_ids(ids, index)}
            if isinstance(r.get("criteria"), dict) and r["criteria"]:
                item["criteria"] = {str(k): str(v) for k, v in r["criteria"].items()}
            if options:
                given = r.get("points")
                points: dict[str, Any] = given if isinstance(given, dict) else {}
                computed = points_score(points, asks)
                if points or r.get("score") is None:  # computed needs points
                    item["points"] = {str(k): v for k, v in points.items()}
                    item["score"] = computed
                    item["score_from"] = "points"
                else:
                    item["score_from"] = "stated"
            elif r.get("likelihood") and r.get("impact") and isinstance(r["likelihood"], int) \
                    and isinstance(r["impact"], int):
                item["score"] = r["likelihood"] * r["impact"]  # code's product, not the model's
            item.update({k: r[k] for k in RANK_FIELDS if r.get(k) not in (None, "")})
            if r.get("calculation"):
                item["calculation"] = str(r["calculation"])
            risks.append(item)
    return risks


def _rank_asks(ctx: UnitContext) -> dict[str, Any]:
    """What the unit ranks and on what, as INPUT carries it (nothing for a plain risk
    ranking, so its requests stay as they were)."""
    p = ctx.unit.params
    out: dict[str, Any] = {}
    if p.get("ranks", "risks") != "risks":
        out["ranks"] = str(p["ranks"])
    if p.get("criteria"):
        out["criteria"] = [str(c) for c in p["criteria"]]
    if p.get("ask"):
        out["ask"] = [str(a) for a in p["ask"]]
    if isinstance(p.get("weights"), dict) and p["weights"]:
        out["weights"] = {str(k): int(v) for k, v in p["weights"].items()}
    return out


def _check_extras(item: Mapping[str, Any], asks: Mapping[str, Any]) -> dict[str, Any]:
    """What the claim check of a ranking of options (criteria declared) sees beside an
    item's title and score: its criterion values and rationale, so it can check them (a
    plain risk ranking's check requests stay as they were)."""
    if not asks.get("ranks") and not asks.get("criteria"):
        return {}
    return {k: item[k] for k in ("criteria", "points", "rationale", "calculation")
            if item.get(k)}


def _rank_schema(asks: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rank answer's JSON Schema with the unit's criteria named as the properties of
    each item's ``criteria`` (and of an option's ``points``); None for a plain risk ranking
    (the plain schema). A free-form map cannot be sent under strict structured output, which
    closes every object: a model could give no criterion at all. A ranking of options is
    asked as ``items`` with no score (code adds the points), likelihood, impact, owner or
    mitigation."""
    criteria = [str(c) for c in asks.get("criteria") or []]
    options = bool(asks.get("ranks"))
    if not criteria and not options:
        return None
    if options:
        schema = copy.deepcopy(json_schema_of(OptionsAnswer))
        item = schema["$defs"]["RankedOption"]
        item["properties"].pop("score", None)
        what = str(asks["ranks"])
        item["properties"]["title"]["description"] = f"the item ranked (one of the {what})"
        schema["properties"]["items"]["description"] = (
            f"the {what}, from the highest score down (code adds each one's points)")
    else:
        schema = copy.deepcopy(json_schema_of(RankAnswer))
        item = schema["$defs"]["Risk"]
    props = item["properties"]
    field = {k: v for k, v in props["criteria"].items()
             if k not in ("additionalProperties", "default")}
    props["criteria"] = {**field, "type": "object", "properties": {
        c: {"type": "string"} for c in criteria}, "required": criteria}
    required = [*item.get("required", []), "criteria"]
    if options:
        points = {k: v for k, v in props["points"].items()
                  if k not in ("additionalProperties", "default")}
        props["points"] = {**points, "type": "object", "properties": {
            c: {"type": "integer", "minimum": POINTS[0], "maximum": POINTS[1]}
            for c in criteria}, "required": criteria}
        required += ["points", "rationale"]
    item["required"] = list(dict.fromkeys(required))
    return schema


def ranking_table(doc: dict[str, Any], cite_ids: Any) -> list[str]:
    """A ranking as a Markdown table of what it ranks, its criteria as columns (and
    likelihood, impact, owner, mitigation, rationale when the items carry them)."""
    items = doc.get("risks") or []
    what = str(doc.get("ranks") or "risks")
    noun = what[:-1] if what.endswith("s") else what
    criteria = [str(c) for c in doc.get("criteria") or []]
    extra = [k for k in RANK_FIELDS if any(r.get(k) not in (None, "") for r in items)]
    # An option's points on each criterion stand beside its value (the score is their sum).
    pointed = what != "risks" and any(r.get("points") for r in items)
    score = "Score (likelihood × impact)" if what == "risks" else \
        "Score (sum of points)" if pointed else "Score"
    columns = [h for c in criteria for h in ([c, f"{c}: points"] if pointed else [c])]
    calculated = any(r.get("calculation") for r in items)
    head = ["Rank", noun.capitalize(), *columns, score,
            *[k.capitalize() for k in extra], *(["Calculation"] if calculated else []),
            "Evidence"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    # The rank is a plain number (1 from the top): item ids (R1, R2, ...) would read as
    # source ids in a document.
    for rank, r in enumerate(items, start=1):
        crit, points = r.get("criteria") or {}, r.get("points") or {}
        values = [cell for c in criteria for cell in (
            [str(crit.get(c, "")), f"{points[c]}/{POINTS[1]}" if c in points else "-"]
            if pointed else [str(crit.get(c, ""))])]
        calc = [shown_calculation(str(r["calculation"])) if r.get("calculation") else ""] \
            if calculated else []
        cells = [str(rank), r["title"], *values,
                 str(r.get("score")), *[str(r.get(k, "")) for k in extra], *calc,
                 cite_ids(r["evidence_ids"])]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells)
                     + " |")
    return lines


def _ranking_md(ctx: UnitContext, doc: dict[str, Any], index: dict[str, dict[str, str]]) -> str:
    lines = [f"# {ctx.unit.title}", "", f"Written for: {doc['audience']}", "",
             *ranking_table(doc, lambda ids: cite(ids, index))]
    lines += ["", f"Settled after {len(doc['rounds'])} round(s): {doc['stop']}.", ""]
    if doc.get("converged") is False:
        lines += ["**Not converged**: the check still found problems at the last round; this "
                  "ranking goes forward flagged.", ""]
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
    quotes = {str(e["id"]): str(e.get("quote", "")) for e in evidence}
    steps: list[StepResult] = []
    asks = _rank_asks(ctx)
    options = "ranks" in asks  # a ranking of anything but risks: items scored by points
    checklist = risk_checklist(ctx, audience) if not options else None
    vocabulary = {"checklist": checklist} if checklist is not None else {}
    told = {**decision_for(ctx), **sources_for(ctx, evidence)}  # the same every round
    for rnd in range(1, max_rounds + 1) if evidence else ():
        ctx.safe_point(f"rank round {rnd}/{max_rounds}")
        rank_step = run_model_step(ctx, prompt=_prompt(ctx, "rank"), inputs={
            "task": "rank", "question": question, "audience": audience, **told,
            "evidence": writer_evidence(evidence),
            "round": rnd, "feedback": problems, **vocabulary, **asks},
            schema=OptionsAnswer if options else RankAnswer, json_schema=_rank_schema(asks),
            rules=(_options_rules if options else _rank_rules)(set(known), quotes, asks),
            round=rnd, label=f"round {rnd}")
        ranked = rank_step.parsed
        risks = _risks_of(ranked, index, asks)
        ctx.safe_point(f"check round {rnd}/{max_rounds}")
        check_step = run_model_step(ctx, prompt=_prompt(ctx, "check", "check_prompt"), inputs={
            "task": "check", "evidence_ids_known": known, "claims": [
                {"id": r["id"], "title": r["title"], "score": r["score"],
                 "evidence_ids": r["evidence_ids"],
                 **_check_extras(r, asks),
                 "evidence": [{"id": i, "quote": quotes[i]} for i in r["evidence_ids"]
                              if i in quotes]} for r in risks],
                **({"criteria": asks["criteria"]} if asks.get("criteria") else {})},
            schema=CheckAnswer, round=rnd, label=f"check round {rnd}")
        steps += [rank_step, check_step]
        checked = check_step.parsed
        responses += [ranked, checked]
        found = checked.get("problems") if isinstance(checked, dict) else None
        problems = [str(p) for p in found] if isinstance(found, list) else [
            "the check response has no problems list"]
        problems += [p.line() for p in rank_step.problems]
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
    unconverged = stop == "max_rounds reached" and ctx.unit.on_last_round == "unconverged"
    doc: dict[str, Any] = {"unit": ctx.unit.id, "title": ctx.unit.title, "question": question,
           "audience": audience, "risks": risks, "rounds": rounds, "stop": stop,
           "evidence": index, "notice": "; ".join(notices(*responses)),
           "conflicts": conflicts_of(ctx, quotes),
           "ranks": asks.get("ranks", "risks"), "criteria": asks.get("criteria", []),
           **({"weights": weights_of(asks)} if options else {}),
           "ask": asks.get("ask", []), "models": models_of(*steps),
           "quotes": {i: quotes[i] for r in risks for i in r["evidence_ids"] if i in quotes},
           "sources": source_titles(ctx, evidence, {i for r in risks for i in r["evidence_ids"]})}
    doc.update(cited_source_meta(ctx, doc["sources"]))
    if unconverged:
        # Goes forward flagged: a later unit (a document, an audit) can record the risk.
        doc.update({"converged": False, "open_problems": problems,
                    "stop": f"not converged after max_rounds = {max_rounds}; the last "
                            "answer goes forward flagged"})
    sources = sorted({s for r in risks for s in r["source_ids"]}, key=natural_key)
    ctx.write("ranking.json", dump_json(doc), media_type=JSON, source_ids=sources)
    ctx.write("ranking.md", _ranking_md(ctx, doc, index), media_type=MARKDOWN, source_ids=sources)
    claim_problems = problems if evidence else ["nothing was ranked"]
    claim_ok = f"checks passed in round {len(rounds)}"
    if unconverged:
        claim_problems = []
        claim_ok = (f"unconverged after {max_rounds} round(s), gone forward flagged: "
                    + ("; ".join(problems[:3]) or "no problems listed"))
    elif stop == "max_rounds reached":
        claim_problems = [f"still failing after max_rounds = {max_rounds}"] + problems
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(risks)} risk(s)"),
            result("citations", citations, "every cited id is in the given evidence"),
            result("claim_check", claim_problems, claim_ok),
        ],
        facts={"rounds": len(rounds), "stop": stop, "risks": len(risks),
               **({"unconverged": True} if unconverged else {})},
        rounds=max(1, len(rounds)),
        problems=[p.model_dump() for s in steps[-2:] for p in s.problems],
        answers=[a for s in steps for a in s.answers],
    )


# --- the general model step -------------------------------------------------------------
@register(MODEL)
def run_model(ctx: UnitContext) -> KindOutcome:
    """``params.prompt`` with ``params.answer``: claims like synthesize, risks like rank (one
    round unless ``max_rounds``)."""
    if ctx.unit.params.get("answer", "claims") == "risks":
        return run_rank(ctx)
    return run_synthesize(ctx)
