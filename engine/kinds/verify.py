"""verify: rule checks, then one model claim check over the evidence-producing units it
depends on (extract units, or any unit whose outputs hold an evidence list: evidence.json).

Rules first (cheap, certain): the evidence must cite a source its extraction unit was
given, and the quote must occur in that source. Only the survivors go to the model, in
one step (several when they do not fit one request), each claim with its own passage —
the paragraph of its source that holds the quote, never the whole source. The model judges
each claim against its passage and lists conflicts: two sources giving one quantity
different values (both ids, the values, the reason, ``conflict-open`` or
``conflict-resolved``). No passage is written out: ``verified.json`` keeps the quote and
nothing more of the source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.core.presets import evidence_sources
from keepstep.engine.files.convert import ConvertedSource
from keepstep.engine.files.convert.quotes import verbatim_matcher
from keepstep.engine.gateway.answers import Problem, problem
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    collapse_ws,
    dump_json,
    evidence_deps,
    natural_key,
    notices,
    quote_cited,
    quote_in_text,
    result,
    structure_problems,
    unit_source_ids,
    verified_deps,
)
from keepstep.engine.kinds.conflicts import CLASSES, Conflict, propose, propose_advice
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.extract import paragraphs, today_of
from keepstep.engine.kinds.model_step import StepResult, known_ids, run_model_step, step_tokens

OUTPUT = "verified.json"
DEFAULT_MIN_SUPPORTED = 0.5
_KEPT_FIELDS = ("id", "source_id", "group", "topic", "kind", "relevance", "quote", "figures",
                "quantities", "qualifies", "locator", "table_header")

PROMPT = "verify"
CONFLICT_STATES = ("conflict-open", "conflict-resolved")


class Verdict(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    supported: bool
    reason: str = ""


class Classification(BaseModel):
    """The model's reading of one candidate disagreement."""

    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True, populate_by_name=True)

    candidate: str = Field(description="the candidate id from INPUT (K1, K2 ...)")
    cls: Literal["definition", "superseded", "outdated", "unexplained", "not-a-conflict"] = \
        Field(alias="class", description="what the disagreement is")
    holds: str | None = Field(default=None, description="the value the documents should use, "
                              "copied from a side's value (null when unexplained)")
    holds_ids: list[str] = Field(default_factory=list,
                                 description="the evidence ids of the sides giving that value")
    reason: str = Field(description="why, in one or two sentences, naming the sources")
    applies: str = Field(default="", description="for a definition: which value applies "
                         "when (what each counts)")
    subject: str = Field(default="", description="for a disagreement over advice: what the "
                         "advice is about, in a few words ('' for figures)")


class VerifyAnswer(BaseModel):
    """The claim check's answer: a verdict per claim, and a class for each candidate
    disagreement."""

    model_config = ConfigDict(extra="allow")

    results: list[Verdict]
    conflicts: list[Classification] = Field(default_factory=list)


