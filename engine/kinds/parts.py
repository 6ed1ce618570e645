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
from keepstep.engine.gateway.offline_provider import PROVIDER as OFFLINE_PROVIDER
from keepstep.engine.kinds.citable import drop_record_labels
from keepstep.engine.kinds.claims import figure_holders
from keepstep.engine.kinds.common import (
    cite,
    dep_units,
    deps_writing,
    evidence_index,
    natural_key,
    notices,
    shown_calculation,
    verified_deps,
)
from keepstep.engine.kinds.conflicts import run_id
from keepstep.engine.kinds.context import UnitContext
from keepstep.engine.kinds.extract import DOCUMENT, REGISTER
from keepstep.engine.kinds.stale import stale_labels
from keepstep.engine.kinds.synthesize import META_FIELDS, POINTS, ranking_table

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
        # Quotes of every cited id (a synthesis or ranking carries those it cites).
        self.quotes: dict[str, str] = {}
        for doc in self.syntheses + self.rankings:
            self.quotes.update({str(k): str(v) for k, v in (doc.get("quotes") or {}).items()})
        self.quotes.update({str(e["id"]): str(e.get("quote", "")) for e in self.evidence
                            if e.get("id") is not None})
        docs = [*self.syntheses, *self.rankings, *self.verified.values()]
        self.models = sorted({str(m) for d in docs for m in d.get("models") or []} | {
            # An artifact written before units recorded their models: only the offline
            # heuristic writes a notice into its answers.
            f"{OFFLINE_PROVIDER}/keepstep-offline" for d in docs
            if "models" not in d and d.get("notice")})
        self.conflicts = conflict_records(docs)
        self._stale: dict[str, tuple[str, list[str]]] | None = None
        self.titles = {str(s["id"]): str((s.get("header") or {}).get("title") or s.get("title")
                                         or "") for s in self.inventory if s.get("id")}
        for doc in self.syntheses + self.rankings:
            for sid, title in (doc.get("sources") or {}).items():
                self.titles.setdefault(str(sid), str(title))
        # Each source's metadata (title, kind, date, publisher) and where each field came
        # from: the project's source register (sources.toml) or the document's own header.
        self.meta: dict[str, dict[str, str]] = {}
        self.meta_from: dict[str, dict[str, str]] = {}
        # (a synthesis or ranking carries the metadata of the sources it cites, so a document
        # drawn from it alone can list them too)
        for doc in [*self.verified.values(), *self.syntheses, *self.rankings]:
            for sid, meta in (doc.get("source_meta") or {}).items():
                if isinstance(meta, dict):
                    self.meta.setdefault(str(sid), {str(k): str(v) for k, v in meta.items()})
                if isinstance(meta, dict) and meta.get("title"):
                    self.titles.setdefault(str(sid), str(meta["title"]))
            for sid, origin in (doc.get("source_meta_from") or {}).items():
                if isinstance(origin, dict):
                    self.meta_from.setdefault(str(sid), {str(k): str(v)
                                                         for k, v in origin.items()})
        for e in self.evidence:
            if e.get("source_title") and e.get("source_id"):
                self.titles.setdefault(str(e["source_id"]), str(e["source_title"]))
        for c in self.conflicts:
            for side in c["sides"]:
                if side.get("quote"):
                    self.quotes.setdefault(side["evidence_id"], str(side["quote"]))
                if side.get("source_title"):
                    self.titles.setdefault(str(side["source_id"]), str(side["source_title"]))
        # Findings and ranked items a placeholder already showed (no repetition unless the
        # template's fill says ``repeat``).
        self.shown: set[str] = set()
        self.written: set[str] = set()  # the words of every model-written sentence so far
        # What the document's template has a section for ("conflicts", "gaps", ...): a part
        # does not repeat what another section of the same document says.
        self.covers: set[str] = set()
        # Whether the document recommends a course (a recommendation placeholder): a
        # disagreement over advice the sources leave open is then weighed, not left aside.
        self.recommends = False
        # What the document's rankings of anything but risks rank ("options"), when it
        # shows one (set by render from every dependency).
        self.ranks: list[str] = []
        self.plan_title = str(getattr(getattr(ctx.plan, "plan", None), "title", "") or "")
        self.title = str(self.contract.get("title") or self.project_contract.get("title")
                         or self.plan_title or ctx.unit.title)
        self.client = str(self.contract.get("client", ""))
        audiences = sorted({str(d.get("audience")) for d in self.syntheses + self.rankings
                            if d.get("audience") and d.get("audience") != "general"})
        self.audience = " and ".join(audiences) or "general readers"
        self.notice = "; ".join(notices(*self.syntheses, *self.rankings, *self.verified.values()))

    def risks(self) -> list[dict[str, Any]]:
        return [r for doc in self.rankings for r in doc.get("risks", [])]

    @property
    def offline(self) -> bool:
        return any(m.startswith(f"{OFFLINE_PROVIDER}/") for m in self.models)

    def notice_line(self) -> str:
        """The document's closing line, for a client: every model that answered (from the
        units' records of their calls) and how its figures were checked."""
        if not self.models:
            return ""
        offline = [m for m in self.models if m.startswith(f"{OFFLINE_PROVIDER}/")]
        models = [m for m in self.models if m not in offline]
        named = []
        if models:
            named.append(f"the {_joined(models)} language model" + ("s" if len(models) > 1
                                                                     else ""))
        if offline:
            named.append(f"keepstep's offline heuristic model ({_joined(offline)}: rules, "
                         "no language model)")
        return (f"_Prepared with {' and '.join(named)}; every figure is checked against the "
                "quoted sources._")

    def offline_notice(self) -> str:
        """The first line of every document an offline heuristic answered for."""
        if not self.offline:
            return ""
        return ("> **Written by keepstep's offline heuristic model, not a language model**: "
                "its findings are sentences picked from the sources by rule. Check them "
                "before relying on them.")

    @property
    def stale(self) -> dict[str, tuple[str, list[str]]]:
        """The evidence whose figures were stated before their period ended, with each
        label (``kinds.stale``), from the sources' dates verify recorded."""
        if self._stale is None:
            self._stale = stale_labels(self.evidence, self.meta, self.meta_from)
            # A document reading syntheses, not the verified evidence: what they recorded.
            for doc in self.syntheses:
                for i, mark in (doc.get("stated_before_period_end") or {}).items():
                    if isinstance(mark, dict) and mark.get("label"):
                        self._stale.setdefault(str(i), (str(mark["label"]), [
                            str(f) for f in mark.get("figures") or []]))
        return self._stale

    def fresh(self, key: str, repeat: bool) -> bool:
        """Whether the item ``key`` may be shown now (marks it shown)."""
        if repeat:
            return True
        if key in self.shown:
            return False
        self.shown.add(key)
        return True

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


