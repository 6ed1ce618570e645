"""render: any template into any named document, filled from the dependencies (no model).

``params.document`` names the document (audits and deliveries refer to it), ``params.template``
the template (declared as a ``template:<name>`` input; the file is ``templates/<name>.md``).
A Markdown template is Jinja2: each placeholder is filled with a part (``kinds.parts.PARTS``:
findings, risks, inventory, …, drawn from what the dependencies wrote) — by its own name, or
by ``params.fill`` mapping the template's names onto parts (``{ pricing = { part =
"findings", from = ["S02"] } }``); any contract field the contract dependency carries is a
placeholder too. An unknown placeholder fails the structure validator (and ``keepstep
validate``). Sections are marked ``<!-- section: id -->`` in the template only: the document
a reader gets carries no marker (an audit finds a section by the template's heading after
it). A CSV document (``format = "csv"``, or an output ending in .csv) lists verified
statements, its columns the template's Markdown list items, and always a ``models`` column
naming the models that answered (the offline heuristic named as such).
Every finding cites evidence ids and where in their sources they are, as
``[A1-e3, B2-e1] (A1, p. 2; B2, Pricing)`` (``cite(..., locators=True)``; a source id alone
for evidence without a locator).

With a language model configured for the unit (anything but the offline heuristic), the
placeholder ``params.prose`` names is written by the model (the ``render`` prompt) from the
syntheses' claims and the top risks; every sentence cites evidence ids, and every figure it
states must be in what it cites. The offline heuristic keeps the rule-based part and makes
no call.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keepstep.engine.core.presets import (
    FillSpec,
    RenderParams,
    document_format,
    document_output,
)
from keepstep.engine.core.templates import (
    placeholders,
    strip_sections,
    syntax_error,
    table_columns,
)
from keepstep.engine.gateway.answers import problem
from keepstep.engine.gateway.offline_provider import PROVIDER as OFFLINE_PROVIDER
from keepstep.engine.kinds.citable import (
    citable_conflicts,
    citable_rankings,
    conflict_evidence,
    drop_record_labels,
    expand,
)
from keepstep.engine.kinds.claims import claim_rules, figure_holders
from keepstep.engine.kinds.common import (
    CSV,
    LOCATED_CITE_RE,
    MARKDOWN,
    cite,
    cited_evidence_ids,
    cited_source_ids,
    natural_key,
    result,
    shown_calculation,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.model_step import StepResult, run_model_step
from keepstep.engine.kinds.parts import TABLE_COLUMNS, TOP_RISKS, Sources, fill_part
from keepstep.engine.kinds.stale import label_for, stated_before
from keepstep.engine.kinds.synthesize import META_FIELDS, Claim, register_only, support_judge

SPEC = KindSpec(
    name="render",
    uses_model=False,
    validators=["structure", "citations"],
    default_outputs=[],
    description="Render any template into a named document from the dependencies' artifacts "
    "(Markdown via Jinja2 placeholders filled with parts, or a CSV table of statements).",
)


class Sentence(Claim):
    """A document's sentence: a claim that may also cite INPUT's citable records."""

    evidence_ids: list[str] = Field(description="the ids from INPUT it rests on: evidence "
                                    "ids (the quote that holds each figure it states) and "
                                    "ids of INPUT's citable_records — a disagreement (K1, "
                                    "...) whose record says which value holds, a ranked item "
                                    "(its record_id) whose place, score or rationale it "
                                    "states")


class RenderAnswer(BaseModel):
    """The render step's answer: the section's sentences, each citing evidence ids."""

    model_config = ConfigDict(extra="allow")

    sentences: list[Sentence]


def _cited_by(src: Sources, units: list[str]) -> set[str]:
    docs = [d for d in src.syntheses + src.rankings if d.get("unit") in units]
    ids = {str(i) for d in docs for c in d.get("claims", []) for i in c.get("evidence_ids", [])}
    return ids | {str(i) for d in docs for r in d.get("risks", [])
                  for i in r.get("evidence_ids", [])}


def _evidence_table(src: Sources, template: str, params: RenderParams) -> tuple[str, list[str]]:
    header = table_columns(template)
    problems = [f"template column {h!r} is unknown (known: {', '.join(TABLE_COLUMNS)})"
                for h in header if h not in TABLE_COLUMNS]
    if not header:
        problems.append("the table template lists no columns ('- id', '- quote', ...)")
    if header and "models" not in header:
        # The CSV names the models that answered whatever its template lists (issue 20).
        header.append("models")
    if header and src.stale and "stated_before" not in header:
        # A figure stated before its period ended is marked whatever the template lists.
        header.append("stated_before")
    rows = sorted(src.evidence, key=lambda e: natural_key(str(e["id"])))
    if params.rows is not None:
        if params.rows.cited_by:
            wanted = _cited_by(src, params.rows.cited_by)
            rows = [e for e in rows if str(e["id"]) in wanted]
        if params.rows.topic:
            rows = [e for e in rows if e.get("topic") in params.rows.topic]
    models = "; ".join(f"{m} (offline heuristic: rules, no language model)"
                       if m.startswith(f"{OFFLINE_PROVIDER}/") else m for m in src.models)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for e in rows:
        row = {**{k: str(e.get(k, "")) for k in TABLE_COLUMNS},
               "group": str(e.get("group") or src.index.get(str(e["id"]), {}).get("group", "")),
               "figures": "; ".join(str(f) for f in e.get("figures", [])),
               "models": models,
               "stated_before": src.stale.get(str(e["id"]), ("", []))[0]}
        writer.writerow([row.get(h, "") for h in header])
    return out.getvalue(), problems


def _sentences_step(ctx: UnitContext, src: Sources, document: str, section: str,
                    inputs: dict[str, Any], quotes: dict[str, str],
                    records: tuple[dict[str, str], dict[str, list[str]]] | None = None,
                    words: int | None = None) -> tuple[str | None, list[StepResult]]:
    """Sentences a model writes for one section from ``inputs`` only, each checked (cited
    ids among ``quotes``, every figure in a quote it cites or given by a checked
    calculation, supported by its quotes) before the section is accepted. ``records``
    (id -> text, id -> evidence ids): disagreements and ranked items a sentence may cite
    like a quote (``kinds.citable``); the document cites the evidence they rest on."""
    record: dict[str, Any] = {}
    texts, rests_on = records or ({}, {})
    if texts:
        inputs = {**inputs, "citable_records": texts}
    citable = {**quotes, **texts}
    base_rules = claim_rules("sentences", citable)
    shown = set(src.written) | set(src.shown)

    def rules(answer: Any, given: Any) -> list[Any]:
        # No sentence repeats what the document already says (a finding or an earlier
        # written sentence): the section must add to it.
        return base_rules(answer, given) + [
            problem(f"sentences[{n}].text", "repeated", "the document already says this; "
                    "write what this section adds, or leave the sentence out", c.text)
            for n, c in enumerate(answer.sentences) if _words(c.text) in shown
        ] + over_budget(section, [c.text for c in answer.sentences], words)

    # The decision the document serves (the contract's goal): the section answers each of
    # its questions first (the render prompt says how). Only a goal the unit reads reaches the
    # request: a contract dependency's (its contract.json) or, when the unit declares
    # contract:goal, the project's — so a goal edit invalidates exactly the renders that use it.
    decision = decision_of(ctx, src)
    stale = stated_before(src.stale, quotes)
    step = run_model_step(ctx, prompt="render", inputs={
        "task": "render", "document": document, "section": section,
        "audience": src.audience, **({"decision": decision} if decision else {}), **inputs,
        **_sources_told(ctx, src, quotes),
        "evidence": {k: v.strip() for k, v in sorted(quotes.items())},
        **({"stated_before_period_end": stale} if stale else {})},
        schema=RenderAnswer, rules=rules,
        judge=support_judge(ctx, "sentences", citable, record, {
            str(e["id"]): str(e["table_header"]) for e in src.evidence
            if e.get("table_header") and str(e["id"]) in quotes}))
    steps = [step, *record.get("steps", [])]
    if not step.ok:
        return None, steps
    # A derived figure shows its checked calculation, as a finding does (the audit reads it);
    # each sentence's citation points at the quotes holding its figures.
    # A figure stated before its period ended, written as an outcome, is labelled
    # (kinds.stale): whatever the writer wrote, the reader is told.
    lines = [f"- {drop_record_labels(c.text.strip(), rests_on)}"
             + label_for(c.text, expand(c.evidence_ids, rests_on)[0], src.stale)
             + (" " + shown_calculation(c.calculation) if c.calculation else "")
             # A cited record (a disagreement, a ranked item) stands for its evidence.
             + " " + cite(expand(figure_holders(c.text, c.evidence_ids, citable,
                                                c.calculation), rests_on)[0],
                          src.index, locators=True)
             for c in step.value.sentences]
    src.written |= {_words(c.text) for c in step.value.sentences}
    return "\n".join(lines) or "Nothing to add to what the sections above say.", steps


# How far a written section may run over its word budget before it is sent back.
OVER_BUDGET = 1.25


def word_count(text: str) -> int:
    """The words a reader reads in ``text`` (a figure such as "364,000" is one word)."""
    return len(re.findall(r"[^\s—–-]+", text))


def over_budget(section: str, texts: list[str], words: int | None) -> list[Any]:
    """A problem when the section's sentences run more than a quarter over ``words`` (its
    budget), naming the section and its count; none without a budget."""
    if not words:
        return []
    count = sum(word_count(t) for t in texts)
    if count <= words * OVER_BUDGET:
        return []
    return [problem("sentences", "too_long", f"the {section} section runs to {count} words, "
                    f"over its budget of {words}: keep the sentences that answer the decision, "
                    "say each once and briefly, and leave the rest to the sections after it",
                    f"{count} words")]


def _sources_told(ctx: UnitContext, src: Sources, quotes: dict[str, str]) -> dict[str, Any]:
    """INPUT's ``sources``: each source of the quotes a section may cite, with its title,
    kind, date and publisher and (``from_register``) the date and publisher only the source
    register gives, so a sentence resting on one says so rather than writing it as the
    document's (``synthesize.register_only``). Nothing when no source has metadata."""
    sids = sorted({str(src.index[i].get("source_id")) for i in quotes
                   if i in src.index and src.index[i].get("source_id")}, key=natural_key)
    told: dict[str, dict[str, Any]] = {
        sid: {k: src.meta[sid][k] for k in META_FIELDS if src.meta.get(sid, {}).get(k)}
        for sid in sids}
    told = {sid: m for sid, m in told.items() if m}
    for sid, fields in register_only(ctx, told, src.meta_from).items():
        told[sid]["from_register"] = fields
    return {"sources": told} if told else {}


