"""The conflicts test pack run to its documents through the CLI, as a user would (issue 20).

tests/fixtures/conflicts_pack plants one disagreement of each class between its seven
sources (superseded, outdated, definition, unexplained with three sides, and one that only
looks like one), three courses of action for the hull order that sources recommend, and a
board memo whose template places a recommendation, the ranked options, the findings, the
disagreements and the evidence. Offline (`keepstep run DIR`), `keepstep conflicts --json`
must list each real disagreement with its class and close the apparent one, and the exported
memo must name each disagreement with the value used and why, repeat no finding across
sections, show the options as a table of options, cite for every figure a quote that holds it
and name the offline heuristic as the model that answered.

The checks on a memo are functions of its text (``memo_problems`` and friends), so the
recorded real-model run (tests/test_relay_conflicts_pack.py) holds its memo to the same ones.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.gateway.offline_rules import normalise
from keepstep.engine.kinds.claims import figures_of
from keepstep.engine.kinds.common import LOCATED_CITE_RE, cited_evidence_ids, expand_footnotes

PACK = Path(__file__).parent / "fixtures" / "conflicts_pack"

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


# --- reading a run's outputs -----------------------------------------------------------------
def planted_key(record: dict[str, Any]) -> tuple[str, str] | None:
    """Which planted disagreement a `keepstep conflicts --json` record is (None: not one)."""
    metric = str(record.get("metric", "")).lower()
    sides = " ".join(str(s.get("quote", "")) for s in record.get("sides", [])).lower()
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
    """The memo's sections by their ``<!-- section: id -->`` marker (footnotes expanded back
    into ``[ids] (source, locator)`` citations, so each line carries what it cites)."""
    body = expand_footnotes(memo)
    parts = re.split(r"<!-- section: ([a-z_]+) -->", body)
    return {parts[n]: parts[n + 1] for n in range(1, len(parts) - 1, 2)}


def evidence_quotes(memo: str) -> dict[str, str]:
    """Evidence id -> quote, from the memo's evidence section (one table row each)."""
    quotes = {}
    for line in sections(memo)["evidence"].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cited_evidence_ids(cells[0]) == {cells[0]}:
            quotes[cells[0]] = re.sub(r"\s*_\(disputed:[^)]*\)_$", "", cells[3])
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


def _stated(line: str) -> list[str]:
    """The figures a line states: its citations, evidence and source ids, footnote marks
    and checked calculations left out."""
    text = LOCATED_CITE_RE.sub(" ", line)
    text = re.sub(r"\(calculated: `[^`]*`\)", " ", text)
    text = re.sub(r"\b[A-Z]\d+(?:-e\d+)?\b", " ", text)
    return figures_of(normalise(text))


def unsupported_figures(memo: str, sources: dict[str, str]) -> list[str]:
    """Each figure a cited line states that none of its cited quotes holds, and each cited
    quote that is not verbatim in its source (``sources``: source id -> text). A table's
    rank and score cells are the ranking's own, not figures of the sources."""
    quotes = evidence_quotes(memo)
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
            if line.startswith("|") and header:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                line = " ".join(c for h, c in zip(header, cells, strict=False)
                                if h not in ("Rank", "Score") and not h.startswith("Score"))
            held = set(figures_of(normalise(" ".join(quotes.get(i, "") for i in ids))))
            problems += [f"{name}: {f} in {line.strip()[:70]!r} is in none of "
                         f"{', '.join(sorted(ids))}" for f in _stated(line) if f not in held]
    return problems


def disagreement_lines(memo: str) -> dict[tuple[str, str], str]:
    """The conflicts section's line for each planted disagreement (by the sides it cites)."""
    text = sections(memo)["conflicts"]
    quotes = evidence_quotes(memo)
    found: dict[tuple[str, str], str] = {}
    for line in text.split("\n- "):
        cited = " ".join(quotes.get(i, "") for i in cited_evidence_ids(line)).lower()
        for words, entity in [*PLANTED, APPARENT]:
            if (words in cited and entity in cited
                    and (words != "pass" or "annual pass" in cited)):
                found.setdefault((words, entity), line)
    return found


def source_texts(root: Path) -> dict[str, str]:
    return {p.name.split("-", 1)[0]: p.read_text(encoding="utf-8")
            for p in (root / "sources").glob("*.md")}


