"""Disagreements between sources (issue 20, items 1-4), on a small pack of our own.

tests/fixtures/conflicts_pack (fictional) plants one disagreement of each class: a revised
passenger count (superseded), a port fee in an old and a new tariff (outdated), two staff
counts of which one counts only crew (definition), three shipyard quotes nobody reconciles
(unexplained, three sides), and a student price beside the list price (only looks like one).
The offline heuristic must list each real one with the right class and the value that holds,
and close the apparent one; ``keepstep conflicts`` shows them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.core.inputs import SourceEntry
from keepstep.engine.gateway.profile import model_profile
from keepstep.engine.gateway.prompts import input_block, read_input_block
from keepstep.engine.kinds import get_kind
from keepstep.engine.kinds.conflicts import Conflict, load_conflicts, propose
from keepstep.engine.kinds.verify import VerifyAnswer, _verify_rules
from tests.support.fake_context import PackRunner

PACK = Path(__file__).parent / "fixtures" / "conflicts_pack"
# (metric, entity) -> (class, the value that holds)
PLANTED = {
    ("passengers travelled", "Tarnlake"): ("superseded", "398,000"),
    ("full-time staff", "Tarnlake"): ("definition", "450"),
    ("euro annual", "Tarnlake"): ("not-a-conflict", "960"),
    ("euro berth", "Kelvmoor"): ("outdated", "140"),
    ("euro hull", "Brisland"): ("unexplained", None),
    # The three sources on newbuild prices advise different courses for the order (order in
    # 2025 / wait for the 2026 list / a second yard's quote first): a disagreement over
    # advice, its subject named by the words the advice shares.
    ("advice on order, buyers, prices", ""): ("unexplained", None),
}


@pytest.fixture(scope="module")
def runner() -> PackRunner:
    r = PackRunner(PACK)
    r.run_all()
    return r


def _conflicts(runner: PackRunner) -> list[Conflict]:
    return load_conflicts({"U04": json.loads(runner.artifacts["U04"]["verified.json"])})


def test_offline_each_planted_disagreement_has_its_class_and_value(runner: PackRunner) -> None:
    """Every planted disagreement is found once, classified as planted, with the value that
    holds and the evidence giving it; the apparent one is closed; nothing else is listed."""
    found = {(c.metric, c.entity): c for c in _conflicts(runner)}
    assert {k: (c.cls, c.holds) for k, c in found.items()} == PLANTED
    assert [c.metric for c in found.values() if c.open] == ["euro hull",
                                                             "advice on order, buyers, prices"]
    hull = found[("euro hull", "Brisland")]
    assert [(s.source_id, s.value) for s in hull.sides] == [
        ("R1", "18 million"), ("R2", "22 million"), ("R3", "20 million")]
    fee = found[("euro berth", "Kelvmoor")]
    assert fee.holds_ids == ["Q2-e1"] and "2025-02-01" in fee.reason  # sources.toml's date
    assert found[("full-time staff", "Tarnlake")].applies
    outcome = runner.outcomes["U04"]
    assert outcome.passed
    assert outcome.facts["conflicts"] == 5 and outcome.facts["apparent_conflicts"] == 1
    assert outcome.facts["open_conflicts"] == 2
    advice = found[("advice on order, buyers, prices", "")]
    assert advice.about == "advice" and not advice.holds and not advice.holds_ids
    assert [(s.source_id, s.evidence_id) for s in advice.sides] == [
        ("R1", "R1-e2"), ("R2", "R2-e3"), ("R3", "R3-e2")]
    assert all(s.value == s.quote for s in advice.sides)  # each side's advice, as written
    assert "R1: act now; R2: wait; R3: check first" in advice.reason
    assert all(c.about == "figure" for c in found.values() if c is not advice)


def test_every_side_carries_evidence_source_locator_and_quote(runner: PackRunner) -> None:
    """Each side names its evidence id, source id, where in the source, and its quote; the
    stored record keeps the legacy keys older readers use."""
    doc = json.loads(runner.artifacts["U04"]["verified.json"])
    verified = {e["id"]: e for e in doc["evidence"]}
    for record in doc["conflicts"]:
        assert record["ids"] == [s["evidence_id"] for s in record["sides"]]
        assert record["status"] in ("conflict-open", "conflict-resolved", "not-a-conflict")
        for side in record["sides"]:
            item = verified[side["evidence_id"]]
            assert side["source_id"] == item["source_id"] and side["quote"] == item["quote"]
            assert side["locator"] == item["locator"] and side["value"] in side["quote"]


def test_extract_asks_its_question_with_the_sources_metadata(runner: PackRunner) -> None:
    """The extract prompt carries the question (unit title and goal), today (the contract's
    date), the source's title, kind, date and publisher (from its header lines, or
    sources.toml), and the text as a raw block with paragraph ids."""
    p1 = runner.contexts["U01"].calls[0]
    assert p1["payload"]["source"] == {
        "id": "P1", "title": "Tarnlake Ferries annual report 2023", "kind": "annual report",
        "date": "2024-03-15", "publisher": "Tarnlake Ferries"}
    assert p1["payload"]["today"] == "2025-03-01"
    assert p1["payload"]["question"].startswith("Ridership, staff and fares (toward: Decide")
    user = p1["messages"][1]["content"]
    assert "<<<text END_OF_TEXT\n¶1 ---" in user and '"text"' not in user.split("<<<")[0]
    q2 = runner.contexts["U02"].calls[1]["payload"]["source"]
    assert q2["date"] == "2025-02-01" and q2["publisher"] == "Kelvmoor Port Authority"


def test_evidence_items_have_kinds_and_structured_figures(runner: PackRunner) -> None:
    """Each item has a kind and relevance; a figure's quantity names metric, entity and
    period beside the figure as written; a caveat links to what it qualifies."""
    evidence = {e["id"]: e for e in
                json.loads(runner.artifacts["U01"]["evidence.json"])["evidence"]}
    assert {e["kind"] for e in evidence.values()} <= {
        "fact", "figure", "requirement", "obligation", "opinion", "recommendation", "caveat",
        "forecast", "definition"}
    [q] = evidence["P1-e1"]["quantities"]
    assert q == {"figure": "412,000", "value": "412000", "unit": "", "entity": "Tarnlake",
                 "metric": "passengers travelled", "period": "2023"}


def test_a_language_model_gets_topic_names_and_descriptions_not_keywords() -> None:
    """The heuristic's keyword lists go only to the heuristic; a model gets the topics as
    names with descriptions and an enum in the schema."""
    me042 = PackRunner()
    me042.run_all(until="U04")
    for profile, keywords in ((model_profile("openai/gpt-4o-mini"), False), (None, True)):
        ctx = me042.context("U05")
        ctx.profile = profile
        get_kind("extract")[1](ctx)
        payload = ctx.calls[0]["payload"]
        assert all(set(t) == {"name", "description"} for t in payload["topics"])
        assert ("offline_hints" in payload) is keywords
        assert ("keywords" in ctx.calls[0]["messages"][1]["content"]) is keywords


def test_candidates_need_two_sources_and_two_values() -> None:
    """One value written two ways is no candidate; two items of one source are none; more
    than two sides are kept."""
    def item(eid: str, figure: str) -> dict[str, Any]:
        return {"id": eid, "source_id": eid.split("-")[0], "quote": f"x {figure}",
                "quantities": [{"figure": figure, "metric": "Revenue", "entity": "Acme",
                                "period": "2024"}]}

    assert propose([item("A1-e1", "1.2 million"), item("B1-e1", "1,200,000")]) == []
    assert propose([item("A1-e1", "5"), item("A1-e2", "6")]) == []
    [c] = propose([item("A1-e1", "5"), item("B1-e1", "6"), item("C1-e1", "7")])
    assert [s.evidence_id for s in c.sides] == ["A1-e1", "B1-e1", "C1-e1"]


def test_a_quantity_a_model_names_differently_in_each_source_is_still_a_candidate() -> None:
    """A real model names one quantity in its own words per source (seen with a model behind
    the relay: "availability incl. planned maintenance, as measured by the customer" against
    "committed minimum monthly availability"): same entity name, same unit and a shared
    salient metric word make a candidate; another entity, another unit or one value do not."""
    def item(eid: str, figure: str, metric: str, entity: str, unit: str = "%") -> dict[str, Any]:
        return {"id": eid, "source_id": eid.split("-")[0], "quote": f"x {figure}",
                "quantities": [{"figure": figure, "value": figure.rstrip("%"), "unit": unit,
                                "metric": metric, "entity": entity, "period": ""}]}

    vendor = item("V4-e2", "99.95%", "committed minimum monthly availability", "Acme")
    customer = item("R1-e8", "99.5%", "availability incl. planned maintenance, as measured",
                    "Acme at a customer site")
    [c] = propose([vendor, customer])
    assert {s.evidence_id for s in c.sides} == {"V4-e2", "R1-e8"}
    assert propose([vendor, item("R1-e8", "99.5%", "availability", "Other Co")]) == []
    assert propose([vendor, item("R1-e8", "99.5", "availability", "Acme", unit="hours")]) == []
    assert propose([vendor, item("R1-e8", "99.95%", "availability", "Acme")]) == []
    assert propose([vendor, item("R1-e8", "20%", "price rise", "Acme")]) == []


def test_a_real_models_recorded_evidence_yields_both_designed_disagreements() -> None:
    """Replayed from a recorded real-model run of vendor-dd (tests/fixtures/relay_vendor_dd,
    README says how it was made): the Corvane price (V2 186,000 against V5 204,000) and the
    StackWise availability (V4 99.95% against R1 99.5%) are both proposed, within the bound."""
    recorded = json.loads((Path(__file__).parent / "fixtures" / "relay_vendor_dd"
                           / "verified_evidence.json").read_text(encoding="utf-8"))
    c01 = recorded["C01"]
    candidates = propose(c01["evidence"], c01["source_meta"])
    sides = [{(s.source_id, s.value) for s in c.sides} for c in candidates]
    assert {("V2", "186,000"), ("V5", "204,000")} in sides
    assert {("V4", "99.95%"), ("R1", "99.5%")} in sides
    assert 2 <= len(candidates) <= 24
    c02 = recorded["C02"]
    assert len(propose(c02["evidence"], c02["source_meta"])) <= 24


def test_the_classification_is_checked_against_the_candidates() -> None:
    """A held value no side gives, an unknown candidate, a missing class: each named."""
    inputs = {"claims": [{"id": "A1-e1"}], "candidates": [
        {"id": "K1", "sides": [{"evidence_id": "A1-e1", "value": "5"},
                               {"evidence_id": "B1-e1", "value": "6"}]},
        {"id": "K2", "sides": []}]}
    answer = VerifyAnswer.model_validate({
        "results": [{"id": "A1-e1", "supported": True}],
        "conflicts": [{"candidate": "K1", "class": "superseded", "holds": "7", "reason": "r"},
                      {"candidate": "K9", "class": "unexplained", "reason": "r"}]})
    rules = {(p.field, p.rule) for p in _verify_rules(answer, inputs)}
    assert rules == {("conflicts[0].holds", "side_value"), ("conflicts[1].candidate",
                                                              "known_id"),
                     ("conflicts", "complete")}


def test_a_source_text_round_trips_through_its_raw_block() -> None:
    """Text holding the terminator, paragraph-id look-alikes and fences comes back exactly."""
    for text in ["END_OF_TEXT\n\n[P2] a", "```json\n{}\n```\n\n\n\nb", "", "x\n"]:
        inputs = {"task": "extract", "text": text}
        assert read_input_block([{"role": "user", "content": input_block(inputs)}]) == inputs


def test_sources_toml_keeps_date_and_publisher_only_when_given() -> None:
    assert "date" not in SourceEntry(id="A", path="a.md").model_dump()
    assert SourceEntry(id="A", path="a.md", date="2025-01-01").model_dump()["date"] == \
        "2025-01-01"


def test_keepstep_conflicts_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a real offline run, `keepstep conflicts` lists each disagreement with its class,
    sides and the value used; --json gives the typed records."""
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    root = tmp_path / "pack"
    shutil.copytree(PACK, root)
    cli = CliRunner()
    ran = cli.invoke(app, ["run", str(root), "--run", "T1", "--quiet"])
    assert ran.exit_code == 0, ran.output
    text = cli.invoke(app, ["conflicts", str(root)])
    assert text.exit_code == 0, text.output
    assert "5 disagreement(s) between sources, 1 apparent one(s) closed" in text.output
    assert "unexplained: advice on order, buyers, prices — no advice followed (open)" in \
        text.output
    assert "R2-e3 (R2, Interview notes: shipyard sales manager) advises: The yard advises " \
        "buyers to wait for its 2026 price list before ordering." in text.output
    assert "superseded: passengers travelled · Tarnlake · 2023 — uses 398,000" in text.output
    assert "P2-e1 (P2, Review of ferry services) [2024-09-30]" in text.output
    doc = json.loads(cli.invoke(app, ["conflicts", str(root), "--json"]).output)
    assert sorted((c["class"], c["about"]) for c in doc["conflicts"]) == [
        ("definition", "figure"), ("not-a-conflict", "figure"), ("outdated", "figure"),
        ("superseded", "figure"), ("unexplained", "advice"), ("unexplained", "figure")]


