"""extract: candidate evidence from each of the unit's approved sources (one model step each).

Each source is read as its converted text (``UnitContext.converted_source``: Markdown with
headings, pipe tables and locators, whatever the file's format — PDF, DOCX, XLSX, CSV, PPTX,
HTML, TXT or MD; converted once and cached). Sources are visited in id order with a safe
point before every conversion and every call, so a cancel, a lost lease or a budget stop lands
between them (a conversion itself stops soon after a cancel). A source whose prompt would not
fit the model's window is split into chunks on paragraph boundaries, and a long table between
rows (each chunk repeating the table's header); each chunk's INPUT carries ``first_id`` so
evidence ids count on across chunks exactly as they would in one piece. The whole unit is
planned before its first call, so a paragraph too long for any request is refused before
anything is paid.

The answer is checked by rules, fed back in revise rounds: the cited source must be the one
in INPUT, the quote must occur in its text verbatim (a table row is quoted as its cells
joined by `` | ``), ids are ``<source>-e<n>``, every figure occurs in its quote, and the
evidence schema's required fields are filled. Each item then gets its ``locator`` — where the
quote is in the source: ``p. 4``, ``'Volume tiers'!A6:C6``, ``slide 2``, ``Pricing > Tiers``
— and the citations validator checks every quote verbatim at its locator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.files.convert import ConvertedSource
from keepstep.engine.files.convert.spill import TextFile
from keepstep.engine.gateway.answers import Problem, problem
from keepstep.engine.gateway.prompts import PARAGRAPH_MARK
from keepstep.engine.kinds.claims import word_numbers
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    QuoteLocator,
    collapse_ws,
    dep_with_param,
    dump_json,
    natural_key,
    notices,
    quote_cited,
    result,
    structure_problems,
)
from keepstep.engine.kinds.conflicts import Quantity
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.model_step import StepResult, render_step, run_model_step, step_tokens
from keepstep.engine.kinds.source_chunks import Chunk, json_tokens, plan_chunks

OUTPUT = "evidence.json"
PROMPT = "extract"
_CITATION_RULES = ("verbatim", "known_source")
# Room kept free in each request for what token counts cannot see exactly.
_MARGIN = 0.9
# A text this many times the window in characters cannot fit: not rendered whole to find out.
_CHARS_PER_TOKEN_BOUND = 8
# Chat templates add a few tokens per message (role markers): a safe allowance.
_PER_MESSAGE_TOKENS = 16

SPEC = KindSpec(
    name="extract",
    uses_model=True,
    validators=["structure", "citations"],
    default_outputs=[OUTPUT],
    description="One extract step per approved source of the unit, read as converted text "
    "(chunked on paragraph and table-row boundaries when a source does not fit the model's "
    "window); candidate evidence with verbatim quotes, figures and locators.",
)


EVIDENCE_KINDS = ("fact", "figure", "requirement", "obligation", "opinion", "recommendation",
                  "caveat", "forecast", "definition")
RELEVANCE = ("high", "medium", "low")


class EvidenceItem(BaseModel):
    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    id: str = Field(description="<source_id>-e<n>, n counting up in document order")
    source_id: str = Field(description="the source id given in INPUT")
    quote: str = Field(description="one whole sentence, or one table row with its cells "
                       "joined by ' | ', copied character for character from the source text")
    kind: Literal["fact", "figure", "requirement", "obligation", "opinion", "recommendation",
                  "caveat", "forecast", "definition"] = Field(
        default="fact", description="what kind of statement the quote is")
    relevance: Literal["high", "medium", "low"] = Field(
        default="medium", description="how directly the quote bears on the question")
    figures: list[str] = Field(description="every number of the quote, as written there "
                               "([] for a statement without numbers)")
    quantities: list[Quantity] = Field(
        default_factory=list, description="one entry per figure that measures something: "
        "the figure as written and what it means")
    qualifies: list[str] = Field(
        default_factory=list, description="for a caveat or a definition: the ids of the items "
        "it qualifies")
    topic: str | None = Field(default=None, description="the topic the quote fits best")


class ExtractAnswer(BaseModel):
    """The extract step's answer: the evidence statements found (empty: none found)."""

    model_config = ConfigDict(extra="allow")

    evidence: list[EvidenceItem]


