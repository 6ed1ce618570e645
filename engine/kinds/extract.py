"""extract: candidate evidence from each of the unit's approved sources (one model step each).

Sources are visited in id order with a safe point before every call, so a cancel, a lost
lease or a budget stop lands between sources. A source whose prompt would not fit the
model's window is split into chunks on paragraph boundaries; each chunk's INPUT carries
``first_id`` so evidence ids count on across chunks exactly as they would in one piece. The
whole unit is planned before its first call, so a paragraph too long for any request is
refused before anything is paid.

The answer is checked by rules, fed back in revise rounds: the cited source must be the one
in INPUT, the quote must occur in its text verbatim, ids are ``<source>-e<n>``, every figure
occurs in its quote, and the evidence schema's required fields are filled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.gateway.answers import Problem, problem
from keepstep.engine.kinds.common import (
    EVIDENCE_REQUIRED,
    JSON,
    collapse_ws,
    dep_with_param,
    dump_json,
    natural_key,
    notices,
    quote_in_text,
    result,
    structure_problems,
    topic_inputs,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.model_step import StepResult, run_model_step, step_tokens

OUTPUT = "evidence.json"
PROMPT = "extract"
_CITATION_RULES = ("verbatim", "known_source")
# Room kept free in each request for what token counts cannot see exactly.
_MARGIN = 0.9

SPEC = KindSpec(
    name="extract",
    uses_model=True,
    validators=["structure", "citations"],
    default_outputs=[OUTPUT],
    description="One extract step per approved source of the unit (chunked on paragraph "
    "boundaries when a source does not fit the model's window); candidate evidence with "
    "verbatim quotes and figures.",
)


class EvidenceItem(BaseModel):
    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    id: str = Field(description="<source_id>-e<n>, n counting up in document order")
    source_id: str = Field(description="the source_id given in INPUT")
    quote: str = Field(description="the sentence, verbatim from the source text")
    figures: list[str] = Field(description="the numbers of the quote, as written there")
    topic: str | None = Field(default=None, description="one topic word")


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


def answer_schema(item_schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The answer's JSON Schema built around the published item schema (what the model is
    told to return), or None to use ``ExtractAnswer``'s own."""
    if not item_schema:
        return None
    item = {k: v for k, v in item_schema.items() if k not in ("$schema", "title")}
    return {"title": "ExtractAnswer", "type": "object", "required": ["evidence"],
            "properties": {"evidence": {"type": "array", "items": item}}}


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


def _chunks(ctx: UnitContext, source_id: str, text: str,
            schema: dict[str, Any] | None) -> list[str]:
    """The text in one piece when its request fits, else paragraph chunks that each fit."""
    profile = ctx.model_profile()
    whole = {"task": "extract", "source_id": source_id, "text": text, **topic_inputs(ctx)}
    if step_tokens(ctx, prompt=PROMPT, inputs=whole, schema=ExtractAnswer,
                   json_schema=schema) <= profile.input_tokens:
        return [text]
    empty = {"task": "extract", "source_id": source_id, "text": "", "first_id": 1,
             **topic_inputs(ctx)}
    overhead = step_tokens(ctx, prompt=PROMPT, inputs=empty, schema=ExtractAnswer,
                           json_schema=schema)
    # An answer quotes the text, so a chunk is also kept within what an answer may hold.
    room = int(min(profile.input_tokens - overhead, profile.output_tokens) * _MARGIN)
    chunks: list[str] = []
    current: list[str] = []
    used = 0
    for n, para in enumerate(paragraphs(text), start=1):
        size = profile.count_text(json.dumps(para + "\n\n"))
        if size > room:
            raise profile.too_large(
                f"{ctx.unit.id}: source {source_id}, paragraph {n} (it cannot be split further)",
                overhead + size)
        if current and used + size > room:
            chunks.append("\n\n".join(current) + "\n")
            current, used = [], 0
        current.append(para)
        used += size
    if current:
        chunks.append("\n\n".join(current) + "\n")
    return chunks


# --- rules -----------------------------------------------------------------------------------

def _rules(text: str, source_id: str, required: list[str]) -> Any:
    id_re = re.compile(rf"{re.escape(source_id)}-e(\d+)")

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
            if not quote_in_text(item.quote, text):
                problems.append(problem(f"{at}.quote", "verbatim",
                                        f"not found verbatim in {source_id}", item.quote))
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
            problems += [problem(f"{at}.figures", "invented_figure",
                                 "every figure must occur in the quote", f)
                         for f in item.figures if str(f) not in quote]
        return problems

    return rules


# --- the kind --------------------------------------------------------------------------------

@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    sources = sorted(ctx.sources_for_unit(), key=lambda s: natural_key(s.id))
    required = required_fields(ctx)
    schema = answer_schema(evidence_schema(ctx))
    texts = {s.id: ctx.source_text(s.id) for s in sources}
    planned = {s.id: _chunks(ctx, s.id, texts[s.id], schema) for s in sources}
    evidence: list[Any] = []
    responses: list[dict[str, Any]] = []
    steps: list[tuple[str, StepResult]] = []
    shape: list[str] = [] if sources else ["the unit names no approved sources"]
    for n, source in enumerate(sources, start=1):
        chunks = planned[source.id]
        next_id = 1
        for c, chunk in enumerate(chunks, start=1):
            part = f" part {c}/{len(chunks)}" if len(chunks) > 1 else ""
            ctx.safe_point(f"extract {source.id}{part} ({n}/{len(sources)})")
            inputs: dict[str, Any] = {"task": "extract", "source_id": source.id, "text": chunk,
                                      **topic_inputs(ctx)}
            if len(chunks) > 1:
                inputs["first_id"] = next_id
            step = run_model_step(ctx, prompt=PROMPT, inputs=inputs, schema=ExtractAnswer,
                                  rules=_rules(chunk, source.id, required), json_schema=schema,
                                  label=f"{source.id}{part}")
            steps.append((f"{source.id}{part}", step))
            responses.append(step.parsed)
            items = step.parsed.get("evidence")
            if not isinstance(items, list):
                shape.append(f"the response for {source.id}{part} has no evidence list")
                continue
            next_id += len(items)
            for item in items:
                if isinstance(item, dict) and "group" not in item:
                    item = {**item, "group": source.group}
                evidence.append(item)

    shape += structure_problems(evidence, required, "evidence")
    # What the rules found and the revise rounds did not fix (the citation rules are
    # reported by the citations validator below).
    shape += [f"{label}: {p.line()}" for label, step in steps for p in step.problems
              if p.rule not in _CITATION_RULES]
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
    facts: dict[str, Any] = {"evidence_count": len(evidence), "sources": len(sources)}
    chunked = sum(1 for c in planned.values() if len(c) > 1)
    if chunked:
        facts["chunked_sources"] = chunked
    return KindOutcome(
        validators=[
            result("structure", shape, f"{len(evidence)} evidence item(s)"),
            result("citations", citations, "every quote found in its cited source"),
        ],
        facts=facts,
        problems=[p.model_dump() for _, s in steps for p in s.problems],
        answers=[a for _, s in steps for a in s.answers],
    )
