"""Disagreements between sources, as typed records: proposed by code, classified by a model.

A **candidate** is proposed by code from the structured figures (``quantities``) of verified
evidence: two or more items from different sources that give the same metric for the same
entity and period, with different values (values are compared after their scale words and
thousands separators are read, in the unit without its scale words: ``1.2 million`` and
``1,200,000`` are one value, and value 18 in "million euro" is value 18000000 in "euro" —
``amount``), or — since a
model words one quantity differently in each source — two figures of different sources with
the same entity name and unit whose metrics share a salient word (at most ``MAX_CANDIDATES``
in all, most alike first). A verify
unit sends its candidates to the model, which classifies each:

- ``definition``: both values are right, they count different things (say which applies);
- ``superseded``: a newer statement amends, replaces or corrects the older one;
- ``outdated``: one value is simply older (an earlier estimate, an old footnote);
- ``unexplained``: the sources disagree and nothing in them says which holds;
- ``not-a-conflict``: it only looks like one (a special price beside a list price, a forecast
  beside an actual, the same value written two ways).

The records are stored in the verify unit's committed ``verified.json`` under ``conflicts``
(one list per verify unit). ``load_conflicts`` reads them back from any number of verified
documents (the whole run), merging a disagreement two verify units both saw.

Callers may rely on: ``Conflict.open`` (only ``unexplained`` is open); ``Conflict.holds`` is
the value the documents should use (None when unexplained or not a conflict … a
``not-a-conflict`` may still name a value); every side carries its evidence id, source id,
locator (when known), quote and value as written; legacy keys (``ids``, ``values``,
``status``) are also written so older readers keep working.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keepstep.engine.errors import KeepstepError

CLASSES = ("definition", "superseded", "outdated", "unexplained", "not-a-conflict")
ConflictClass = Literal["definition", "superseded", "outdated", "unexplained", "not-a-conflict"]
# The legacy ``status`` of a record: what an older renderer reads.
_STATUS = {"unexplained": "conflict-open", "not-a-conflict": "not-a-conflict"}


class Quantity(BaseModel):
    """One figure of an evidence item, structured: what it measures, for whom, when."""

    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    figure: str = Field(description="the figure exactly as written in the quote")
    value: str = Field(default="", description="the whole number, e.g. 46 or 18000000")
    unit: str = Field(default="", description="%, EUR, units, days ... no scale word "
                      "('' if none)")
    metric: str = Field(default="", description="what is measured, e.g. market share")
    entity: str = Field(default="", description="whose or what's figure it is ('' if general)")
    period: str = Field(default="", description="the year, quarter or date it holds for "
                        "('' if none)")


class ConflictSide(BaseModel):
    """One side of a disagreement: the evidence that gives one value."""

    model_config = ConfigDict(extra="allow")

    evidence_id: str
    source_id: str
    value: str = Field(description="the figure as written in the quote")
    quote: str = ""
    locator: str | None = None
    source_date: str = ""
    source_title: str = ""


class Conflict(BaseModel):
    """A disagreement with two or more sides, and how it was settled."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str = Field(description="K<n> within its verify unit")
    metric: str
    entity: str = ""
    period: str = ""
    unit: str = ""
    sides: list[ConflictSide] = Field(min_length=2)
    cls: ConflictClass = Field(alias="class")
    holds: str | None = Field(default=None, description="the value the documents use")
    holds_ids: list[str] = Field(default_factory=list,
                                 description="the evidence ids giving the value that holds")
    reason: str = ""
    applies: str = Field(default="", description="for a definition: which value applies when")
    verify_unit: str = ""
    classified_by: str = ""

    @property
    def open(self) -> bool:
        return self.cls == "unexplained"

    @property
    def evidence_ids(self) -> list[str]:
        return [s.evidence_id for s in self.sides]

    @property
    def source_ids(self) -> list[str]:
        return list(dict.fromkeys(s.source_id for s in self.sides))

    def record(self) -> dict[str, Any]:
        """The stored form: the fields by alias, and the legacy keys older readers use."""
        out = self.model_dump(by_alias=True, exclude_none=False)
        out["ids"] = self.evidence_ids
        out["values"] = [s.value for s in self.sides]
        out["status"] = _STATUS.get(self.cls, "conflict-resolved")
        return out


class Candidate(BaseModel):
    """A disagreement proposed by code, before it is classified."""

    model_config = ConfigDict(extra="allow")

    id: str
    metric: str
    entity: str = ""
    period: str = ""
    unit: str = ""
    sides: list[ConflictSide] = Field(min_length=2)


# --- reading values ----------------------------------------------------------------------