def evidence_schema(ctx: UnitContext) -> dict[str, Any] | None:
    """The evidence schema a schema intake unit published, if one is a dependency."""
    schema_unit = dep_with_param(ctx, UnitKind.intake, "step", "schema")
    if schema_unit is None:
        return None
    doc = ctx.dep_json(schema_unit.id, "evidence-schema.json")
    return doc if isinstance(doc, dict) else None


def required_fields(ctx: UnitContext) -> list[str]:
    """The evidence schema's required fields when a schema unit is a dependency."""
    doc = evidence_schema(ctx)
    required = doc.get("required") if doc else None
    return [str(f) for f in required] if isinstance(required, list) else list(EVIDENCE_REQUIRED)


def answer_schema(item_schema: dict[str, Any] | None,
                  topics: list[str] | None = None) -> dict[str, Any]:
    """The answer's JSON Schema (what the model is told to return): the published item schema
    when there is one, with the fields ``EvidenceItem`` adds that it lacks (kind, relevance,
    quantities, qualifies), the topic an enum of the topic names when the pack names topics."""
    own = ExtractAnswer.model_json_schema()
    defs = own.get("$defs", {})
    own_item = defs["EvidenceItem"]
    if item_schema:
        item = {k: v for k, v in item_schema.items() if k not in ("$schema", "title")}
        props = dict(item.get("properties") or {})
        for name in ("kind", "relevance", "quantities", "qualifies", "topic"):
            props.setdefault(name, own_item["properties"][name])
        item["properties"] = props
    else:
        item = dict(own_item)
        item["properties"] = dict(own_item["properties"])
    if topics:
        item["properties"]["topic"] = {"type": "string", "enum": list(topics),
                                       "description": "the topic (from INPUT topics) the "
                                       "quote fits best; null when none fits (there is no "
                                       "catch-all topic)"}
    schema: dict[str, Any] = {"title": "ExtractAnswer", "type": "object",
                              "required": ["evidence"],
                              "properties": {"evidence": {"type": "array", "items": item}}}
    if "Quantity" in defs:
        schema["$defs"] = {"Quantity": defs["Quantity"]}
    return schema


# --- what a prompt carries -------------------------------------------------------------------

_HEADER_KEYS = {"title": ("title",), "kind": ("type", "kind"),
                "date": ("date", "published", "updated", "as_of"),
                "publisher": ("publisher", "issuer", "author", "source", "organisation",
                              "organization")}


REGISTER = "source register"
DOCUMENT = "document"


def source_meta_with_origin(ctx: UnitContext, entry: Any
                            ) -> tuple[dict[str, str], dict[str, str]]:
    """What a prompt says of a source (id, title, kind, date, publisher, from sources.toml,
    else the source's header lines; empty fields left out) and where each of its fields came
    from: ``REGISTER`` (the project's sources.toml) or ``DOCUMENT`` (the source's own header
    lines), so a document can say whether a date it relies on is the source's own or the
    project's."""
    try:
        header = {k.lower(): v for k, v in ctx.source_header(entry.id).items()}
    except Exception:  # a header that cannot be read is no metadata, not a failure
        header = {}
    meta = {"id": entry.id}
    origin: dict[str, str] = {}
    for name, keys in _HEADER_KEYS.items():
        given = str(getattr(entry, name, "") or "")
        if name == "title" and given == entry.id:
            given = ""
        value = given or next((str(header[k]) for k in keys if header.get(k)), "")
        if value:
            meta[name] = value
            origin[name] = REGISTER if given else DOCUMENT
    return meta, origin


def _contract_field(ctx: UnitContext, *names: str) -> str:
    """The first of the contract ``names`` the unit reads (a ``contract:<name>`` input: so an
    edit of it invalidates the unit), '' when it reads none of them."""
    read = set(ctx.unit.input_refs("contract"))
    return next((str(ctx.contract.fields[n]).strip() for n in names
                 if n in read and ctx.contract.fields.get(n)), "")


def question_of(ctx: UnitContext) -> str:
    """The question the unit's evidence serves: its ``question`` param, else its title and
    the contract's goal (when the unit reads ``contract:goal``)."""
    given = str(ctx.unit.params.get("question") or "").strip()
    if given:
        return given
    goal = _contract_field(ctx, "goal")
    return f"{ctx.unit.title}" + (f" (toward: {goal})" if goal else "")


