"""Text rules behind the offline heuristic model (stdlib only, deterministic).

Kept apart from ``offline_model`` so the task dispatch stays short and so the
Markdown/sentence rules can be reused (and tested) on their own. Nothing here
depends on time, randomness, locale or dict ordering of caller input.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

# Topics come with the prompt (the pack's data/topics.toml, as INPUT "topics": a list of
# {"name", "keywords"}); without them every statement is filed under this one.
GENERAL_TOPIC = "general"
Topics = list[tuple[str, tuple[str, ...]]]


def topic_list(raw: object, hints: object = None) -> Topics:
    """INPUT's ``topics`` as (name, keywords) pairs, in the order given (ties go to the
    earlier topic); malformed entries are skipped. The keywords are the heuristic's side data:
    a topic's own ``keywords``, else ``hints["topic_keywords"][name]`` (INPUT's
    ``offline_hints``, sent only to this heuristic)."""
    out: Topics = []
    side = hints.get("topic_keywords") if isinstance(hints, dict) else None
    side = side if isinstance(side, dict) else {}
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                words = item.get("keywords") or side.get(item["name"]) or []
                out.append((item["name"], tuple(str(w).lower() for w in words
                                                if isinstance(w, str))))
    return out


# Abbreviations whose trailing period never ends a sentence in the sample sources.
ABBREVIATIONS: frozenset[str] = frozenset(
    {"e.g", "i.e", "approx", "vs", "no", "nos", "dr", "mr", "mrs", "ms", "st", "ltd",
     "inc", "co", "cf", "fig", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
     "sept", "oct", "nov", "dec", "est", "incl", "min", "max"}
)

FIGURE_RE = re.compile(r"\d+(?:[.,]\d+)*%?")
_LINK_RE = re.compile(r"\[[^\]]*\]\([^)]*\)")
_URL_RE = re.compile(r"https?://\S+|www\.\S+")
_LIST_MARKER_RE = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_HEADING_RE = re.compile(r"^\s{0,3}#{1,6}(\s|$)")
_SETEXT_RE = re.compile(r"^\s*(=+|-+)\s*$")
# A candidate boundary: terminal punctuation, optional closing quote/bracket, whitespace,
# then something that can start a sentence. Decimals ("4.5%") never match: no whitespace.
_BOUNDARY_RE = re.compile(r"([.!?])([\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def strip_front_matter(text: str) -> str:
    """Drop a leading YAML front-matter block (``---`` ... ``---``) if present."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() in ("---", "..."):
                return "\n".join(lines[i + 1:])
    return text


def _is_link_line(content: str) -> bool:
    """A list entry that starts with a link or URL is part of a link list, not prose."""
    stripped = content.lstrip()
    return bool(_LINK_RE.match(stripped) or _URL_RE.match(stripped))


_PIPE_LINE_RE = re.compile(r"^ {0,3}\|")
_TABLE_SEPARATOR_RE = re.compile(r"^ {0,3}\|?(\s*:?-+:?\s*\|)*\s*:?-+:?\s*\|?\s*$")
_ROW_EDGE_RE = re.compile(r"^[\s|]+|(?<!\\)[\s|]+$")


def row_quote(line: str) -> str:
    """A pipe-table row as a citation quotes it: the line without its outer pipes (and empty
    outer cells), e.g. ``Framework | 50,000 | 12%`` for ``| Framework | 50,000 | 12% |``. It
    is a verbatim piece of the line."""
    return _ROW_EDGE_RE.sub("", line.strip())