def decision_of(ctx: UnitContext, src: Sources) -> str:
    """The goal a render unit reads (see ``_sentences_step``); "" when it reads none."""
    goal = src.contract.get("goal")
    if not goal and "goal" in ctx.unit.input_refs("contract"):
        goal = src.project_contract.get("goal")
    return str(goal or "").strip()


def _words(text: str) -> str:
    return " ".join(text.lower().split())


def _prose(ctx: UnitContext, src: Sources, document: str,
           section: str) -> tuple[str | None, list[StepResult]]:
    """The model-written section ``params.prose`` names, from every synthesis and the top
    risks; each sentence cites the quotes that hold its figures (the real quotes of the ids
    it names)."""
    findings = [{"title": s.get("title", ""), "question": s.get("question", ""),
                 "claims": [{"text": c.get("text", ""), "evidence_ids": c.get("evidence_ids", []),
                             **({"conflict_ids": c["conflict_ids"]} if c.get("conflict_ids")
                                else {})}
                            for c in s.get("claims", [])]} for s in src.syntheses]
    # Risks are given as risks; the top of a ranking of anything else (options, vendors,
    # prices) as what it ranks, so the prompt speaks of the top risk only when there is one.
    risks = [{"title": r["title"], "score": r["score"], "evidence_ids": r["evidence_ids"]}
             for d in src.rankings if str(d.get("ranks") or "risks") == "risks"
             for r in d.get("risks", [])][:TOP_RISKS]
    top = [{"ranks": str(d["ranks"]), "title": d["risks"][0]["title"],
            "score": d["risks"][0]["score"], "evidence_ids": d["risks"][0]["evidence_ids"]}
           for d in src.rankings if str(d.get("ranks") or "risks") != "risks" and d.get("risks")]
    cited = {str(i) for f in findings for c in f["claims"] for i in c["evidence_ids"]} | {
        str(i) for r in [*risks, *top] for i in r["evidence_ids"]}
    quotes = {i: src.quotes[i] for i in cited if i in src.quotes}
    # A finding resting on a settled disagreement may be restated with it (kinds.citable).
    return _sentences_step(ctx, src, document, section,
                           {"findings": findings, "risks": risks,
                            **({"top_ranked": top} if top else {})}, quotes,
                           (citable_conflicts(src.conflicts), conflict_evidence(src.conflicts)))