def today_of(ctx: UnitContext) -> str:
    """The contract's date (its ``date`` or ``today`` field, when the unit reads it) — what
    a prompt calls today."""
    return _contract_field(ctx, "date", "today")


def topic_view(ctx: UnitContext) -> dict[str, Any]:
    """The pack's topics as a prompt carries them: names with one-line descriptions. The
    keyword lists are the offline heuristic's side data: only its requests carry them
    (``offline_hints``), never a language model's."""
    raw = ctx.data("topics").get("topic")
    if not isinstance(raw, list):
        return {}
    topics = [t for t in raw if isinstance(t, dict) and t.get("name")]
    if not topics:
        return {}
    out: dict[str, Any] = {"topics": [
        {"name": str(t["name"]),
         "description": str(t.get("description") or "").strip()
         or str(t["name"]).replace("_", " ")} for t in topics]}
    if ctx.model_profile().offline:
        out["offline_hints"] = {"topic_keywords": {
            str(t["name"]): [str(k) for k in t.get("keywords", [])] for t in topics}}
    return out


def base_inputs(ctx: UnitContext, entry: Any, meta: dict[str, str]) -> dict[str, Any]:
    """The INPUT of an extract step without its text."""
    out: dict[str, Any] = {"task": "extract", "source_id": entry.id, "source": meta,
                           "question": question_of(ctx), **topic_view(ctx)}
    today = today_of(ctx)
    if today:
        out["today"] = today
    return out


# An evidence item's fields besides its quote (id, kind, relevance, figures, topic, ...), in
# tokens; what may end a statement (a sentence's end, a line: a table row, a list item).
_ITEM_TOKENS = 80
_STATEMENT_END_RE = re.compile(r"[.!?](?=\s)|\n")


def expected_answer(text: str) -> int:
    """Tokens an extract answer over ``text`` may take at most: every statement quoted
    (the text itself, ~4 characters a token) with an item's other fields each (it sizes
    the request's max_tokens)."""
    statements = len(_STATEMENT_END_RE.findall(text)) + 1
    return math.ceil(len(text) / 4) + _ITEM_TOKENS * statements


# --- chunks ----------------------------------------------------------------------------------

def paragraphs(text: str) -> list[str]:
    """The text's paragraphs (blank-line separated; a fenced block is never split)."""
    out: list[str] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith(("```", "~~~")):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                out.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        out.append("\n".join(current))
    return out


def _surely_fits(ctx: UnitContext, profile: Any, text: str | TextFile,
                 base: dict[str, Any], schema: dict[str, Any] | None) -> bool:
    """Whether the whole text fits in one request, shown without a tokenizer: no tokenizer
    makes more tokens than a text has UTF-8 bytes (plus a few per message), so a request
    whose bytes fit fits. Most sources are far below any window, and counting them exactly
    (three renders and tokenizer passes of the whole source) was a large part of a unit's
    time; a source near the limit is counted exactly, as before."""
    if not isinstance(text, str):
        return False  # a large source on disk: always chunked
    if len(text) > min(profile.input_tokens, profile.output_tokens):
        return False  # more characters than room: its bytes cannot show that it fits
    whole = {**base, "text": text}
    messages, _schema, _sha = render_step(ctx, prompt=PROMPT, inputs=whole,
                                          schema=ExtractAnswer, json_schema=schema)
    bound = sum(len(str(m.get("content") or "").encode()) + _PER_MESSAGE_TOKENS
                for m in messages) + _PER_MESSAGE_TOKENS
    room = int(min(profile.input_tokens - bound, profile.output_tokens) * _MARGIN)
    # count_text wraps the text in a message of its own: its allowance is counted too.
    return bound <= profile.input_tokens and len(text.encode()) + _PER_MESSAGE_TOKENS <= room


