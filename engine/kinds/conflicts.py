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
    entity: str = Field(default="", description="whose figure it is, as the statement names "
                        "it ('' if none): never inferred from another statement or source")
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
    about: Literal["figure", "advice"] = Field(
        default="figure", description="figure: the sides give different values of one "
        "quantity; advice: the sides advise different courses (each side's value is its advice "
        "as written)")

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
    about: Literal["figure", "advice"] = "figure"


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


# --- disagreements over advice -------------------------------------------------------------
# Sources also disagree on what to do ("order now", "wait for the 2026 list", "get a second
# quote first"). Code proposes such a candidate from evidence that advises a course — kind
# ``recommendation``, or an ``opinion`` worded as advice — from different sources on the same
# subject: items whose quotes share at least ``ADVICE_OVERLAP`` content words (crudely
# stemmed; advice verbs and function words do not count) are linked, and each connected
# group spanning two or more sources is one candidate. Whether the courses really differ is
# the verify unit's judgement (the model's, or the offline rules').
MAX_ADVICE_CANDIDATES = 8
MAX_ADVICE_SIDES = 6
ADVICE_OVERLAP = 2
_ADVICE_WORDING = re.compile(
    r"\b(?:should|shouldn't|ought to|recommend\w*|advis\w*|suggest\w*|urg\w*|"
    r"better to|best to|we would|it would be wise)\b", re.IGNORECASE)
_FUNCTION = frozenset("""
a an and as at be been being but by can could did do does for from had has have if in into is
it its may might more most must not of on or our over should so than that the their them then
there these they this those to too under until upon was we were what when which while who will
with would you your any all also only very just again before after once now yet still even
such other another same some each both either neither one two three own
recommend recommends recommended recommending recommendation recommendations advise advises
advised advising advice suggest suggests suggested suggesting urge urges urged ought better
best wise consider considers view believe believes think thinks told says said
""".split())


def advises(item: Mapping[str, Any]) -> bool:
    """Whether an evidence item advises a course: a ``recommendation``, or an ``opinion``
    worded as advice ("should", "we advise", "recommend" ...)."""
    kind = str(item.get("kind", "")).strip().lower()
    if kind == "recommendation":
        return True
    return kind == "opinion" and bool(_ADVICE_WORDING.search(str(item.get("quote", ""))))


def _stems(text: str) -> list[str]:
    """The content words of ``text`` in order, each cut to its first five letters (a crude
    stem: "ordering" and "order", "buyers" and "buyer" meet); numbers and function words
    left out."""
    out: list[str] = []
    for word in re.findall(r"[a-z][a-z'-]+", str(text).lower()):
        word = word.removesuffix("'s").strip("'-")
        if len(word) < 3 or word in _FUNCTION or word in _GENERIC:
            continue
        stem = word[:5]
        if stem not in out:
            out.append(stem)
    return out


def propose_advice(evidence: Iterable[Mapping[str, Any]],
                   meta: Mapping[str, Mapping[str, str]] | None = None,
                   first: int = 1) -> list[Candidate]:
    """Candidates of disagreement over advice: groups of advising items (``advises``) from
    two or more sources on one subject (linked when their quotes share ``ADVICE_OVERLAP``
    content words, or one and the same non-general topic), numbered ``K<first>``, ``K<first
    + 1>`` ...; each side's value is its quote. The candidate's metric names the subject by
    the words its sides share."""
    meta = meta or {}
    items = [i for i in evidence if advises(i) and str(i.get("quote", "")).strip()]
    stems = [_stems(str(i.get("quote", ""))) for i in items]
    parent = list(range(len(items)))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a in range(len(items)):
        for b in range(a + 1, len(items)):
            if str(items[a].get("source_id")) == str(items[b].get("source_id")):
                continue
            shared = set(stems[a]) & set(stems[b])
            topic = str(items[a].get("topic") or "").strip().lower()
            same_topic = bool(topic) and topic != "general" and \
                topic == str(items[b].get("topic") or "").strip().lower()
            if len(shared) >= ADVICE_OVERLAP or (shared and same_topic):
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for n in range(len(items)):
        groups.setdefault(root(n), []).append(n)
    out: list[Candidate] = []
    for members in sorted(groups.values(), key=lambda m: _natural(str(items[m[0]].get("id")))):
        if len({str(items[n].get("source_id")) for n in members}) < 2:
            continue
        members = members[:MAX_ADVICE_SIDES]
        counts: dict[str, int] = {}
        for n in members:
            for stem in stems[n]:
                counts[stem] = counts.get(stem, 0) + 1
        words = _subject_words([str(items[n].get("quote", "")) for n in members], counts)
        sides = []
        for n in members:
            item = items[n]
            side = _side(item, Quantity(figure=str(item.get("quote", ""))), meta)
            sides.append(side)
        out.append(Candidate(id=f"K{first + len(out)}",
                             metric="advice on " + (", ".join(words) or "one course"),
                             sides=sides, about="advice"))
        if len(out) >= MAX_ADVICE_CANDIDATES:
            break
    return out