def _verify_rules(answer: VerifyAnswer, inputs: Mapping[str, Any]) -> list[Problem]:
    claims = {str(c["id"]) for c in inputs.get("claims", [])}
    problems: list[Problem] = []
    answered: set[str] = set()
    for n, verdict in enumerate(answer.results):
        if verdict.id not in claims:
            problems.append(problem(f"results[{n}].id", "known_id",
                                    "is not a claim id of INPUT", verdict.id))
        elif verdict.id in answered:
            problems.append(problem(f"results[{n}].id", "unique", "judged twice", verdict.id))
        answered.add(verdict.id)
    problems += [problem("results", "complete", "no verdict for this claim", cid)
                 for cid in sorted(claims - answered, key=natural_key)]
    candidates = {str(c.get("id")): c for c in inputs.get("candidates", [])
                  if isinstance(c, dict)}
    classified: set[str] = set()
    for n, item in enumerate(answer.conflicts):
        at = f"conflicts[{n}]"
        candidate = candidates.get(item.candidate)
        if candidate is None:
            problems.append(problem(f"{at}.candidate", "known_id",
                                    "is not a candidate id of INPUT", item.candidate))
            continue
        if item.candidate in classified:
            problems.append(problem(f"{at}.candidate", "unique", "classified twice",
                                    item.candidate))
        classified.add(item.candidate)
        sides = [s for s in candidate.get("sides", []) if isinstance(s, dict)]
        values = {collapse_ws(str(s.get("value"))).lower() for s in sides}
        ids = {str(s.get("evidence_id")) for s in sides}
        if item.holds is not None and collapse_ws(item.holds).lower() not in values:
            problems.append(problem(f"{at}.holds", "side_value",
                                    "must be one side's value, copied as given", item.holds))
        advice = candidate.get("about") == "advice"
        if item.holds is None and item.cls in ("superseded", "outdated", "definition") and \
                not (advice and item.holds_ids):
            problems.append(problem(f"{at}.holds", "required",
                                    f"a {item.cls} disagreement names the value that holds"))
        problems += known_ids(f"{at}.holds_ids", item.holds_ids, ids)
        if item.cls == "definition" and not item.applies.strip():
            problems.append(problem(f"{at}.applies", "required",
                                    "say which value applies when (what each counts)"))
        if not item.reason.strip():
            problems.append(problem(f"{at}.reason", "required", "say why"))
    problems += [problem("conflicts", "complete", "this candidate is not classified", cid)
                 for cid in sorted(set(candidates) - classified, key=natural_key)]
    return problems


def table_header(quote: str, passage: str) -> str | None:
    """The header row of the Markdown table whose row ``quote`` is (outer pipes off), or
    None when the quote is not a table row (or is the header): a row read on its own ("17 |
    4") says nothing of what its cells count, so its header travels with it."""
    lines = passage.splitlines()
    for n, line in enumerate(lines):
        if not line.lstrip().startswith("|") or not quote_in_text(quote, line):
            continue
        start = n
        while start > 0 and lines[start - 1].lstrip().startswith("|"):
            start -= 1
        if start == n:
            return None
        return " | ".join(c.strip() for c in lines[start].strip().strip("|").split("|"))
    return None


def passage_for(quote: str, text: str) -> str:
    """The paragraph of ``text`` holding ``quote`` (or the fewest adjacent paragraphs that
    do); the whole text only when no paragraph run holds it."""
    paras = paragraphs(text)
    for width in range(1, len(paras) + 1):
        for start in range(0, len(paras) - width + 1):
            window = "\n\n".join(paras[start:start + width])
            if quote_in_text(quote, window):
                return window
    return text


# How far around an occurrence in a large source its paragraph is looked for.
_PASSAGE_REACH = 20_000


def passage_near(conv: ConvertedSource, quote: str) -> str:
    """For a large source (its text read by window): the blank-line-separated paragraphs
    around the quote's first verbatim occurrence, at most ``_PASSAGE_REACH`` characters on
    either side; the quote itself when it does not occur."""
    matcher = verbatim_matcher(quote)
    found = None if matcher is None else matcher.search(conv.text)
    if found is None:
        return quote
    lo = max(0, found[0] - _PASSAGE_REACH)
    window = conv.text[lo:min(len(conv.text), found[1] + _PASSAGE_REACH)]
    a, b = found[0] - lo, found[1] - lo
    start = window.rfind("\n\n", 0, a)
    end = window.find("\n\n", b)
    return window[0 if start < 0 else start + 2:len(window) if end < 0 else end].strip()


class _SourceTexts:
    """The sources a verify unit checks quotes against, each read once: a source held in
    memory as its text (the checks as they always were), a large one as its converted
    source, searched by window (its whole text is never in memory)."""

    def __init__(self, ctx: UnitContext) -> None:
        self.ctx = ctx
        self.held: dict[str, str | ConvertedSource] = {}

    def _get(self, sid: str) -> str | ConvertedSource:
        if sid not in self.held:
            conv = self.ctx.converted_source(sid)
            self.held[sid] = conv.text if isinstance(conv.text, str) else conv
        return self.held[sid]

    def holds(self, sid: str, quote: str) -> bool:
        source = self._get(sid)
        if isinstance(source, str):
            return quote_in_text(quote, source)
        return quote_cited(source, quote, None)

    def passage(self, sid: str, quote: str) -> str:
        source = self._get(sid)
        return passage_for(quote, source) if isinstance(source, str) \
            else passage_near(source, quote)


