"""audit and notes: declarative checks over named documents, and change notes (no model).

The audit reads the documents its render dependencies produced (by ``params.document``)
and runs the checks ``params.checks`` lists (``core.presets.AuditCheck``): documents
present, a document's sections against its template, cited evidence ids that exist, cited
sources in the inventory, a document listing a table's sources, figures that match another
document or the evidence, a section citing enough sources from enough groups. It writes its
verdict (audit.json: passed, each check with its detail, the hashes of the documents it
checked) and commits it even when a check fails: the verdict is what a release gate binds
and what holds every deliver unit downstream. The change notes are written from the run's
decision events, oldest first.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from pydantic import ValidationError

from keepstep.engine.core.explain import compact_ids
from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.presets import (
    AuditParams,
    CitedIdsCheck,
    CitedSourcesCheck,
    CitesGroupsCheck,
    ConflictsCheck,
    FiguresCheck,
    ListsSourcesCheck,
    PresentCheck,
    SectionsCheck,
    document_format,
    document_output,
)
from keepstep.engine.core.templates import rendered_sections, section_ids
from keepstep.engine.core.timefmt import parse_iso, readable_utc
from keepstep.engine.errors import KeepstepError
from keepstep.engine.gateway.offline_rules import normalise
from keepstep.engine.kinds.claims import calculation_problems, figures_of, stated_figures
from keepstep.engine.kinds.common import (
    CALCULATED_RE,
    JSON,
    LOCATED_CITE_RE,
    MARKDOWN,
    cited_evidence_ids,
    cited_source_ids,
    dep_units,
    deps_writing,
    dump_json,
    expand_footnotes,
    natural_key,
    recorded_calculation,
    result,
    verified_deps,
)
from keepstep.engine.kinds.context import (
    KindOutcome,
    KindSpec,
    UnitContext,
    ValidatorResult,
    register,
)
from keepstep.engine.kinds.parts import conflict_records, open_conflicts, real_conflicts
from keepstep.storage.hashing import sha256_hex

AUDIT = KindSpec(
    name="audit",
    uses_model=False,
    validators=["final"],
    default_outputs=["audit.json"],
    description="Declarative checks over the documents the dependencies rendered; commits its "
    "verdict even when a check fails (a failed verdict holds deliveries downstream).",
)
NOTES = KindSpec(
    name="notes",
    uses_model=False,
    validators=["structure"],
    default_outputs=["change-notes.md"],
    description="Change notes written from the run's decision events, oldest first.",
)
_SHOWN = 8
_SUMMARY_CHARS = 200
_FAILING_CHARS = 240
# What is not a stated figure in a document line: list numbering, citations, scores.
# Not stated figures: list numbering, citations (ids, "(sources: …)", and located ones whose
# page numbers and cell ranges are where a figure is, not a figure), scores, comments, headings.
_NOT_FIGURES = (re.compile(r"^\s*(?:\d+[.)]|[-*+])\s+", re.MULTILINE), LOCATED_CITE_RE,
                re.compile(r"\[[^\]]*\]"), re.compile(r"\(sources?: [^)]*\)"),
                re.compile(r"\(score \d+\)"), re.compile(r"<!--.*?-->"),
                re.compile(r"^#+ .*$", re.MULTILINE))


def _check(name: str, kind: str, problems: list[str], ok: str) -> dict[str, Any]:
    shown = "; ".join(problems[:_SHOWN]) + (f" (+{len(problems) - _SHOWN} more)"
                                           if len(problems) > _SHOWN else "")
    return {"name": name, "check": kind, "passed": not problems,
            "detail": shown if problems else ok}


def _ids(ids: set[str]) -> list[str]:
    return sorted(ids, key=natural_key)


class _Documents:
    """The documents of the audit's render dependencies, and what the checks compare them
    with (verified evidence, the inventory)."""

    def __init__(self, ctx: UnitContext) -> None:
        self.units = {str(u.params.get("document")): u for u in dep_units(ctx, UnitKind.render)
                      if u.params.get("document")}
        self.raw = {d: ctx.dep_bytes(u.id, document_output(u)) for d, u in self.units.items()}
        self.text = {d: expand_footnotes(b.decode("utf-8")) for d, b in self.raw.items()}
        self.evidence = {str(e["id"]): e for u, name in verified_deps(ctx)
                         for e in ctx.dep_json(u.id, name).get("evidence", [])
                         if isinstance(e, dict) and e.get("id")}
        records = [ctx.dep_json(u.id, n) for n in ("synthesis.json", "ranking.json")
                   for u in deps_writing(ctx, n)]
        records += [ctx.dep_json(u.id, name) for u, name in verified_deps(ctx)]
        self.conflicts = conflict_records(records)
        inv = deps_writing(ctx, "inventory.json")
        self.inventory = ({s["id"]: s for s in ctx.dep_json(inv[0].id, "inventory.json")
                           .get("sources", [])} if inv else None)
        # Each approved source's group as sources.toml says (the run's input snapshot): no
        # dependency on an inventory unit is needed to know it.
        self.groups = dict(ctx.snapshot.groups or {})
        self._ctx = ctx
        self._sections: dict[str, dict[str, str]] = {}  # document -> its sections, parsed once

    def sections(self, doc: str) -> dict[str, str]:
        """A rendered document's sections by id: a document carries no section markers (they
        are stripped for its reader), so they are found by its template's headings."""
        if doc in self._sections:
            return self._sections[doc]
        unit = self.units.get(doc)
        name = str(unit.params.get("template") or "") if unit is not None else ""
        template = ""
        if name:
            try:
                template = self._ctx.template_text(name)
            except (KeepstepError, KeyError, OSError):
                template = ""
        self._sections[doc] = rendered_sections(self.text.get(doc, ""), template)
        return self._sections[doc]

    def is_table(self, doc: str) -> bool:
        return doc in self.units and document_format(self.units[doc]) == "csv"

    def rows(self, doc: str) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(self.text.get(doc, ""))))

    def missing(self, docs: list[str]) -> list[str]:
        return [f"{d} was not rendered by a dependency" for d in docs if d not in self.text]

    def cited_sources(self, doc: str) -> set[str]:
        if self.is_table(doc):
            return {r["source_id"] for r in self.rows(doc) if r.get("source_id")}
        return cited_source_ids(self.text.get(doc, ""))

    def group_of(self, source_id: str) -> str:
        if self.inventory and source_id in self.inventory:
            return str(self.inventory[source_id].get("group", ""))
        if self.groups.get(source_id):
            return str(self.groups[source_id])
        found = next((e for e in self.evidence.values() if e.get("source_id") == source_id), None)
        return str(found.get("group", "")) if found else ""


