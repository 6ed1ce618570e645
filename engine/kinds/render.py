"""render: the consultant-facing documents, filled from dependencies and a template (no model).

``params.document`` picks the document, ``params.template`` the template (declared as a
``template:<name>`` input, read with ``ctx.template_text``; the file is
``templates/<name>.md``). Templates use ``{{ name }}`` placeholders; an unknown placeholder
fails the structure validator. The evidence table's template lists its columns instead.
Every finding cites evidence ids and where in their sources they are, as
``[A1-e3, B2-e1] (A1, p. 2; B2, Pricing)`` (``cite(..., locators=True)``; a source id alone
for evidence without a locator).

With a language model configured for the unit (anything but the offline heuristic), the
report's executive summary and the brief's supporting findings are written by the model
(the ``render`` prompt) from the syntheses' claims and the top risks; every sentence cites
evidence ids, and every figure it states must be in what it cites. The offline heuristic
keeps the rule-based text and makes no call. Tables, the recommendation rule and the
appendix are always rule-based.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.kinds.common import (
    CSV,
    MARKDOWN,
    cite,
    cited_evidence_ids,
    cited_source_ids,
    dep_units,
    dep_with_param,
    evidence_index,
    fill_template,
    natural_key,
    notices,
    result,
)
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.engine.kinds.model_step import StepResult, run_model_step
from keepstep.engine.kinds.synthesize import Claim, claim_rules

DOCUMENT_OUTPUTS = {
    "report": "report.md",
    "evidence-table": "evidence-table.csv",
    "decision-brief": "decision-brief.md",
    "appendix": "appendix.md",
}
TABLE_COLUMNS = {
    "id": "evidence id: <source id>-e<n>",
    "source_id": "the approved source the quote comes from",
    "group": "the source group (A-L)",
    "topic": "the topic the statement was filed under",
    "figures": "the figures in the quote, separated by '; '",
    "quote": "the statement, verbatim from the source",
    "locator": "where in the source: page, sheet and cells, slide or heading path",
}
# A column of the evidence-table template: a list item such as "- source_id" or "- `quote`".
_COLUMN_ITEM_RE = re.compile(r"^\s*[-*+]\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*$", re.MULTILINE)
PILOT_FIRST_SCORE, STAGED_SCORE, TOP_RISKS = 20, 12, 3

SPEC = KindSpec(
    name="render",
    uses_model=False,
    validators=["structure", "citations"],
    default_outputs=list(DOCUMENT_OUTPUTS.values()),
    description="Render one deliverable (report, evidence table, decision brief, appendix) "
    "from the dependencies' artifacts and a template.",
)


class _Inputs:
    """Everything a document may draw on, read once from the dependencies."""

    def __init__(self, ctx: UnitContext) -> None:
        self.syntheses = [ctx.dep_json(u.id, "synthesis.json")
                          for u in dep_units(ctx, UnitKind.synthesize)]
        self.rankings = [ctx.dep_json(u.id, "ranking.json") for u in dep_units(ctx, UnitKind.rank)]
        self.verified = {u.id: ctx.dep_json(u.id, "verified.json")
                         for u in dep_units(ctx, UnitKind.verify)}
        self.contract = self._intake(ctx, "contract", "contract.json").get("fields", {})
        self.questions = self._intake(ctx, "questions", "questions.json").get("questions", [])
        self.inventory = self._intake(ctx, "inventory", "inventory.json").get("sources", [])
        self.schema = self._intake(ctx, "schema", "evidence-schema.json")
        table = next((u for u in dep_units(ctx, UnitKind.render)
                      if u.params.get("document") == "evidence-table"), None)
        self.table_header = (next(csv.reader(io.StringIO(
            ctx.dep_bytes(table.id, DOCUMENT_OUTPUTS["evidence-table"]).decode())), [])
            if table else [])
        self.evidence = [e for doc in self.verified.values() for e in doc.get("evidence", [])]
        self.index: dict[str, dict[str, str]] = evidence_index(self.evidence)
        for doc in self.syntheses + self.rankings:
            for k, v in (doc.get("evidence") or {}).items():
                self.index.setdefault(k, v)
        self.title = str(self.contract.get("title") or "Research pack")
        self.client = str(self.contract.get("client", ""))
        audiences = sorted({str(d.get("audience")) for d in self.syntheses + self.rankings
                            if d.get("audience") and d.get("audience") != "general"})
        self.audience = " and ".join(audiences) or "general readers"
        self.notice = "; ".join(notices(*self.syntheses, *self.rankings, *self.verified.values()))

    @staticmethod
    def _intake(ctx: UnitContext, step: str, name: str) -> dict[str, Any]:
        unit = dep_with_param(ctx, UnitKind.intake, "step", step)
        return ctx.dep_json(unit.id, name) if unit else {}

    def risks(self) -> list[dict[str, Any]]:
        return [r for doc in self.rankings for r in doc.get("risks", [])]

    def notice_line(self) -> str:
        return f"_Produced with the {self.notice}._" if self.notice else ""


# --- document parts --------------------------------------------------------------------
def _cite(ids: Any, index: dict[str, dict[str, str]]) -> str:
    """A document's citation: evidence ids, then where in each source (``A1, p. 2``)."""
    return cite(ids, index, locators=True)