def _written_section(ctx: UnitContext, src: Sources, document: str, section: str,
                     of: list[str], words: int | None = None
                     ) -> tuple[str | None, list[StepResult]]:
    """A section a model writes from what ``of`` names (of ``src``'s units) and nothing
    else: findings, rankings, disagreements, gaps, evidence; within ``words`` (the section's
    word budget) when the template's fill declares one."""
    inputs: dict[str, Any] = {"made_of": of, **({"words": words} if words else {})}
    cited: set[str] = set()
    if "findings" in of:
        # Only the findings the document has not shown yet: the section adds to it.
        fresh = [(s, [c for c in s.get("claims", []) if _words(str(c.get("text", "")))
                      not in src.shown]) for s in src.syntheses]
        inputs["findings"] = [
            {"title": s.get("title", ""), "question": s.get("question", ""),
             "claims": [{k: c[k] for k in ("text", "evidence_ids", "calculation", "confidence",
                                           "confidence_reason", "conflict_ids")
                         if c.get(k)} for c in claims]} for s, claims in fresh if claims]
        cited |= {str(i) for _, claims in fresh for c in claims
                  for i in c.get("evidence_ids", [])}
    if "rankings" in of:
        inputs["rankings"] = [{"title": d.get("title", ""), "ranks": d.get("ranks", "risks"),
                               "criteria": d.get("criteria", []), "items": d.get("risks", [])}
                              for d in src.rankings]
        cited |= {str(i) for r in src.risks() for i in r.get("evidence_ids", [])}
    texts: dict[str, str] = {}
    rests_on: dict[str, list[str]] = {}
    if "rankings" in of:
        # Each ranked item is citable (its criteria, score and rationale): a recommendation
        # that an option ranks last rests on the ranking, not only on quotes.
        texts, rests_on = citable_rankings(src.rankings)
        for ranking, doc in zip(inputs["rankings"], src.rankings, strict=True):
            if doc.get("unit"):
                ranking["items"] = [{**r, "record_id": f"{doc['unit']}.{r.get('id', '')}"}
                                    for r in ranking["items"]]
    if "conflicts" in of or "findings" in of:
        # A disagreement is citable (its sides, class, the value used and why, the sources'
        # dates): a sentence saying which value holds rests on it.
        texts |= citable_conflicts(src.conflicts)
        rests_on |= conflict_evidence(src.conflicts)
    if "conflicts" in of:
        inputs["conflicts"] = src.conflicts
        cited |= {s["evidence_id"] for c in src.conflicts for s in c["sides"]}
    if "gaps" in of:
        inputs["gaps"] = [g for s in src.syntheses for g in s.get("gaps") or []]
    if "evidence" in of:
        cited |= {str(e["id"]) for e in src.evidence}
    quotes = {i: src.quotes[i] for i in cited if i in src.quotes}
    cited_records = {k: v for k, v in texts.items()
                     if not rests_on.get(k) or set(rests_on[k]) & set(src.quotes)}
    return _sentences_step(ctx, src, document, section, inputs, quotes,
                           (cited_records, rests_on), words)