def _present(docs: _Documents, check: PresentCheck) -> tuple[list[str], str]:
    problems = [f"{d} ({document_output(docs.units[d])}) is missing" if d in docs.units else
                f"{d} is missing (no render dependency produces it)" for d in check.documents
                if d not in docs.text]
    problems += [f"{d} is empty" for d in check.documents
                 if d in docs.text and not docs.text[d].strip()]
    return problems, f"{', '.join(check.documents)} present"


def _sections(ctx: UnitContext, docs: _Documents, check: SectionsCheck) -> tuple[list[str], str]:
    if check.document not in docs.text:
        return docs.missing([check.document]), ""
    have = list(docs.sections(check.document))
    want = section_ids(ctx.template_text(check.template)) if check.template else []
    problems = [f"{check.document} lacks section {s!r} of template {check.template}"
                for s in want if s not in have]
    present = [s for s in have if s in want]
    if not problems and present != [s for s in want if s in present]:
        problems.append(f"{check.document}'s sections are out of order: {', '.join(present)}")
    problems += [f"{check.document} lacks required section {s!r}" for s in check.required
                 if s not in have]
    return problems, f"{check.document}: {len(set(want) | set(check.required))} section(s) there"


def _cited_ids(docs: _Documents, check: CitedIdsCheck) -> tuple[list[str], str]:
    problems = docs.missing([d for d in check.documents])
    if check.against == "evidence":
        known = set(docs.evidence)
        where = "the verified evidence"
        if not docs.evidence:
            problems.append("no verified evidence among the audit's dependencies to check "
                            "against")
    else:
        problems += docs.missing([check.against])
        known = {r.get("id", "") for r in docs.rows(check.against)}
        where = "the evidence table" if docs.is_table(check.against) else check.against
    texts = {d: docs.text[d] for d in check.documents if d in docs.text}
    problems += [f"{d} cites {i}, not in {where}"
                 for d, t in texts.items() for i in _ids(cited_evidence_ids(t) - known)]
    if check.require:
        problems += [f"{d} cites no evidence" for d, t in texts.items()
                     if not cited_evidence_ids(t)]
    cited: set[str] = set().union(*(cited_evidence_ids(t) for t in texts.values()))
    unit = "table row(s)" if check.against != "evidence" else "verified statement(s)"
    return problems, f"{len(cited)} cited id(s), all among {len(known)} {unit}"