def _blocks(text: str, front_matter: bool = True) -> list[tuple[str, str, str]]:
    """(kind, text, table header) in document order: ``prose`` blocks and table ``row``s.

    A table is a pipe line directly followed by a separator line (``| --- |``); its data rows
    are the pipe lines after that. Other pipe lines (no separator) are skipped as before.
    """
    blocks: list[tuple[str, str, str]] = []
    current: list[str] = []
    in_fence = False
    lines = (strip_front_matter(text) if front_matter else text).splitlines()

    def flush() -> None:
        if current:
            blocks.append(("prose", " ".join(current), ""))
            current.clear()

    i = 0
    while i < len(lines):
        raw = lines[i]
        i += 1
        line = raw.strip()
        if line.startswith(("```", "~~~")):
            flush()
            in_fence = not in_fence
            continue
        if in_fence or not line:
            flush()
            continue
        if _PIPE_LINE_RE.match(raw) and i < len(lines) and _TABLE_SEPARATOR_RE.match(lines[i]) \
                and not _TABLE_SEPARATOR_RE.match(raw):
            flush()
            header = row_quote(raw)
            i += 1  # the separator line
            while i < len(lines) and _PIPE_LINE_RE.match(lines[i]) and not (
                    i + 1 < len(lines) and _TABLE_SEPARATOR_RE.match(lines[i + 1])):
                quote = row_quote(lines[i])
                if quote:
                    blocks.append(("row", quote, header))
                i += 1
            continue
        if _SETEXT_RE.match(line):
            # A setext underline turns the line above it into a heading: drop that line.
            if current:
                current.pop()
            flush()
            continue
        if _HEADING_RE.match(line) or line.startswith(("|", "<!--")) or line in ("***", "___"):
            flush()
            continue
        line = re.sub(r"^>\s?", "", line)
        if not line.strip():
            flush()  # a bare ">" separates two blockquote paragraphs: never join them
            continue
        marker = _LIST_MARKER_RE.match(line)
        if marker:
            flush()
            content = line[marker.end():]
            if _is_link_line(content):
                continue
            current.append(content.strip())
            continue
        current.append(line)
    flush()
    return [(kind, re.sub(r"\s+", " ", b).strip() if kind == "prose" else b, header)
            for kind, b, header in blocks if b.strip()]


def body_blocks(text: str) -> list[str]:
    """Return prose blocks (paragraphs and list items) in document order.

    Skipped: front matter, headings (ATX and setext underlines), link-list entries,
    table rows, fenced code, HTML comments and horizontal rules. List markers
    (including numbered ``1.``) are removed so their digits never count as figures.
    """
    return [b for kind, b, _ in _blocks(text) if kind == "prose"]


def statements(text: str, front_matter: bool = True) -> list[tuple[str, str, str]]:
    """(kind, quote, table header) of every statement in document order: each prose
    sentence (``sentence``) and each table data row (``row``, quoted by ``row_quote``).
    ``front_matter``: whether a leading ``---`` block is the text's front matter (False for
    a later chunk of a source: a block that opens it is body text, as in the whole)."""
    out: list[tuple[str, str, str]] = []
    for kind, block, header in _blocks(text, front_matter):
        if kind == "row":
            out.append(("row", block, header))
        else:
            out += [("sentence", s, "") for s in split_sentences(block)]
    return out


