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
from keepstep.engine.gateway.answers import check_answer, strict_schema
from keepstep.engine.kinds.synthesize import OptionsAnswer, RankAnswer, _rank_schema
from tests.support.fake_context import PackRunner
from tests.support.memo_checks import (
    ADVICE,
    ADVICE_QUOTES,
    APPARENT,
    HOLDS,
    HULL_QUOTES,
    PACK,
    PLANTED,
    disagreement_lines,
    evidence_quotes,
    gaps_repeated,
    planted_key,
    production_artefacts,
    repeated_across_sections,
    sections,
    source_rows,
    source_texts,
    unsupported_figures,
)


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
    assert set(lines) == {*PLANTED, APPARENT, ADVICE}
    for key, value in HOLDS.items():
        assert f"we use {value}" in lines[key]
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
        # (a date the reason takes from the source register is said to be so)
        assert record["reason"].rstrip(".").lower() in \
            line.lower().replace(" in the source register", "")
    assert "(Q2, 2025-02-01 in the source register)" in lines[("berth", "kelvmoor")]


def test_the_disagreement_over_advice_is_listed_and_named_in_the_memo(
        offline: dict[str, Any]) -> None:
    """The three sources on newbuild prices advise different courses (order in 2025, wait for
    the yard's 2026 list, a second yard's quote first): `keepstep conflicts --json` lists one
    disagreement over advice with each side's advice, source and evidence, unresolved (the
    offline rules read three different courses and no date or amending word); the memo's
    disagreement section sets out every side's advice with its citation and date (or that it
    has none) and says that the sources do not settle it and that the memo's recommendation
    weighs the courses in its ranking of the options (issue 20: it said "we follow none as
    settled" beside a recommendation following one), and why."""
    [advice] = [c for c in offline["conflicts"] if c["about"] == "advice"]
    assert advice["class"] == "unexplained" and not advice["holds"] and not advice["holds_ids"]
    assert [(s["source_id"], s["value"][:30]) for s in advice["sides"]] == [
        (q[0], q[1][:30]) for q in zip(("R1", "R2", "R3"), ADVICE_QUOTES, strict=True)]
    assert "act now" in advice["reason"] and "wait" in advice["reason"]
    line = disagreement_lines(offline["memo"])[ADVICE]
    assert all(f"“{q}" in line for q in ADVICE_QUOTES)
    assert line.count("undated") == 3  # the R sources carry no date
    assert "**Unresolved**: the sources do not settle which course to follow, so every side " \
        "is set out here; the recommendation weighs the courses in the ranking of the " \
        "options." in line
    assert "follow none" not in line
    assert advice["reason"].rstrip(".").lower() in line.lower()
    # cited by footnotes a reader can follow: one per side
    assert len(re.findall(r"\[R\d-e\d\]", line)) == 3