def _cited_sources(docs: _Documents, check: CitedSourcesCheck) -> tuple[list[str], str]:
    problems = docs.missing(check.documents)
    if docs.inventory is None:
        return problems + ["no source inventory among the audit's dependencies"], ""
    cited: set[str] = set()
    for d in check.documents:
        cited |= docs.cited_sources(d)
    problems += [f"source {s} is cited but not in the inventory"
                 for s in _ids(cited - set(docs.inventory))]
    return problems, f"{len(cited)} cited source(s), all in the inventory"


def _lists_sources(docs: _Documents, check: ListsSourcesCheck) -> tuple[list[str], str]:
    problems = docs.missing([check.document, check.of])
    tabled = {r.get("source_id", "") for r in docs.rows(check.of) if r.get("source_id")}
    text = docs.text.get(check.document, "")
    problems += [f"{check.document} does not list tabled source {s}" for s in _ids(tabled)
                 if f"| {s} |" not in text]
    return problems, f"all {len(tabled)} tabled source(s) listed"


def _stated_figures(text: str) -> list[str]:
    for pattern in _NOT_FIGURES:
        text = pattern.sub(" ", text)
    return stated_figures(text)


def _part(docs: _Documents, doc: str, section: str | None) -> tuple[str | None, list[str]]:
    if doc not in docs.text:
        return None, docs.missing([doc])
    if section is None:
        return docs.text[doc], []
    part = docs.sections(doc).get(section)
    return part, [] if part is not None else [f"{doc} has no section {section!r}"]


def _figures(docs: _Documents, check: FiguresCheck) -> tuple[list[str], str]:
    text, problems = _part(docs, check.document, check.section)
    if text is None:
        return problems, ""
    where = f"{check.document}" + (f" ({check.section})" if check.section else "")
    checked = 0
    if check.against == "evidence":
        for line in text.splitlines():
            ids = cited_evidence_ids(line)
            if not ids:
                continue
            quoted = {f for i in ids for f in figures_of(normalise(
                str(docs.evidence.get(i, {}).get("quote", ""))))}
            calc = _CALCULATED_RE.search(line)
            if calc:
                # A derived figure passes when its calculation recomputes from cited figures.
                quotes = {i: str(docs.evidence.get(i, {}).get("quote", "")) for i in ids}
                rest = line.replace(calc.group(0), " ")
                wrong, derived = calculation_problems("", rest, recorded_calculation(calc),
                                                      sorted(ids),
                                                      quotes)
                if not wrong:
                    quoted |= derived | set(figures_of(normalise(recorded_calculation(calc))))
                line = rest
            for f in _stated_figures(line):
                checked += 1
                if f not in quoted:
                    problems.append(f"{where} states {f}, in none of the quotes it cites "
                                    f"({', '.join(_ids(ids))})")
        return problems, f"{checked} figure(s) in {where}, each in a quote it cites"
    problems += docs.missing([check.against])
    other = set(figures_of(normalise(docs.text.get(check.against, ""))))
    for f in dict.fromkeys(_stated_figures(text)):
        checked += 1
        if f not in other:
            problems.append(f"{where} states {f}, which {check.against} does not")
    return problems, f"{checked} figure(s) in {where}, each in {check.against}"


