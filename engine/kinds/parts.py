"""Document parts: the named pieces a render template's placeholders are filled with.

A part is drawn from the render unit's dependencies by what they wrote — synthesis.json
(findings), ranking.json (risks), verified.json (evidence, conflicts), inventory.json,
contract.json, questions.json, evidence-schema.json, audit.json, a CSV table document —
never by their kind, so a pack's own units feed them too. ``PARTS`` names them (with what
each is, for docs/plan-format.md); ``Sources`` reads the dependencies once; ``fill_part``
makes one part's text. Nothing here is specific to a pack: wording that is a pack's
judgement (a recommendation rule) comes from the pack's data files.

Every finding cites evidence ids and the sources they come from, as
``[A1-e3, B2-e1] (sources: A1, B2)`` (``common.cite``).
"""

from __future__ import annotations

import csv
import io
from typing import Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.presets import (
    PARTS,
    TABLE_COLUMNS,
    FillSpec,
    document_format,
    document_output,
)
from keepstep.engine.kinds.common import (
    cite,
    dep_units,
    deps_writing,
    evidence_index,
    natural_key,
    notices,
    verified_deps,
)
from keepstep.engine.kinds.context import UnitContext

TOP_RISKS = 3


def _cite(ids: Any, index: dict[str, dict[str, str]]) -> str:
    """A document's citation: evidence ids, then where in each source (``A1, p. 2``)."""
    return cite(ids, index, locators=True)


def _first(ctx: UnitContext, name: str, units: list[str] | None) -> dict[str, Any]:
    found = deps_writing(ctx, name, units)
    return ctx.dep_json(found[0].id, name) if found else {}


class Sources:
    """Everything a document may draw on, read once from the dependencies (only ``units``
    when given)."""

    def __init__(self, ctx: UnitContext, units: list[str] | None = None) -> None:
        self.syntheses = [ctx.dep_json(u.id, "synthesis.json")
                          for u in deps_writing(ctx, "synthesis.json", units)]
        self.rankings = [ctx.dep_json(u.id, "ranking.json")
                         for u in deps_writing(ctx, "ranking.json", units)]
        self.verified = {u.id: ctx.dep_json(u.id, name) for u, name in verified_deps(ctx)
                         if not units or u.id in units}
        self.contract = _first(ctx, "contract.json", units).get("fields", {})
        self.questions = _first(ctx, "questions.json", units).get("questions", [])
        self.inventory = _first(ctx, "inventory.json", units).get("sources", [])
        self.schema = _first(ctx, "evidence-schema.json", units)
        self.audits = {u.id: ctx.dep_json(u.id, "audit.json")
                       for u in deps_writing(ctx, "audit.json", units)}
        table = next((u for u in dep_units(ctx, UnitKind.render)
                      if document_format(u) == "csv" and (not units or u.id in units)), None)
        self.table_header = (next(csv.reader(io.StringIO(
            ctx.dep_bytes(table.id, document_output(table)).decode())), [])
            if table else [])
        self.evidence = [e for doc in self.verified.values() for e in doc.get("evidence", [])]
        self.index: dict[str, dict[str, str]] = evidence_index(self.evidence)
        for doc in self.syntheses + self.rankings:
            for k, v in (doc.get("evidence") or {}).items():
                self.index.setdefault(k, v)
        # contract.md's own fields (its front matter) reach a template that names them even
        # without a contract intake dependency; a dependency's copy wins where both have one.
        self.project_contract = {str(k): v for k, v in (ctx.contract.fields or {}).items()
                                 if isinstance(v, str | int | float | bool)}
        self.title = str(self.contract.get("title") or self.project_contract.get("title")
                         or ctx.plan.plan.title or "Research pack")
        self.client = str(self.contract.get("client", ""))
        audiences = sorted({str(d.get("audience")) for d in self.syntheses + self.rankings
                            if d.get("audience") and d.get("audience") != "general"})
        self.audience = " and ".join(audiences) or "general readers"
        self.notice = "; ".join(notices(*self.syntheses, *self.rankings, *self.verified.values()))

    def risks(self) -> list[dict[str, Any]]:
        return [r for doc in self.rankings for r in doc.get("risks", [])]

    def notice_line(self) -> str:
        return f"_Produced with the {self.notice}._" if self.notice else ""

    def base_values(self) -> dict[str, str]:
        """The contract fields (every field the contract dependency carries), the audience and
        the notice."""
        values = {k: str(v) for k, v in self.project_contract.items()}
        values.update({str(k): str(v) for k, v in self.contract.items()})
        values.update({"title": self.title, "client": self.client, "audience": self.audience,
                       "goal": str(self.contract.get("goal", "")),
                       "scope": str(self.contract.get("scope", "")),
                       "notice": self.notice_line()})
        return values


def with_provenance(text: str, line: str) -> str:
    """A rendered document always carries its provenance line (the models that answered, the
    offline notice), whatever its template: appended when the template left it out."""
    if not line or line in text:
        return text
    return text.rstrip("\n") + "\n\n" + line + "\n"