_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "m": 1e6, "mn": 1e6, "bn": 1e9,
           "billion": 1e9}
_NUMBER_RE = re.compile(r"-?\d+(?:[.,]\d+)*")


def number(text: str) -> float | None:
    """The number a value states, its scale word read (``2.3 million`` -> 2300000); None
    when it holds no number. A comma followed by three digits is a thousands separator."""
    t = str(text).lower().replace("\u00a0", " ")
    found = _NUMBER_RE.search(t)
    if found is None:
        return None
    raw = found.group(0)
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", raw):
        raw = raw.replace(",", "")
    elif "," in raw and "." not in raw:
        raw = raw.replace(",", ".")
    try:
        value = float(raw.replace(",", ""))
    except ValueError:
        return None
    rest = t[found.end():].strip()
    word = re.match(r"[a-z]+", rest)
    if word and word.group(0) in _SCALES:
        value *= _SCALES[word.group(0)]
    return value


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9%]+", " ", str(text).lower()).strip()


# Scale words a unit may carry ("million euro"): read into the amount, never into the unit.
_UNIT_SCALES = {"thousand": 1e3, "thousands": 1e3, "million": 1e6, "millions": 1e6,
                "mn": 1e6, "mio": 1e6, "billion": 1e9, "billions": 1e9, "bn": 1e9}


def base_unit(unit: str) -> tuple[str, float]:
    """A quantity's unit without its scale words, and the scale they give:
    ``"million euro"`` -> ("euro", 1e6); ``"euro"`` -> ("euro", 1.0)."""
    scale, words = 1.0, []
    for word in _key(unit).split():
        if word in _UNIT_SCALES:
            scale *= _UNIT_SCALES[word]
        else:
            words.append(word)
    return " ".join(words), scale


def amount(q: Quantity) -> float | None:
    """The quantity in its base unit (``base_unit``), however the model split it: "18
    million euro" given as value 18 with unit "million euro", or as value 18000000 with unit
    "euro", is 18000000 either way (and a value without its scale beside a figure that
    writes one, "18" for "18 million", is read with the figure's scale). None: no number."""
    _unit, scale = base_unit(q.unit)
    written = number(q.figure)
    value = number(q.value) if str(q.value).strip() else None
    if value is None:
        return None if written is None else written * scale
    digits = _NUMBER_RE.search(str(q.figure))
    bare = number(digits.group(0)) if digits else None
    if scale == 1.0 and written is not None and bare is not None and written != bare \
            and value == bare:
        return written  # value 18 beside the figure "18 million", unit "euro"
    if scale != 1.0 and written is not None and value == written and written != bare:
        return value  # value 18000000 beside the figure "18 million", unit "million euro"
    return value * scale


def same_amount(a: Quantity, b: Quantity) -> bool:
    """Whether two quantities state the same amount of the same base unit (see ``amount``)."""
    x, y = amount(a), amount(b)
    return x is not None and y is not None and base_unit(a.unit)[0] == base_unit(b.unit)[0] \
        and f"{x:.6g}" == f"{y:.6g}"


def quantities_of(item: Mapping[str, Any]) -> list[Quantity]:
    """An evidence item's structured figures (``quantities``), malformed ones skipped."""
    out = []
    raw = item.get("quantities")
    for q in raw if isinstance(raw, list) else []:
        try:
            out.append(Quantity.model_validate(q))
        except ValidationError:
            continue
    return out


