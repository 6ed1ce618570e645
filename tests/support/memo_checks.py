"""Checks on a memo of the conflicts test pack (tests/fixtures/conflicts_pack), as functions of
its text: the offline run (tests/test_conflicts_pack_documents.py) and the recorded real-model
run (tests/test_relay_conflicts_pack.py) hold their memos to the same ones."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from keepstep.engine.core.templates import rendered_sections
from keepstep.engine.kinds.claims import figure_problems
from keepstep.engine.kinds.common import (
    CALCULATED_RE,
    LOCATED_CITE_RE,
    cited_evidence_ids,
    expand_footnotes,
    recorded_calculation,
)

PACK = Path(__file__).parent.parent / "fixtures" / "conflicts_pack"

# The disagreements the pack's sources plant: (metric words, entity) -> class. The metric is
# matched by its words, since a language model names a quantity in its own words.
PLANTED: dict[tuple[str, str], str] = {
    ("passenger", "tarnlake"): "superseded",
    ("staff", "tarnlake"): "definition",
    ("berth", "kelvmoor"): "outdated",
    ("hull", "brisland"): "unexplained",
}
APPARENT = ("pass", "tarnlake")  # 960 euro list price beside a 720 euro student price
# The value each settled disagreement's documents use.
HOLDS = {("passenger", "tarnlake"): "398,000", ("berth", "kelvmoor"): "140"}
HULL_QUOTES = ("18 million", "22 million", "20 million")
# The courses the R sources advise for the hull order (order in 2025 / wait for the 2026 list
# / a second yard's quote first): a disagreement over advice, not over a figure.
ADVICE = ("advice", "order")
ADVICE_QUOTES = ("Buyers should order a hull in 2025",
                 "The yard advises buyers to wait for its 2026 price list",
                 "We recommend that the board seeks a second yard's quote")


def planted_key(record: dict[str, Any]) -> tuple[str, str] | None:
    """Which planted disagreement a `keepstep conflicts --json` record is (None: not one)."""
    metric = str(record.get("metric", "")).lower()
    sides = " ".join(str(s.get("quote", "")) for s in record.get("sides", [])).lower()
    if record.get("about") == "advice":
        return ADVICE if "order" in sides else None
    for words, entity in [*PLANTED, APPARENT]:
        if words == "pass" and "annual pass" not in sides:
            continue
        if words in metric + " " + sides and entity in (
                str(record.get("entity", "")).lower() + " " + sides):
            if words == "pass" or words in metric or _only_metric_in(words, record):
                return words, entity
    return None


def _only_metric_in(words: str, record: dict[str, Any]) -> bool:
    """A record whose metric a model worded without the planted word (e.g. "crew count"):
    it is that disagreement when every side's quote holds the word."""
    return all(words in str(s.get("quote", "")).lower() for s in record.get("sides", []))


def sections(memo: str) -> dict[str, str]:
    """The memo's sections by its template's ``<!-- section: id -->`` markers (the memo
    carries none: they are found by the template's headings), footnotes expanded back into
    ``[ids] (source, locator)`` citations, so each line carries what it cites."""
    template = (PACK / "templates" / "memo.md").read_text(encoding="utf-8")
    return rendered_sections(expand_footnotes(memo), template)


def evidence_quotes(memo: str) -> dict[str, str]:
    """Evidence id -> quote, from the memo's evidence section (one table row each)."""
    quotes = {}
    for line in sections(memo)["evidence"].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cited_evidence_ids(cells[0]) == {cells[0]}:
            # The table's own marks: a side of an open disagreement, a figure stated before
            # its period ended (kinds.stale).
            quotes[cells[0]] = re.sub(r"(?:\s*_\((?:disputed:|stated )[^)]*\)_)+$",
                                      "", cells[3])
    return quotes


