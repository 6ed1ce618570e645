"""Helpers shared by the unit kinds: JSON bytes, citations, dependency lookups, templates.

Everything here is a pure function; kinds stay deterministic by going through it
(sorted keys, natural id order, one citation format that the audit can parse back).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from keepstep.engine.core.plan import Unit, UnitKind, outputs_of
from keepstep.engine.core.presets import (
    AUDIENCES,
    RISKS,
    TOPICS,
    evidence_output,
    evidence_sources,
    verified_output,
)
from keepstep.engine.files.convert import ConvertedSource, find_occurrence
from keepstep.engine.files.convert.quotes import verbatim_matcher
from keepstep.engine.kinds.context import UnitContext, ValidatorResult

JSON = "application/json"
MARKDOWN = "text/markdown"
CSV = "text/csv"

# What every evidence item carries (the intake schema step publishes the same list).
EVIDENCE_REQUIRED = ("id", "source_id", "quote", "figures")

# Evidence ids look like "A1-e3"; documents cite them as "[A1-e3, A1-e4] (sources: A1)", or
# with locators as "[A1-e3, E1-e7] (A1, p. 4; E1, 'Volume tiers'!A6:C6)".
EVIDENCE_ID_RE = re.compile(r"\b[A-Za-z][A-Za-z0-9]*-e\d+\b")
SOURCES_CITE_RE = re.compile(r"\(sources?: ([^)]*)\)")
# A located citation: the id list, then "(SOURCE, LOCATOR; ...)" (one level of parentheses
# allowed inside a locator, e.g. a heading "Prices (2024)").
LOCATED_CITE_RE = re.compile(
    r"\[[A-Za-z][A-Za-z0-9]*-e\d+(?:, [A-Za-z][A-Za-z0-9]*-e\d+)*\] "
    r"\((?!sources?: )((?:[^()]|\([^()]*\))*)\)")
_DETAIL_PROBLEMS = 5


def dump_json(value: Any) -> bytes:
    """Readable, byte-stable JSON: sorted keys, two-space indent, UTF-8, final newline."""
    return (json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def natural_key(value: str) -> tuple[Any, ...]:
    """Sort key putting "A2-e10" after "A2-e9" (plain string order would not)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", value))