def _batches(ctx: UnitContext, claims: list[dict[str, Any]],
             candidates: list[dict[str, Any]],
             meta: Mapping[str, Mapping[str, str]] | None = None
             ) -> list[list[dict[str, Any]]]:
    """The claims in one batch when the request fits, else consecutive batches that each do
    (the first batch also carries the candidates). A request fits when its prompt fits the
    window and its expected answer (a verdict per claim, a classification per candidate)
    fits the model's output limit: a batch never forces reasons to shrink."""
    profile = ctx.model_profile()
    answer_room = int(profile.answer_limit * _ANSWER_MARGIN)

    def tokens(batch: list[dict[str, Any]], first: bool) -> int:
        answer = expected_answer(batch, candidates if first else [])
        if answer > answer_room and len(batch) > 1:
            return profile.input_tokens + 1  # too much to answer at once: split
        inputs = _inputs(batch, candidates if first else [], meta, today_of(ctx))
        return step_tokens(ctx, prompt=PROMPT, inputs=inputs, schema=VerifyAnswer)

    limit = profile.input_tokens

    if tokens(claims, True) <= limit:
        return [claims]
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for claim in claims:
        first = not batches
        if current and tokens([*current, claim], first) > limit:
            batches.append(current)
            current = []
            first = False
        if tokens([claim], first) > limit:
            raise ctx.model_profile().too_large(
                f"{ctx.unit.id}: the claim check of {claim['id']}", tokens([claim], first))
        current.append(claim)
    if current:
        batches.append(current)
    return batches


# Expected answer sizes in tokens: a verdict with a one-sentence reason, a classification
# with its reason, and each side it names; what an answer may fill of the output limit.
_VERDICT_ANSWER, _CANDIDATE_ANSWER, _SIDE_ANSWER = 40, 90, 12
_ANSWER_MARGIN = 0.8