def split_sentences(block: str) -> list[str]:
    """Split one prose block into sentences, keeping decimals and abbreviations intact."""
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY_RE.finditer(block):
        end = match.end(2)
        if match.group(1) == ".":
            word = re.search(r"([A-Za-z][A-Za-z.]*)\.$", block[start:match.start(1) + 1])
            if word and word.group(1).lower().rstrip(".") in ABBREVIATIONS:
                continue
            # Single capital initials ("J. Larsen") are names, not sentence ends.
            if word and len(word.group(1)) == 1 and word.group(1).isupper():
                continue
        piece = block[start:end].strip()
        if piece:
            sentences.append(piece)
        start = match.end()
    tail = block[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def body_sentences(text: str) -> list[str]:
    """All prose sentences of a Markdown document, in order."""
    return [s for block in body_blocks(text) for s in split_sentences(block)]


def figures(sentence: str) -> list[str]:
    """Numeric tokens in order of appearance, e.g. ``["4.5%", "2026", "1,250"]``."""
    return FIGURE_RE.findall(sentence)


# Keywords match at a word start ("installer" also hits "installers", "fine" not "define").
@lru_cache(maxsize=4096)
def _keyword_re(keyword: str) -> re.Pattern[str]:
    return re.compile(r"\b" + re.escape(keyword))


def classify_topic(sentence: str, topics: Topics) -> str:
    """Topic with the most keyword hits; ties go to the earlier topic; the first topic when
    none hits; ``GENERAL_TOPIC`` when no topics are given."""
    if not topics:
        return GENERAL_TOPIC
    best, best_hits = topics[0][0], 0
    for name, keywords in topics:
        hits = keyword_hits(sentence, keywords)
        if hits > best_hits:
            best, best_hits = name, hits
    return best


def keyword_hits(sentence: str, keywords: tuple[str, ...]) -> int:
    """How many of ``keywords`` occur in ``sentence`` (each at a word start)."""
    lowered = sentence.lower()
    return sum(1 for kw in keywords if _keyword_re(kw).search(lowered))


# Sentences opening with these lean on the previous sentence, so they read badly when quoted
# on their own in a finding.
_DEPENDENT_OPENERS = re.compile(r"^(it|its|this|that|these|those|they|their|of these|such)\b",
                                re.IGNORECASE)


def reads_standalone(sentence: str) -> bool:
    """False when the sentence opens with a pronoun that refers back to earlier text."""
    return not _DEPENDENT_OPENERS.match(sentence.strip())


def normalise(text: str) -> str:
    """Comparison form: NFKC, plain quotes/dashes, no emphasis marks, lowercase, one space."""
    text = unicodedata.normalize("NFKC", text)
    for fancy, plain in (("\u2018", "'"), ("\u2019", "'"), ("\u201c", '"'), ("\u201d", '"'),
                         ("\u2013", "-"), ("\u2014", "-"), ("\u00a0", " ")):
        text = text.replace(fancy, plain)
    text = re.sub(r"[*_`]", "", text)
    return re.sub(r"\s+", " ", text).strip().lower()


# --- risk rules -----------------------------------------------------------------
# The checklist comes with the prompt (the pack's data/risks.toml, as INPUT "checklist": a
# list of {"key", "title", "keywords", "impact"}, the impact already weighed for the
# audience). Without one, risks are read from generic cue words (below).
GENERIC_RISK_CUES: tuple[str, ...] = (
    "delay", "shortage", "risk", "penalt", "fail", "exclusiv", "overrun", "breach", "expire",
    "uncertain", "claim", "dispute", "slip", "postpone", "backlog", "outage", "downtime",
)
# A plausible-sounding risk with no support in the sources: what an ungrounded generator
# tends to add. The first ranking round includes it so the claim check has something real
# to catch; it is always flagged and dropped on revision.
UNSUPPORTED_RISK = ("macro", "General economic slowdown cuts demand", 3, 4)


# --- conflicting figures -----------------------------------------------------------
# A figure, optionally followed by a scale word, then the words that name what it counts.
_QUANTITY_RE = re.compile(
    r"(?<![\w.,])(\d+(?:[.,]\d+)*%?)(?:\s+(million|billion|thousand|percent|per cent))?"
    r"((?:\s+[a-z][a-z-]*){1,4})")
_YEAR_RE = re.compile(r"\b(?:19|20)\d\d\b")
_METRIC_STOP = frozenset((
    "the", "a", "an", "of", "in", "on", "for", "by", "to", "and", "or", "with", "at", "from",
    "is", "are", "was", "were", "be", "will", "would", "per", "each", "than", "more", "over",
    "about", "around", "nearly", "almost", "its", "their", "this", "that", "these", "those",
))
_SUPERSEDES = ("revised", "updated", "corrected", "restated", "supersed", "replaces")
_DEFINITION = ("defined as", "definition", "counts only", "excluding", "including", "excludes",
               "includes")
_FOOTNOTE = ("footnote", "note:", "outdated", "earlier estimate")


def quantities(sentence: str) -> list[tuple[str, str, str]]:
    """(metric, value, period) for each counted quantity in a sentence.

    The metric is the first two content words after the figure ("2.3 million registered
    users" -> "registered users"), the value the figure with its scale word, the period
    the sentence's other four-digit years. Bare years are not quantities.
    """
    text = normalise(sentence)
    years = set(_YEAR_RE.findall(text))
    out = []
    for figure, scale, tail in _QUANTITY_RE.findall(text):
        if _YEAR_RE.fullmatch(figure):
            continue
        words = [w for w in tail.split() if w not in _METRIC_STOP]
        if len(words) < 2:
            continue
        value = f"{figure} {scale}".strip()
        period = ",".join(sorted(years - {figure}))
        out.append((" ".join(words[:2]), value, period))
    return out


_NAME_RE = re.compile(r"(?<=[\s(])([A-Z][a-z]+(?:[A-Z][a-z]+)*)\b")
_NOT_NAMES = frozenset(("January", "February", "March", "April", "May", "June", "July",
                        "August", "September", "October", "November", "December", "The",
                        "This", "It", "Its", "They", "Their"))


def names(sentence: str) -> set[str]:
    """Capitalised words other than the sentence's first word: who or what it is about."""
    return {n for n in _NAME_RE.findall(sentence) if n not in _NOT_NAMES} | (
        {sentence.split()[0]} if sentence.split() and sentence.split()[0] not in _NOT_NAMES
        and sentence.split()[0][:1].isupper() else set())


def _conflict_reason(a: str, b: str) -> tuple[str, str]:
    both = f"{normalise(a)} || {normalise(b)}"
    if any(k in both for k in _SUPERSEDES):
        return "conflict-resolved", "a newer source supersedes the older figure"
    if any(k in both for k in _DEFINITION):
        return "conflict-resolved", "a definition difference: the sources count different things"
    if any(k in both for k in _FOOTNOTE):
        return "conflict-resolved", "an outdated footnote: the main text's figure holds"
    return "conflict-open", "unexplained: the sources give the same quantity different values"


def find_conflicts(claims: list[dict]) -> list[dict]:
    """Pairs of claims from different sources giving one quantity different values, in id
    order; each with both ids, the values and a reason. One quantity: the same metric, the
    same period, and a name both quotes mention (46% of meters for one supplier and 12% for
    another are two quantities, not a conflict)."""
    seen: dict[tuple[str, str], list[tuple[str, str, str, str]]] = {}
    for claim in sorted(claims, key=lambda c: str(c.get("id"))):
        cid, sid, quote = str(claim.get("id")), str(claim.get("source_id", "")), str(
            claim.get("quote", ""))
        for metric, value, period in quantities(quote):
            seen.setdefault((metric, period), []).append((cid, sid, value, quote))
    conflicts = []
    for (metric, period), items in sorted(seen.items()):
        for i, (aid, asrc, aval, aquote) in enumerate(items):
            for bid, bsrc, bval, bquote in items[i + 1:]:
                if asrc == bsrc or aval == bval or not names(aquote) & names(bquote):
                    continue
                status, reason = _conflict_reason(aquote, bquote)
                conflicts.append({"ids": [aid, bid], "metric": metric,
                                  "period": period, "values": [aval, bval],
                                  "status": status, "reason": reason})
    return conflicts


# --- statement kinds, quantities and classifying disagreements ---------------------------
# The heuristic's reading of what a statement is (extract's ``kind``), in this order: the
# first cue that matches wins; a statement with a figure and no cue is a ``figure``.
_KIND_CUES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("definition", ("defined as", "definition", "refers to", "counts only", "is measured as",
                    "are measured as", " means ")),
    ("caveat", ("however", "excluding", "except", "unless", "subject to", "provided that",
                "only if", "note:", "caveat")),
    ("recommendation", ("recommend", "should", "we advise", "advises", "suggest")),
    ("obligation", ("must", "shall", "is required to", "are required to", "obliged")),
    ("requirement", ("required", "requirement", "mandatory", "minimum", "at least")),
    ("forecast", ("forecast", "expected to", "projected", "will ", "outlook")),
    ("opinion", ("we believe", "in our view", "told us", "said", "thinks", "considers",
                 "according to")),
)