def _chunks(ctx: UnitContext, source_id: str, text: str | TextFile, base: dict[str, Any],
            schema: dict[str, Any] | None) -> list[Chunk]:
    """The text in one piece when its request fits, else chunks that each fit."""
    profile = ctx.model_profile()
    if _surely_fits(ctx, profile, text, base, schema):
        return [Chunk(0, len(text))]
    empty = {**base, "text": "", "first_id": 1}
    overhead = step_tokens(ctx, prompt=PROMPT, inputs=empty, schema=ExtractAnswer,
                           json_schema=schema)
    # An answer quotes the text, so a chunk is also kept within what an answer may hold —
    # a source in one piece too: a window of a million tokens does not make an answer that
    # long possible.
    room = int(min(profile.input_tokens - overhead, profile.output_tokens) * _MARGIN)
    # (A large source's text is on disk, millions of characters: it is chunked whatever the
    # window, never rendered whole.)
    if isinstance(text, str) and len(text) <= _CHARS_PER_TOKEN_BOUND * room:
        whole = {**base, "text": text}
        if step_tokens(ctx, prompt=PROMPT, inputs=whole, schema=ExtractAnswer,
                       json_schema=schema) <= profile.input_tokens \
                and profile.count_text(text) <= room:
            return [Chunk(0, len(text))]

    def too_large(n: int, size: int) -> Exception:
        return profile.too_large(
            f"{ctx.unit.id}: source {source_id}, paragraph {n} (it cannot be split further)",
            overhead + size)

    return plan_chunks(text, room, json_tokens(profile.count_text), too_large=too_large,
                       check=ctx.safe_point)


# --- rules -----------------------------------------------------------------------------------

def _digits(figure: str) -> float | None:
    """A figure written in digits alone ("4"), as a number; None otherwise."""
    return float(figure) if re.fullmatch(r"\d+", figure.strip()) else None


# A paragraph marker of the raw source block (``gateway.prompts.mark_paragraphs``).
_MARKER_RE = re.compile(rf"{PARAGRAPH_MARK}\d+\s?")


def _rules(text: str, source_id: str, required: list[str], topics: list[str]) -> Any:
    id_re = re.compile(rf"{re.escape(source_id)}-e(\d+)")
    collapsed = collapse_ws(text)

    def rules(answer: ExtractAnswer, inputs: Mapping[str, Any]) -> list[Problem]:
        first = inputs.get("first_id")
        problems: list[Problem] = []
        seen: set[str] = set()
        for n, item in enumerate(answer.evidence):
            at = f"evidence[{n}]"
            raw = item.model_dump()
            for name in required:
                if raw.get(name) in (None, "", []) and name != "figures":
                    problems.append(problem(f"{at}.{name}", "required",
                                            "the evidence schema requires it"))
            if item.source_id != source_id:
                problems.append(problem(f"{at}.source_id", "known_source",
                                        f"must be {source_id}, the source in INPUT",
                                        item.source_id))
            quoted = collapse_ws(item.quote)
            if not quoted or quoted not in collapsed:
                # A copied paragraph marker is not part of the text: the quote is not verbatim
                # (revised like any other), and the feedback says why.
                marker = _MARKER_RE.search(item.quote)
                problems.append(problem(f"{at}.quote", "verbatim", (
                    f"not found verbatim in {source_id}"
                    + (f": it copies the paragraph marker {marker.group(0).strip()}, which "
                       "is not part of the text" if marker else "")), item.quote))
            if not id_re.fullmatch(item.id):
                problems.append(problem(f"{at}.id", "id_format",
                                        f"ids are {source_id}-e<n>", item.id))
            elif item.id in seen:
                problems.append(problem(f"{at}.id", "unique", "the id appears twice", item.id))
            elif isinstance(first, int) and item.id != f"{source_id}-e{first + n}":
                problems.append(problem(f"{at}.id", "numbering",
                                        f"must be {source_id}-e{first + n} (numbered from "
                                        "first_id, in order)", item.id))
            seen.add(item.id)
            quote = collapse_ws(item.quote)
            # A number the quote writes in words ("four weeks") may be given in digits (4).
            words = word_numbers(quote)
            problems += [problem(f"{at}.figures", "invented_figure",
                                 "every figure must occur in the quote", f)
                         for f in item.figures if str(f) not in quote
                         and _digits(str(f)) not in words]
            problems += [problem(f"{at}.quantities[{q}].figure", "invented_figure",
                                 "a quantity's figure is a figure of the quote, as written "
                                 "there", quantity.figure)
                         for q, quantity in enumerate(item.quantities)
                         if not quantity.figure or (collapse_ws(quantity.figure) not in quote
                                                    and _digits(quantity.figure) not in words)]
            if topics and item.topic is not None and item.topic not in topics:
                problems.append(problem(f"{at}.topic", "known_topic",
                                        f"must be one of {', '.join(topics)}", item.topic))
        ids = {item.id for item in answer.evidence}
        for n, item in enumerate(answer.evidence):
            problems += [problem(f"evidence[{n}].qualifies", "known_id",
                                 "names an item of this answer (the statement it qualifies)",
                                 q) for q in item.qualifies if q not in ids and q != item.id
                         and not id_re.fullmatch(q)]
        return problems

    return rules