def _claim_line(claim: dict[str, Any], index: dict[str, dict[str, str]]) -> str:
    return f"{claim['text']} {_cite(claim['evidence_ids'], index)}"


def _risk_table(inp: _Inputs) -> str:
    if not inp.rankings:
        return "No risk ranking was given for this document."
    lines = ["| Rank | Risk | Score | Evidence |", "|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['title']} | {r['score']} | {_cite(r['evidence_ids'], inp.index)} |"
              for r in inp.risks()]
    for doc in inp.rankings:
        rounds = len(doc.get("rounds", []))
        note = (f"Scores are likelihood × impact (1-25). The ranking was settled after "
                f"{rounds} round(s) of generate → check → revise ({doc.get('stop', '')}).")
        lines += ["", note]
    return "\n".join(lines)


def _report(inp: _Inputs) -> dict[str, str]:
    summary = [f"- **{s['title']}**: {_claim_line(s['claims'][0], inp.index)}"
               for s in inp.syntheses if s.get("claims")]
    if inp.risks():
        top = inp.risks()[0]
        summary.append(f"- **Top risk**: {top['title']} (score {top['score']}) "
                       f"{_cite(top['evidence_ids'], inp.index)}")
    findings = []
    for s in inp.syntheses:
        findings += [f"### {s['title']}", "", f"_Question: {s['question']}_", ""]
        findings += [f"{n}. {_claim_line(c, inp.index)}"
                     for n, c in enumerate(s.get("claims", []), start=1)] or ["No findings."]
        findings.append("")
    questions = [f"- {q['id']}: {q['question']}" for q in inp.questions]
    return {
        "executive_summary": "\n".join(summary) or "No synthesis was given for this report.",
        "findings": "\n".join(findings).strip() or "No findings.",
        "risks": _risk_table(inp),
        "questions": "\n".join(questions) or "No research questions were framed for this report.",
    }


def _recommendation(risks: list[dict[str, Any]]) -> str:
    if not risks:
        return ("Do not decide yet: no ranked risks were available, so the risk ranking must "
                "be completed first.")
    top = risks[0]
    score = top["score"] if isinstance(top["score"], int) else 0
    if score >= PILOT_FIRST_SCORE:
        text = (f"**Run a pilot first.** Commit to full entry only once the top risk — "
                f"{top['title']} (score {score}) — has a tested mitigation.")
    elif score >= STAGED_SCORE:
        text = (f"**Proceed with a staged entry.** Start with one pilot utility and give each of "
                f"the top {min(TOP_RISKS, len(risks))} risks an owner and a mitigation before "
                "scaling.")
    else:
        text = "**Proceed with entry as planned**, monitoring the risks below."
    return text + (f"\n\nThis recommendation follows a fixed rule on the risk scores (pilot first "
                   f"at {PILOT_FIRST_SCORE} or more, staged entry at {STAGED_SCORE} or more); it "
                   "is not a model's judgement.")


