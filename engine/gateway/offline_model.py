"""Deterministic offline heuristic "model" for keepstep.

This is the default model: it lets the sample pack run with no key and no network.
It is honest about what it is: every response carries ``HEURISTIC_NOTICE`` and the
work is done by plain rules (``offline_rules``), not by a language model.

Callers may rely on:
- ``respond(payload)`` dispatching on ``payload["task"]`` (extract, verify, synthesize, rank,
  check, render, summarise) and returning a JSON-serialisable dict that always has
  ``"notice": HEURISTIC_NOTICE``. The payload is the INPUT block of a rendered prompt — the
  provider reads it out of the messages; there is no other way in;
- identical output for identical input (no randomness, no clock, sorted iteration);
- ``ValueError`` for an unknown task or a malformed payload.

It is wrapped for litellm elsewhere (``gateway/offline_provider.py``); this module imports
nothing outside the standard library. Its answers are the shapes the kinds' schemas ask for
(``verify`` also lists conflicting figures between sources, ``extract`` numbers from
``first_id`` so a chunked source gets the ids it would get in one piece).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from keepstep.engine.gateway import offline_rules as rules

_T = TypeVar("_T")

MODEL_NAME = "keepstep-offline"
HEURISTIC_NOTICE = (
    "offline heuristic model (keepstep-offline): deterministic rules, no language model"
)

_MAX_FINDINGS, _MIN_FINDINGS, _IDS_PER_FINDING = 6, 3, 3
_MAX_RISKS, _GENERIC_IMPACT = 6, 3


def count_tokens(text: str) -> int:
    """Deterministic token estimate: ``ceil(len(text) / 4)``; 0 for empty text."""
    return math.ceil(len(text) / 4)


def _audience_key(audience: object) -> str:
    return re.sub(r"\s+", " ", str(audience or "")).strip().lower()


# --- extract ---------------------------------------------------------------------------
def extract_evidence(source_id: str, text: str, first_id: int = 1,
                     topics: rules.Topics | None = None, question: str = "") -> list[dict]:
    """Evidence statements of one source (or one chunk of it), in document order.

    A statement is a body sentence (not a heading, front matter, link-list entry or list
    marker) or a data row of a Markdown table, containing at least one digit. A row's quote is
    the row without its outer pipes (``Framework | 50,000 | 12%``), verbatim from the text;
    its topic is read from the row and the table's header. Ids are ``f"{source_id}-e{n}"``
    with n from ``first_id`` (1 for a whole source; a later chunk continues the count, so
    ids do not depend on how a source was split); a sentence's ``quote`` is the sentence
    with whitespace collapsed.

    Each item also gets its ``kind`` (by cue words), its ``relevance`` to ``question`` (shared
    content words), its ``quantities`` (figure, value, unit, metric, entity, period, read by
    rule) and, for a caveat or a definition, ``qualifies``: the statement before it. (The
    heuristic keeps to statements with a figure: a statement without one is evidence for a
    language model, but no rule here tells which of them matter.)
    """
    evidence: list[dict] = []
    # Only a source's start holds its front matter: a later chunk (first_id past 1) that
    # opens on a "---" block reads it as the whole source would, as body text.
    for kind, quote, header in rules.statements(text, front_matter=first_id == 1):
        if not any(ch.isdigit() for ch in quote):
            continue
        item_id = f"{source_id}-e{first_id + len(evidence)}"
        what = rules.statement_kind(quote)
        evidence.append({
            "id": item_id,
            "source_id": source_id,
            "quote": quote,
            "kind": what,
            "relevance": rules.relevance(quote, question),
            "figures": rules.figures(quote),
            "quantities": rules.structured_quantities(quote),
            "qualifies": [evidence[-1]["id"]] if what in ("caveat", "definition") and evidence
            else [],
            "topic": rules.classify_topic(f"{header} {quote}" if kind == "row" else quote,
                                          topics or []),
        })
    return evidence


def _task_extract(payload: dict) -> dict:
    source_id = _require(payload, "source_id", str)
    text = _require(payload, "text", str)
    first_id = payload.get("first_id", 1)
    if not isinstance(first_id, int) or first_id < 1:
        raise ValueError("extract: 'first_id' must be an int >= 1")
    return {"evidence": extract_evidence(
        source_id, text, first_id,
        rules.topic_list(payload.get("topics"), payload.get("offline_hints")),
        str(payload.get("question") or ""))}


# --- verify ----------------------------------------------------------------------------
def verify_claim(quote: str, passage: str) -> tuple[bool, str]:
    """Supported iff the normalised quote occurs in the normalised passage and every
    figure of the quote is a figure of the passage. Returns (supported, short reason)."""
    if not quote.strip():
        return False, "empty quote"
    if not passage.strip():
        return False, "no passage to check against"
    passage_figures = set(rules.figures(rules.normalise(passage)))
    quote_figures = rules.figures(rules.normalise(quote))
    missing = [f for f in quote_figures if f not in passage_figures]
    if missing:
        return False, "figure(s) not in passage: " + ", ".join(missing)
    if rules.normalise(quote) not in rules.normalise(passage):
        return False, "quote not found in passage"
    return True, f"quote found in passage; {len(quote_figures)} figure(s) match"


def _task_verify(payload: dict) -> dict:
    """A verdict per claim; with INPUT ``candidates`` (disagreements proposed by code), each
    classified by rule (``offline_rules.classify``); without, the pairs ``find_conflicts``
    reads from the quotes (the older request)."""
    results = []
    claims = _dicts(payload, "claims")
    raw = payload.get("passages")
    passages = raw if isinstance(raw, dict) else {}
    for claim in claims:
        # A claim names its passage by id in INPUT "passages" (or, in an older request,
        # carries the passage itself).
        named = str(claim.get("passage", ""))
        ok, reason = verify_claim(str(claim.get("quote", "")), str(passages.get(named, named)))
        results.append({"id": claim.get("id"), "supported": ok, "reason": reason})
    if "candidates" in payload:
        return {"results": results,
                "conflicts": [rules.classify(c) for c in _dicts(payload, "candidates")]}
    supported = {str(r["id"]) for r in results if r["supported"]}
    return {"results": results,
            "conflicts": rules.find_conflicts([c for c in claims
                                               if str(c.get("id")) in supported])}


# --- synthesize ------------------------------------------------------------------------
def _strength(item: dict, keywords: tuple[str, ...]) -> tuple[int, int, int, str]:
    # Most on-topic first, then quotable on its own, then more concrete (more figures);
    # the id makes the order total and therefore stable.
    quote = str(item.get("quote", ""))
    return (-rules.keyword_hits(quote, keywords), 0 if rules.reads_standalone(quote) else 1,
            -len(item.get("figures") or rules.figures(quote)), str(item["id"]))


def _reading(payload: dict, topics: rules.Topics) -> tuple[list[str], dict[str, str]]:
    """The topics in the order the audience reads them, and the heading of each (INPUT's
    ``reading_order`` and ``labels``; by default the topics' own order and names)."""
    names = [t for t, _ in topics] or [rules.GENERAL_TOPIC]
    given = payload.get("reading_order")
    order = [t for t in given if t in names] if isinstance(given, list) else []
    order += [t for t in names if t not in order]
    raw = payload.get("labels")
    labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    return order, {t: labels.get(t) or t.replace("_", " ").capitalize() for t in names}


def _task_synthesize(payload: dict) -> dict:
    question = str(payload.get("question", "")).strip()
    audience = _audience_key(payload.get("audience"))
    evidence = _unique_evidence(_require(payload, "evidence", list))
    topics = rules.topic_list(payload.get("topics"), payload.get("offline_hints"))
    order, labels = _reading(payload, topics)
    keywords = dict(topics)
    by_topic: dict[str, list[dict]] = {t: [] for t in order}
    for item in evidence:
        given = str(item.get("topic") or "")
        topic = given if given in by_topic else rules.classify_topic(
            str(item.get("quote", "")), topics)
        by_topic.setdefault(topic, []).append(item)
    for topic, items in by_topic.items():
        items.sort(key=lambda item, t=topic: _strength(  # type: ignore[misc]
            item, keywords.get(t, ())))

    # One finding per topic in reading order; with fewer than 3 topics, top up with further
    # slices of the topics that have the most evidence left, so no id is cited twice.
    order = [t for t in order if t in by_topic] + [t for t in by_topic if t not in order]
    groups: list[tuple[str, list[dict]]] = [
        (t, by_topic[t][:_IDS_PER_FINDING]) for t in order if by_topic[t]]
    used = {t: min(len(by_topic[t]), _IDS_PER_FINDING) for t in order}
    while len(groups) < _MIN_FINDINGS:
        left = [(len(by_topic[t]) - used[t], t) for t in order if len(by_topic[t]) > used[t]]
        if not left:
            break
        topic = min(left, key=lambda pair: (-pair[0], order.index(pair[1])))[1]
        groups.append((topic, by_topic[topic][used[topic]:used[topic] + _IDS_PER_FINDING]))
        used[topic] += len(groups[-1][1])
    groups = groups[:_MAX_FINDINGS]

    audience_label = audience or "general reader"
    lines = [f"## Findings for the {audience_label}", ""]
    if question:
        lines += [f"Question: {question}", ""]
    claims: list[dict[str, Any]] = []
    times = _revised(payload, "claims", len(groups))
    for n, (topic, items) in enumerate(groups):
        if n not in times:
            continue  # flagged twice: dropped, the heuristic has no other way to say it
        # The claim states its lead statement, so it cites the quote that holds its figures
        # and not the topic's other statements (a reader would look for them there).
        lead_id = str(items[0]["id"])
        lead = str(items[0].get("quote", "")).strip()
        label = labels.get(topic) or topic.capitalize()
        # Revised once: it says only what the quote says, in the quote's words.
        text = lead if times[n] else f"{label}: {lead}"
        lines.append(f"{len(claims) + 1}. **{label}**: {lead} [{lead_id}]")
        claims.append({"text": text, "evidence_ids": [lead_id]})
    if not claims:
        lines.append("No verified evidence was given, so no findings are stated.")
    lines += ["", f"_{HEURISTIC_NOTICE}; findings are selected and ordered by rules._"]
    return {"summary": "\n".join(lines), "claims": claims}


def _revised(payload: dict, field: str, count: int) -> dict[int, int]:
    """The items (of ``count`` first made) still answered after INPUT's revise rounds, each
    with how often feedback named it: once, it is restated; twice, it is dropped.

    The heuristic answers a revise round by answering the same INPUT again and amending what
    each round's feedback names (``claims[2].text [rule]: ...``, an index into that round's
    answer); being deterministic, it replays the rounds in order to know those indices."""
    alive = list(range(count))
    times = dict.fromkeys(alive, 0)
    for round_problems in payload.get("revise") or []:
        named = {int(m.group(1)) for p in round_problems if isinstance(p, dict)
                 for m in [re.match(rf"{field}\[(\d+)\]", str(p.get("field", "")))] if m}
        for k in named:
            if k < len(alive):
                times[alive[k]] += 1
        alive = [n for n in alive if times[n] < 2]
    return {n: times[n] for n in alive}


# --- rank ------------------------------------------------------------------------------
def _checklist(raw: object) -> list[tuple[str, str, tuple[str, ...], int]]:
    """INPUT's ``checklist`` as (key, title, keywords, impact) in the order given."""
    out = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not item.get("key") or not item.get("title"):
            continue
        impact = item.get("impact", _GENERIC_IMPACT)
        out.append((str(item["key"]), str(item["title"]),
                    tuple(str(k).lower() for k in item.get("keywords") or []),
                    int(impact) if isinstance(impact, int) else _GENERIC_IMPACT))
    return out


def _candidate_risks(checklist: list[tuple[str, str, tuple[str, ...], int]],
                     evidence: list[dict]) -> list[dict]:
    if not checklist:
        return _generic_risks(evidence)
    candidates = []
    for key, title, keywords, impact in checklist:
        ids = sorted(str(e["id"]) for e in evidence
                     if any(k in str(e.get("quote", "")).lower() for k in keywords))
        if not ids:
            continue
        likelihood = min(5, len(ids))
        candidates.append({"key": key, "title": title, "score": likelihood * min(5, impact),
                           "evidence_ids": ids[:5]})
    return candidates


def _generic_risks(evidence: list[dict]) -> list[dict]:
    """Without a checklist: one risk per generic cue word the statements show (a risk,
    a delay, a shortage …), titled by the first statement that shows it."""
    candidates: list[dict[str, Any]] = []
    for cue in rules.GENERIC_RISK_CUES:
        hits = [e for e in evidence if cue in str(e.get("quote", "")).lower()]
        if not hits:
            continue
        ids = sorted(str(e["id"]) for e in hits)
        lead = str(min(hits, key=lambda e: str(e["id"])).get("quote", "")).strip()
        words = lead.split()
        title = " ".join(words[:10]).rstrip(".,;:") + ("…" if len(words) > 10 else "")
        candidates.append({"key": f"cue-{cue}", "title": title,
                           "score": min(5, len(ids)) * _GENERIC_IMPACT,
                           "evidence_ids": ids[:5]})
    candidates.sort(key=lambda r: (-r["score"], r["key"]))
    return candidates[:_MAX_RISKS]


def _option_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]{4,}", rules.normalise(text)) if w not in _STOPWORDS}


