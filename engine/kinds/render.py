"""render: any template into any named document, filled from the dependencies (no model).

``params.document`` names the document (audits and deliveries refer to it), ``params.template``
the template (declared as a ``template:<name>`` input; the file is ``templates/<name>.md``).
A Markdown template is Jinja2: each placeholder is filled with a part (``kinds.parts.PARTS``:
findings, risks, inventory, …, drawn from what the dependencies wrote) — by its own name, or
by ``params.fill`` mapping the template's names onto parts (``{ pricing = { part =
"findings", from = ["S02"] } }``); any contract field the contract dependency carries is a
placeholder too. An unknown placeholder fails the structure validator (and ``keepstep
validate``). Sections marked ``<!-- section: id -->`` pass into the document, so an audit can
find them. A CSV document (``format = "csv"``, or an output ending in .csv) lists verified
statements, its columns the template's Markdown list items.
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

from pydantic import BaseModel, ConfigDict, ValidationError

from keepstep.engine.core.presets import (
    FillSpec,
    RenderParams,
    document_format,
    document_output,
)
from keepstep.engine.core.templates import placeholders, syntax_error
from keepstep.engine.kinds.common import (
    CSV,
    MARKDOWN,
    cite,
    cited_evidence_ids,
    cited_source_ids,
    natural_key,
    result,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.model_step import StepResult, run_model_step
from keepstep.engine.kinds.parts import (
    PARTS,
    TABLE_COLUMNS,
    TOP_RISKS,
    Sources,
    fill_part,
    with_provenance,
)
from keepstep.engine.kinds.synthesize import Claim, claim_rules

# A column of a table template: a list item such as "- source_id" or "- `quote`".
_COLUMN_ITEM_RE = re.compile(r"^\s*[-*+]\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*$", re.MULTILINE)

SPEC = KindSpec(
    name="render",
    uses_model=False,
    validators=["structure", "citations"],
    default_outputs=[],
    description="Render any template into a named document from the dependencies' artifacts "
    "(Markdown via Jinja2 placeholders filled with parts, or a CSV table of statements).",
)


class RenderAnswer(BaseModel):
    """The render step's answer: the section's sentences, each citing evidence ids."""

    model_config = ConfigDict(extra="allow")

    sentences: list[Claim]


def table_columns(template: str) -> list[str]:
    """A table document's columns: the template's Markdown list items, in order."""
    return [m.group(1) for m in _COLUMN_ITEM_RE.finditer(template)]


def known_placeholders(params: RenderParams, contract_fields: set[str]) -> set[str]:
    """The names a template of this unit may use: the parts, ``fill``'s names and the
    contract fields."""
    return set(PARTS) | set(params.fill) | set(contract_fields)


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
    rows = sorted(src.evidence, key=lambda e: natural_key(str(e["id"])))
    if params.rows is not None:
        if params.rows.cited_by:
            wanted = _cited_by(src, params.rows.cited_by)
            rows = [e for e in rows if str(e["id"]) in wanted]
        if params.rows.topic:
            rows = [e for e in rows if e.get("topic") in params.rows.topic]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for e in rows:
        row = {**{k: str(e.get(k, "")) for k in TABLE_COLUMNS},
               "group": str(e.get("group") or src.index.get(str(e["id"]), {}).get("group", "")),
               "figures": "; ".join(str(f) for f in e.get("figures", []))}
        writer.writerow([row.get(h, "") for h in header])
    return out.getvalue(), problems


def _prose(ctx: UnitContext, src: Sources, document: str,
           section: str) -> tuple[str | None, StepResult]:
    """The model-written section (``None`` when the step failed) and the step."""
    findings = [{"title": s.get("title", ""), "question": s.get("question", ""),
                 "claims": [{"text": c.get("text", ""), "evidence_ids": c.get("evidence_ids", [])}
                            for c in s.get("claims", [])]} for s in src.syntheses]
    risks = [{"title": r["title"], "score": r["score"], "evidence_ids": r["evidence_ids"]}
             for r in src.risks()[:TOP_RISKS]]
    quotes = {str(e["id"]): str(e.get("quote", "")) for e in src.evidence}
    # Ids cited by a finding or risk but not among the verified evidence given here carry
    # the text that cites them, so a sentence restating that text passes the figure rule.
    for item in [c for f in findings for c in f["claims"]] + [
            {"text": r["title"], "evidence_ids": r["evidence_ids"]} for r in risks]:
        for i in item["evidence_ids"]:
            quotes[str(i)] = quotes.get(str(i), "") + " " + str(item["text"])
    inputs = {"task": "render", "document": document, "section": section,
              "audience": src.audience, "findings": findings, "risks": risks,
              "evidence": {k: v.strip() for k, v in sorted(quotes.items())}}
    step = run_model_step(ctx, prompt="render", inputs=inputs, schema=RenderAnswer,
                          rules=claim_rules("sentences", quotes))
    if not step.ok:
        return None, step
    lines = [f"- {c.text.strip()} {cite(c.evidence_ids, src.index)}"
             for c in step.value.sentences]
    return "\n".join(lines), step


def _fill_values(ctx: UnitContext, params: RenderParams, names: list[str], src: Sources
                 ) -> tuple[dict[str, str], list[str]]:
    """A value for every placeholder; the names nothing fills are returned (and kept as
    written)."""
    values: dict[str, str] = {}
    unknown: list[str] = []
    base = src.base_values()
    for name in names:
        spec = params.fill.get(name)
        if isinstance(spec, str):
            spec = FillSpec(part=spec)
        part = spec.part if spec is not None else name
        if spec is None and name in base:
            values[name] = base[name]
            continue
        try:
            values[name] = fill_part(ctx, part, spec, src)
        except KeyError:
            unknown.append(name)
            values[name] = "{{ " + name + " }}"
    return values, unknown


def render_text(template: str, values: dict[str, str]) -> str:
    """The template rendered with ``values`` (Jinja2, no escaping, trailing newline kept)."""
    import jinja2

    from keepstep.engine.files.sandbox import render_bounded, template_env  # jinja2: lazy

    env = template_env(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return render_bounded(env.from_string(template), values, what="the template")


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    shape: list[str] = []
    step: StepResult | None = None
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
            values, unknown = _fill_values(ctx, params, names, src)
            if params.prose and params.prose in values and not ctx.model_profile().offline:
                ctx.safe_point(f"write the {params.prose} of {document}")
                prose, step = _prose(ctx, src, document, params.prose)
                if prose is not None:
                    values[params.prose] = prose
                else:
                    shape += [f"{params.prose}: {p.line()}" for p in step.problems]
            text = with_provenance(render_text(template, values), src.notice_line())
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
        problems=[p.model_dump() for p in (step.problems if step else [])],
        answers=list(step.answers if step else []),
    )


__all__ = ["RenderAnswer", "known_placeholders", "render_text", "run", "table_columns"]