def _covers(params: RenderParams, names: list[str]) -> set[str]:
    """The parts the template's placeholders show (a written section: what it is made of),
    so one part leaves to another what that one says (a gaps section lists the gaps)."""
    out: set[str] = set()
    for name in names:
        spec = params.fill.get(name)
        if isinstance(spec, str):
            spec = FillSpec(part=spec)
        part = spec.part if spec is not None else name
        out |= set(spec.of) if part == "section" and spec is not None else {part}
    return out


def _recommends(params: RenderParams, names: list[str]) -> bool:
    """Whether the template recommends a course: a placeholder named ``recommendation`` or
    filled with the recommendation part."""
    for name in names:
        spec = params.fill.get(name)
        part = spec if isinstance(spec, str) else spec.part if spec is not None else name
        if "recommendation" in (name, part):
            return True
    return False


def _fill_values(ctx: UnitContext, params: RenderParams, names: list[str], src: Sources
                 ) -> tuple[dict[str, str], list[str], list[StepResult], list[str]]:
    """A value for every placeholder, in the template's order (so an item shows once);
    the names nothing fills, the model steps, and the written sections that failed."""
    values: dict[str, str] = {}
    unknown: list[str] = []
    steps: list[StepResult] = []
    failed: list[str] = []
    base = src.base_values()
    writes = not ctx.model_profile().offline
    for name in names:
        spec = params.fill.get(name)
        if isinstance(spec, str):
            spec = FillSpec(part=spec)
        part = spec.part if spec is not None else name
        if spec is None and name in base:
            values[name] = base[name]
            continue
        if writes and (name == params.prose or (part == "section" and spec is not None)):
            ctx.safe_point(f"write the {name} of {params.document}")
            if part == "section" and spec is not None:
                section_src = Sources(ctx, spec.from_) if spec.from_ else src
                section_src.shown, section_src.written = src.shown, src.written
                section_src.covers = src.covers
                text, made = _written_section(ctx, section_src, params.document, name,
                                              list(spec.of), spec.words)
            else:
                text, made = _prose(ctx, src, params.document, name)
            steps += made
            if text is not None:
                values[name] = text
                _mark_restated(src, text)
                continue
            failed += [f"{name}: {p.line()}" for p in made[0].problems]
        try:
            values[name] = fill_part(ctx, part, spec, src)
        except KeyError:
            unknown.append(name)
            values[name] = "{{ " + name + " }}"
    return values, unknown, steps, failed