def test_claim_checks_are_batched_by_the_answer_they_expect() -> None:
    """With a small output limit the claim check is split so each expected answer fits; the
    candidates go with the first batch only; every claim is judged once and the conflicts
    are the same. Each request names the cited sources' metadata."""
    small = PackRunner(PACK)
    small.run_all(until="U03")
    ctx = small.context("U04")
    ctx.profile = model_profile("local/keepstep-offline", max_tokens=200)
    outcome = get_kind("verify")[1](ctx)
    assert outcome.passed and len(ctx.calls) > 2
    payloads = [c["payload"] for c in ctx.calls]
    # (the last request classifies the disagreements over advice, and judges no claim)
    assert [bool(p["candidates"]) for p in payloads] == [True] + [False] * (len(payloads) - 2) \
        + [True]
    assert payloads[-1]["claims"] == [] and all(
        c["about"] == "advice" for c in payloads[-1]["candidates"])
    assert all(len(p["claims"]) * 40 <= 160 for p in payloads[1:])
    judged = [c["id"] for p in payloads for c in p["claims"]]
    assert len(judged) == len(set(judged)) == outcome.facts["checked"]
    assert payloads[0]["sources"]["Q2"]["date"] == "2025-02-01"
    assert outcome.facts["conflicts"] == 5