def collapse_ws(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def quote_in_text(quote: str, text: str) -> bool:
    """The quote occurs verbatim in the text, line breaks and repeated spaces aside."""
    q = collapse_ws(quote)
    return bool(q) and q in collapse_ws(text)


def quote_cited(conv: ConvertedSource, quote: str, locator: str | None) -> bool:
    """The citation check: ``quote`` occurs verbatim (line breaks and repeated spaces aside,
    as ``quote_in_text``) within the part of the converted source that ``locator`` names —
    a page, a sheet's cells, a slide, a heading path, a table row; anywhere in the text when
    ``locator`` is empty or None. A locator the source does not have fails."""
    matcher = verbatim_matcher(quote)
    if matcher is None:
        return False
    if locator:
        span = conv.span_of(locator)
        if span is None:
            return False
    else:
        span = (0, len(conv.text))
    return matcher.search(conv.text, *span) is not None


class QuoteLocator:
    """Locates the quotes of one answer within ``text[start:end]`` of a converted source.

    Quotes come in document order, so each search starts where the previous quote was found
    (and only when it is not found after it, from ``start`` again): an answer of N items
    costs about one pass over the text, not N. ``locate`` gives the locator an evidence item
    citing the quote carries: ``hint`` (e.g. the model's own) when the quote is verbatim
    there, else the innermost part holding its occurrence; ``""`` when it occurs outside
    every located part, None when it does not occur.
    """

    def __init__(self, conv: ConvertedSource, start: int = 0, end: int | None = None) -> None:
        self.conv, self.start = conv, start
        self.end = len(conv.text) if end is None else end
        self._cursor = start

    def locate(self, quote: str, hint: str | None = None) -> str | None:
        if hint and quote_cited(self.conv, quote, hint):
            return hint
        found = find_occurrence(self.conv, quote, start=self._cursor, end=self.end)
        if found is None and self._cursor > self.start:
            found = find_occurrence(self.conv, quote, start=self.start, end=self.end)
        if found is None:
            return None
        self._cursor = found[0]  # the next quote may start inside this one's line
        locator = self.conv.locator_of(*found)
        return "" if locator is None else locator


def result(name: str, problems: list[str], ok: str = "") -> ValidatorResult:
    """A validator result: passed when there are no problems; detail names the first few."""
    if not problems:
        return ValidatorResult(name=name, passed=True, detail=ok)
    shown = "; ".join(problems[:_DETAIL_PROBLEMS])
    extra = len(problems) - _DETAIL_PROBLEMS
    more = f" (+{extra} more)" if extra > 0 else ""
    return ValidatorResult(name=name, passed=False,
                           detail=f"{len(problems)} problem(s): {shown}{more}")


def structure_problems(items: Any, required: Iterable[str], what: str) -> list[str]:
    """Missing fields and duplicate ids in a list of dicts that must each carry ``required``."""
    if not isinstance(items, list):
        return [f"{what} is not a list"]
    problems: list[str] = []
    seen: set[str] = set()
    for n, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            problems.append(f"{what} #{n} is not an object")
            continue
        label = str(item.get("id") or f"#{n}")
        missing = [f for f in required if item.get(f) in (None, "")]
        if missing:
            problems.append(f"{what} {label} lacks {', '.join(missing)}")
        if "figures" in item and not isinstance(item["figures"], list):
            problems.append(f"{what} {label}: figures is not a list")
        if label in seen:
            problems.append(f"{what} {label} appears twice")
        seen.add(label)
    return problems


# --- the plan around a unit ------------------------------------------------------------
def dep_units(ctx: UnitContext, *kinds: UnitKind) -> list[Unit]:
    """The unit's dependencies of the given kinds (all when none given), by id."""
    units = ctx.plan.unit_map()
    deps = [units[d.unit] for d in ctx.unit.depends_on if d.unit in units]
    if kinds:
        deps = [u for u in deps if u.kind in kinds]
    return sorted(deps, key=lambda u: natural_key(u.id))


def dep_with_param(ctx: UnitContext, kind: UnitKind, key: str, value: str) -> Unit | None:
    """The first dependency of ``kind`` whose ``params[key] == value`` (e.g. intake step)."""
    return next((u for u in dep_units(ctx, kind) if u.params.get(key) == value), None)


def deps_writing(ctx: UnitContext, name: str, units: list[str] | None = None) -> list[Unit]:
    """The unit's dependencies (only ``units`` when given) that write an output ``name``, by
    id — what a general mechanism reads instead of asking for a kind."""
    return [u for u in dep_units(ctx) if name in outputs_of(u)
            and (not units or u.id in units)]


def _deps_with(ctx: UnitContext, output_of: Callable[[Unit], str | None]
               ) -> list[tuple[Unit, str]]:
    return [(u, name) for u in dep_units(ctx) if (name := output_of(u))]


def evidence_deps(ctx: UnitContext) -> list[tuple[Unit, str]]:
    """(unit, its evidence output) for every evidence-producing unit the unit reaches through
    its dependencies (``core.presets.evidence_sources``: directly, or through units that
    produce none, such as other verify units)."""
    units = ctx.plan.unit_map()
    return [(u, name) for u in evidence_sources(ctx.unit, units)
            if (name := evidence_output(u))]


def verified_deps(ctx: UnitContext) -> list[tuple[Unit, str]]:
    """(dependency, its verified-evidence output) for every verification dependency."""
    return _deps_with(ctx, verified_output)


# --- the pack's vocabulary (data/<name>.toml), as the prompts carry it ----------------------
def topic_hints(ctx: UnitContext) -> list[dict[str, Any]] | None:
    """data:topics as INPUT's ``topics``: [{name, keywords}] in the pack's order; None when
    the pack has none."""
    topics = ctx.data(TOPICS).get("topic")
    if not isinstance(topics, list):
        return None
    return [{"name": str(t["name"]), "keywords": [str(k) for k in t.get("keywords", [])]}
            for t in topics if isinstance(t, dict) and t.get("name")]


def audience_view(ctx: UnitContext, audience: str) -> dict[str, Any]:
    """How ``audience`` reads (data:audiences): order, labels, risk_focus; the ``[default]``
    table for an audience the pack does not describe; {} without the file."""
    doc = ctx.data(AUDIENCES)
    key = collapse_ws(audience).lower()
    for name, view in (doc.get("audience") or {}).items():
        if collapse_ws(str(name)).lower() == key and isinstance(view, dict):
            return view
    default = doc.get("default")
    return default if isinstance(default, dict) else {}


def reading_hints(ctx: UnitContext, audience: str) -> dict[str, Any]:
    """The vocabulary a synthesis prompt carries: topics, and the audience's reading order
    and headings (keys left out when the pack has none)."""
    out: dict[str, Any] = {}
    topics = topic_hints(ctx)
    if topics:
        # Names with a line each for a model; the keyword lists are the offline heuristic's
        # side data, sent to it alone (as an extraction's ``offline_hints``).
        described = {str(t["name"]): str(t.get("description") or "").strip()
                     for t in ctx.data(TOPICS).get("topic") or [] if isinstance(t, dict)
                     and t.get("name")}
        out["topics"] = [{"name": t["name"], "description": described.get(t["name"])
                          or t["name"].replace("_", " ")} for t in topics]
        if ctx.model_profile().offline:
            out["offline_hints"] = {"topic_keywords": {t["name"]: t["keywords"]
                                                       for t in topics}}
    view = audience_view(ctx, audience)
    if isinstance(view.get("order"), list):
        out["reading_order"] = [str(t) for t in view["order"]]
    if isinstance(view.get("labels"), dict):
        out["labels"] = {str(k): str(v) for k, v in view["labels"].items()}
    return out


# What a writer (synthesize, rank) reads of an evidence item: not where it sits in its
# source (documents add locators), its group, or its figures as bare strings (its quantities
# carry them) — fields it would only re-read, each item, in every request.
_WRITER_SKIPS = frozenset({"locator", "group", "figures"})


def writer_evidence(evidence: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evidence items as a synthesis or ranking request carries them."""
    return [{k: v for k, v in e.items() if k not in _WRITER_SKIPS} for e in evidence]


def risk_checklist(ctx: UnitContext, audience: str) -> list[dict[str, Any]] | None:
    """data:risks as INPUT's ``checklist``, each impact weighed for the audience (+1, at most
    5, for the risks in its risk_focus); None when the pack has no checklist."""
    risks = ctx.data(RISKS).get("risk")
    if not isinstance(risks, list):
        return None
    focus = {str(k) for k in audience_view(ctx, audience).get("risk_focus") or []}
    out = []
    for r in risks:
        if not isinstance(r, dict) or not r.get("key") or not r.get("title"):
            continue
        impact = int(r.get("impact", 3))
        out.append({"key": str(r["key"]), "title": str(r["title"]),
                    "keywords": [str(k) for k in r.get("keywords", [])],
                    "impact": min(5, impact + (1 if str(r["key"]) in focus else 0))})
    return out


def unit_source_ids(unit: Unit, groups: dict[str, str]) -> set[str]:
    """Approved sources a unit names through its ``source:`` and ``group:`` inputs."""
    wanted = set(unit.input_refs("group"))
    ids = {sid for sid, g in groups.items() if g in wanted}
    return ids | {s for s in unit.input_refs("source") if s in groups}


def evidence_index(items: Iterable[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """id -> {source_id, group, topic, locator}: what documents need to cite without the
    quote (``locator`` is "" for evidence that carries none)."""
    return {
        str(e["id"]): {"source_id": str(e.get("source_id", "")), "group": str(e.get("group", "")),
                       "topic": str(e.get("topic", "")), "locator": str(e.get("locator") or "")}
        for e in items if isinstance(e, dict) and e.get("id") is not None
    }


def cite_source(source_id: str, locator: str | None = None) -> str:
    """Where a statement is in its source, as a document names it: ``A3, p. 4``,
    ``E1, 'Volume tiers'!A6:C6``, ``L3, slide 2``, ``D1, Key points``; ``A3`` alone when
    there is no locator."""
    return f"{source_id}, {locator}" if locator else source_id


def cite(ids: Iterable[str], index: dict[str, dict[str, str]], *,
         locators: bool = False) -> str:
    """``[A1-e1, A1-e2] (sources: A1)`` — evidence ids, then the sources they come from.

    ``locators=True`` names where in each source instead, one ``cite_source`` per distinct
    (source, locator) in id order, separated by ``; ``:
    ``[A1-e1, E1-e7] (A1, p. 2; E1, 'Volume tiers'!A6:C6)``. Both forms parse back with
    ``cited_evidence_ids`` and ``cited_source_ids``.
    """
    ids = sorted({str(i) for i in ids}, key=natural_key)
    if not ids:
        return "(no evidence cited)"
    text = "[" + ", ".join(ids) + "]"
    if locators:
        places = dict.fromkeys(
            cite_source(index[i]["source_id"], index[i].get("locator"))
            for i in ids if i in index and index[i]["source_id"])
        return text + (f" ({'; '.join(places)})" if places else "")
    sources = sorted({index[i]["source_id"] for i in ids if i in index and index[i]["source_id"]},
                     key=natural_key)
    return text + (f" (sources: {', '.join(sources)})" if sources else "")


# A footnoted citation in a document's body, "(Title (A1), p. 2)[^3]" or, one note per quote,
# "(Title (A1), p. 2; Other (B1))[^3][^4]", and a note's definition,
# "[^3]: [A1-e3] (A1, p. 2) — Title (A1), p. 2: “quote”".
_FOOTNOTE_REF_RE = re.compile(r"\((?:[^()]|\([^()]*\))*\)((?:\[\^\d+\])+)")
_FOOTNOTE_DEF_RE = re.compile(r"^\[\^(\d+)\]: (.*)$", re.MULTILINE)
_NOTE_NUMBER_RE = re.compile(r"\[\^(\d+)\]")


def expand_footnotes(text: str) -> str:
    """A document with each footnoted citation put back in place as its ``[ids] (source,
    locator)`` form (a citation with several notes, one per quote, as one citation of all
    their ids and places) and the footnote definitions dropped: what the audit checks line
    by line (a figure next to the ids it cites, never a digit of a title or a quote)."""
    notes: dict[str, tuple[str, list[str], list[str]]] = {}  # number -> (as cited, ids, places)
    for m in _FOOTNOTE_DEF_RE.finditer(text):
        found = LOCATED_CITE_RE.search(m.group(2))
        if found:
            notes[m.group(1)] = (found.group(0), sorted(cited_evidence_ids(found.group(0))),
                                 [p.strip() for p in found.group(1).split(";") if p.strip()])
    if not notes:
        return text
    body = _FOOTNOTE_DEF_RE.sub("", text)

    def merged(m: re.Match[str]) -> str:
        numbers = _NOTE_NUMBER_RE.findall(m.group(1))
        if not numbers or any(n not in notes for n in numbers):
            return m.group(0)
        if len(numbers) == 1:
            return notes[numbers[0]][0]
        ids = sorted({i for n in numbers for i in notes[n][1]}, key=natural_key)
        places = dict.fromkeys(p for n in numbers for p in notes[n][2])
        return "[" + ", ".join(ids) + "]" + (f" ({'; '.join(places)})" if places else "")

    return _FOOTNOTE_REF_RE.sub(merged, body)


def cited_evidence_ids(text: str) -> set[str]:
    return set(EVIDENCE_ID_RE.findall(text))


def cited_source_ids(text: str) -> set[str]:
    """Source ids a document cites, from both ``cite`` forms."""
    ids: set[str] = set()
    for group in SOURCES_CITE_RE.findall(text):
        ids |= {p.strip() for p in group.split(",") if p.strip()}
    for group in LOCATED_CITE_RE.findall(text):
        ids |= {p.split(",", 1)[0].strip() for p in group.split(";") if p.strip()}
    return ids


def notices(*docs: Any) -> list[str]:
    """The distinct ``notice`` strings of model-made artifacts, sorted."""
    return sorted({str(d["notice"]) for d in docs if isinstance(d, dict) and d.get("notice")})


# --- a checked calculation as a reader sees it ----------------------------------------------
# A finding's recorded calculation ("2600 * 140 = 364000") is shown as arithmetic a reader
# reads ("(calculated: 2,600 × 140 = 364,000)"); checks reading a document turn it back.
# An older document's inline-code form ("(calculated: `2600 * 140 = 364000`)") still reads.
CALCULATED_RE = re.compile(r"\(calculated: (?:`([^`]*)`|((?:[^()`]|\([^()]*\))*))\)")
_SHOWN_OPS = {"*": "×", "/": "÷", "-": "−"}
_RECORDED_OPS = {v: k for k, v in _SHOWN_OPS.items()}
_BARE_NUMBER_RE = re.compile(r"(?<![\d,.])(\d{4,})(?=(?:\.\d+)?(?![\d,]))")


def _grouped(match: re.Match[str]) -> str:
    digits = match.group(1)
    if len(digits) == 4 and 1900 <= int(digits) <= 2099:
        return digits  # a year, not an amount
    return f"{int(digits):,}"


def readable_calculation(calculation: str) -> str:
    """A recorded calculation as readable arithmetic: "2600 * (140 - 120) = 52000" ->
    "2,600 × (140 − 120) = 52,000" (thousands grouped, a year left alone; ×, ÷, −)."""
    text = _BARE_NUMBER_RE.sub(_grouped, calculation.strip())
    text = re.sub(r"\s*\*\s*", " × ", text)
    text = re.sub(r"\s*/\s*", " ÷ ", text)
    # A minus between two terms ("140 - 120"), not a sign ("-5") or a hyphen in a word.
    text = re.sub(r"(?<=[\d%)])\s*-\s*(?=[\d(])", " − ", text)
    return text


def shown_calculation(calculation: str) -> str:
    """How a document shows a finding's checked calculation: "(calculated: 2,600 × 140 =
    364,000)"; ``CALCULATED_RE`` finds it, ``recorded_calculation`` reads it back."""
    return f"(calculated: {readable_calculation(calculation)})"


def recorded_calculation(match: re.Match[str]) -> str:
    """The calculation a ``CALCULATED_RE`` match shows, in the form the checker reads
    ("2,600 × 140 = 364,000" -> "2,600 * 140 = 364,000")."""
    text = match.group(1) if match.group(1) is not None else match.group(2)
    return "".join(_RECORDED_OPS.get(ch, ch) for ch in text)