def propose(evidence: Iterable[Mapping[str, Any]],
            meta: Mapping[str, Mapping[str, str]] | None = None) -> list[Candidate]:
    """Candidates from the structured figures of ``evidence``: items from at least two
    sources giving the same metric, entity, period (and unit) different values. Each side is
    one evidence item (its first figure for that quantity); sides with equal values are one
    side per source kept. ``meta`` maps a source id to its metadata (date, title)."""
    meta = meta or {}
    groups: dict[tuple[str, str, str, str], list[ConflictSide]] = {}
    amounts: dict[tuple[str, tuple[str, str, str, str]], str] = {}
    for item in evidence:
        sid, eid = str(item.get("source_id", "")), str(item.get("id", ""))
        for q in quantities_of(item):
            if not q.metric.strip():
                continue
            # One unit however its scale is split between value and unit ("million euro").
            key = (_key(q.metric), _key(q.entity), _key(q.period), base_unit(q.unit)[0])
            sides = groups.setdefault(key, [])
            if any(s.evidence_id == eid for s in sides):
                continue
            info = meta.get(sid) or {}
            sides.append(ConflictSide(
                evidence_id=eid, source_id=sid, value=q.figure, quote=str(item.get("quote", "")),
                locator=item.get("locator") if isinstance(item.get("locator"), str) else None,
                source_date=str(info.get("date", "")), source_title=str(info.get("title", ""))))
            amounts[eid, key] = _amount_key(q)
    found: list[tuple[tuple[str, str, str, str], list[ConflictSide]]] = []
    for key, sides in groups.items():
        values = {amounts[s.evidence_id, key] for s in sides}
        if len({s.source_id for s in sides}) >= 2 and len(values) >= 2:
            found.append((key, sides))
    # In the order of their first sides' evidence ids (document order), so K1 comes first.
    found.sort(key=lambda pair: (_natural(pair[1][0].evidence_id), pair[0]))
    out: list[Candidate] = []
    for (metric, _entity, _period, _unit), sides in found:
        first = next(q for q in _first_quantities(evidence, sides[0].evidence_id)
                     if _key(q.metric) == metric)
        out.append(Candidate(id=f"K{len(out) + 1}", metric=first.metric,
                             entity=first.entity, period=first.period, unit=first.unit,
                             sides=sides))
    paired = {frozenset(s.evidence_id for s in c.sides) for c in out}
    # Enough near pairs to fill the bound even where some repeat an exact candidate.
    for a, b, qa in _near_pairs(evidence, meta, 2 * MAX_CANDIDATES):
        pair = frozenset((a.evidence_id, b.evidence_id))
        if any(pair <= seen for seen in paired) or len(out) >= MAX_CANDIDATES:
            continue
        paired.add(pair)
        out.append(Candidate(id=f"K{len(out) + 1}", metric=qa.metric, entity=qa.entity,
                             period=qa.period, unit=qa.unit, sides=[a, b]))
    return out


# A model names one quantity in its own words in each source ("availability as measured by
# the customer" against "committed monthly availability"): besides exact matches, two figures
# of different sources are a candidate when they share the entity's name, the unit and a
# salient word of the metric. The model classifies each (most are not-a-conflict); the number
# is bounded so a large run does not send hundreds.
MAX_CANDIDATES = 24
_GENERIC = frozenset("""
a an and as at by for from in incl including of on or per the to with without over under
annual annually monthly month months year years yearly daily weekly quarterly total overall
minimum maximum min max lower upper bound band target committed measured actual average about
around roughly approximately estimated expected current draft offered new old share rate
level number count amount value figure cap limit each every first last latest base standard
""".split())


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z0-9]+", str(text).lower())
            if w not in _GENERIC and len(w) > 2}


def _name(entity: str) -> str:
    words = re.findall(r"[a-z][a-z0-9]+", str(entity).lower())
    return next((w for w in words if w not in _GENERIC and len(w) > 2), "")


def _near_pairs(evidence: Iterable[Mapping[str, Any]],
                meta: Mapping[str, Mapping[str, str]], limit: int
                ) -> list[tuple[ConflictSide, ConflictSide, Quantity]]:
    """Up to ``limit`` pairs of figures from different sources for the same entity name and
    unit whose metrics share a salient word and whose values differ, most alike metrics
    first. Figures are compared only within their (entity name, unit) group, so a large run
    does not compare every figure with every other."""
    groups: dict[tuple[str, str], list[tuple[int, str, set[str], Quantity,
                                             Mapping[str, Any]]]] = {}
    n = 0
    for item in evidence:
        for q in quantities_of(item):
            name, words = _name(q.entity), _words(q.metric)
            if name and words and number(q.value or q.figure) is not None:
                groups.setdefault((name, base_unit(q.unit)[0]), []).append(
                    (n, str(item.get("source_id", "")), words, q, item))
                n += 1
    scored: list[tuple[float, int, int, Quantity, Mapping[str, Any], Quantity,
                       Mapping[str, Any]]] = []
    for rows in groups.values():
        for k, (i, sa, wa, qa, ia) in enumerate(rows):
            for j, sb, wb, qb, ib in rows[k + 1:]:
                if sa == sb or not (wa & wb):
                    continue
                if _amount_key(qa) == _amount_key(qb):
                    continue
                scored.append((len(wa & wb) / len(wa | wb), i, j, qa, ia, qb, ib))
    scored.sort(key=lambda t: (-t[0], t[1], t[2]))
    return [(_side(ia, qa, meta), _side(ib, qb, meta), qa)
            for _, _, _, qa, ia, qb, ib in scored[:limit]]


def _side(item: Mapping[str, Any], q: Quantity,
          meta: Mapping[str, Mapping[str, str]]) -> ConflictSide:
    sid = str(item.get("source_id", ""))
    info = meta.get(sid) or {}
    return ConflictSide(
        evidence_id=str(item.get("id", "")), source_id=sid, value=q.figure,
        quote=str(item.get("quote", "")),
        locator=item.get("locator") if isinstance(item.get("locator"), str) else None,
        source_date=str(info.get("date", "")), source_title=str(info.get("title", "")))