# --- disagreements -----------------------------------------------------------------------------
_LEGACY_CLASS = {"conflict-open": "unexplained", "conflict-resolved": "superseded",
                 "not-a-conflict": "not-a-conflict"}


def conflict_records(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The disagreements recorded in ``docs`` (verified.json's full records, a synthesis's
    or ranking's copies, older ids/values/status records), one per set of evidence ids:
    metric, entity, period, cls, holds, holds_ids, reason, applies, sides."""
    out: dict[frozenset[str], dict[str, Any]] = {}
    taken: set[str] = set()
    for doc in docs:
        for c in doc.get("conflicts") or []:
            if not isinstance(c, dict):
                continue
            sides = [dict(s) for s in c.get("sides") or [] if isinstance(s, dict)]
            if not sides:
                values = list(c.get("values") or [])
                sides = [{"evidence_id": str(i), "value": str(values[n]) if n < len(values)
                          else ""} for n, i in enumerate(c.get("ids") or [])]
            for side in sides:
                side["evidence_id"] = str(side.get("evidence_id", ""))
                side["source_id"] = str(side.get("source_id") or
                                        side["evidence_id"].rsplit("-e", 1)[0])
                side["value"] = str(side.get("value", ""))
            key = frozenset(s["evidence_id"] for s in sides)
            if not key or key in out:
                continue
            cls = str(c.get("class") or _LEGACY_CLASS.get(str(c.get("status")), "unexplained"))
            # An id another record took (two verify units each number theirs K1, K2 ...) is
            # qualified by this record's verify unit, or by the synthesis or ranking whose
            # copy it is, so each id names one disagreement.
            cid = str(c.get("id") or "")
            cid = run_id(cid, str(c.get("verify_unit") or doc.get("unit") or ""), taken) \
                if cid else ""
            out[key] = {"id": cid,
                        "metric": str(c.get("metric") or "a quantity"),
                        "entity": str(c.get("entity") or ""), "period": str(c.get("period") or ""),
                        "cls": cls, "holds": str(c.get("holds") or ""),
                        "holds_ids": [str(i) for i in c.get("holds_ids") or []],
                        "reason": str(c.get("reason") or ""),
                        "applies": str(c.get("applies") or ""), "sides": sides,
                        "about": "advice" if c.get("about") == "advice" else "figure"}
    return sorted(out.values(), key=lambda c: natural_key(min(c["sides"][0]["evidence_id"],
                                                                  default="")))


def open_conflicts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in records if c["cls"] == "unexplained"]


def real_conflicts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in records if c["cls"] != "not-a-conflict"]


_VERDICT = {
    "definition": "Two definitions, both valid",
    "superseded": "Superseded",
    "outdated": "Out of date",
    "unexplained": "Unresolved",
}


def _sentence(text: str) -> str:
    text = text.strip().rstrip(".").strip()
    return text[:1].upper() + text[1:] + "." if text else ""


def _advice_line(c: dict[str, Any], src: Sources) -> str:
    """A disagreement over advice: each source's advice (its words, quoted, with its date
    where known), what kind of disagreement it is, the advice the documents follow (or none)
    and why."""
    sides = []
    for s in c["sides"]:
        date = src.meta.get(s["source_id"], {}).get("date") or s.get("source_date") or ""
        sides.append(f"“{s['value'].strip()}” {_cite([s['evidence_id']], src.index)}, "
                     + (f"dated {date}" if date else "undated"))
    if c["cls"] == "unexplained":
        verdict = "the sources do not settle which course to follow, so every side is set " \
            "out here"
        if src.recommends:
            # The document recommends a course: it weighs the courses, it does not deny
            # taking one (the document's ranking of options, when it has one, shows how).
            verdict += ("; the recommendation weighs the courses"
                        + (f" in the ranking of the {src.ranks[0]}" if src.ranks else ""))
        else:
            verdict += " and none is taken as settled"
    else:
        followed = [s for s in c["sides"] if s["evidence_id"] in c["holds_ids"]
                    or (c["holds"] and s["value"] == c["holds"])]
        verdict = ("we follow " + ", ".join(
            src.titles.get(s["source_id"]) or s["source_id"] for s in followed) + "'s advice"
            if followed else "we follow none of them as settled")
    why = " ".join(x for x in (_sentence(c["applies"]) if c["cls"] == "definition" else "",
                               _sentence(_attributed(c["reason"], c, src))) if x)
    label = "Advice for different cases" if c["cls"] == "definition" else \
        _VERDICT.get(c["cls"], c["cls"])
    return (f"- **Sources disagree on what to do ({c['metric']})**: " + "; ".join(sides)
            + f". **{label}**: {verdict}." + (f" {why}" if why else ""))


def _conflict_line(c: dict[str, Any], src: Sources) -> str:
    if c.get("about") == "advice":
        return _advice_line(c, src)
    what = c["metric"] + (f" ({', '.join(x for x in (c['entity'], c['period']) if x)})"
                          if c["entity"] or c["period"] else "")
    sides = "; ".join(f"{s['value']} {_cite([s['evidence_id']], src.index)}"
                      for s in c["sides"])
    if c["cls"] == "unexplained":
        verdict = "nothing in the sources says which holds, so we state neither value as fact"
    elif c["cls"] == "definition":
        verdict = (f"we use {c['holds']}" if c["holds"] else
                   "each value applies to its own definition")
    else:
        verdict = f"we use {c['holds']}" if c["holds"] else "see why"
    why = " ".join(x for x in (_sentence(c["applies"]) if c["cls"] == "definition" else "",
                               _sentence(_attributed(c["reason"], c, src))) if x)
    return (f"- **{what}**: {sides}. **{_VERDICT.get(c['cls'], c['cls'])}**: {verdict}."
            + (f" {why}" if why else ""))


def caveat(claim: dict[str, Any], src: Sources) -> str:
    """For a finding that cites the losing side of a settled disagreement (a superseded or
    out-of-date value) or a side of an unresolved one: nothing when the document has a
    disagreements section (it says which value holds and why), else a plain sentence naming
    the figure and what the disagreement record says of it."""
    if "conflicts" in src.covers:
        return ""
    ids = set(claim.get("evidence_ids") or [])
    notes = []
    for c in real_conflicts(src.conflicts):
        if c["cls"] == "definition" or c.get("about") == "advice":
            continue
        hit = [s for s in c["sides"] if s["evidence_id"] in ids
               and s["evidence_id"] not in c["holds_ids"]
               and (c["cls"] == "unexplained" or s["value"] != c["holds"])]
        if not hit:
            continue
        # Figure-free, so the sentence never adds a figure the line's quotes do not hold.
        if c["cls"] == "unexplained":
            notes.append(f"The sources disagree on the {c['metric']} and none says which "
                         "holds, so this figure is one side of that disagreement.")
        else:
            state = "superseded by a later source" if c["cls"] == "superseded" \
                else "out of date"
            whose = ", ".join(dict.fromkeys(s["source_id"] for s in hit))
            notes.append(f"The {c['metric']} figure from {whose} is {state}; another "
                         "source's value holds.")
    return (" " + " ".join(notes)) if notes else ""


def score_scale(doc: dict[str, Any]) -> str:
    """The line under a ranking's table: the score's scale and how it is formed."""
    if str(doc.get("ranks") or "risks") == "risks":
        return ("Score: likelihood (1-5) × impact (1-5), so 1-25; a higher score is a more "
                "serious risk. Rank 1 is the highest score.")
    criteria = [str(c) for c in doc.get("criteria") or []]
    items = [r for r in doc.get("risks") or [] if isinstance(r, dict)]
    if criteria and items and all(r.get("score_from") == "points" for r in items):
        low, high = POINTS
        weights = doc.get("weights") or {}
        terms = [f"{c} points × {weights[c]}" if weights.get(c, 1) != 1 else f"{c} points"
                 for c in criteria]
        top = sum(high * int(weights.get(c, 1)) for c in criteria)
        bottom = sum(low * int(weights.get(c, 1)) for c in criteria)
        return (f"Score = {' + '.join(terms)}, so {bottom}-{top}, higher is better: each "
                f"{_noun(doc)} gets {low}-{high} points per criterion ({high} meets it best) "
                "on the value shown, and the score is the sum of the points. Rank 1 is the "
                "highest score.")
    on = f" on {', '.join(criteria)}" if criteria else " on the question's criteria"
    return (f"Score: 1-25, higher is better, a judgement of each {_noun(doc)}{on} as stated "
            "by the ranking (the rationale says how its criteria give its score; it has no "
            "points per criterion to rebuild it from). Rank 1 is the highest score.")


def _noun(doc: dict[str, Any]) -> str:
    what = str(doc.get("ranks") or "risks")
    return what[:-1] if what.endswith("s") else what


# --- sources ------------------------------------------------------------------------------
_ORIGIN_WORDS = {REGISTER: "the source register",
                 DOCUMENT: "the document itself"}


def _meta_origin(sid: str, src: Sources) -> str:
    """Where a source's metadata came from, in words: "title, date: the source register;
    publisher: the document itself"."""
    meta, origin = src.meta.get(sid, {}), src.meta_from.get(sid, {})
    by: dict[str, list[str]] = {}
    for f in META_FIELDS:
        if meta.get(f):
            by.setdefault(origin.get(f, ""), []).append(f)
    return "; ".join(f"{', '.join(fs)}: {_ORIGIN_WORDS.get(o, 'not recorded')}"
                     for o, fs in by.items())


def source_list(src: Sources) -> str:
    """The sources the document rests on: id, title, kind, date and publisher, and where
    each came from (the project's source register or the document itself), so a date
    used to settle a disagreement can be checked."""
    ids = sorted({str(e.get("source_id")) for e in src.evidence if e.get("source_id")}
                 | set(src.meta), key=natural_key)
    if not ids:
        return "No source was verified for this document."
    lines = ["| Source | Title | Kind | Date | Publisher | Where this comes from |",
             "|---|---|---|---|---|---|"]
    for sid in ids:
        meta = src.meta.get(sid, {})
        title = meta.get("title") or src.titles.get(sid, "")
        cells = [sid, title, *[meta.get(f) or "not given" for f in META_FIELDS[1:]],
                 _meta_origin(sid, src) or "not recorded"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def _attributed(reason: str, c: dict[str, Any], src: Sources) -> str:
    """A disagreement's reason with each date it takes from the source register said to be
    so ("dated 2025-02-01 in the source register"): the document itself does not carry it."""
    for sid in dict.fromkeys(s["source_id"] for s in c["sides"]):
        date = src.meta.get(sid, {}).get("date", "")
        if not date or src.meta_from.get(sid, {}).get("date") != REGISTER:
            continue
        at = reason.find(date)
        if at < 0 or reason[at + len(date):].lstrip().startswith("in the source register"):
            continue
        end = at + len(date)
        reason = reason[:end] + " in the source register" + reason[end:]
    return reason


def conflicts(src: Sources) -> str:
    """Every disagreement between sources, each side with its evidence, its class and the
    value the documents use; the apparent ones after, as such."""
    real = real_conflicts(src.conflicts)
    apparent = [c for c in src.conflicts if c["cls"] == "not-a-conflict"]
    if not real and not apparent:
        return ("The verified evidence holds no disagreement between sources: no two sources "
                "give different values for the same quantity or advise different courses.")
    lines = [_conflict_line(c, src) for c in real]
    for about, heading in (("figure", "Figures that look alike but do not disagree:"),
                           ("advice", "Advice that looks alike but does not disagree:")):
        shown = [c for c in apparent if c.get("about", "figure") == about]
        if not shown:
            continue
        lines += ["", heading]
        lines += [f"- {c['metric']}: " + ", ".join(
            (f"“{s['value'].strip()}”" if about == "advice" else s["value"])
            + f" {_cite([s['evidence_id']], src.index)}" for s in c["sides"])
            + (f" — {c['reason'].rstrip('.')}." if c["reason"] else ".") for c in shown]
    return "\n".join(lines).strip()


def gaps(src: Sources) -> str:
    # The synthesis a gap comes from is named only when several name gaps (one title after
    # every line says nothing to a reader).
    named = sum(1 for s in src.syntheses if s.get("gaps")) > 1
    lines = [f"- {g}" + (f" ({s.get('title', s.get('unit', ''))})" if named else "")
             for s in src.syntheses for g in s.get("gaps") or []]
    return "\n".join(lines) or "The syntheses name nothing the sources leave unanswered."


# --- parts -------------------------------------------------------------------------------------
def claim_line(claim: dict[str, Any], index: dict[str, dict[str, str]],
               src: Sources | None = None) -> str:
    """A finding with its checked calculation and a confidence short of high (only with the
    reason the finding gives for it, in words), then where it comes from."""
    extra = ""
    if claim.get("calculation"):
        extra += " " + shown_calculation(str(claim['calculation']))
    reason = str(claim.get("confidence_reason") or "").strip().rstrip(".")
    if claim.get("confidence") in ("medium", "low") and reason:
        extra += f" This is held with {claim['confidence']} confidence: {reason}."
    if claim.get("stated_before"):
        # A figure its source gave before its period ended, stated as if an outcome
        # (kinds.stale): the synthesis recorded the label; the document shows it.
        extra += f" ({claim['stated_before']})"
    if src is not None:
        extra += caveat(claim, src)
    ids = [str(i) for i in claim.get("evidence_ids") or []]
    if src is not None:
        # A figure's citation points at the quote that holds it, not at each id of the finding.
        ids = figure_holders(str(claim.get("text", "")), ids, src.quotes,
                             claim.get("calculation"))
    text = drop_record_labels(str(claim["text"]), claim.get("conflict_ids") or [])
    return f"{text}{extra} {_cite(ids, index)}"


def _key(doc: dict[str, Any], item: dict[str, Any]) -> str:
    """What makes two items the same finding: their words (two syntheses may find one)."""
    return " ".join(str(item.get("text", item.get("title", ""))).lower().split())


def risk_table(src: Sources, repeat: bool = False) -> str:
    """Each ranking as a table of what it ranks (risks, options, vendors, ...), once per
    document unless ``repeat``: a later part names the one shown above."""
    if not src.rankings:
        return "No ranking was given for this document."
    lines: list[str] = []
    for doc in src.rankings:
        if not src.fresh(f"ranking {doc.get('unit', '')}", repeat):
            lines += [f"The ranking ({doc.get('title', '')}) is shown above.", ""]
            continue
        if len(src.rankings) > 1:
            lines += [f"**{doc.get('title', '')}**", ""]
        lines += ranking_table(doc, lambda ids: _cite(ids, src.index))
        lines += ["", score_scale(doc)]
        if doc.get("converged") is False:
            lines += ["", "This ranking's check still found problems it could not settle: "
                      "they are listed with the open problems."]
        lines.append("")
    return "\n".join(lines).strip()


def executive_summary(src: Sources, repeat: bool = False) -> str:
    summary = [f"- **{s['title']}**: {claim_line(c, src.index, src)}"
               for s in src.syntheses if (c := _first_fresh(src, s, repeat)) is not None]
    ranked = next((d for d in src.rankings if d.get("risks")), None)
    if ranked is not None:
        # The top of what the ranking ranks: a risk, or the top-ranked option (vendor, ...).
        top = ranked["risks"][0]
        label = "Top risk" if str(ranked.get("ranks") or "risks") == "risks" else \
            f"Top-ranked {_noun(ranked)}"
        summary.append(f"- **{label}**: {top['title']} (score {top['score']}) "
                       f"{_cite(top['evidence_ids'], src.index)}")
    return "\n".join(summary) or "No synthesis was given for this report."


def findings(src: Sources, repeat: bool = False) -> str:
    lines: list[str] = []
    for s in src.syntheses:
        claims = s.get("claims", [])
        fresh = [c for c in claims if src.fresh(_key(s, c), repeat)]
        lines += [f"### {s['title']}", ""]
        if len(fresh) < len(claims):
            lines += ["(Its findings shown above are not repeated here.)", ""]
        lines += [f"{n}. {claim_line(c, src.index, src)}"
                  for n, c in enumerate(fresh, start=1)] or (
            [] if claims else ["No findings."])
        if s.get("gaps") and "gaps" not in src.covers:
            # The gaps section lists them when the template has one; otherwise a list here.
            lines += ["", "Not answered by the sources:", ""]
            lines += [f"- {_sentence(str(g))}" for g in s["gaps"]]
        lines.append("")
    return "\n".join(lines).strip() or "No findings."


def questions(src: Sources) -> str:
    lines = [f"- {q['id']}: {q['question']}" for q in src.questions]
    return "\n".join(lines) or "No research questions were framed for this report."


def top_risks(src: Sources, n: int = TOP_RISKS) -> str:
    top = [f"{k}. **{r['title']}** (score {r['score']}) {_cite(r['evidence_ids'], src.index)}"
           for k, r in enumerate(src.risks()[:n], start=1)]
    return "\n".join(top) or "No ranked risks."


def supporting_findings(src: Sources, repeat: bool = False) -> str:
    support = [f"- **{s['title']}**: {claim_line(c, src.index, src)}"
               for s in src.syntheses if (c := _first_fresh(src, s, repeat)) is not None]
    if not support and any(s.get("claims") for s in src.syntheses):
        return "The findings that support it are in the summary above."
    return "\n".join(support) or "No supporting findings were given."


def _first_fresh(src: Sources, synthesis: dict[str, Any], repeat: bool) -> dict[str, Any] | None:
    """The synthesis's first finding the document has not shown yet (marked shown)."""
    return next((c for c in synthesis.get("claims", [])
                 if src.fresh(_key(synthesis, c), repeat)), None)


def section_by_rule(src: Sources, of: list[str], repeat: bool = False) -> str:
    """A written section composed by rule (the offline heuristic's way) from what ``of``
    names: the findings not shown yet, the rankings, the disagreements, the gaps."""
    parts: list[str] = []
    if "findings" in of:
        lines = [f"- {claim_line(c, src.index, src)}" for s in src.syntheses
                 for c in s.get("claims", []) if src.fresh(_key(s, c), repeat)]
        parts.append("\n".join(lines) or "Every finding is shown above.")
    if "rankings" in of:
        parts.append(risk_table(src, repeat))
    if "conflicts" in of:
        parts.append(conflicts(src))
    if "gaps" in of:
        parts.append(gaps(src))
    if "evidence" in of:
        parts.append(evidence(src, [], None))
    return "\n\n".join(p for p in parts if p)


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
    # A statement on a side of an unresolved disagreement is marked so: the table quotes it,
    # it does not state it as fact.
    disputed = {s["evidence_id"] for c in open_conflicts(src.conflicts) for s in c["sides"]}
    # "general" is no topic: where none was assigned the row shows its kind (fact, figure,
    # recommendation, …); a table with neither has no such column.
    topic = {str(e["id"]): t for e in rows
             if (t := str(e.get("topic") or "")) and t != "general"}
    what = {str(e["id"]): topic.get(str(e["id"])) or str(e.get("kind") or "") for e in rows}
    head = "Topic" if topic else "Kind" if any(what.values()) else ""
    lines = ["| Evidence | Source | " + (f"{head} | " if head else "") + "Statement |",
             "|---|---|" + ("---|" if head else "") + "---|"]
    lines += [f"| {e['id']} | {e.get('source_id', '')} | "
              + (f"{what[str(e['id'])].replace('|', '/')} | " if head else "")
              + f"{str(e.get('quote', '')).replace('|', '/')}"
              + (" _(disputed: see where the sources disagree)_" if e["id"] in disputed
                 else "")
              # A figure stated before its period ended (kinds.stale): not an outcome.
              + (f" _({src.stale[str(e['id'])][0]}, before its period ended)_"
                 if str(e["id"]) in src.stale else "")
              + " |" for e in rows]
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
    repeat = spec.repeat if spec is not None else False
    if spec is not None and spec.from_:
        src.shown = default.shown  # one document: what it showed, whatever a part draws from
        src.covers = default.covers
        src.recommends = default.recommends
        src.ranks = default.ranks
    values = src.base_values()
    if part in values:
        return values[part]
    if part == "executive_summary":
        return executive_summary(src, repeat)
    if part == "findings":
        return findings(src, repeat)
    if part == "supporting_findings":
        return supporting_findings(src, repeat)
    if part == "section":
        return section_by_rule(src, list(spec.of) if spec is not None else [], repeat)
    if part == "gaps":
        return gaps(src)
    if part == "risks":
        return risk_table(src, repeat)
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
    if part == "sources":
        return source_list(src)
    if part == "audit":
        return audit(src)
    if part == "unconverged":
        return unconverged(src)
    raise KeyError(part)


__all__ = ["PARTS", "TABLE_COLUMNS", "Sources", "claim_line", "conflict_records", "fill_part",
           "open_conflicts", "real_conflicts", "recommendation", "score_scale",
           "section_by_rule", "source_list", "with_provenance"]


def _joined(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