def test_vendor_dd_offline_finds_its_newer_price_and_nothing_spurious() -> None:
    """On the second sample pack the heuristic finds the designed price disagreement (V5's
    2025 price list supersedes V2's product sheet: AMC 204,000 holds) and publishes no
    spurious one. (Its availability disagreement is missed offline: R1's sentence names no
    vendor, so no rule can tie it to V4's figure — a language model's quantities can.)"""
    vdd = PackRunner(Path(__file__).parents[1] / "sample_projects" / "vendor-dd")
    vdd.run_all(until="C02")
    found = load_conflicts({u: json.loads(vdd.artifacts[u]["verified.json"])
                            for u in ("C01", "C02")})
    assert [(c.cls, c.holds, c.holds_ids[0][:2], [s.source_id for s in c.sides])
            for c in found] == [("superseded", "204,000", "V5", ["V2", "V5"])]


def _model_like(payload: dict[str, Any]) -> dict[str, Any]:
    """Answers the way a language model reading the pack would (written by hand for this
    test): statements without numbers are evidence too, quantities name the metric as a
    reader would, and the classification cites the sources' wording and dates."""
    from keepstep.engine.gateway.offline_model import respond

    if payload["task"] == "extract" and payload["source_id"] == "P1":
        return {"evidence": [
            {"id": "P1-e1", "source_id": "P1", "kind": "figure", "relevance": "high",
             "quote": "412,000 passengers travelled on Tarnlake Ferries routes in 2023.",
             "figures": ["412,000", "2023"], "topic": None, "qualifies": [],
             "quantities": [{"figure": "412,000", "value": "412000", "unit": "passengers",
                             "metric": "annual passengers", "entity": "Tarnlake Ferries",
                             "period": "2023"}]},
            {"id": "P1-e2", "source_id": "P1", "kind": "recommendation", "relevance": "high",
             "quote": "The board should review the winter timetable before any fare change.",
             "figures": [], "quantities": [], "qualifies": []},
            {"id": "P1-e3", "source_id": "P1", "kind": "fact", "relevance": "medium",
             "quote": "Passengers from the islands rely on the morning crossing to reach work.",
             "figures": [], "quantities": [], "qualifies": []}]}
    if payload["task"] == "extract" and payload["source_id"] == "P2":
        return {"evidence": [
            {"id": "P2-e1", "source_id": "P2", "kind": "figure", "relevance": "high",
             "quote": "398,000 passengers travelled on Tarnlake Ferries routes in 2023, a "
             "revised count that replaces the March figure.", "figures": ["398,000", "2023"],
             "quantities": [{"figure": "398,000", "value": "398000", "unit": "passengers",
                             "metric": "Annual passengers", "entity": "Tarnlake ferries",
                             "period": "2023"}], "qualifies": []},
            {"id": "P2-e2", "source_id": "P2", "kind": "obligation", "relevance": "high",
             "quote": "Operators must publish their fares four weeks before they change.",
             "figures": [], "quantities": [], "qualifies": []}]}
    if payload["task"] == "extract":
        return {"evidence": []}
    if payload["task"] != "verify":  # the pack's documents: the heuristic's own answers
        return respond(payload)
    out = respond({**payload, "candidates": []})
    out["conflicts"] = [{"candidate": c["id"], "class": "superseded", "holds": "398,000",
                         "holds_ids": ["P2-e1"], "reason": "The transport board's September "
                         "2024 review (P2) revises the March count of the annual report (P1)."}
                        for c in payload["candidates"]]
    return out


