"""Records a claim may cite beside evidence: a disagreement and a ranked item.

A finding that says which of two values holds rests on the disagreement verify settled —
its sides' quotes, class, the value used and the reason, which rest on the sources' dates
(metadata, in no quote); a recommendation that says an option ranks last rests on the
ranking. Both are made citable here: each gets an id (``K1`` for a disagreement, as its
verify unit numbered it; ``<unit>.R2`` for a ranked item) and a text — what the claim rules
(its figures) and the support check (its quotes) read, in the place of a quote. After the
answer, a cited record is expanded to the evidence it rests on, so a document cites real
quotes only (``expand``).

Callers may rely on: ``conflict_text`` naming every side's value, evidence id, source title
and date ("dated 1 February 2025"), the class, the value used and the reason; ids never
matching an evidence id (``K1``, ``K01.R2``: no ``-e<n>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Any

_CLASS_WORDS = {
    "definition": "two definitions, both valid",
    "superseded": "superseded (a newer source replaces the older figure)",
    "outdated": "out of date (the older figure is no longer current)",
    "unexplained": "unexplained (nothing says which holds)",
    "not-a-conflict": "not a conflict (the figures measure different things)",
}
_ISO_DATE_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")


def human_date(text: str) -> str:
    """``2025-02-01`` -> ``1 February 2025`` (a date a claim can state: its figures are
    words a figure check reads); anything else as given."""
    m = _ISO_DATE_RE.match(text.strip())
    if not m:
        return text.strip()
    try:
        d = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return text.strip()
    return f"{d.day} {d.strftime('%B')} {d.year}"


def conflict_text(c: Mapping[str, Any]) -> str:
    """A disagreement as a claim cites it: its sides (value, evidence id, source, date,
    quote), its class, the value used and why."""
    cls = str(c.get("class") or c.get("cls") or "unexplained")
    if c.get("about") == "advice":
        return _advice_text(c, cls)
    about = ", ".join(str(c[k]) for k in ("entity", "period") if c.get(k))
    head = f"Disagreement {c.get('id', '')} on {c.get('metric') or 'a quantity'}" + (
        f" ({about})" if about else "") + f": {_CLASS_WORDS.get(cls, cls)}."
    sides = []
    for s in c.get("sides") or []:
        where, dated = _where_dated(s)
        quote = f": “{s['quote']}”" if s.get("quote") else ""
        sides.append(f"{s.get('value', '')} in {s.get('evidence_id', '')} from {where}"
                     f"{dated}{quote}")
    body = " Sides: " + "; ".join(sides) + "." if sides else ""
    holds = str(c.get("holds") or "")
    used = (f" The value that holds: {holds}" + (
        f" ({', '.join(str(i) for i in c.get('holds_ids') or [])})"
        if c.get("holds_ids") else "") + "." if holds else
        " No value holds: the documents state neither as fact.")
    applies = f" Which applies when: {c['applies']}." if c.get("applies") else ""
    reason = f" Why: {str(c['reason']).strip()}" if c.get("reason") else ""
    return (head + body + used + applies + reason).strip()


def _where_dated(side: Mapping[str, Any]) -> tuple[str, str]:
    """A side's source as "Title (id)" and ", dated <date>" (or ", undated")."""
    source = str(side.get("source_title") or side.get("source_id") or "")
    sid = str(side.get("source_id") or "")
    where = f"{source} ({sid})" if source and sid and source != sid else source
    dated = f", dated {human_date(str(side['source_date']))}" if side.get("source_date") \
        else ", undated"
    return where, dated


_ADVICE_CLASS_WORDS = {
    "definition": "each advice holds for its own case",
    "superseded": "superseded (a newer source's advice replaces the older)",
    "outdated": "out of date (the older advice is no longer current)",
    "unexplained": "unexplained (nothing says which course to follow)",
    "not-a-conflict": "not a conflict (the advice does not disagree)",
}


def _advice_text(c: Mapping[str, Any], cls: str) -> str:
    """A disagreement over advice as a claim cites it: each source's advice (its words),
    evidence id, source and date, the class, the advice followed and why."""
    head = (f"Disagreement {c.get('id', '')} over advice ({c.get('metric') or 'a course'}): "
            f"{_ADVICE_CLASS_WORDS.get(cls, cls)}.")
    sides = []
    for s in c.get("sides") or []:
        where, dated = _where_dated(s)
        sides.append(f"{where}{dated} advises in {s.get('evidence_id', '')}: "
                     f"“{s.get('value', '')}”")
    body = " Sides: " + "; ".join(sides) + "." if sides else ""
    ids = [str(i) for i in c.get("holds_ids") or []]
    used = (f" The advice followed: {', '.join(ids)}." if ids and cls != "unexplained" else
            " The sources do not settle which advice to follow: the documents set every side "
            "out, and a recommendation weighs the courses.")
    applies = f" Which applies when: {c['applies']}." if c.get("applies") else ""
    reason = f" Why: {str(c['reason']).strip()}" if c.get("reason") else ""
    return (head + body + used + applies + reason).strip()