def _criterion_value(criterion: str, evidence: list[dict]
                     ) -> tuple[str, list[str], str | None]:
    """A criterion's value by rule: the figures of the statements that name every word of
    it (each as written, the sources' values side by side), else "not stated"; when they
    differ, the spread from the lowest to the highest, with its calculation (the highest
    figure minus the lowest, as the quotes write them) for code to recompute."""
    wanted = _option_words(criterion)
    hits = [e for e in evidence if wanted and wanted <= _option_words(
        " ".join(w.rstrip("s") + " " + w for w in str(e.get("quote", "")).split()))]
    # Each figure as written ("18 million"), from the statement's structured quantities.
    values = {str(e["id"]): [str(q.get("figure", "")) for q in e.get("quantities") or []
                             if isinstance(q, dict) and q.get("figure")] for e in hits}
    cited = sorted(i for i, figs in values.items() if figs)
    shown = list(dict.fromkeys(f for i in cited for f in values[i]))
    if not shown:
        return "not stated", [], None
    if len(shown) == 1:
        return shown[0], cited[:3], None
    # Values that differ between statements are shown side by side as such, never one as
    # fact; their spread is a derived figure, given with its calculation.
    text = " / ".join(shown) + " (the sources differ)"
    spread = _spread(shown)
    if spread is None:
        return text, cited[:3], None
    low, high, scale, difference = spread
    return (" / ".join(shown) + f" (the sources differ, by {difference}{scale} from the "
            "lowest to the highest)", cited[:3], f"{high} - {low} = {difference}")