def test_a_models_answers_carry_statements_without_numbers_and_its_classes() -> None:
    """Statements without a number pass the rules as evidence; the model's quantities (in
    its own words and case) meet across sources; its classification is stored as given."""
    run = PackRunner(PACK, responder=_model_like)
    run.run_all()
    assert all(o.passed for o in run.outcomes.values()), {
        u: o.validators for u, o in run.outcomes.items() if not o.passed}
    verified = json.loads(run.artifacts["U04"]["verified.json"])
    kinds = {e["id"]: e["kind"] for e in verified["evidence"]}
    assert kinds["P1-e2"] == "recommendation" and kinds["P2-e2"] == "obligation"
    [c] = load_conflicts({"U04": verified})
    assert (c.cls, c.holds, c.holds_ids) == ("superseded", "398,000", ["P2-e1"])
    assert "September 2024" in c.reason and c.metric == "annual passengers"


async def test_the_tui_shows_the_disagreements(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`k` on the dashboard opens the disagreements: each with its class and value used."""
    from keepstep.app.tui import make_app
    from keepstep.app.tui.screens.conflicts import ConflictsScreen
    from keepstep.engine import open_project
    from tests.support.tui_support import APP_OPTIONS, screen_text

    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    root = tmp_path / "pack"
    shutil.copytree(PACK, root)
    with open_project(root) as project:
        assert project.start_run("T1").run().decision == "done"
    app = make_app(root, "T1", **APP_OPTIONS)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, ConflictsScreen)
        text = screen_text(app)
        assert "5 disagreement(s) between sources" in text and "outdated" in text


def test_a_verify_unit_over_verify_units_finds_disagreements_across_the_run(
        tmp_path: Path) -> None:
    """P1 and P2 are verified by different units, so neither finds their disagreements; a
    verify unit over both proposes candidates across all their verified evidence and asks
    only for the classes (no claim is judged twice)."""
    import tomllib

    import tomli_w

    root = tmp_path / "pack"
    shutil.copytree(PACK, root)
    sources = tomllib.loads((root / "sources.toml").read_text())
    for s in sources["source"]:
        s["group"] = "S" if s["id"] == "P2" else s["group"]
    (root / "sources.toml").write_text(tomli_w.dumps(sources))

    def unit(uid: str, kind: str, groups: str, deps: list[str]) -> dict[str, Any]:
        out = {"id": uid, "title": f"{kind} {groups}", "phase": kind, "kind": kind,
               "inputs": [f"group:{g}" for g in groups],
               "outputs": ["evidence.json" if kind == "extract" else "verified.json"],
               "validators": ["structure", "citations"] + (
                   ["claim_check"] if kind == "verify" else [])}
        return out | ({"depends_on": deps} if deps else {}) | (
            {"required_final": True} if uid == "V3" else {})

    units = [unit("E1", "extract", "P", []), unit("E2", "extract", "S", []),
             unit("E3", "extract", "Q", []), unit("E4", "extract", "R", []),
             unit("V1", "verify", "PQ", ["E1", "E3"]), unit("V2", "verify", "SR", ["E2", "E4"]),
             unit("V3", "verify", "PQRS", ["V1", "V2"])]
    (root / "plan.toml").write_text(tomli_w.dumps({"plan": {"title": "t", "deliverables": []},
                                                   "unit": units}))
    run = PackRunner(root)
    run.run_all()
    docs = {u: json.loads(run.artifacts[u]["verified.json"]) for u in ("V1", "V2", "V3")}
    assert [c.cls for c in load_conflicts({"V1": docs["V1"]})] == ["outdated"]
    # (V2 holds the R sources: their shipyard quotes, and their advice on the order)
    assert [(c.cls, c.about) for c in load_conflicts({"V2": docs["V2"]})] == [
        ("unexplained", "figure"), ("unexplained", "advice")]
    across = load_conflicts({"V3": docs["V3"]})
    assert {(c.metric, c.entity): (c.cls, c.holds) for c in across} == PLANTED
    call, advice = run.contexts["V3"].calls
    assert call["payload"]["claims"] == [] and len(call["payload"]["candidates"]) == 5
    assert advice["payload"]["claims"] == [] and len(advice["payload"]["candidates"]) == 1
    assert run.outcomes["V3"].passed and len(docs["V3"]["evidence"]) == sum(
        len(docs[u]["evidence"]) for u in ("V1", "V2"))
    whole = load_conflicts(docs)
    assert len(whole) == 6  # the whole run: each disagreement once
    # V1 and V2 each numbered theirs from K1: the run's ids are unique, the later qualified
    ids = [c.id for c in whole]
    assert len(set(ids)) == len(ids) and "K1" in ids and "V2.K1" in ids


def test_a_padded_table_row_quoted_with_single_spaces_is_verbatim(tmp_path: Path) -> None:
    """The quoting rule 'a run of spaces may be written as one space' agrees with the checks:
    a padded row quoted as its cells joined by ' | ' passes the extract rules and the
    citation check, and is located at its row."""
    root = tmp_path / "pack"
    shutil.copytree(PACK, root)
    (root / "sources" / "R1-broker-note.md").write_text(
        "# Broker note\n\n| Yard | Quote |\n|---|---|\n| Brisland Yards   |  18 million  |\n")

    def answer(payload: dict[str, Any]) -> dict[str, Any]:
        from keepstep.engine.gateway.offline_model import respond

        if payload.get("source_id") != "R1":
            return respond(payload)
        return {"evidence": [{"id": "R1-e1", "source_id": "R1", "kind": "figure",
                              "quote": "Brisland Yards | 18 million", "figures": ["18"]}]}

    run = PackRunner(root, responder=answer)
    run.run_all(until="U03")
    assert run.outcomes["U03"].passed, run.outcomes["U03"].validators
    [item] = [e for e in json.loads(run.artifacts["U03"]["evidence.json"])["evidence"]
              if e["source_id"] == "R1"]
    assert item["locator"]


# --- disagreements over advice (the proposal and the offline rules, on their own) ---------
def _advice_item(eid: str, quote: str, kind: str = "recommendation",
                 topic: str = "general") -> dict[str, Any]:
    return {"id": eid, "source_id": eid.split("-e")[0], "kind": kind, "topic": topic,
            "quote": quote}


def test_advice_candidates_join_advice_of_different_sources_on_one_subject() -> None:
    """Advising items (a recommendation, or an opinion worded as advice) of different sources
    whose quotes share content words make one candidate, each side's value its advice as
    written; advice on another subject, a plain opinion and a source's own second advice do
    not; the ids follow the figure candidates'."""
    from keepstep.engine.kinds.conflicts import advises, propose_advice

    evidence = [
        _advice_item("A1-e1", "Councils should tender the metering contract this year."),
        _advice_item("B1-e4", "In our view councils should delay the metering tender until "
                     "the pilot ends.", kind="opinion"),
        _advice_item("C1-e2", "Residents should insulate their lofts before winter."),
        _advice_item("D1-e1", "The metering tender drew eleven bids.", kind="opinion"),
        _advice_item("A1-e2", "Councils should publish the metering tender results."),
    ]
    assert [advises(e) for e in evidence] == [True, True, True, False, True]
    [cand] = propose_advice(evidence, {"B1": {"date": "2025-05-01", "title": "Review"}},
                            first=4)
    assert cand.id == "K4" and cand.about == "advice"
    assert [s.evidence_id for s in cand.sides] == ["A1-e1", "B1-e4", "A1-e2"]
    assert all(s.value == s.quote for s in cand.sides)
    assert cand.sides[1].source_date == "2025-05-01"
    assert cand.metric.startswith("advice on ") and "metering" in cand.metric
    # one source alone is no disagreement
    assert propose_advice([evidence[0], evidence[4]]) == []


def test_offline_rules_classify_advice_by_its_course_and_dates() -> None:
    """The offline rules read each side's course from its wording: different courses with
    nothing to choose between them are unexplained (every side named with its course); the
    same course is no conflict; where the sources' dates differ the newest advice is
    followed; an amending side replaces the others."""
    from keepstep.engine.gateway.offline_rules import classify, course_of

    assert [course_of(q) for q in (
        "Buyers should order the pumps now.", "We advise waiting for the 2026 list.",
        "Get a second quote before signing.", "The council should not renew the lease.",
        "The weather was fine.")] == ["act now", "wait", "check first", "against it", ""]

    def cand(*sides: tuple[str, str, str]) -> dict[str, Any]:
        return {"id": "K9", "about": "advice", "metric": "advice on pumps", "sides": [
            {"evidence_id": eid, "source_id": eid.split("-e")[0], "value": v,
             "source_date": d} for eid, v, d in sides]}

    order = ("A1-e1", "Buyers should order the pumps now.", "")
    wait = ("B1-e1", "Buyers should wait for the 2026 pump prices.", "")
    split = classify(cand(order, wait))
    assert split["class"] == "unexplained" and split["holds"] is None
    assert "A1: act now; B1: wait" in split["reason"]
    same = classify(cand(order, ("B1-e1", "Order the pumps immediately.", "")))
    assert same["class"] == "not-a-conflict"
    dated = classify(cand((*order[:2], "2024-01-01"), (*wait[:2], "2025-03-01")))
    assert dated["class"] == "outdated" and dated["holds_ids"] == ["B1-e1"]
    revised = classify(cand(order, ("B1-e1", "Our revised advice: wait for the 2026 "
                                    "prices.", "")))
    assert revised["class"] == "superseded" and revised["holds_ids"] == ["B1-e1"]


def test_an_advice_classification_may_name_the_advice_followed_by_its_id() -> None:
    """A model classifying advice may name the side followed by its evidence id alone (no
    need to copy a whole sentence into holds); a value that is no side's is still refused."""
    inputs = {"claims": [], "candidates": [{"id": "K1", "about": "advice", "sides": [
        {"evidence_id": "A1-e1", "source_id": "A1", "value": "Order now."},
        {"evidence_id": "B1-e1", "source_id": "B1", "value": "Wait a year."}]}]}
    ok = VerifyAnswer.model_validate({"results": [], "conflicts": [{
        "candidate": "K1", "class": "outdated", "holds": None, "holds_ids": ["B1-e1"],
        "reason": "B1 is newer", "subject": "when to order"}]})
    assert _verify_rules(ok, inputs) == []
    bad = VerifyAnswer.model_validate({"results": [], "conflicts": [{
        "candidate": "K1", "class": "outdated", "holds": "Wait two years.",
        "holds_ids": ["B1-e1"], "reason": "B1 is newer"}]})
    assert [p.rule for p in _verify_rules(bad, inputs)] == ["side_value"]


def test_a_models_advice_followed_reaches_the_record_and_the_memo() -> None:
    """When the model follows one side's advice (here: the consultant's second quote, named
    by its evidence id, with the subject in its words), the record holds that advice and its
    id, its metric names the model's subject, and the memo's disagreement section says whose
    advice is followed and why."""
    from keepstep.engine.gateway.offline_model import respond
    from tests.support.memo_checks import disagreement_lines

    def answer(payload: dict[str, Any]) -> dict[str, Any]:
        out = respond(payload)
        if payload.get("task") == "verify" and any(
                c.get("about") == "advice" for c in payload.get("candidates", [])):
            [cand] = payload["candidates"]
            out["conflicts"] = [{
                "candidate": cand["id"], "class": "definition", "holds": None,
                "holds_ids": ["R3-e2"], "subject": "when and from whom to order the hull",
                "applies": "R1 and R2 speak for buyers in general; R3 advises this board",
                "reason": "R3 is the only advice addressed to the board itself"}]
        return out

    run = PackRunner(PACK, responder=answer)
    run.run_all()
    [advice] = [c for c in _conflicts(run) if c.about == "advice"]
    assert advice.metric == "advice on when and from whom to order the hull"
    assert advice.holds_ids == ["R3-e2"] and advice.holds and advice.holds.startswith(
        "We recommend that the board seeks a second yard's quote")
    memo = run.artifacts["D01"]["memo.md"].decode()
    line = next(v for k, v in disagreement_lines(memo).items() if k[0] == "advice")
    assert "**Advice for different cases**: we follow Consultant memo on fleet renewal's " \
        "advice." in line
    assert "R3 advises this board" in line and "addressed to the board itself" in line
    assert run.outcomes["A01"].passed


def test_disagreement_ids_are_unique_across_verify_units() -> None:
    """Two verify units each number their disagreements K1, K2 ...: a document's records, and
    a synthesis's copies, keep the first K1 and qualify the other by its unit (V2.K1), so a
    citable record id names one disagreement (before, the second K1 was dropped from the
    citable records); the same disagreement met twice stays one record."""
    from keepstep.engine.kinds.citable import citable_conflicts, conflict_evidence
    from keepstep.engine.kinds.parts import conflict_records

    def record(unit: str, a: str, b: str) -> dict[str, Any]:
        return {"id": "K1", "metric": "price", "class": "unexplained", "verify_unit": unit,
                "sides": [{"evidence_id": a, "source_id": a[:2], "value": "1"},
                          {"evidence_id": b, "source_id": b[:2], "value": "2"}]}

    docs = [{"conflicts": [record("V1", "A1-e1", "B1-e1")]},
            {"conflicts": [record("V2", "C1-e1", "D1-e1"), record("V2", "A1-e1", "B1-e1")]}]
    found = conflict_records(docs)
    assert sorted(c["id"] for c in found) == ["K1", "V2.K1"]
    cited = citable_conflicts(found)
    assert set(cited) == {"K1", "V2.K1"} and "C1-e1" in cited["V2.K1"]
    assert conflict_evidence(found)["V2.K1"] == ["C1-e1", "D1-e1"]