# --- parts -------------------------------------------------------------------------------------
def claim_line(claim: dict[str, Any], index: dict[str, dict[str, str]]) -> str:
    return f"{claim['text']} {_cite(claim['evidence_ids'], index)}"


def risk_table(src: Sources) -> str:
    if not src.rankings:
        return "No risk ranking was given for this document."
    lines = ["| Rank | Risk | Score | Evidence |", "|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['title']} | {r['score']} | {_cite(r['evidence_ids'], src.index)} |"
              for r in src.risks()]
    for doc in src.rankings:
        rounds = len(doc.get("rounds", []))
        note = (f"Scores are likelihood × impact (1-25). The ranking was settled after "
                f"{rounds} round(s) of generate → check → revise ({doc.get('stop', '')}).")
        if doc.get("converged") is False:
            note += " It did not converge: the check's open problems are listed with it."
        lines += ["", note]
    return "\n".join(lines)


def executive_summary(src: Sources) -> str:
    summary = [f"- **{s['title']}**: {claim_line(s['claims'][0], src.index)}"
               for s in src.syntheses if s.get("claims")]
    if src.risks():
        top = src.risks()[0]
        summary.append(f"- **Top risk**: {top['title']} (score {top['score']}) "
                       f"{_cite(top['evidence_ids'], src.index)}")
    return "\n".join(summary) or "No synthesis was given for this report."


def findings(src: Sources) -> str:
    lines: list[str] = []
    for s in src.syntheses:
        lines += [f"### {s['title']}", "", f"_Question: {s['question']}_", ""]
        lines += [f"{n}. {claim_line(c, src.index)}"
                  for n, c in enumerate(s.get("claims", []), start=1)] or ["No findings."]
        lines.append("")
    return "\n".join(lines).strip() or "No findings."


def questions(src: Sources) -> str:
    lines = [f"- {q['id']}: {q['question']}" for q in src.questions]
    return "\n".join(lines) or "No research questions were framed for this report."


def top_risks(src: Sources, n: int = TOP_RISKS) -> str:
    top = [f"{k}. **{r['title']}** (score {r['score']}) {_cite(r['evidence_ids'], src.index)}"
           for k, r in enumerate(src.risks()[:n], start=1)]
    return "\n".join(top) or "No ranked risks."


def supporting_findings(src: Sources) -> str:
    support = [f"- **{s['title']}**: {claim_line(s['claims'][0], src.index)}"
               for s in src.syntheses if s.get("claims")]
    return "\n".join(support) or "No supporting findings were given."


GENERIC_RULES: dict[str, Any] = {
    "none": "No recommendation yet: no ranked risks were available.",
    "rule": [{"min_score": 0, "text": "Decide once the top risk — {title} (score {score}) — "
              "has an owner and a mitigation."}],
}


def recommendation(src: Sources, rules: dict[str, Any] | None, n: int = TOP_RISKS) -> str:
    """The first rule whose ``min_score`` the top risk reaches (rules from the pack's data
    file: ``none``, ``[[rule]] min_score, text`` with {title}, {score}, {top_n}, and a
    ``note`` appended after a blank line)."""
    rules = rules or GENERIC_RULES
    risks = src.risks()
    if not risks:
        return str(rules.get("none") or GENERIC_RULES["none"])
    top = risks[0]
    score = top["score"] if isinstance(top["score"], int) else 0
    chosen = sorted((r for r in rules.get("rule", []) if isinstance(r, dict)),
                    key=lambda r: -int(r.get("min_score", 0)))
    rule = next((r for r in chosen if score >= int(r.get("min_score", 0))), None)
    if rule is None:
        rule = GENERIC_RULES["rule"][0]
    text = str(rule.get("text", "")).format(title=top["title"], score=score,
                                             top_n=min(n, len(risks)))
    note = str(rules.get("note") or "")
    return text + (f"\n\n{note}" if note else "")


def inventory(src: Sources) -> str:
    if not src.inventory:
        return "No source inventory was given."
    if all("sha256" in s for s in src.inventory):
        lines = ["| Source | Group | Kind | Title | sha256 (first 12) |", "|---|---|---|---|---|"]
        lines += [f"| {s['id']} | {s['group']} | {s['kind']} | {s['title']} | "
                  f"`{s['sha256'][:12]}` |" for s in src.inventory]
        return "\n".join(lines)
    # A header-only inventory: what the header lines say.
    lines = ["| Source | Group | Title | Type | Date |", "|---|---|---|---|---|"]
    for s in src.inventory:
        head = s.get("header") or {}
        lines.append(f"| {s['id']} | {s.get('group', '')} | {head.get('title') or s['title']} | "
                     f"{head.get('type') or s.get('kind', '')} | {head.get('date', '')} |")
    return "\n".join(lines)