def _cited_items(text: str) -> list[str]:
    """A section's list items and table rows that cite evidence, their citations removed."""
    items = []
    for line in text.splitlines():
        if not cited_evidence_ids(line):
            continue
        m = re.match(r"^\s*(?:\d+[.)]|[-*+])\s+(.*)$", line)
        item = m.group(1) if m else line if line.startswith("|") else None
        if item is not None:
            items.append(" ".join(LOCATED_CITE_RE.sub("", item).lower().split()))
    return items


def repeated_across_sections(memo: str) -> list[str]:
    """Cited items (findings, ranked options, disagreements) shown in more than one section,
    or twice in one."""
    seen: dict[str, list[str]] = {}
    for name, text in sections(memo).items():
        if name == "evidence":  # the evidence table quotes statements; it is not a finding
            continue
        for item in _cited_items(text):
            seen.setdefault(item, []).append(name)
    return [f"{item[:60]} ({', '.join(where)})" for item, where in seen.items()
            if len(where) > 1]


_CALCULATED_RE = CALCULATED_RE  # "(calculated: 2,600 × 140 = 364,000)"


def _without_ids(text: str) -> str:
    """The text without its citations and evidence and source ids (R1, P2-e3)."""
    return re.sub(r"\b[A-Z]\d+(?:-e\d+)?\b", " ", LOCATED_CITE_RE.sub(" ", text))


def line_problems(line: str, ids: set[str], quotes: dict[str, str],
                  ranges: bool = False) -> list[str]:
    """Each figure ``line`` states that none of the quotes of ``ids`` holds and its checked
    calculation (``(calculated: ...)``) does not give, and that calculation's own problems
    (recomputed, operands in the cited quotes: keepstep's claim rules). ``ranges``: a
    ranked item's row, where a difference written beside both its cited ends passes, as the
    rank step's rules let it (``kinds.claims.range_differences``)."""
    calculation = _CALCULATED_RE.search(line)
    text = _without_ids(_CALCULATED_RE.sub(" ", line))
    found = figure_problems("line", text, sorted(ids), quotes,
                            recorded_calculation(calculation) if calculation else None,
                            ranges=ranges)
    return [f"{p.rule}: {p.message} ({p.value})" for p in found]


def table_scores(memo: str) -> list[str]:
    """The score cell of each row of the memo's options table ("| Rank | Option | ... |")."""
    column, out = None, []
    for line in memo.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| Rank |"):
            column = next((n for n, c in enumerate(cells) if c.startswith("Score")), None)
        elif column is not None and line.startswith("|") and len(cells) > column:
            if re.fullmatch(r"\d+", cells[column]):
                out.append(cells[column])
        elif not line.startswith("|"):
            column = None
    return out


def unsupported_figures(memo: str, sources: dict[str, str]) -> list[str]:
    """Each figure a cited line states that none of its cited quotes holds (nor a checked
    calculation from them gives), and each cited quote that is not verbatim in its source
    (``sources``: source id -> text). A table's rank and score cells, and a rationale's
    ratings on the 1-5 scale, are the ranking's own, not figures of the sources."""
    quotes = evidence_quotes(memo)
    # A line's "(score 17)" restates an option's score in the options table (the audit's
    # figures check does not count it either): the ranking's own, when the table gives it.
    scores = set(table_scores(memo))
    flat = {sid: " ".join(text.split()) for sid, text in sources.items()}
    problems = [f"{i}: quote not in source {i.rsplit('-e', 1)[0]}"
                for i, q in quotes.items() if " ".join(q.split()) not in
                flat.get(i.rsplit("-e", 1)[0], "")]
    for name, text in sections(memo).items():
        if name == "evidence":
            continue
        header: list[str] = []
        for line in text.splitlines():
            if line.startswith("| Rank"):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
            ids = cited_evidence_ids(line)
            if not ids:
                continue
            line = re.sub(r"^\s*(?:\d+[.)]|[-*+])\s+", "", line)  # a list item's number
            line = re.sub(r"\(score (\d+)\)",
                          lambda m: " " if m.group(1) in scores else m.group(0), line)
            row = line.startswith("|") and bool(header)
            if row:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                line = " ".join(c for h, c in zip(header, cells, strict=False)
                                if h not in ("Rank", "Evidence") and not h.startswith("Score"))
                # A rationale's ratings on the ranking's own 1-5 scale ("hull price 4/5")
                # are the score's parts, not figures of the sources.
                line = re.sub(r"\b[1-5]\s*/\s*5\b", " ", line)
            problems += [f"{name}: {p} in {line.strip()[:70]!r}"
                         for p in line_problems(line, ids, quotes,
                                                ranges=row)]
    return problems