def _subject_words(quotes: list[str], counts: Mapping[str, int]) -> list[str]:
    """The words the sides share (their stems in two or more quotes), as first written, the
    most shared first (at most three)."""
    seen: dict[str, str] = {}
    for quote in quotes:
        for word in re.findall(r"[A-Za-z][A-Za-z'-]+", quote):
            plain = word.lower().removesuffix("'s").strip("'-")
            if plain not in _FUNCTION and plain not in _GENERIC and len(plain) >= 3 \
                    and counts.get(plain[:5], 0) >= 2:
                seen.setdefault(plain[:5], plain)
    order = list(seen)
    return [seen[s] for s in sorted(order, key=lambda s: (-counts[s], order.index(s)))][:3]


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


def run_id(conflict_id: str, verify_unit: str, taken: set[str]) -> str:
    """A disagreement's id, unique across the run: its verify unit's own (``K1``) unless a
    disagreement of another verify unit already took it, then qualified by its unit
    (``U22.K1``: still no evidence id). ``taken`` gathers the ids given so far."""
    out = conflict_id
    if out in taken and verify_unit:
        out = f"{verify_unit}.{conflict_id}"
    taken.add(out)
    return out


def load_conflicts(docs: Mapping[str, Mapping[str, Any]]) -> list[Conflict]:
    """Every disagreement of a run from its verify units' ``verified.json`` documents
    (``{verify unit id: document}``), in unit order: a disagreement two units both found
    (the same evidence ids) is listed once, as the first unit classified it."""
    seen: set[frozenset[str]] = set()
    taken: set[str] = set()
    out: list[Conflict] = []
    for unit_id in sorted(docs, key=_natural):
        for conflict in parse_conflicts(docs[unit_id], unit_id):
            key = frozenset(conflict.evidence_ids)
            if key in seen:
                continue
            seen.add(key)
            # Two verify units each number theirs K1, K2 ...: an id a unit before took is
            # qualified by this record's unit, so every id names one disagreement.
            conflict.id = run_id(conflict.id, conflict.verify_unit or unit_id, taken)
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
        if c.about == "advice":
            used = ("follows " + ", ".join(c.holds_ids) if c.holds_ids and not c.open
                    else "no advice followed (open)" if c.open else "follows none")
            lines[-1] = f"{c.id} ({c.verify_unit})  {c.cls}: {c.metric} — {used}"
        for side in c.sides:
            where = f", {side.locator}" if side.locator else ""
            dated = f" [{side.source_date}]" if side.source_date else ""
            mark = "*" if side.evidence_id in c.holds_ids else " "
            if c.about == "advice":
                lines.append(f"  {mark} {side.evidence_id} ({side.source_id}{where}){dated} "
                             f"advises: {side.value}")
                continue
            lines.append(f"  {mark} {side.value:<14} {side.evidence_id} "
                         f"({side.source_id}{where}){dated}")
        lines.append(f"    why: {c.reason}")
        if c.applies:
            lines.append(f"    applies: {c.applies}")
    return "\n".join(lines)


def _natural(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


__all__ = ["CLASSES", "Candidate", "Conflict", "ConflictClass", "ConflictSide", "Quantity",
           "advises", "amount", "base_unit", "conflicts_text", "load_conflicts", "number",
           "parse_conflicts", "propose", "propose_advice", "quantities_of", "run_conflicts",
           "run_id", "same_amount"]