def _brief(inp: _Inputs) -> dict[str, str]:
    risks = inp.risks()
    top = [f"{n}. **{r['title']}** (score {r['score']}) {_cite(r['evidence_ids'], inp.index)}"
           for n, r in enumerate(risks[:TOP_RISKS], start=1)]
    support = [f"- **{s['title']}**: {_claim_line(s['claims'][0], inp.index)}"
               for s in inp.syntheses if s.get("claims")]
    return {
        "recommendation": _recommendation(risks),
        "top_risks": "\n".join(top) or "No ranked risks.",
        "supporting_findings": "\n".join(support) or "No supporting findings were given.",
    }


def _appendix(inp: _Inputs) -> dict[str, str]:
    inventory = ["| Source | Group | Kind | Title | sha256 (first 12) |", "|---|---|---|---|---|"]
    inventory += [f"| {s['id']} | {s['group']} | {s['kind']} | {s['title']} | "
                  f"`{s['sha256'][:12]}` |" for s in inp.inventory]
    verification = ["| Unit | From extraction units | Checked | Supported | Rejected |",
                    "|---|---|---|---|---|"]
    rejected: list[str] = []
    for uid, doc in inp.verified.items():
        verification.append(f"| {uid} | {', '.join(doc.get('from_units', []))} | "
                            f"{doc.get('checked', 0)} | {len(doc.get('evidence', []))} | "
                            f"{len(doc.get('rejected', []))} |")
        rejected += [f"- {r['id']} ({r['source_id']}), {r['stage']} check: {r['reason']}"
                     for r in doc.get("rejected", [])]
    verification += ["", "Rejected statements:", *rejected] if rejected else [
        "", "No statement was rejected."]
    required = inp.schema.get("required", [])
    optional = [p for p in inp.schema.get("properties", {}) if p not in required]
    columns = [f"- `{c}`: {TABLE_COLUMNS.get(c, 'an extra column')}" for c in inp.table_header]
    return {
        "inventory": "\n".join(inventory) if inp.inventory else "No source inventory was given.",
        "verification": "\n".join(verification) if inp.verified else "No verification was given.",
        "schema_fields": (f"required: {', '.join(required)}; optional: {', '.join(optional)}"
                          if required else "no evidence schema was given"),
        "evidence_table_columns": "\n".join(columns) or "No evidence table was given.",
    }


def table_columns(template: str) -> list[str]:
    """The evidence table's columns: the template's Markdown list items, in order."""
    return [m.group(1) for m in _COLUMN_ITEM_RE.finditer(template)]


def _evidence_table(inp: _Inputs, template: str) -> tuple[str, list[str]]:
    header = table_columns(template)
    problems = [f"template column {h!r} is unknown (known: {', '.join(TABLE_COLUMNS)})"
                for h in header if h not in TABLE_COLUMNS]
    if not header:
        problems.append("the evidence-table template lists no columns ('- id', '- quote', ...)")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for e in sorted(inp.evidence, key=lambda e: natural_key(str(e["id"]))):
        row = {**{k: str(e.get(k, "")) for k in TABLE_COLUMNS},
               "group": str(e.get("group") or inp.index.get(str(e["id"]), {}).get("group", "")),
               "figures": "; ".join(str(f) for f in e.get("figures", []))}
        writer.writerow([row.get(h, "") for h in header])
    return out.getvalue(), problems


_FILLERS = {"report": _report, "decision-brief": _brief, "appendix": _appendix}
class RenderAnswer(BaseModel):
    """The render step's answer: the section's sentences, each citing evidence ids."""

    model_config = ConfigDict(extra="allow")

    sentences: list[Claim]


# The prose section a language model writes, per document.
PROSE_SECTIONS = {"report": "executive_summary", "decision-brief": "supporting_findings"}