def expected_answer(batch: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> int:
    """Tokens a claim check's answer is expected to take: a verdict per claim and a
    classification per candidate with each of its sides (it sizes the request's
    max_tokens, and a batch whose answer would not fit the model's output limit is split)."""
    return _VERDICT_ANSWER * len(batch) + sum(
        _CANDIDATE_ANSWER + _SIDE_ANSWER * len(c.get("sides", [])) for c in candidates)


def _inputs(batch: list[dict[str, Any]], candidates: list[dict[str, Any]],
            meta: Mapping[str, Mapping[str, str]] | None = None, today: str = ""
            ) -> dict[str, Any]:
    """A claim check's INPUT: the claims (each naming its passage by id), the passages, the
    candidates, the metadata of the sources they cite (title, kind, date, publisher) and
    today's date when the unit reads it."""
    # A passage is sent once, by id: statements of one paragraph (a table's rows, a list's
    # items) each named it in full before, often half of a claim check's passage text.
    passages: dict[str, str] = {}
    ids: dict[str, str] = {}
    claims = []
    for claim in batch:
        text = str(claim.get("passage", ""))
        if text not in ids:
            ids[text] = f"P{len(ids) + 1}"
            passages[ids[text]] = text
        claims.append({**claim, "passage": ids[text]})
    out: dict[str, Any] = {"task": "verify", "claims": claims, "candidates": candidates}
    if passages:
        out["passages"] = passages
    cited = sorted({str(c.get("source_id")) for c in batch} | {
        str(s.get("source_id")) for c in candidates for s in c.get("sides", [])},
        key=natural_key)
    sources = {sid: dict(meta[sid]) for sid in cited if meta and sid in meta}
    if sources:
        out["sources"] = sources
    if today:
        out["today"] = today
    return out


SPEC = KindSpec(
    name="verify",
    uses_model=True,
    validators=["structure", "citations", "claim_check"],
    default_outputs=[OUTPUT],
    description="Rule checks (approved source, verbatim quote) then one model claim check "
    "over the evidence of the evidence-producing units it depends on.",
)


def _gather(ctx: UnitContext, meta: dict[str, dict[str, str]] | None = None,
            pre: set[str] | None = None, origins: dict[str, dict[str, str]] | None = None
            ) -> tuple[list[tuple[dict[str, Any], set[str]]], list[str]]:
    """(evidence item, sources it may cite) from every evidence-producing dependency and
    every verify dependency (its verified evidence: the ids go into ``pre``, already
    judged), first id wins; ``meta`` gathers the dependencies' source metadata and
    ``origins`` where each field of it came from (source register or document)."""
    own = {s.id for s in ctx.sources_for_unit()}
    gathered: list[tuple[dict[str, Any], set[str]]] = []
    seen: set[str] = set()
    problems: list[str] = []
    meta = {} if meta is None else meta
    origins = {} if origins is None else origins
    pre = set() if pre is None else pre
    checked = verified_deps(ctx)
    deps = _unchecked_evidence_deps(ctx) + checked
    if not deps:
        problems.append("no evidence-producing unit among the dependencies")
    for dep, name in deps:
        allowed = unit_source_ids(dep, ctx.snapshot.groups)
        # A verify unit that declares its sources may only check those; one that declares
        # none trusts its dependencies' approved inputs.
        allowed = allowed & own if own else allowed
        doc = ctx.dep_json(dep.id, name)
        items = doc.get("evidence")
        given = doc.get("source_meta")
        for sid, info in (given.items() if isinstance(given, dict) else []):
            if isinstance(info, dict):
                meta.setdefault(str(sid), {str(k): str(v) for k, v in info.items()})
        # Where each field came from: carried to the documents, not to a prompt.
        given = doc.get("source_meta_from")
        for sid, info in (given.items() if isinstance(given, dict) else []):
            if isinstance(info, dict):
                origins.setdefault(str(sid), {str(k): str(v) for k, v in info.items()})
        if not isinstance(items, list):
            problems.append(f"{dep.id}/{name} has no evidence list")
            continue
        for item in items:
            key = str(item.get("id")) if isinstance(item, dict) else ""
            if key and key in seen:
                continue
            seen.add(key)
            gathered.append((item, allowed))
            if (dep, name) in checked and key:
                pre.add(key)
    return gathered, problems


def _unchecked_evidence_deps(ctx: UnitContext) -> list[tuple[Any, str]]:
    """The evidence-producing units this verify unit reads itself: those it reaches through
    its dependencies, less those a verify dependency covers (their evidence comes judged,
    from that dependency's verified output)."""
    units = ctx.plan.unit_map()
    covered = {u.id for dep, _ in verified_deps(ctx) for u in evidence_sources(dep, units)}
    return [(u, n) for u, n in evidence_deps(ctx) if u.id not in covered]


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    meta: dict[str, dict[str, str]] = {}
    # Evidence a verify dependency already judged is not asked about again: a verify unit
    # over verify units looks for disagreements across all their evidence (the whole run).
    pre: set[str] = set()
    origins: dict[str, dict[str, str]] = {}
    gathered, shape = _gather(ctx, meta, pre, origins)
    texts = _SourceTexts(ctx)
    candidates: list[dict[str, Any]] = []
    passages: dict[str, str] = {}  # evidence id -> the passage its quote stands in
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
        if not texts.holds(sid, str(item["quote"])):
            reject(item, "rule", f"quote not found verbatim in {sid}")
            continue
        kept = {k: item[k] for k in _KEPT_FIELDS if k in item}
        passages[str(item["id"])] = texts.passage(sid, str(item["quote"]))
        header = table_header(str(item["quote"]), passages[str(item["id"])])
        if header:
            kept["table_header"] = header
        candidates.append(kept)
    candidates.sort(key=lambda e: natural_key(str(e["id"])))

    verdicts: dict[str, dict[str, Any]] = {}
    responses: list[dict[str, Any]] = []
    classes: dict[str, dict[str, Any]] = {}
    steps: list[StepResult] = []
    claims = [{"id": e["id"], "source_id": e["source_id"], "quote": e["quote"],
               "passage": passages[str(e["id"])],
               **{k: e[k] for k in ("kind", "quantities") if k in e}}
              for e in candidates if str(e["id"]) not in pre]
    proposed = [c.model_dump(exclude_none=True, exclude={"about"})
                for c in propose([_with_quantities(e) for e in candidates], meta)]
    # Disagreements over advice (sources recommending different courses) are asked in a
    # request of their own after the claim check, numbered after the figures' candidates.
    advice = [c.model_dump(exclude_none=True)
              for c in propose_advice(candidates, meta, first=len(proposed) + 1)]
    batches = _batches(ctx, claims, proposed, meta) if claims else [[]] if proposed else []
    for b, batch in enumerate(batches, start=1):
        part = f", batch {b}/{len(batches)}" if len(batches) > 1 else ""
        ctx.safe_point(f"claim check of {len(batch)} statement(s){part}")
        step = run_model_step(ctx, prompt=PROMPT,
                              inputs=_inputs(batch, proposed if b == 1 else [], meta,
                                             today_of(ctx)),
                              schema=VerifyAnswer, rules=_verify_rules, label=part.lstrip(", "),
                              answer_tokens=expected_answer(batch, proposed if b == 1 else []))
        steps.append(step)
        responses.append(step.parsed)
        results = step.parsed.get("results")
        if not isinstance(results, list):
            shape.append("the claim check response has no results list")
            results = []
        verdicts.update({str(r.get("id")): r for r in results if isinstance(r, dict)})
        found = step.parsed.get("conflicts")
        classes.update({str(c.get("candidate")): c for c in found if isinstance(c, dict)}
                       if isinstance(found, list) and b == 1 else {})
        shape += [p.line() for p in step.problems if p.rule != "complete"]

    if advice:
        ctx.safe_point(f"advice check of {len(advice)} candidate(s)")
        step = run_model_step(ctx, prompt=PROMPT,
                              inputs=_inputs([], _advice_input(advice), meta, today_of(ctx)),
                              schema=VerifyAnswer, rules=_verify_rules, label="advice",
                              answer_tokens=expected_answer([], advice))
        steps.append(step)
        responses.append(step.parsed)
        found = step.parsed.get("conflicts")
        classes.update({str(c.get("candidate")): c for c in found if isinstance(c, dict)}
                       if isinstance(found, list) else {})
        shape += [p.line() for p in step.problems if p.rule != "complete"]
        proposed += advice

    supported: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for e in candidates:
        verdict = verdicts.get(str(e["id"]))
        if str(e["id"]) in pre:
            supported.append(e)
        elif verdict is None:
            unanswered.append(f"no verdict for {e['id']}")
            reject(e, "model", "no verdict returned")
        elif verdict.get("supported") is True:
            supported.append(e)
        else:
            reject(e, "model", str(verdict.get("reason") or "not supported"))
    rejected.sort(key=lambda r: natural_key(r["id"]))
    records = _records(ctx, proposed, classes, {str(e["id"]) for e in supported})

    checked = len(gathered)
    fraction = round(len(supported) / checked, 3) if checked else 0.0
    minimum = float(ctx.unit.params.get("min_supported", DEFAULT_MIN_SUPPORTED))
    claim_problems = list(unanswered)
    if fraction < minimum:
        claim_problems.append(f"only {fraction:.0%} of {checked} statement(s) supported "
                              f"(minimum {minimum:.0%})")
    shape += structure_problems(supported, EVIDENCE_REQUIRED, "verified evidence")
    own = {s.id for s in ctx.sources_for_unit()} or set(texts.held)
    citations = [f"{e['id']} cites {e['source_id']}, not a source of {ctx.unit.id}"
                 for e in supported if e["source_id"] not in own]

    source_ids = sorted({e["source_id"] for e in supported}, key=natural_key)
    # The models that answered for this evidence: the extractions' and this unit's own.
    models = {m for s in steps for m in s.models} | {
        str(m) for d, name in _unchecked_evidence_deps(ctx)
        for m in ctx.dep_json(d.id, name).get("models") or []}
    doc = {
        "models": sorted(models),
        "from_units": [d.id for d, _ in _unchecked_evidence_deps(ctx) + verified_deps(ctx)],
        "checked": checked,
        "evidence": supported,
        "rejected": rejected,
        "candidates": len(proposed),
        "conflicts": [r.record() for r in records],
        "source_meta": {sid: meta[sid] for sid in source_ids if sid in meta},
        "source_meta_from": {sid: origins[sid] for sid in source_ids if sid in origins},
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
               "supported_fraction": fraction,
               **_conflict_facts(records)},
        problems=[p.model_dump() for s in steps for p in s.problems],
        answers=[a for s in steps for a in s.answers],
    )