def statement_kind(sentence: str) -> str:
    """fact, figure, requirement, obligation, opinion, recommendation, caveat, forecast or
    definition, by the cue words above."""
    text = f" {normalise(sentence)} "
    for kind, cues in _KIND_CUES:
        if any(c in text for c in cues):
            return kind
    return "figure" if any(ch.isdigit() for ch in sentence) else "fact"


_WORD_RE = re.compile(r"[a-z]{4,}")
_QUESTION_STOP = frozenset(("what", "which", "whether", "should", "would", "could", "with",
                            "from", "that", "this", "their", "there", "about", "into", "toward",
                            "have", "does", "when", "where", "how", "they", "them", "than"))


def relevance(sentence: str, question: str) -> str:
    """high (two or more of the question's content words occur), medium (one), else low."""
    words = {w for w in _WORD_RE.findall(normalise(question)) if w not in _QUESTION_STOP}
    said = normalise(sentence)
    hits = sum(1 for w in words if re.search(r"\b" + re.escape(w[:6]), said))
    return "high" if hits >= 2 else "medium" if hits == 1 else "low"


_SENTENCE_STARTERS = frozenset((
    "In", "On", "At", "By", "For", "From", "With", "Our", "We", "A", "An", "As", "According",
    "After", "Before", "Since", "Under", "Each", "Every", "All", "Most", "Some", "Only",
    "Across", "Among", "Both", "If", "When", "While", "Its", "Their", "There", "These",
    "Those", "That", "This", "The", "It", "They", "Of", "To", "Per", "Total", "Note",
    "However", "Excluding", "Including", "Unless", "Over", "About", "Around", "Nearly",
))