def _spread(shown: list[str]) -> tuple[str, str, str, str] | None:
    """(lowest, highest, scale words, difference) of figures written with one scale ("18
    million", "22 million"), the numbers as the quotes write them; None when they differ in
    scale or are not plain numbers."""
    parts = [re.fullmatch(r"(\d+(?:\.\d+)?)(\s+[A-Za-z]+)?", f.strip()) for f in shown]
    if not all(parts) or len({(m.group(2) or "").strip().lower() for m in parts if m}) != 1:
        return None
    numbers = sorted((float(m.group(1)), m.group(1)) for m in parts if m)
    (low, low_text), (high, high_text) = numbers[0], numbers[-1]
    difference = high - low
    decimals = max(len(t.partition(".")[2]) for _, t in numbers)
    shown_difference = f"{difference:.{decimals}f}"
    scale = (parts[0].group(2) or "") if parts[0] else ""
    return low_text, high_text, scale, shown_difference


def _points(n: int) -> int:
    """Points on a criterion (1-5) from how many statements bear on it: one each, from 1."""
    return max(1, min(5, 1 + n))


_COUNT_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _option_candidates(evidence: list[dict], criteria: list[str],
                       weights: dict[str, Any] | None = None) -> list[dict]:
    """What a ranking of options (vendors, prices ...) ranks by rule: each course of action a
    source recommends (a ``recommendation`` statement), titled by its words; its points on a
    criterion are 1 plus the statements bearing on the course (sharing its subject) that name
    the criterion (at most 5), so code's sum of points ranks it; each criterion's value from
    the statements that name it, and a spread between differing values with its calculation."""
    candidates = []
    values = {c: _criterion_value(c, evidence) for c in criteria}
    calculation = "; ".join(calc for _, _, calc in values.values() if calc) or None
    for e in evidence:
        if e.get("kind") != "recommendation":
            continue
        quote = str(e.get("quote", "")).strip()
        words = _option_words(quote)
        support = [o for o in evidence if o is not e
                   and len(words & _option_words(str(o.get("quote", "")))) >= 2]
        ids = [str(e["id"])] + sorted({i for _, cited, _ in values.values() for i in cited})
        title = " ".join(quote.split()[:14]).rstrip(".,;:")
        named = {c: [o for o in support if _option_words(c) <= _option_words(
            " ".join(w.rstrip("s") + " " + w for w in str(o.get("quote", "")).split()))]
            for c in criteria}
        # A value the evidence does not state gets the lowest point (the rank prompt's
        # rule, which code checks): unknown is never scored as good.
        points = {c: 1 if values[c][0] == "not stated" else _points(len(named[c]))
                  for c in criteria}
        reasons = "; ".join(
            f"{c}: {_COUNT_WORDS[min(len(named[c]), 9)]} statement(s) bearing on this course "
            "name it" for c in criteria)
        candidates.append({
            "key": str(e["id"]), "title": title,
            "score": sum(p * int((weights or {}).get(c, 1)) for c, p in points.items()),
            "points": points, "evidence_ids": list(dict.fromkeys(ids))[:8],
            "criteria": {c: v for c, (v, _, _) in values.items()},
            **({"calculation": calculation} if calculation else {}),
            "rationale": f"a course of action source {e.get('source_id', '')} recommends; "
                         f"points per criterion by how many other statements on it name the "
                         f"criterion ({reasons})"})
    return candidates