def disagreement_lines(memo: str) -> dict[tuple[str, str], str]:
    """The conflicts section's line for each planted disagreement (by the sides it cites)."""
    text = sections(memo)["conflicts"]
    quotes = evidence_quotes(memo)
    found: dict[tuple[str, str], str] = {}
    for line in text.split("\n- "):
        if "disagree on what to do" in line:
            found.setdefault(ADVICE, line)
            continue
        cited = " ".join(quotes.get(i, "") for i in cited_evidence_ids(line)).lower()
        for words, entity in [*PLANTED, APPARENT]:
            if (words in cited and entity in cited
                    and (words != "pass" or "annual pass" in cited)):
                found.setdefault((words, entity), line)
    return found


def source_texts(root: Path) -> dict[str, str]:
    return {p.name.split("-", 1)[0]: p.read_text(encoding="utf-8")
            for p in (root / "sources").glob("*.md")}


# What a client document must not carry: production artefacts (issue 20's blind review).
_ARTEFACTS = {
    "section marker": re.compile(r"<!--\s*section:"),
    "question line": re.compile(r"^_Question:", re.MULTILINE),
    "note stub": re.compile(r"_\(Note: "),
    "bare confidence tag": re.compile(r"\(confidence: (?:high|medium|low)\)"),
    "'.;' run-on join": re.compile(r"\.;"),
    # Production text a client must not read (the partner's review of relay run 4).
    "model footer": re.compile(r"Models that answered"),
    "code wording": re.compile(r"\bcode (?:adds|computes|checks)\b"),
    "inline code": re.compile(r"`"),
    "file name": re.compile(r"\bsources\.toml\b"),
}
_EVIDENCE_ID_RE = re.compile(r"\b[A-Z]\d+-e\d+\b")


def _prose_ids(line: str) -> bool:
    """Whether ``line`` names an evidence id in its words: not a footnote, a bracketed
    citation ("[R1-e3]") or a table cell holding only an id (the evidence appendix)."""
    if line.startswith("[^"):
        return False
    cells = line.split("|") if line.startswith("|") else [line]
    return any(_EVIDENCE_ID_RE.search(re.sub(r"\[[^\]]*\]", " ", c)) for c in cells
               if not _EVIDENCE_ID_RE.fullmatch(c.strip()))


def production_artefacts(memo: str) -> list[str]:
    """Each production artefact the memo carries, named with the line it is on."""
    return [f"{name}: {line.strip()[:70]!r}" for line in memo.splitlines()
            for name, pattern in _ARTEFACTS.items() if pattern.search(line)] + [
        f"evidence id in prose: {line.strip()[:70]!r}" for line in memo.splitlines()
        if _prose_ids(line)]


def gaps_repeated(memo: str) -> list[str]:
    """Each line of the gaps section whose words the findings section also says."""
    parts = sections(memo)
    findings = " ".join(parts["findings"].split()).lower()
    gaps = [re.sub(r"\s*\([^)]*\)$", "", line[2:]).strip() for line in
            parts["gaps"].splitlines() if line.startswith("- ")]
    return [g for g in gaps if " ".join(g.split()).lower().rstrip(".") in findings]


def source_rows(memo: str) -> dict[str, list[str]]:
    """The sources section's table: source id -> its cells (title, kind, date, publisher,
    where they come from)."""
    rows = {}
    for line in sections(memo)["sources"].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"[A-Z]\d+", cells[0]):
            rows[cells[0]] = cells[1:]
    return rows