def _prose(ctx: UnitContext, inp: _Inputs, document: str) -> tuple[str | None, StepResult]:
    """The model-written section (``None`` when the step failed) and the step."""
    findings = [{"title": s.get("title", ""), "question": s.get("question", ""),
                 "claims": [{"text": c.get("text", ""), "evidence_ids": c.get("evidence_ids", [])}
                            for c in s.get("claims", [])]} for s in inp.syntheses]
    risks = [{"title": r["title"], "score": r["score"], "evidence_ids": r["evidence_ids"]}
             for r in inp.risks()[:TOP_RISKS]]
    quotes = {str(e["id"]): str(e.get("quote", "")) for e in inp.evidence}
    # Ids cited by a finding or risk but not among the verified evidence given here carry
    # the text that cites them, so a sentence restating that text passes the figure rule.
    for item in [c for f in findings for c in f["claims"]] + [
            {"text": r["title"], "evidence_ids": r["evidence_ids"]} for r in risks]:
        for i in item["evidence_ids"]:
            quotes[str(i)] = quotes.get(str(i), "") + " " + str(item["text"])
    inputs = {"task": "render", "document": document, "section": PROSE_SECTIONS[document],
              "audience": inp.audience, "findings": findings, "risks": risks,
              "evidence": {k: v.strip() for k, v in sorted(quotes.items())}}
    step = run_model_step(ctx, prompt="render", inputs=inputs, schema=RenderAnswer,
                          rules=claim_rules("sentences", quotes))
    if not step.ok:
        return None, step
    lines = [f"- {c.text.strip()} {_cite(c.evidence_ids, inp.index)}"
             for c in step.value.sentences]
    return "\n".join(lines), step




@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    document = str(ctx.unit.params.get("document", ""))
    name = str(ctx.unit.params.get("template", ""))
    shape: list[str] = []
    step: StepResult | None = None
    if document not in DOCUMENT_OUTPUTS:
        shape.append(f"params.document is {document!r}; use one of {', '.join(DOCUMENT_OUTPUTS)}")
        return KindOutcome(validators=[result("structure", shape)])
    if name not in ctx.unit.input_refs("template"):
        shape.append(f"params.template {name!r} is not declared as a template:<name> input")
        template = ""
    else:
        template = ctx.template_text(name)
    inp = _Inputs(ctx)

    if document == "evidence-table":
        text, problems = _evidence_table(inp, template)
        shape += problems
        rows = list(csv.DictReader(io.StringIO(text)))
        citations = [f"row {r.get('id')} is not verified evidence of the dependencies"
                     for r in rows if r.get("id") not in inp.index]
        cited_sources = {r["source_id"] for r in rows if r.get("source_id")}
        facts: dict[str, Any] = {"document": document, "rows": len(rows)}
        media = CSV
    else:
        values = {"title": inp.title, "client": inp.client, "audience": inp.audience,
                  "goal": str(inp.contract.get("goal", "")),
                  "scope": str(inp.contract.get("scope", "")),
                  "notice": inp.notice_line(), **_FILLERS[document](inp)}
        if document in PROSE_SECTIONS and not ctx.model_profile().offline:
            ctx.safe_point(f"write the {PROSE_SECTIONS[document]} of {document}")
            prose, step = _prose(ctx, inp, document)
            if prose is not None:
                values[PROSE_SECTIONS[document]] = prose
            else:
                shape += [f"{PROSE_SECTIONS[document]}: {p.line()}" for p in step.problems]
        text, unknown = fill_template(template, values)
        shape += [f"template {name} uses unknown placeholder {{{{{u}}}}}" for u in unknown]
        cited = cited_evidence_ids(text)
        cited_sources = cited_source_ids(text)
        known_sources = {v["source_id"] for v in inp.index.values()} | {
            s["id"] for s in inp.inventory}
        citations = [f"cites unknown evidence {i}" for i in sorted(cited - set(inp.index))]
        citations += [f"cites unknown source {s}" for s in sorted(cited_sources - known_sources)]
        facts = {"document": document, "cited_evidence": len(cited), "audience": inp.audience}
        media = MARKDOWN
    if not text.strip():
        shape.append("the document is empty")
    sources = sorted(cited_sources, key=natural_key)
    ctx.write(DOCUMENT_OUTPUTS[document], text, media_type=media, source_ids=sources)
    return KindOutcome(
        validators=[result("structure", shape, f"{DOCUMENT_OUTPUTS[document]} rendered"),
                    result("citations", citations, "every cited id is verified evidence")],
        facts=facts,
        problems=[p.model_dump() for p in (step.problems if step else [])],
        answers=list(step.answers if step else []),
    )