def test_the_memo_carries_no_production_artefact_and_lists_its_sources(
        offline: dict[str, Any]) -> None:
    """No section marker (the template keeps them; the audit found the sections by the
    template's headings and passed), no question line, note stub, bare confidence tag or
    '.;' join; the gaps are said once (the gaps section), not again in the findings; the
    sources section gives each source's metadata and where it came from; the models that
    answered are named in a closing line a client can read."""
    memo = offline["memo"]
    assert production_artefacts(memo) == []
    assert set(sections(memo)) == {"recommendation", "options", "findings", "gaps",
                                   "conflicts", "sources", "evidence"}
    assert gaps_repeated(memo) == []
    assert "Not answered by the sources" not in sections(memo)["findings"]
    rows = source_rows(memo)
    assert set(rows) == {"P1", "P2", "Q1", "Q2", "R1", "R2", "R3"}
    # Q2's date and publisher are the source register's (its text has neither); P1's date
    # is its own header's.
    assert rows["Q2"][2:] == ["2025-02-01", "Kelvmoor Port Authority",
                              "title, kind, date, publisher: the source register"]
    assert rows["P1"][2] == "2024-03-15" and "date, publisher: the document itself" in \
        rows["P1"][4]
    assert rows["R1"][2] == "not given"
    assert memo.rstrip().splitlines()[-1].startswith("[^") and "_Prepared with " in \
        memo[memo.index("## Appendix: the evidence"):]


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
    # Since issue 20's rebuildable scores, each criterion's points stand beside its value,
    # the score is their sum, and the row's checked calculation has its column (this pinned
    # "| Rank | Option | hull price | delivery | Score | Rationale | Evidence |" before).
    assert header == ("| Rank | Option | hull price | hull price: points | delivery | "
                      "delivery: points | Score (sum of points) | Rationale | Calculation | "
                      "Evidence |")
    rows = [line for line in memo.splitlines() if re.match(r"^\| \d+ \|", line)]
    titles = [row.split("|")[2].strip() for row in rows]
    assert len(rows) == 3 and any("second yard" in t for t in titles)
    assert all("(the sources differ" in row for row in rows)
    assert "likelihood" not in memo.lower()
    # The score is rebuilt from the table: the sum of the row's points, highest first; the
    # line under the table says how.
    scores = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        points = [int(cells[3].split("/")[0]), int(cells[5].split("/")[0])]
        assert all(1 <= p <= 5 for p in points) and int(cells[6]) == sum(points)
        scores.append(int(cells[6]))
    assert scores == sorted(scores, reverse=True)
    assert ("Score = hull price points + delivery points, so 2-10, higher is better: each "
            "option gets 1-5 points per criterion (5 meets it best) on the value shown, and "
            "the score is the sum of the points.") in memo


def test_the_offline_ranking_states_one_checked_derived_figure(offline: dict[str, Any]) -> None:
    """The offline heuristic, answering the options prompt, states the spread of the three
    shipyard quotes (a derived figure) with its calculation, which the rank rules recomputed
    from the cited quotes; the memo shows it, and the memo's figure check holds it."""
    ranking = json.loads(next((offline["root"] / ".keepstep" / "artifacts").glob(
        "T1/K01/*/ranking.json")).read_text(encoding="utf-8"))
    assert ranking["rounds"][-1]["problems"] == [] and ranking["stop"] == "checks passed"
    top = ranking["risks"][0]
    assert top["calculation"] == "22 - 18 = 4"
    assert "by 4 million from the lowest to the highest" in top["criteria"]["hull price"]
    assert top["score_from"] == "points" and top["score"] == sum(top["points"].values())
    memo = sections(offline["memo"])["recommendation"]
    assert "(calculated: 22 − 18 = 4)" in memo  # readable arithmetic, not inline code
    assert unsupported_figures(offline["memo"], source_texts(offline["root"])) == []


def test_every_citation_points_at_a_quote_holding_its_figure(offline: dict[str, Any]) -> None:
    """Each figure a cited line of the memo states is in a quote it cites, and each quote is
    verbatim in its source; the audit's checks passed."""
    memo = offline["memo"]
    assert unsupported_figures(memo, source_texts(offline["root"])) == []
    assert len(evidence_quotes(memo)) == 16


def test_provenance_names_the_offline_heuristic(offline: dict[str, Any]) -> None:
    """The memo opens with the offline notice and names the model that answered."""
    memo = offline["memo"]
    assert memo.startswith("> **Written by keepstep's offline heuristic model")
    assert ("_Prepared with keepstep's offline heuristic model (local/keepstep-offline: "
            "rules, no language model); every figure is checked against the quoted "
            "sources._") in memo