def _number(risks: list[dict]) -> list[dict]:
    risks = sorted(risks, key=lambda r: (-r["score"], r["key"]))
    return [{"id": f"R{n}", "title": r["title"], "score": r["score"],
             "evidence_ids": r["evidence_ids"],
             **{k: r[k] for k in ("criteria", "rationale") if k in r}}
            for n, r in enumerate(risks, start=1)]


def _number_items(items: list[dict]) -> list[dict]:
    """Ranked options as the options prompt asks for them: no score (code adds the points)."""
    items = sorted(items, key=lambda r: (-r["score"], r["key"]))
    return [{"id": f"R{n}", "title": r["title"], "criteria": r["criteria"],
             "points": r["points"], "rationale": r["rationale"],
             "evidence_ids": r["evidence_ids"],
             **({"calculation": r["calculation"]} if r.get("calculation") else {})}
            for n, r in enumerate(items, start=1)]


def check_ranking(risks: list[dict], known_evidence_ids: Iterable[str] | None = None
                  ) -> list[str]:
    """Problems with a ranking, e.g. ``"R4 cites no evidence"``; empty list means clean.

    Checks: every risk cites evidence (known evidence, when ``known_evidence_ids`` is
    given), scores are ints 1-25, ids are unique, and scores never increase down the list.
    """
    known = set(known_evidence_ids) if known_evidence_ids is not None else None
    problems: list[str] = []
    seen: set[str] = set()
    previous: int | None = None
    for risk in risks:
        rid, score = str(risk.get("id")), risk.get("score")
        if rid in seen:
            problems.append(f"{rid} is listed twice")
        seen.add(rid)
        ids = list(risk.get("evidence_ids") or [])
        if not ids:
            problems.append(f"{rid} cites no evidence")
        elif known is not None:
            problems += [f"{rid} cites unknown evidence {e}" for e in ids if e not in known]
        if not isinstance(score, int) or not 1 <= score <= 25:
            problems.append(f"{rid} score {score!r} is outside 1-25")
        elif previous is not None and score > previous:
            problems.append(f"{rid} scores higher than the risk ranked above it")
        if isinstance(score, int):
            previous = score
    return problems