def _cites_groups(docs: _Documents, check: CitesGroupsCheck) -> tuple[list[str], str]:
    text, problems = _part(docs, check.document, check.section)
    if text is None:
        return problems, ""
    sources = cited_source_ids(text) | {i.rsplit("-e", 1)[0] for i in cited_evidence_ids(text)}
    groups = {g for g in (docs.group_of(s) for s in sources) if g}
    where = f"{check.document}" + (f" ({check.section})" if check.section else "")
    if len(sources) < check.min_sources:
        problems.append(f"{where} cites {len(sources)} source(s), fewer than {check.min_sources}")
    if len(groups) < check.min_groups:
        problems.append(f"{where} cites sources from {len(groups)} group(s) "
                        f"({', '.join(sorted(groups)) or 'none'}), fewer than {check.min_groups}")
    return problems, (f"{where} cites {len(sources)} source(s) from {len(groups)} group(s): "
                      f"{', '.join(sorted(groups))}")


# A finding's checked calculation as a document shows it: "(calculated: 1,200 × 97% = 1,164)"
# (``kinds.common.shown_calculation``).
_CALCULATED_RE = CALCULATED_RE
# A document saying it found no disagreement ("No conflicting figures were found.").
_NONE_FOUND_RE = re.compile(
    r"\bno (?:conflicting figures|conflicts?|disagreements?)(?: between (?:the )?sources)? "
    r"(?:were|was) found\b|\bhold no disagreement\b", re.IGNORECASE)
# Words that say a figure is disputed, not stated as fact.
_HEDGE_RE = re.compile(r"unresolved|disagree|disput|conflict|differ|uncertain|either|"
                       r"\bvs\.?\b|versus|unexplained|which (?:\w+ )?holds", re.IGNORECASE)


# A line leaving open which of a disagreement's values holds.
# "which holds" asks only after a verb of finding out ("confirm which applies") or as a question
# ("which holds?"): "140, which holds over the 120" settles it.
_OPEN_RE = re.compile(r"\b(?:confirm|check|establish|clarify|verify|determine|decide|ask|know|"
                      r"say|says|unclear|clear) which\b|\bwhich (?:\w+ )?(?:applies|holds|is "
                      r"(?:right|correct|current))\s*\?|\bwhichever\b|\beither\b|\bunclear\b|"
                      r"\bnot (?:known|clear)\b|\bnothing says which\b", re.IGNORECASE)
# A line saying which value of a disagreement holds.
_SETTLED_RE = re.compile(r"\bholds?\b|out of date|outdated|supersed|replac|revised|\bnewer\b|"
                         r"\bolder\b|\bearlier\b|\bcurrent\b|in force|no longer|\bapplies\b|"
                         r"\buses?\b|\bused\b", re.IGNORECASE)


def settled_as_open(text: str, conflict: dict[str, Any]) -> list[str]:
    """Lines of ``text`` that give every side's value of a settled disagreement (superseded or
    out of date, a value holds), citing its sides, but leave open which holds ("the board
    should confirm which applies") or never say."""
    if conflict["cls"] not in ("superseded", "outdated") or not conflict["holds"] or \
            conflict.get("about") == "advice":
        return []
    ids = {s["evidence_id"] for s in conflict["sides"]}
    every = [set(figures_of(normalise(s["value"]))) for s in conflict["sides"]]
    out = []
    for line in text.splitlines():
        if not ids <= cited_evidence_ids(line) or not all(every):
            continue
        stated = set(_stated_figures(line))
        if all(w <= stated for w in every) and (
                _OPEN_RE.search(line) or not _SETTLED_RE.search(line)):
            out.append(line.strip())
    return out