def test_a_strict_rank_schema_names_each_criterion() -> None:
    """Under strict structured output every object is closed: the ranking's criteria reach a
    model as named, required properties (a free-form map would allow none), and an answer
    giving them validates."""
    sent = strict_schema(_rank_schema({"ranks": "options", "criteria": ["hull price",
                                                                        "delivery"]}) or {})
    item = sent["$defs"]["RankedOption"]
    criteria = item["properties"]["criteria"]
    assert criteria["properties"] == {"hull price": {"type": "string"},
                                      "delivery": {"type": "string"}}
    assert criteria["required"] == ["hull price", "delivery"]
    assert criteria["additionalProperties"] is False
    assert "criteria" in item["required"] and "points" in item["required"]
    # Options are asked as "items" with points per criterion: no score (code adds the
    # points), no likelihood, impact, owner or mitigation (issue 20; this read "Risk" before).
    assert set(item["properties"]["points"]["required"]) == {"hull price", "delivery"}
    assert not {"score", "likelihood", "impact", "owner", "mitigation"} & set(item["properties"])
    assert "items" in sent["required"] and "risks" not in sent["properties"]
    assert _rank_schema({}) is None  # a plain risk ranking's requests stay as they were
    risk = strict_schema(_rank_schema({"criteria": ["hull price"]}) or {})
    assert "likelihood" in risk["$defs"]["Risk"]["properties"]  # risks keep their shape
    answer = json.dumps({"risks": [{"id": "R1", "title": "Seek a second quote", "score": 20,
                                    "evidence_ids": ["R3-e2"], "criteria": {
                                        "hull price": "not stated", "delivery": "30 months"}}]})
    parsed, _, problems = check_answer(answer, RankAnswer)
    assert problems == [] and parsed is not None
    # An answer of the earlier shape (its options under "risks", a stated score, no points)
    # still parses as options, marked legacy: recorded runs replay.
    legacy, _, problems = check_answer(answer, OptionsAnswer)
    assert problems == [] and legacy is not None
    assert legacy.items[0].score == 20 and legacy.model_extra["legacy"] is True


def test_the_audit_holds_the_memo_to_the_unresolved_disagreement() -> None:
    """The audit fails a memo line that states one shipyard quote as fact, and passes one
    that sets out every side's value (a real model's memo wrote "18, 20 or 22 million euro")
    or says that nothing says which holds."""
    runner = PackRunner(PACK)
    runner.run_all()
    assert runner.outcomes["A01"].passed
    memo = runner.artifacts["D01"]["memo.md"]
    cite = b" [R1-e1, R2-e1, R3-e1] (R1, Broker note; R2, Interview; R3, Memo)\n"
    lines = [b"- The hull costs 18 million euro.",
             b"- The hull price is 18, 20 or 22 million euro.",
             b"- The hull price is 18 million euro; nothing says which figure holds."]
    verdicts = []
    for line in lines:
        runner.artifacts["D01"]["memo.md"] = memo + b"\n" + line + cite
        verdicts.append(runner.run("A01")[1].passed)
    assert verdicts == [False, True, True]


def test_validate_names_an_offline_options_ranking_with_nothing_to_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, a ranking of options ranks the courses of action the sources recommend: with
    none in the approved sources, `keepstep validate` names the unit and what to do."""
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    cli = CliRunner()
    assert cli.invoke(app, ["validate", str(root)]).exit_code == 0
    for source in (root / "sources").glob("R*.md"):
        text = source.read_text(encoding="utf-8")
        source.write_text("\n".join(line for line in text.splitlines() if not any(
            w in line for w in ("should", "recommend", "advises"))) + "\n", encoding="utf-8")
    checked = cli.invoke(app, ["validate", str(root)])
    assert checked.exit_code != 0
    assert "K01" in checked.output and "courses of action the sources recommend" in \
        checked.output and "set a real model" in checked.output


def test_offline_figures_stated_before_their_period_ended_are_marked(
        offline: dict[str, Any]) -> None:
    """Offline the same marks as with the real model (kinds.stale): the annual report dated
    15 March 2024 gives 2024 staff and 2025 passes, the 2023 tariff notice a 2025 fee; the
    evidence table marks them and a finding stating one as an outcome is labelled."""
    memo = offline["memo"]
    rows = {line.split("|")[1].strip(): line for line in sections(memo)["evidence"].splitlines()
            if line.startswith("| ") and "-e" in line.split("|")[1]}
    assert "_(stated 15 March 2024, before its period ended)_" in rows["P1-e2"]
    assert "_(stated 10 January 2023, before its period ended)_" in rows["Q1-e1"]
    # 2023 passengers in a 2024 report: an outcome
    assert "before its period ended" not in rows["P1-e1"]
    assert re.search(r"960 euro annual passes for 2025\. \(stated 15 March 2024, "
                     r"before the period it covers had ended: not a final figure\)", memo)