def entity_of(sentence: str) -> str:
    """Who or what a sentence's figures belong to: its first capitalised word that is not a
    sentence starter or a month ('' when none)."""
    for word in re.findall(r"[A-Za-z][A-Za-z'-]*", sentence):
        word = word.removesuffix("'s")
        if word[:1].isupper() and word not in _SENTENCE_STARTERS and word not in _NOT_NAMES \
                and not word.isupper():
            return word
    return ""


def structured_quantities(sentence: str) -> list[dict[str, str]]:
    """The figures of a sentence that measure something, as extract's ``quantities``:
    figure (as written), value, unit, metric, entity, period — read by ``quantities``."""
    written = figures(sentence)
    entity = entity_of(sentence)
    out = []
    for metric, value, period in quantities(sentence):
        figure, _, scale = value.partition(" ")
        if figure not in written:
            continue
        # The figure as written, with its scale word ("18 million"), in the sentence's case.
        found = re.search(r"(?<![\w.,])" + re.escape(value).replace(r"\ ", r"\s+"), sentence,
                          re.IGNORECASE)
        number = figure.rstrip("%").replace(",", "")
        factor = _SCALE_FACTORS.get(scale, 1)
        if factor != 1:
            number = _plain(float(number) * factor)
        out.append({"figure": found.group(0) if found else figure, "value": number,
                    "unit": "%" if figure.endswith("%") or scale in ("percent", "per cent")
                    else "", "metric": metric, "entity": entity, "period": period})
    taken = {q["figure"].split()[0] for q in out}
    for m in _PRICE_RE.finditer(sentence):
        currency, figure, scale, per = m.group(1) or m.group(2), m.group(3), m.group(4), m.group(5)
        if figure in taken or figure not in written:
            continue
        number = figure.replace(",", "")
        factor = _SCALE_FACTORS.get((scale or "").lower(), 1)
        if factor != 1:
            number = _plain(float(number) * factor)
        out.append({"figure": f"{figure} {scale}" if scale else figure, "value": number,
                    "unit": currency, "metric": f"price per {per.lower()}", "entity": entity,
                    "period": _period(sentence, figure)})
    return out