def _task_rank(payload: dict) -> dict:
    """Rank risks by INPUT's checklist (score = likelihood x impact, 1-25; without a
    checklist, by generic risk words); a ranking of anything else (INPUT's ``ranks``) ranks
    the courses of action the sources recommend, with INPUT's ``criteria`` as values.

    Round 1 with more than 5 candidates adds one risk that cites no evidence, as an
    ungrounded generator would; round >= 2 with feedback drops the risks it names.
    """
    evidence = _unique_evidence(_require(payload, "evidence", list))
    round_no = payload.get("round", 1)
    if not isinstance(round_no, int) or round_no < 1:
        raise ValueError("rank: 'round' must be an int >= 1")
    ranks = str(payload.get("ranks") or "risks")
    if ranks != "risks":
        # Options, vendors, prices ...: no risk words, no deliberately ungrounded item.
        return {"items": _number_items(_option_candidates(
            evidence, [str(c) for c in payload.get("criteria") or []],
            payload.get("weights") if isinstance(payload.get("weights"), dict) else None)),
            "round": round_no, "revisions": []}
    candidates = _candidate_risks(_checklist(payload.get("checklist")), evidence)
    if len(candidates) > 5:
        key, title, likelihood, impact = rules.UNSUPPORTED_RISK
        candidates.append({"key": key, "title": title, "score": likelihood * impact,
                           "evidence_ids": []})
    risks = _number(candidates)
    raw_feedback = payload.get("feedback") or []
    feedback = [raw_feedback] if isinstance(raw_feedback, str) else [str(f) for f in raw_feedback]
    revisions: list[str] = []
    if round_no >= 2 and feedback:
        # Feedback names risks by their round-1 id, which this deterministic generator
        # reproduces exactly, so the ids line up. Generated rankings are always sorted, in
        # range and cite only given evidence, so the unsupported risk is the only thing the
        # check can flag: dropping it makes round 2 clean and the loop stops there.
        flagged = {m for f in feedback for m in re.findall(r"\bR\d+\b", f)}
        kept = []
        ranked = sorted(candidates, key=lambda r: (-r["score"], r["key"]))
        for risk, cand in zip(risks, ranked, strict=False):
            if risk["id"] in flagged:
                revisions.append(f"dropped {risk['id']} ({risk['title']}): flagged by check")
            else:
                kept.append(cand)
        risks = _number(kept)
    return {"risks": risks, "round": round_no, "revisions": revisions}