def _conflicts(docs: _Documents, check: ConflictsCheck) -> tuple[list[str], str]:
    problems = docs.missing(check.documents)
    real = real_conflicts(docs.conflicts)
    unresolved = open_conflicts(docs.conflicts)
    for d in check.documents:
        text = docs.text.get(d)
        if text is None:
            continue
        if real and _NONE_FOUND_RE.search(text):
            problems.append(f"{d} says no disagreement was found, but {len(real)} were: "
                            + ", ".join(c["metric"] for c in real[:3]))
        # (a disagreement over advice has no figure a line could state as fact: its sides'
        # numbers are the advice's own, "order in 2025")
        for c in (c for c in unresolved if c.get("about") != "advice"):
            every = [set(figures_of(normalise(s["value"]))) for s in c["sides"]]
            for side in c["sides"]:
                wanted = set(figures_of(normalise(side["value"])))
                if not wanted:
                    continue
                for line in text.splitlines():
                    if side["evidence_id"] not in cited_evidence_ids(line) or \
                            _HEDGE_RE.search(line):
                        continue
                    stated = set(_stated_figures(line))
                    # A line giving every side's value ("18, 20 or 22 million") sets the
                    # disagreement out; it states none of them as the fact.
                    if all(w <= stated for w in every):
                        continue
                    if wanted <= stated:
                        problems.append(
                            f"{d} states {side['value']} ({c['metric']}, "
                            f"{side['evidence_id']}) as fact, but the sources disagree on it "
                            "and nothing says which holds")
                        break
        for c in real if check.settled else []:
            for line in settled_as_open(text, c):
                problems.append(
                    f"{d} offers the sides of a settled disagreement ({c['metric']}: "
                    f"{', '.join(s['value'] for s in c['sides'])}) as open, but {c['holds']} "
                    f"holds ({c['cls']}): say which holds — {line[:160]}")
    return problems, (f"{', '.join(check.documents)}: {len(real)} disagreement(s), "
                      f"{len(unresolved)} unresolved, none stated as fact or denied"
                      + (", none settled offered as open" if check.settled else ""))


def _default_checks(docs: _Documents) -> list[Any]:
    checks: list[Any] = [PresentCheck(check="present", documents=sorted(docs.units))]
    markdown = [d for d in sorted(docs.units) if not docs.is_table(d)]
    if docs.evidence and markdown:
        checks.append(CitedIdsCheck(check="cited_ids", documents=markdown, require=False))
    return checks


def _run_check(ctx: UnitContext, docs: _Documents, check: Any) -> dict[str, Any]:
    runners: dict[str, Any] = {
        "present": _present, "cited_ids": _cited_ids, "cited_sources": _cited_sources,
        "lists_sources": _lists_sources, "figures": _figures, "cites_groups": _cites_groups,
        "conflicts": _conflicts}
    if isinstance(check, SectionsCheck):
        problems, ok = _sections(ctx, docs, check)
    else:
        problems, ok = runners[check.check](docs, check)
    about = getattr(check, "document", None) or ",".join(getattr(check, "documents", []))
    name = check.name or f"{check.check}:{about}"
    return _check(name, check.check, problems, ok)