# A price: a currency code or sign, the amount, "per" (or "a") and what it is per.
_PRICE_RE = re.compile(r"(?:\b([A-Z]{3})|([€$£]))\s?(\d+(?:[.,]\d+)*)"
                       r"(?:\s+(million|billion|thousand))?\s+(?:per|a|an)\s+([a-z]+)")


def _period(sentence: str, figure: str) -> str:
    return ",".join(sorted(set(_YEAR_RE.findall(sentence)) - {figure}))


_SCALE_FACTORS = {"thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}


def _plain(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.6g}"


# Disagreement classes, by rule (the sides' quotes and their sources' dates).
_AMENDS = ("amend", "supersed", "replace", "revised", "revision", "updated", "corrected",
           "restated", " now ", "has been changed")
_SCOPE = ("special", "discount", "promotional", "introductory", "one-off", "negotiated",
          "pilot", "trial", "target", "forecast", "expected", "projected", "scenario",
          "proposed", "draft", "before rebate", "temporary")
_DEFINES = ("defined as", "definition", "counts only", "counting only", "excluding",
            "including", "excludes", "includes", "measured as", "net of", "gross", "on a ")
_OLD = ("footnote", "outdated", "earlier estimate", "previous estimate", "previously",
        "out of date", "superseded")


def _has(text: str, cues: tuple[str, ...]) -> bool:
    t = f" {normalise(text)} "
    return any(c in t for c in cues)


def classify(candidate: dict) -> dict:
    """One candidate disagreement classified by rules: {candidate, class, holds, holds_ids,
    reason, applies}. In this order: a side whose wording amends or replaces holds
    (superseded); a side scoped as special, a target or a forecast beside a plain one is no
    conflict (the plain value holds); definitional wording on a side is a definition (each
    holds for what it counts; the plain side is the headline); different source dates or
    out-of-date wording: the newest holds (outdated); else unexplained."""
    sides = [s for s in candidate.get("sides") or [] if isinstance(s, dict)]
    cid = str(candidate.get("id", ""))

    def out(cls: str, holding: list[dict], reason: str, applies: str = "") -> dict:
        value = str(holding[0].get("value")) if holding else None
        return {"candidate": cid, "class": cls, "holds": value,
                "holds_ids": [str(s.get("evidence_id")) for s in holding
                              if str(s.get("value")) == value],
                "reason": reason, "applies": applies}

    quotes = {id(s): str(s.get("quote") or s.get("value") or "") for s in sides}
    if candidate.get("about") == "advice":
        return _classify_advice(cid, sides, quotes, out)
    amending = [s for s in sides if _has(quotes[id(s)], _AMENDS)]
    if amending and len(amending) < len(sides):
        src = ", ".join(str(s.get("source_id")) for s in amending)
        return out("superseded", amending, f"{src} amends or replaces the earlier figure")
    scoped = [s for s in sides if _has(quotes[id(s)], _SCOPE)]
    if scoped and len(scoped) < len(sides):
        plain = [s for s in sides if s not in scoped]
        return out("not-a-conflict", plain, "the values describe different cases (a special, "
                   "target or forecast figure beside the standard one)")
    # A definition difference: some sides define what they count and others do not (wording
    # all sides share, "including hosting" on every price, is no difference).
    defining = [s for s in sides if _has(quotes[id(s)], _DEFINES)]
    if defining and len(defining) < len(sides):
        plain = [s for s in sides if s not in defining] or defining
        # Each side's quote without its full stop: the sides join with "; ", never ".;".
        applies = "; ".join(f"{s.get('value')} ({s.get('source_id')}): "
                            f"{quotes[id(s)].strip().rstrip('.')}" for s in sides)
        return out("definition", plain, "the sources count different things", applies)
    dated = sorted((s for s in sides if str(s.get("source_date") or "").strip()),
                   key=lambda s: str(s.get("source_date")))
    old = [s for s in sides if _has(quotes[id(s)], _OLD)]
    if old and len(old) < len(sides):
        return out("outdated", [s for s in sides if s not in old],
                   "the other figure is marked as out of date")
    if len(dated) == len(sides) and str(dated[0].get("source_date")) != str(
            dated[-1].get("source_date")):
        newest = [s for s in dated if s.get("source_date") == dated[-1].get("source_date")]
        return out("outdated", newest, f"the newest source ({newest[0].get('source_id')}, "
                   f"{newest[0].get('source_date')}) holds; the older figure is out of date")
    return {"candidate": cid, "class": "unexplained", "holds": None, "holds_ids": [],
            "reason": "the sources give different values and neither says which holds",
            "applies": ""}


# Disagreements over advice, by rule: the course each side advises, read from its wording.
# The first course whose words a side uses is its course; sides advising one course agree.
_COURSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("against it", (" not ", "n't ", " avoid", " against ", " refrain", " reject", " cancel",
                    " drop ", " stop ", " abandon")),
    ("wait", (" wait", " defer", " delay", " postpone", " hold off", " hold back", " later ",
              " pause", " until ")),
    ("check first", (" second quote", " second opinion", " compare", " competing", " tender",
                     " another quote", " other quote", " review ", " assess", " evaluate",
                     " seek ", " seeks ", " check ", " verify", " confirm", " investigate")),
    ("act now", (" now", " immediately", " at once", " order ", " buy ", " sign ", " proceed",
                 " go ahead", " commit", " invest", " adopt", " launch", " start ", " book ")),
)