# --- check / summarise -----------------------------------------------------------------
def _task_check(payload: dict) -> dict:
    # The quotes that come with each claim are for a language model to judge; the rules
    # below check only what rules can: cited at all, and cited ids known.
    known = {str(i) for i in _require(payload, "evidence_ids_known", list)}
    problems: list[str] = []
    for n, claim in enumerate(_dicts(payload, "claims"), start=1):
        label = f"claim {claim.get('id', n)}"
        ids = [str(i) for i in claim.get("evidence_ids") or []]
        if not ids:
            problems.append(f"{label} cites no evidence")
        problems += [f"{label} cites unknown evidence {i}" for i in ids if i not in known]
    return {"problems": problems}


def _task_support(payload: dict) -> dict:
    """The support check by rule: a claim is supported when every figure it states is in its
    quotes (or, with a calculation, every operand is) and it shares a content word with them;
    else its quotes do not address it. (A rule cannot see a contradiction.)"""
    verdicts = []
    for n, claim in enumerate(_dicts(payload, "claims"), start=1):
        quotes = " ".join(str(q.get("quote", "")) for q in claim.get("quotes") or []
                          if isinstance(q, dict))
        said = rules.normalise(quotes)
        text = rules.normalise(str(claim.get("text", "")))
        stated = re.findall(r"(?<![A-Za-z0-9_.,-])\d+(?:[.,]\d+)*%?(?![A-Za-z0-9_-])",
                            rules.normalise(str(claim.get("calculation") or "")) or text)
        words = {w for w in re.findall(r"[a-z]{4,}", text) if w not in _STOPWORDS}
        missing = [f for f in stated if f not in said and f not in ("1", "100", "1000")]
        shared = any(w in said for w in words) or not words
        ok = bool(quotes) and not missing and shared
        verdicts.append({"claim": str(claim.get("id", n)),
                         "verdict": "supports" if ok else "does_not_address",
                         "reason": "" if ok else (
                             f"the quotes do not state {', '.join(missing)}" if missing
                             else "the quotes share nothing with the claim")})
    return {"verdicts": verdicts}