_FOOTNOTE_QUOTE_CHARS = 220


def _mark_restated(src: Sources, written: str) -> None:
    """Findings a written section restates (their words within its text) count as shown,
    so a later part does not repeat them."""
    said = " ".join(written.lower().split())
    for s in src.syntheses:
        for c in s.get("claims", []):
            key = " ".join(str(c.get("text", "")).lower().split())
            if key and key in said:
                src.shown.add(key)


_WORDS_RE = re.compile(r"[a-z0-9]+")


def adds_to_title(locator: str, title: str) -> bool:
    """Whether ``locator`` tells a reader more than the source's ``title``: not when every
    word of it is a word of the title ("Tariff notice" in "Kelvmoor Port tariff notice");
    a page, sheet, slide or another section does."""
    words = set(_WORDS_RE.findall(locator.lower()))
    return bool(words) and not words <= set(_WORDS_RE.findall(title.lower()))


def with_footnotes(text: str, src: Sources) -> str:
    """Citations a reader can follow: each ``[ids] (source, locator; ...)`` becomes the
    sources' titles and locators, followed by one numbered footnote per quote it cites — the
    quote, its evidence id, source title and locator — and a quote cited again reuses its
    number, so a sentence resting on three quotes points at three short notes, never one
    note bundling them. Each footnote keeps the ``[id] (source, locator)`` form, so the audit
    reads the same ids and sources back (``expand_footnotes`` merges a citation's notes)."""
    notes: dict[str, int] = {}  # evidence id -> its footnote number

    def place(i: str) -> str:
        sid = src.index[i]["source_id"] if i in src.index else ""
        title = src.titles.get(sid, "")
        name = f"{title} ({sid})" if title else sid
        loc = src.index.get(i, {}).get("locator", "") or ""
        return f"{name}, {loc}" if loc and adds_to_title(loc, title) else name

    def sub(match: re.Match[str]) -> str:
        whole = match.group(0)
        ids = sorted(cited_evidence_ids(whole), key=natural_key)
        if not ids:
            return whole
        where: dict[str, list[str]] = {}
        for i in ids:
            if i in src.index and src.index[i]["source_id"]:
                locs = where.setdefault(src.index[i]["source_id"], [])
                loc = src.index[i].get("locator", "")
                if loc and loc not in locs:
                    locs.append(loc)
        places = []
        for sid, locs in where.items():
            title = src.titles.get(sid, "")
            name = f"{title} ({sid})" if title else sid
            # A locator that only repeats the title ("Broker note on newbuild prices" for the
            # broker note) tells the reader nothing: shown only when it adds a place.
            locs = [loc for loc in locs if adds_to_title(loc, title)]
            places.append(f"{name}, {' · '.join(locs)}" if locs else name)
        human = "; ".join(places) or ", ".join(ids)
        numbers = sorted(notes.setdefault(i, len(notes) + 1) for i in ids)
        refs = "".join(f"[^{n}]" for n in numbers)
        return f"({human.replace('|', '/')}){refs}"

    body = LOCATED_CITE_RE.sub(sub, text)
    if not notes:
        return text
    lines = ["", "---", ""]
    for i, n in notes.items():
        own = cite([i], src.index, locators=True)
        quote = f": “{_short(src.quotes[i])}”" if src.quotes.get(i) else ""
        lines.append(f"[^{n}]: {own} — {place(i).replace('|', '/')}{quote}")
    return body.rstrip("\n") + "\n" + "\n".join(lines) + "\n"