def course_of(advice: str) -> str:
    """The course a piece of advice takes ("wait", "check first", "act now", "against it"),
    or "" when its wording names none of them."""
    text = " " + re.sub(r"[^a-z0-9']+", " ", normalise(advice)) + " "
    for course, words in _COURSES:
        if any(w in text for w in words):
            return course
    return ""


def _classify_advice(cid: str, sides: list[dict], quotes: dict[int, str],
                     out: Any) -> dict:
    """A candidate disagreement over advice: sides advising one course (or whose courses the
    wording does not name) do not disagree; else the newest advice holds when one side
    amends the others or the sources' dates differ, and the disagreement is unexplained
    when nothing says which to follow."""
    courses = {id(s): course_of(quotes[id(s)]) for s in sides}
    named = {c for c in courses.values() if c}
    if len(named) < 2:
        return out("not-a-conflict", [], "the sources advise the same course"
                   + (f" ({next(iter(named))})" if named else "") + " or name none the "
                   "rules can tell apart: no opposite course words")
    said = "; ".join(f"{s.get('source_id')}: {courses[id(s)] or 'no course named'}"
                     for s in sides)
    amending = [s for s in sides if _has(quotes[id(s)], _AMENDS)]
    if amending and len(amending) < len(sides):
        src = ", ".join(str(s.get("source_id")) for s in amending)
        return out("superseded", amending, f"the sources advise different courses ({said}); "
                   f"{src} revises the earlier advice")
    dated = sorted((s for s in sides if str(s.get("source_date") or "").strip()),
                   key=lambda s: str(s.get("source_date")))
    if len(dated) == len(sides) and str(dated[0].get("source_date")) != str(
            dated[-1].get("source_date")):
        newest = [s for s in dated if s.get("source_date") == dated[-1].get("source_date")]
        return out("outdated", newest[:1], f"the sources advise different courses ({said}); "
                   f"the newest source ({newest[0].get('source_id')}, "
                   f"{newest[0].get('source_date')}) is followed")
    return {"candidate": cid, "class": "unexplained", "holds": None, "holds_ids": [],
            "reason": f"the sources advise different courses ({said}) and nothing in them "
                      "says which to follow", "applies": ""}