def _amount_key(q: Quantity) -> str:
    n = amount(q)
    return f"{n:.6g}" if n is not None else _key(q.value or q.figure)


def _first_quantities(evidence: Iterable[Mapping[str, Any]], eid: str) -> list[Quantity]:
    for item in evidence:
        if str(item.get("id")) == eid:
            return quantities_of(item)
    return []


# --- loading -----------------------------------------------------------------------------

def parse_conflicts(doc: Mapping[str, Any], verify_unit: str = "") -> list[Conflict]:
    """The typed records of one verified.json (records of an older shape, without sides,
    are read as two-sided records from their ``ids`` and ``values``)."""
    out = []
    raw = doc.get("conflicts") if isinstance(doc, Mapping) else None
    for n, c in enumerate(raw if isinstance(raw, list) else [], start=1):
        if not isinstance(c, dict):
            continue
        c = dict(c)
        if "sides" not in c:  # an older record: ids, values, status, reason
            ids, values = c.get("ids") or [], c.get("values") or []
            c["sides"] = [{"evidence_id": str(i), "source_id": str(i).split("-e")[0],
                           "value": str(v)} for i, v in zip(ids, values, strict=False)]
            c.setdefault("id", f"K{n}")
            c.setdefault("class", "unexplained" if c.get("status") == "conflict-open"
                         else "superseded")
        c.setdefault("verify_unit", verify_unit)
        try:
            out.append(Conflict.model_validate(c))
        except ValidationError:
            continue
    return out


def load_conflicts(docs: Mapping[str, Mapping[str, Any]]) -> list[Conflict]:
    """Every disagreement of a run from its verify units' ``verified.json`` documents
    (``{verify unit id: document}``), in unit order: a disagreement two units both found
    (the same evidence ids) is listed once, as the first unit classified it."""
    seen: set[frozenset[str]] = set()
    out: list[Conflict] = []
    for unit_id in sorted(docs, key=_natural):
        for conflict in parse_conflicts(docs[unit_id], unit_id):
            key = frozenset(conflict.evidence_ids)
            if key in seen:
                continue
            seen.add(key)
            out.append(conflict)
    return out


def run_conflicts(run: Any) -> list[Conflict]:
    """Every disagreement a run's succeeded verify units recorded (``load_conflicts`` over
    their committed ``verified.json``, each read hash-checked): what ``keepstep conflicts``
    lists."""
    docs: dict[str, Mapping[str, Any]] = {}
    for unit_id, view in run.status().units.items():
        if view.kind != "verify" or view.state != "succeeded":
            continue
        try:
            import json

            docs[unit_id] = json.loads(run.output(unit_id, "verified.json").text)
        except (ValueError, KeyError, KeepstepError):
            continue
    return load_conflicts(docs)


def conflicts_text(found: list[Conflict]) -> str:
    """The listing ``keepstep conflicts`` prints and the TUI shows: one block per
    disagreement — its class, what it measures, the value used (or none: open), each side
    (``*`` marks the sides giving the value used) with its evidence, source, locator and
    date, and why."""
    if not found:
        return "No disagreements between sources were recorded (no verify unit found one)."
    real = [c for c in found if c.cls != "not-a-conflict"]
    lines = [f"{len(real)} disagreement(s) between sources"
             + (f", {len(found) - len(real)} apparent one(s) closed" if len(real) < len(found)
                else "") + ":"]
    for c in found:
        what = " · ".join(x for x in (c.metric, c.entity, c.period) if x)
        used = f"uses {c.holds}" if c.holds else "no value holds (open)"
        lines += ["", f"{c.id} ({c.verify_unit})  {c.cls}: {what} — {used}"]
        for side in c.sides:
            where = f", {side.locator}" if side.locator else ""
            dated = f" [{side.source_date}]" if side.source_date else ""
            mark = "*" if side.evidence_id in c.holds_ids else " "
            lines.append(f"  {mark} {side.value:<14} {side.evidence_id} "
                         f"({side.source_id}{where}){dated}")
        lines.append(f"    why: {c.reason}")
        if c.applies:
            lines.append(f"    applies: {c.applies}")
    return "\n".join(lines)


def _natural(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


__all__ = ["CLASSES", "Candidate", "Conflict", "ConflictClass", "ConflictSide", "Quantity",
           "amount", "base_unit", "load_conflicts", "number", "same_amount",
           "conflicts_text", "run_conflicts", "parse_conflicts", "propose", "quantities_of"]