def citable_conflicts(conflicts: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """id -> text of each disagreement that has an id (a record without one is not
    citable); an id met twice keeps its first record."""
    out: dict[str, str] = {}
    for c in conflicts:
        cid = str(c.get("id") or "")
        if cid and cid not in out:
            out[cid] = conflict_text(c)
    return out


def conflict_evidence(conflicts: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """id -> the evidence ids of its sides."""
    return {str(c["id"]): [str(s.get("evidence_id")) for s in c.get("sides") or []
                           if s.get("evidence_id")]
            for c in conflicts if c.get("id")}


def ranking_text(unit: str, doc: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """A ranked item as a claim cites it: what the ranking ranks and on what criteria, the
    item's place, score, criterion values and rationale."""
    what = str(doc.get("ranks") or "risks")
    items = doc.get("risks") or []
    place = next((n for n, r in enumerate(items, start=1) if r.get("id") == item.get("id")), 0)
    criteria = item.get("criteria") or {}
    crit = "; ".join(f"{k}: {v}" for k, v in criteria.items()) if isinstance(criteria, dict) \
        else ""
    declared = ", ".join(str(c) for c in doc.get("criteria") or [])
    text = (f"Ranking {unit} ({doc.get('title', '')}) of {len(items)} {what}"
            + (f" on {declared}" if declared else "") + f": {item.get('id', '')} "
            f"“{item.get('title', '')}” ranks {place} of {len(items)}"
            + (" (last)" if place and place == len(items) else "")
            + f" with score {item.get('score')}.")
    if crit:
        text += f" Criteria: {crit}."
    points = item.get("points")
    if isinstance(points, dict) and points:
        text += (" Points (1-5 per criterion; the score is "
                 + ("their weighted sum" if any(int(w) != 1 for w in
                                                (doc.get("weights") or {}).values())
                    else "their sum") + "): "
                 + "; ".join(f"{k}: {v}" for k, v in points.items()) + ".")
    if item.get("calculation"):
        text += f" Calculation (recomputed by code): {item['calculation']}."
    if item.get("rationale"):
        text += f" Rationale: {str(item['rationale']).strip()}"
    return text


def citable_rankings(rankings: Iterable[Mapping[str, Any]]
                     ) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(id -> text, id -> evidence ids) of each ranked item, its id ``<unit>.<item id>``."""
    texts: dict[str, str] = {}
    evidence: dict[str, list[str]] = {}
    for doc in rankings:
        unit = str(doc.get("unit") or "")
        for item in doc.get("risks") or []:
            rid = f"{unit}.{item.get('id', '')}" if unit else str(item.get("id", ""))
            if not item.get("id") or rid in texts:
                continue
            texts[rid] = ranking_text(unit, doc, item)
            evidence[rid] = [str(i) for i in item.get("evidence_ids") or []]
    return texts, evidence


def expand(ids: Iterable[str], records: Mapping[str, list[str]]) -> tuple[list[str], list[str]]:
    """(evidence ids, record ids) of a claim's cited ids: each cited record stands for the
    evidence it rests on, so the document cites those quotes."""
    evidence: list[str] = []
    cited: list[str] = []
    for i in ids:
        if i in records:
            cited.append(i)
            evidence += records[i]
        else:
            evidence.append(i)
    return list(dict.fromkeys(evidence)), list(dict.fromkeys(cited))


def drop_record_labels(text: str, ids: Iterable[str]) -> str:
    """``text`` without the bare record ids a writer put in parentheses ("… replaces the 2023
    notice (K1); …"): in a document a record stands for its evidence, cited by footnote, so
    its id would point a reader nowhere. Only the given ids are removed (a source may be
    called K1 too), and a parenthesis that holds anything else stays."""
    known = {str(i) for i in ids}
    if not known:
        return text

    def repl(m: re.Match[str]) -> str:
        parts = [p.strip() for p in m.group(1).split(",")]
        return "" if parts and all(p in known for p in parts) else m.group(0)

    out = re.sub(r" ?\(([^()]{1,80})\)", repl, text)
    return re.sub(r" +([,.;:])", r"\1", out)


__all__ = ["citable_conflicts", "citable_rankings", "conflict_evidence", "conflict_text",
           "drop_record_labels", "expand", "human_date", "ranking_text"]