def _task_render(payload: dict) -> dict:
    """Sentences for a document section: each finding's lead claim, then the top risk.

    Rule-based like the rest: the sentences are the syntheses' own first claims (so every
    figure stays in the evidence they cite) and the top risk's title.
    """
    sentences = []
    for finding in _dicts(payload, "findings"):
        claims = [c for c in finding.get("claims") or [] if isinstance(c, dict)]
        if claims and claims[0].get("evidence_ids"):
            title = str(finding.get("title", "")).strip()
            text = str(claims[0].get("text", "")).strip()
            sentences.append({"text": f"{title}: {text}" if title else text,
                              "evidence_ids": [str(i) for i in claims[0]["evidence_ids"]]})
    risks = [r for r in payload.get("risks") or [] if isinstance(r, dict)]
    if risks and risks[0].get("evidence_ids"):
        sentences.append({"text": f"Top risk: {risks[0].get('title', '')}",
                          "evidence_ids": [str(i) for i in risks[0]["evidence_ids"]]})
    for top in [t for t in payload.get("top_ranked") or [] if isinstance(t, dict)]:
        if top.get("evidence_ids"):
            what = str(top.get("ranks") or "options")
            noun = what[:-1] if what.endswith("s") else what
            sentences.append({"text": f"Top-ranked {noun}: {top.get('title', '')}",
                              "evidence_ids": [str(i) for i in top["evidence_ids"]]})
    return {"sentences": sentences}


_STOPWORDS = frozenset((
    "the", "a", "an", "and", "or", "of", "to", "in", "on", "for", "by", "with", "at", "from",
    "is", "are", "was", "were", "be", "been", "this", "that", "it", "its", "as", "per",
    "than", "more", "most", "not", "no", "but", "has", "have", "had", "will", "would", "can",
    "could", "our", "their", "they", "we", "he", "she", "which", "who",
))


def _task_summarise(payload: dict) -> dict:
    text = _require(payload, "text", str)
    max_sentences = payload.get("max_sentences", 3)
    if not isinstance(max_sentences, int) or max_sentences < 1:
        raise ValueError("summarise: 'max_sentences' must be an int >= 1")
    sentences = rules.body_sentences(text)
    words = Counter(w for s in sentences for w in re.findall(r"[a-z]{3,}", s.lower())
                    if w not in _STOPWORDS)
    top = {w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:10]}

    def score(sentence: str) -> int:
        # Concrete figures and the document's recurring terms mark the central sentences.
        return 2 * len(rules.figures(sentence)) + len(top & set(re.findall(r"[a-z]{3,}",
                                                                           sentence.lower())))

    chosen = sorted(sorted(range(len(sentences)), key=lambda i: (-score(sentences[i]), i))
                    [:max_sentences])
    return {"summary": " ".join(sentences[i] for i in chosen)}


# --- dispatch --------------------------------------------------------------------------
def _require(payload: dict, key: str, kind: type[_T]) -> _T:
    value = payload.get(key)
    if not isinstance(value, kind):
        # One exception type for every bad payload keeps the provider wrapper's mapping simple.
        raise ValueError(  # noqa: TRY004
            f"{payload.get('task')}: payload needs '{key}' as {kind.__name__}")
    return value


def _dicts(payload: dict, key: str) -> list[dict]:
    items = _require(payload, key, list)
    if not all(isinstance(item, dict) for item in items):
        raise ValueError(f"{payload.get('task')}: every item of '{key}' must be an object")
    return items


def _unique_evidence(items: list) -> list[dict]:
    seen: dict[str, dict] = {}
    for item in items:
        if isinstance(item, dict) and item.get("id") is not None:
            seen.setdefault(str(item["id"]), item)
    return [seen[k] for k in sorted(seen)]


_TASKS: dict[str, Callable[[dict], dict]] = {
    "extract": _task_extract,
    "verify": _task_verify,
    "synthesize": _task_synthesize,
    "rank": _task_rank,
    "check": _task_check,
    "render": _task_render,
    "support": _task_support,
    "summarise": _task_summarise,
}


def respond(payload: dict) -> dict:
    """Run one task and return its JSON-serialisable result plus ``"notice"``.

    Raises ValueError for a non-dict payload, an unknown task (the message lists the
    known tasks) or missing/ill-typed fields.
    """
    if not isinstance(payload, dict):
        raise ValueError("payload must be a dict with a 'task' key")  # noqa: TRY004
    task = payload.get("task")
    handler = _TASKS.get(task) if isinstance(task, str) else None
    if handler is None:
        raise ValueError(
            f"unknown task {task!r}; known tasks: {', '.join(sorted(_TASKS))}")
    result = handler(payload)
    result["notice"] = HEURISTIC_NOTICE
    return result