@register(AUDIT)
def run_audit(ctx: UnitContext) -> KindOutcome:
    try:
        params = AuditParams.model_validate(ctx.unit.params)
    except ValidationError as exc:
        detail = "; ".join(f"params.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                           for e in exc.errors())
        return KindOutcome(validators=[ValidatorResult(name="final", passed=False,
                                                       detail=f"failed: {detail}")])
    docs = _Documents(ctx)
    checks = [_run_check(ctx, docs, c) for c in params.checks or _default_checks(docs)]
    passed = all(c["passed"] for c in checks)
    doc = {"passed": passed, "checks": checks,
           "documents": {document_output(docs.units[d]): sha256_hex(b)
                         for d, b in sorted(docs.raw.items())}}
    ctx.write("audit.json", dump_json(doc), media_type=JSON)
    failed = [c["name"] for c in checks if not c["passed"]]
    failing = [f"{c['name']}: {c['detail']}"[:_FAILING_CHARS] for c in checks if not c["passed"]]
    return KindOutcome(
        validators=[ValidatorResult(
            name="final", passed=passed,
            detail=f"{len(checks)} check(s) passed" if passed else "failed: " + ", ".join(failed))],
        facts={"passed": passed, "checks": len(checks), "failed": failed,
               **({"failing": failing} if failing else {})},
    )


# --- notes -----------------------------------------------------------------------------
# The change notes are read by a person: what changed, when, why, who decided and what was
# redone because of it — one paragraph per decision, in the words of the decision.


def _when(ts: str) -> str:
    try:
        return readable_utc(parse_iso(ts), seconds=False)
    except ValueError:
        return ts


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in sorted(value.items())
                         if v not in (None, "", [], {}))
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    # Hashes are noise to a reader; their first 12 characters still identify them.
    text = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1…", text)
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _by(p: dict[str, Any]) -> str:
    return f" by {p['who']}" if p.get("who") else ""


def _redone(units: Any) -> str:
    ids = sorted(units or [], key=natural_key)
    return compact_ids(ids) if ids else ""


def binding_note(bound: dict[str, Any]) -> str:
    """What an approval applies to, for the change notes: each thing its decision binds
    (``gates.bound_object``), e.g. "Applies while the audience is 'CFO' and the delivered
    files are the ones approved (memo.md sha256 1a2b3c4d5e6f)"."""
    if "binds" not in bound:
        if "artifact_unit" in bound:
            return f"Applies while {bound['artifact_unit']}'s output is unchanged"
        plan = f" for plan-v{bound['plan_n']}" if "plan_n" in bound else ""
        return f"Applies{plan} while the contract is unchanged"
    parts: list[str] = []
    for ref, value in (bound.get("binds") or {}).items():
        kind, _, name = str(ref).partition(":")
        if ref == "plan":
            parts.append(f"the plan is plan-v{value}")
        elif ref == "contract":
            parts.append("the contract is unchanged")
        elif kind == "contract":
            parts.append(f"the contract's {name} is {value!r}")
        elif kind == "artifact":
            parts.append(f"{name}'s output is unchanged")
        elif kind == "verdict":
            passed = isinstance(value, dict) and value.get("passed")
            parts.append(f"{name}'s verdict is {'passed' if passed else 'not passed'}")
        elif kind == "deliver":
            files = ", ".join(f"{f.partition(':')[2] or f} sha256 {str(h)[:12]}"
                              for f, h in (value or {}).items()) if isinstance(value, dict) \
                else ""
            parts.append(f"{name} delivers the same bytes" + (f" ({files})" if files else ""))
        elif kind == "audited":
            parts.append(f"the audit passed on the bytes {name} delivers")
        else:
            parts.append(f"{ref} is unchanged")
    return "Applies while " + ("; ".join(parts) if parts else "nothing it binds changes")