# --- entities ------------------------------------------------------------------------------

# A name in an entity: a capitalised word ("Brisland", "Yards", "EU").
_NAME_RE = re.compile(r"[A-Z][A-Za-z'&.-]*")
_WORD_RE = re.compile(r"[a-z0-9][a-z0-9'&.-]*")


def _named_in(name: str, haystack: set[str]) -> bool:
    """Whether a word of ``haystack`` (lowercase words) starts with ``name``'s stem (the
    name less up to two trailing letters, at least four: "Germany" is named by "German")."""
    name = name.lower().removesuffix("'s")
    stem = name[:max(4, len(name) - 2)]
    return any(w.startswith(stem) for w in haystack)


def unnamed_entities(items: list[Any], meta: Mapping[str, str]) -> list[str]:
    """Blank each quantity's ``entity`` that names an organisation neither its quote nor its
    source's title or publisher names (an entity inferred from another sentence or source:
    "Brisland Yards" for "Delivery takes about 30 months", said two lines after a sentence
    naming the yard); one note per blanked entity. An entity in the source's own words
    without a name ("the yard") stays. Code checks what the extract prompt's rule says, so
    no writer reads an inferred owner as the source's."""
    notes: list[str] = []
    context = " ".join(str(meta.get(k) or "") for k in ("title", "publisher"))
    for item in items:
        if not isinstance(item, dict):
            continue
        haystack = set(_WORD_RE.findall(f"{item.get('quote', '')} {context}".lower()))
        for q in item.get("quantities") or []:
            if not isinstance(q, dict) or not str(q.get("entity") or "").strip():
                continue
            names = _NAME_RE.findall(str(q["entity"]))
            if names and not any(_named_in(n, haystack) for n in names):
                notes.append(f"{item.get('id')}: entity \"{q['entity']}\" of figure "
                             f"{q.get('figure')} is named by neither its quote nor its "
                             "source's title or publisher: left blank (never inferred)")
                q["entity"] = ""
    return notes


# --- the kind --------------------------------------------------------------------------------

def _locate(items: list[Any], conv: ConvertedSource, chunk: Chunk) -> int:
    """Give each item the locator of its quote within the chunk; how many cite a table row."""
    rows = 0
    where = QuoteLocator(conv, chunk.start, chunk.end)
    for item in items:
        if not isinstance(item, dict):
            continue
        hint = item.get("locator")
        locator = where.locate(str(item.get("quote", "")),
                               hint=hint if isinstance(hint, str) else None)
        if locator:
            item["locator"] = locator
            rows += 1 if conv.kind_of(locator) == "table-row" else 0
        else:
            item.pop("locator", None)  # outside every located part: the text as a whole
    return rows