# --- disagreements ---------------------------------------------------------------------------

def _with_quantities(item: dict[str, Any]) -> dict[str, Any]:
    """The item with structured figures: its own ``quantities``, or — for evidence that has
    none (an older extraction) — those a rule reads from its quote."""
    if isinstance(item.get("quantities"), list):
        return item
    from keepstep.engine.gateway.offline_rules import structured_quantities

    return {**item, "quantities": structured_quantities(str(item.get("quote", "")))}


def _records(ctx: UnitContext, proposed: list[dict[str, Any]],
             classes: dict[str, dict[str, Any]], supported: set[str]) -> list[Conflict]:
    """The typed records: each candidate with its class (one the model left unclassified is
    ``unexplained``), keeping the sides whose evidence was supported; a candidate left with
    fewer than two sources or one value is dropped."""
    out: list[Conflict] = []
    model = ctx.model_profile().model
    for cand in proposed:
        sides = [s for s in cand["sides"] if s["evidence_id"] in supported]
        values = {collapse_ws(str(s["value"])).lower() for s in sides}
        if len({s["source_id"] for s in sides}) < 2 or len(values) < 2:
            continue
        got = classes.get(str(cand["id"])) or {}
        cls = got.get("class") if got.get("class") in CLASSES else "unexplained"
        holds = got.get("holds") if cls != "unexplained" else None
        holds = str(holds) if holds not in (None, "") else None
        ids = [str(i) for i in got.get("holds_ids") or [] if isinstance(i, str)]
        if cand.get("about") == "advice" and cls != "unexplained" and holds is None and ids:
            # Advice followed, named by its evidence id: its value is that side's advice.
            holds = next((str(s["value"]) for s in sides if s["evidence_id"] in ids), None)
        if holds is not None and not ids:
            ids = [s["evidence_id"] for s in sides
                   if collapse_ws(str(s["value"])).lower() == collapse_ws(holds).lower()]
        subject = collapse_ws(str(got.get("subject") or ""))
        metric = f"advice on {subject}" if cand.get("about") == "advice" and subject \
            else cand.get("metric", "")
        out.append(Conflict.model_validate({
            **{k: cand[k] for k in ("id", "entity", "period", "unit", "about") if k in cand},
            "metric": metric,
            "sides": sides, "class": cls, "holds": holds, "holds_ids": ids,
            "reason": str(got.get("reason") or "the model did not classify it"),
            "applies": str(got.get("applies") or ""), "verify_unit": ctx.unit.id,
            "classified_by": model}))
    return out


def _advice_input(advice: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Candidates over advice as a request carries them: each side's value is its quote, so
    the quote is not sent twice."""
    return [{**c, "sides": [{k: v for k, v in s.items() if k != "quote"}
                            for s in c.get("sides", [])]} for c in advice]


def _conflict_facts(records: list[Conflict]) -> dict[str, int]:
    real = [r for r in records if r.cls != "not-a-conflict"]
    out = {"conflicts": len(real)} if real else {}
    if any(r.open for r in records):
        out["open_conflicts"] = sum(1 for r in records if r.open)
    if len(real) < len(records):
        out["apparent_conflicts"] = len(records) - len(real)
    return out