# --- the offline run ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The pack run offline through the CLI: `keepstep run`, `conflicts --json`, `export`."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    root = tmp_path_factory.mktemp("offline") / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    cli = CliRunner()
    try:
        ran = cli.invoke(app, ["run", str(root), "--quiet"])
        listed = cli.invoke(app, ["conflicts", str(root), "--json"])
        exported = cli.invoke(app, ["export", str(root), "--out", str(root / "out")])
    finally:
        mp.undo()
    assert ran.exit_code == 0, ran.output
    assert listed.exit_code == 0 and exported.exit_code == 0, listed.output + exported.output
    return {"root": root, "conflicts": json.loads(listed.output)["conflicts"],
            "memo": (root / "out" / "memo.md").read_text(encoding="utf-8")}


def test_each_real_disagreement_is_listed_with_its_class(offline: dict[str, Any]) -> None:
    """`keepstep conflicts --json` lists each planted disagreement once, with its class; the
    unresolved one has all three shipyard quotes as sides and no value that holds."""
    by_key = {planted_key(c): c for c in offline["conflicts"]}
    assert None not in by_key and len(by_key) == len(offline["conflicts"])
    assert {k: by_key[k]["class"] for k in PLANTED} == PLANTED
    for key, value in HOLDS.items():
        assert by_key[key]["holds"] == value
    hull = by_key[("hull", "brisland")]
    assert sorted(s["source_id"] for s in hull["sides"]) == ["R1", "R2", "R3"]
    assert not hull["holds"] and not hull["holds_ids"]


def test_the_apparent_disagreement_is_closed(offline: dict[str, Any]) -> None:
    """The student price beside the list price is listed as not-a-conflict, with why."""
    [apparent] = [c for c in offline["conflicts"] if planted_key(c) == APPARENT]
    assert apparent["class"] == "not-a-conflict" and apparent["reason"]


def test_the_memos_disagreement_section_names_each_with_the_value_used_and_why(
        offline: dict[str, Any]) -> None:
    """Each real disagreement has its line in the memo's conflicts section: every side's
    value, the class, the value used (none for the unresolved one) and the reason."""
    lines = disagreement_lines(offline["memo"])
    assert set(lines) == {*PLANTED, APPARENT}
    for key, value in HOLDS.items():
        assert f"the documents use {value}" in lines[key]
    assert "**Superseded**" in lines[("passenger", "tarnlake")]
    assert "**Out of date**" in lines[("berth", "kelvmoor")]
    staff = lines[("staff", "tarnlake")]
    assert "**Two definitions, both valid**" in staff and "counting only crew" in staff
    hull = lines[("hull", "brisland")]
    assert "**Unresolved**" in hull and "state neither value as fact" in hull
    assert all(q in hull for q in HULL_QUOTES)
    assert "look alike but do not disagree" in sections(offline["memo"])["conflicts"]
    for key, line in lines.items():  # and why: the classification's reason follows
        record = next(c for c in offline["conflicts"] if planted_key(c) == key)
        assert record["reason"].rstrip(".").lower() in line.lower()


def test_no_finding_is_repeated_across_sections(offline: dict[str, Any]) -> None:
    """No cited finding, ranked option or disagreement shows in two sections; the ranking's
    table shows once, and the section after it points back to it."""
    memo = offline["memo"]
    assert repeated_across_sections(memo) == []
    assert memo.count("| Rank | Option |") == 1
    assert "is shown above" in sections(memo)["options"]


def test_the_ranking_of_options_renders_as_a_table_of_options(offline: dict[str, Any]) -> None:
    """The options the sources recommend are ranked in a table of options with the unit's
    criteria as columns; a criterion the sources disagree on shows every value as such."""
    memo = sections(offline["memo"])["recommendation"]
    header = next(line for line in memo.splitlines() if line.startswith("| Rank"))
    assert header == "| Rank | Option | hull price | delivery | Score | Rationale | Evidence |"
    rows = [line for line in memo.splitlines() if re.match(r"^\| R\d+ \|", line)]
    titles = [row.split("|")[2].strip() for row in rows]
    assert len(rows) == 3 and any("second yard" in t for t in titles)
    assert all("(the sources differ)" in row for row in rows)
    assert "likelihood" not in memo.lower()


def test_every_citation_points_at_a_quote_holding_its_figure(offline: dict[str, Any]) -> None:
    """Each figure a cited line of the memo states is in a quote it cites, and each quote is
    verbatim in its source; the audit's checks passed."""
    memo = offline["memo"]
    assert unsupported_figures(memo, source_texts(offline["root"])) == []
    assert len(evidence_quotes(memo)) == 15


def test_provenance_names_the_offline_heuristic(offline: dict[str, Any]) -> None:
    """The memo opens with the offline notice and names the model that answered."""
    memo = offline["memo"]
    assert memo.startswith("> **Written by keepstep's offline heuristic model")
    assert ("_Models that answered: local/keepstep-offline (the offline heuristic model: "
            "rules, no language model)._") in memo