def _citation_problems(evidence: list[Any], convs: dict[str, ConvertedSource],
                       unit_id: str) -> list[str]:
    problems: list[str] = []
    for item in evidence:
        if not isinstance(item, dict):
            continue
        sid = str(item.get("source_id", ""))
        quote = str(item.get("quote", ""))
        locator = item.get("locator")
        if sid not in convs:
            problems.append(f"{item.get('id')} cites {sid or 'no source'}, not a source of "
                            f"{unit_id}")
        elif locator and not quote_cited(convs[sid], quote, str(locator)):
            problems.append(f"{item.get('id')}: quote not found verbatim at {sid}, {locator}")
        elif not locator and not quote_cited(convs[sid], quote, None):
            problems.append(f"{item.get('id')}: quote not found verbatim in {sid}")
    return problems


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    sources = sorted(ctx.sources_for_unit(), key=lambda s: natural_key(s.id))
    required = required_fields(ctx)
    topics = [str(t["name"]) for t in topic_view(ctx).get("topics", [])]
    schema = answer_schema(evidence_schema(ctx), topics)
    convs: dict[str, ConvertedSource] = {}
    for n, source in enumerate(sources, start=1):
        ctx.safe_point(f"convert {source.id} ({n}/{len(sources)})")
        convs[source.id] = ctx.converted_source(source.id)
    with_origin = {s.id: source_meta_with_origin(ctx, s) for s in sources}
    metas = {sid: m for sid, (m, _) in with_origin.items()}
    bases = {s.id: base_inputs(ctx, s, metas[s.id]) for s in sources}
    planned = {s.id: _chunks(ctx, s.id, convs[s.id].text, bases[s.id], schema)
               for s in sources}
    evidence: list[Any] = []
    responses: list[dict[str, Any]] = []
    steps: list[tuple[str, StepResult]] = []
    shape: list[str] = [] if sources else ["the unit names no approved sources"]
    table_rows = 0
    blanked: list[str] = []
    for n, source in enumerate(sources, start=1):
        conv = convs[source.id]
        chunks = planned[source.id]
        next_id = 1
        for c, chunk in enumerate(chunks, start=1):
            part = f" part {c}/{len(chunks)}" if len(chunks) > 1 else ""
            ctx.safe_point(f"extract {source.id}{part} ({n}/{len(sources)})")
            # A large source's text is never read whole: even a single chunk is cut from it.
            text = chunk.text(conv.text) if len(chunks) > 1 or not isinstance(conv.text, str) \
                else conv.text
            inputs: dict[str, Any] = {**bases[source.id], "text": text}
            if len(chunks) > 1:
                inputs["first_id"] = next_id
            step = run_model_step(ctx, prompt=PROMPT, inputs=inputs, schema=ExtractAnswer,
                                  rules=_rules(text, source.id, required, topics),
                                  json_schema=schema,
                                  label=f"{source.id}{part}",
                                  answer_tokens=expected_answer(text))
            steps.append((f"{source.id}{part}", step))
            responses.append(step.parsed)
            items = step.parsed.get("evidence")
            if not isinstance(items, list):
                shape.append(f"the response for {source.id}{part} has no evidence list")
                continue
            next_id += len(items)
            table_rows += _locate(items, conv, chunk)
            blanked += unnamed_entities(items, metas[source.id])
            for item in items:
                if isinstance(item, dict) and "group" not in item:
                    item = {**item, "group": source.group}
                evidence.append(item)

    shape += structure_problems(evidence, required, "evidence")
    # What the rules found and the revise rounds did not fix (the citation rules are
    # reported by the citations validator below).
    shape += [f"{label}: {p.line()}" for label, step in steps for p in step.problems
              if p.rule not in _CITATION_RULES]
    citations = _citation_problems(evidence, convs, ctx.unit.id)

    doc = {"sources": [s.id for s in sources], "source_meta": metas,
           "source_meta_from": {sid: o for sid, (_, o) in with_origin.items()},
           "evidence": evidence,
           "notice": "; ".join(notices(*responses)),
           "models": sorted({m for _, s in steps for m in s.models})}
    ctx.write(OUTPUT, dump_json(doc), media_type=JSON, source_ids=[s.id for s in sources])
    facts: dict[str, Any] = {"evidence_count": len(evidence), "sources": len(sources)}
    chunked = sum(1 for c in planned.values() if len(c) > 1)
    if chunked:
        facts["chunked_sources"] = chunked
    if table_rows:
        facts["table_rows"] = table_rows
    if blanked:
        facts["entities_not_named"] = blanked
    formats = sorted({c.format for c in convs.values()} - {"md"})
    if formats:
        facts["formats"] = formats
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(evidence)} evidence item(s)"),
            result("citations", citations,
                   "every quote found verbatim in its cited source, at its locator"),
        ],
        facts=facts,
        problems=[p.model_dump() for _, s in steps for p in s.problems],
        answers=[a for _, s in steps for a in s.answers],
    )