def _note(kind: str, unit: str | None, p: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(headline, detail lines) for one decision event; None when it changed nothing."""
    if kind in ("decision.plan_change", "decision.input_change"):
        what = "; ".join(str(c.get("detail") or c.get("kind")) for c in p.get("changes", []))
        label = p.get("plan") or p.get("inputs") or ""
        head = f"{'Plan' if kind.endswith('plan_change') else 'Inputs'} changed" + (
            f" ({label})" if label else "") + f": {what or 'the project files changed'}"
        lines = []
        origins = sorted({str(c.get("origin")) for c in p.get("changes", []) if c.get("origin")})
        if origins:
            lines.append(f"Why: {', '.join(origins)} changed in the project files.")
        redo = _redone(p.get("invalidated"))
        lines.append(f"Redone: {redo} (each depends on what changed)." if redo else
                     "Redone: nothing (no current unit depended on it).")
        if p.get("reused"):
            lines.append(f"Reused: {len(p['reused'])} units.")
        return head, lines
    if kind == "decision.budget_raise":
        old, new = p.get("old", {}), p.get("new", {})
        moves = ", ".join(f"{k} {_plain(old[k]) if k in old else 'no limit'} → "
                          f"{_plain(new[k])}" for k in sorted(new))
        return (f"Budget raised{_by(p)}: {moves}",
                [f"Why: {p.get('reason') or 'no reason given'}.",
                 f"Used at the time: {_plain(p.get('used', {})) or 'nothing'}."])
    if kind == "approval.decided":
        gate = p.get("gate") or p.get("gate_id") or unit
        bound = p.get("bound_object") or {}
        return (f"Approval: gate {gate} answered {p.get('choice')!r}{_by(p)}",
                [binding_note(bound)
                 + (f" (via {p['via']})." if p.get("via") not in (None, "direct") else ".")])
    if kind == "approval.revoked":
        return (f"Approval revoked: gate {p.get('gate') or p.get('gate_id') or unit}{_by(p)}",
                [f"Why: {p.get('reason') or 'no reason given'}."])
    if kind == "decision.takeover":
        action = str(p.get("action", "takeover")).replace("_", " ")
        lines = [f"Note: {p['note']}."] if p.get("note") else []
        redo = _redone(p.get("invalidated"))
        if redo:
            lines.append(f"Redone: {redo}.")
        return f"Takeover: {action}" + (f" {unit}" if unit else "") + _by(p), lines
    if kind == "recovery.done":
        if not p.get("did_work"):
            return None
        lines = []
        if p.get("orphans"):
            lost = sorted({str(a).split("/")[0] for a in p["orphans"]}, key=natural_key)
            lines.append(f"Lost in an interruption and redone: {compact_ids(lost)} (unfinished "
                         f"attempt(s) {', '.join(map(str, p['orphans']))} set aside, never used).")
        if p.get("invalidated"):
            lines.append(f"Redone: {_redone(p['invalidated'])}.")
        if p.get("reused") is not None:
            lines.append(f"Reused: {p['reused']} units.")
        interrupted = p.get("orphans") or p.get("fenced")
        return ("Recovered after an interruption" if interrupted else
                "Resumed: " + ("applied what changed" if p.get("changes") or p.get("invalidated")
                               else "settled what was pending")), lines
    if kind == "decision.recovery_reset":
        return (f"Recovery reset{_by(p)}", [f"Why: {p.get('reason') or 'no reason given'}."])
    details = _plain({k: v for k, v in p.items() if k != "who"})
    return (kind.removeprefix("decision.").replace("_", " ").capitalize()
            + (f" ({unit})" if unit else "") + _by(p), [details] if details else [])


@register(NOTES)
def run_notes(ctx: UnitContext) -> KindOutcome:
    events = sorted(ctx.decision_events(), key=lambda e: e.seq)
    audit_units = deps_writing(ctx, "audit.json")
    lines = [f"# Change notes — run {ctx.run_id}", ""]
    for unit in audit_units:
        audit = ctx.dep_json(unit.id, "audit.json")
        verdict = "passed" if audit.get("passed") else "FAILED"
        lines.append(f"Final audit {unit.id}: {verdict} ({len(audit.get('checks', []))} checks).")
    if audit_units:
        lines.append("")
    notes = [(e, n) for e in events if (n := _note(e.kind, e.unit, e.payload)) is not None]
    if not notes:
        lines.append("No decisions recorded: the run went ahead on its original plan, approvals "
                     "and budget.")
    else:
        lines += [f"What changed during the run, oldest first ({len(notes)}):", ""]
        for number, (e, (head, details)) in enumerate(notes, start=1):
            lines.append(f"{number}. **{_when(e.ts)} — {head}**")
            lines += [f"   {d}" for d in details]
    text = "\n".join(lines) + "\n"
    ctx.write("change-notes.md", text, media_type=MARKDOWN)
    return KindOutcome(validators=[result("structure", [], f"{len(events)} decision(s) noted")],
                       facts={"decisions": len(events)})