_BRACKETED_RE = re.compile(r"\[[^\]\n]*\]")
_PROSE_ID_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9]*)-e\d+\b")


def without_prose_ids(text: str) -> str:
    """``text`` with each evidence id a sentence names in its words ("the broker note (R1-e3)
    advises") replaced by its source's id ("(R1)"): an evidence id means nothing to a reader.
    Citations keep theirs (a footnote's "[R1-e3]", a bracketed citation), and so does a table
    cell holding only an id (the evidence appendix's first column)."""
    def line_of(line: str) -> str:
        if line.startswith("[^"):
            return line  # a footnote: the citation itself
        if line.startswith("|"):
            cells = line.split("|")
            return "|".join(c if _PROSE_ID_RE.fullmatch(c.strip()) else _words_of(c)
                            for c in cells)
        return _words_of(line)
    return "\n".join(line_of(line) for line in text.split("\n"))


def _words_of(text: str) -> str:
    out, at = [], 0
    for m in _BRACKETED_RE.finditer(text):
        out += [_PROSE_ID_RE.sub(r"\1", text[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join([*out, _PROSE_ID_RE.sub(r"\1", text[at:])])


def _short(quote: str) -> str:
    text = " ".join(quote.split()).replace("|", "/")
    return text if len(text) <= _FOOTNOTE_QUOTE_CHARS else \
        text[: _FOOTNOTE_QUOTE_CHARS - 1] + "…"


def repeated_items(text: str) -> list[str]:
    """List items citing evidence (findings, ranked items) that appear more than once in a
    document (a template's own fixed text may repeat)."""
    seen: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(?:\d+[.)]|[-*+])\s+(.{40,})$", line)
        if m and cited_evidence_ids(line):
            key = " ".join(m.group(1).split())
            seen[key] = seen.get(key, 0) + 1
    return [k for k, n in seen.items() if n > 1]


def render_text(template: str, values: dict[str, str]) -> str:
    """The template rendered with ``values`` (Jinja2, no escaping, trailing newline kept)."""
    import jinja2

    from keepstep.engine.files.sandbox import render_bounded, template_env  # jinja2: lazy

    env = template_env(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return render_bounded(env.from_string(template), values, what="the template")


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    shape: list[str] = []
    steps: list[StepResult] = []
    try:
        params = RenderParams.model_validate(ctx.unit.params)
    except ValidationError as exc:
        detail = "; ".join(f"params.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                           for e in exc.errors())
        return KindOutcome(validators=[result("structure", [detail])])
    document, name = params.document, params.template
    output = document_output(ctx.unit)
    if name not in ctx.unit.input_refs("template"):
        shape.append(f"params.template {name!r} is not declared as a template:<name> input")
        template = ""
    else:
        template = ctx.template_text(name)
    src = Sources(ctx)

    if document_format(ctx.unit) == "csv":
        text, problems = _evidence_table(src, template, params)
        shape += problems
        rows = list(csv.DictReader(io.StringIO(text)))
        citations = [f"row {r.get('id')} is not verified evidence of the dependencies"
                     for r in rows if r.get("id") not in src.index]
        cited_sources = {r["source_id"] for r in rows if r.get("source_id")}
        facts: dict[str, Any] = {"document": document, "rows": len(rows)}
        media = CSV
    else:
        bad = syntax_error(template)
        if bad:
            shape.append(f"template {name} is not valid Jinja2: {bad}")
            text, unknown = template, list[str]()
        else:
            names = placeholders(template)
            src.covers = _covers(params, names)
            src.recommends = _recommends(params, names)
            if src.covers & {"risks", "rankings"}:
                src.ranks = [str(d["ranks"]) for d in src.rankings if d.get("risks")
                             and str(d.get("ranks") or "risks") != "risks"]
            values, unknown, steps, failed = _fill_values(ctx, params, names, src)
            shape += failed
            # The section markers stay in the template (the audit finds a section by its
            # template's heading); a reader's document carries none.
            text = strip_sections(render_text(template, values), template)
            repeats = [r for r in repeated_items(text)
                       if not any(isinstance(f, FillSpec) and f.repeat
                                  for f in params.fill.values())]
            shape += [f"repeats across sections: {r[:80]}" for r in repeats]
            first = src.offline_notice()
            if first:
                text = first + "\n\n" + text
            if "notice" not in names and src.notice_line():
                # Every document names the models that answered, whatever its template.
                text = text.rstrip("\n") + "\n\n" + src.notice_line() + "\n"
            text = without_prose_ids(with_footnotes(text, src))
        shape += [f"template {name} uses unknown placeholder {{{{{u}}}}}" for u in unknown]
        cited = cited_evidence_ids(text)
        cited_sources = cited_source_ids(text)
        known_sources = {v["source_id"] for v in src.index.values()} | {
            s["id"] for s in src.inventory}
        citations = [f"cites unknown evidence {i}" for i in sorted(cited - set(src.index))]
        citations += [f"cites unknown source {s}" for s in sorted(cited_sources - known_sources)]
        facts = {"document": document, "cited_evidence": len(cited), "audience": src.audience}
        media = MARKDOWN
    if not text.strip():
        shape.append("the document is empty")
    sources = sorted(cited_sources, key=natural_key)
    ctx.write(output, text, media_type=media, source_ids=sources)
    return KindOutcome(
        validators=[result("structure", shape, f"{output} rendered"),
                    result("citations", citations, "every cited id is verified evidence")],
        facts=facts,
        problems=[p.model_dump() for s in steps[:1] for p in s.problems],
        answers=[a for s in steps for a in s.answers],
    )


__all__ = ["RenderAnswer", "render_text", "run", "table_columns"]