def verification(src: Sources) -> str:
    if not src.verified:
        return "No verification was given."
    lines = ["| Unit | From extraction units | Checked | Supported | Rejected |",
             "|---|---|---|---|---|"]
    rejected: list[str] = []
    for uid, doc in src.verified.items():
        lines.append(f"| {uid} | {', '.join(doc.get('from_units', []))} | "
                     f"{doc.get('checked', 0)} | {len(doc.get('evidence', []))} | "
                     f"{len(doc.get('rejected', []))} |")
        rejected += [f"- {r['id']} ({r['source_id']}), {r['stage']} check: {r['reason']}"
                     for r in doc.get("rejected", [])]
    lines += ["", "Rejected statements:", *rejected] if rejected else [
        "", "No statement was rejected."]
    return "\n".join(lines)


def schema_fields(src: Sources) -> str:
    required = src.schema.get("required", [])
    optional = [p for p in src.schema.get("properties", {}) if p not in required]
    return (f"required: {', '.join(required)}; optional: {', '.join(optional)}"
            if required else "no evidence schema was given")


def table_columns_text(src: Sources) -> str:
    columns = [f"- `{c}`: {TABLE_COLUMNS.get(c, 'an extra column')}" for c in src.table_header]
    return "\n".join(columns) or "No evidence table was given."


def evidence(src: Sources, topics: list[str], n: int | None) -> str:
    rows = [e for e in sorted(src.evidence, key=lambda e: natural_key(str(e["id"])))
            if not topics or e.get("topic") in topics][:n]
    if not rows:
        return "No verified statement" + (f" on {', '.join(topics)}." if topics else ".")
    lines = ["| Evidence | Source | Topic | Statement |", "|---|---|---|---|"]
    lines += [f"| {e['id']} | {e.get('source_id', '')} | {e.get('topic', '')} | "
              f"{str(e.get('quote', '')).replace('|', '/')} |" for e in rows]
    return "\n".join(lines)


def conflicts(src: Sources) -> str:
    found = [c for doc in src.verified.values() for c in doc.get("conflicts", [])
             if isinstance(c, dict)]
    if not found:
        return "No conflicting figures were found."
    lines = []
    for c in found:
        ids = [str(i) for i in c.get("ids", [])]
        values = " vs ".join(str(v) for v in c.get("values", []))
        lines.append(f"- {c.get('metric', 'a quantity')}: {values} {_cite(ids, src.index)} — "
                     f"{c.get('reason', '')} ({c.get('status', 'conflict-open')})")
    return "\n".join(lines)


def audit(src: Sources) -> str:
    if not src.audits:
        return "No audit was given."
    lines = []
    for uid, doc in src.audits.items():
        verdict = "passed" if doc.get("passed") else "FAILED"
        checks = doc.get("checks", [])
        lines += [f"Audit {uid}: **{verdict}** ({len(checks)} check(s)).", ""]
        lines += [f"- {c.get('name')}: {'passed' if c.get('passed') else 'FAILED'} — "
                  f"{c.get('detail', '')}" for c in checks]
    return "\n".join(lines).strip()


def unconverged(src: Sources) -> str:
    lines = [f"- {doc.get('unit', '?')} ({doc.get('title', '')}): {doc.get('stop', '')}; open: "
             + ("; ".join(str(p) for p in doc.get("open_problems", [])) or "none listed")
             for doc in src.rankings if doc.get("converged") is False]
    return "\n".join(lines) or "Every loop converged."


def fill_part(ctx: UnitContext, part: str, spec: FillSpec | None, default: Sources) -> str:
    """The text of one part (``spec`` narrows where it draws from and how much)."""
    src = Sources(ctx, spec.from_) if spec is not None and spec.from_ else default
    n = spec.n if spec is not None else None
    values = src.base_values()
    if part in values:
        return values[part]
    if part == "executive_summary":
        return executive_summary(src)
    if part == "findings":
        return findings(src)
    if part == "supporting_findings":
        return supporting_findings(src)
    if part == "risks":
        return risk_table(src)
    if part == "top_risks":
        return top_risks(src, n or TOP_RISKS)
    if part == "recommendation":
        data = spec.data if spec is not None and spec.data else (
            "recommendation" if "data:recommendation" in ctx.unit.inputs else None)
        return recommendation(src, ctx.data(data) if data else None, n or TOP_RISKS)
    if part == "questions":
        return questions(src)
    if part == "inventory":
        return inventory(src)
    if part == "verification":
        return verification(src)
    if part == "schema_fields":
        return schema_fields(src)
    if part == "evidence_table_columns":
        return table_columns_text(src)
    if part == "evidence":
        return evidence(src, list(spec.topic) if spec is not None else [], n)
    if part == "conflicts":
        return conflicts(src)
    if part == "audit":
        return audit(src)
    if part == "unconverged":
        return unconverged(src)
    raise KeyError(part)


__all__ = ["PARTS", "TABLE_COLUMNS", "Sources", "claim_line", "fill_part", "recommendation",
           "with_provenance"]
