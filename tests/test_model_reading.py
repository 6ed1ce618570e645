"""Prompts a real model reads right (issue 20, the recorded real model's remarks).

What the model answering tests/fixtures/relay_conflicts_pack found hard to read, each fixed
where code and prompt meet: paragraph markers that looked like source ids, a figure's scale
split two ways, numbers written in words, calculation rules the prompt did not state, and
citable records the schema did not name.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.gateway.prompts import (
    PARAGRAPH_MARK,
    input_block,
    load_prompt,
    read_input_block,
)
from keepstep.engine.kinds.claims import (
    calculation_problems,
    figure_holders,
    figure_problems,
    quote_values,
    word_numbers,
)
from keepstep.engine.kinds.conflicts import Quantity as Q
from keepstep.engine.kinds.conflicts import amount, propose, same_amount
from keepstep.engine.kinds.extract import ExtractAnswer, _rules
from keepstep.engine.kinds.render import RenderAnswer
from keepstep.engine.kinds.synthesize import SynthesisAnswer

TEXT = ("# Notes P1\n\nThe yard quoted 18 million euro for a hull in 2024.\n\n"
        "Delivery takes four weeks after P2 sign-off.")


def _item(quote: str, n: int = 1, **extra: Any) -> dict[str, Any]:
    return {"id": f"P1-e{n}", "source_id": "P1", "quote": quote, "kind": "fact",
            "relevance": "high", "figures": [], "quantities": [], "qualifies": [],
            "topic": "general", **extra}


def _extract_problems(*items: dict[str, Any]) -> list[Any]:
    rules = _rules(TEXT, "P1", [], [])
    return rules(ExtractAnswer.model_validate({"evidence": list(items)}), {"first_id": 1})


# --- 1. paragraph markers ----------------------------------------------------------------------
def test_paragraph_markers_cannot_be_read_as_source_or_passage_ids() -> None:
    """The raw source block opens each paragraph with ¶n, not [Pn] (which a model read as
    source P1 and a check's passage P1); the text comes back exactly, ids in it untouched."""
    block = input_block({"task": "extract", "source_id": "P1", "text": TEXT})
    raw = block.split("<<<text END_OF_TEXT\n", 1)[1]
    assert raw.startswith(f"{PARAGRAPH_MARK}1 # Notes P1\n\n{PARAGRAPH_MARK}2 The yard")
    assert f"{PARAGRAPH_MARK}3 Delivery" in raw
    assert "[P1]" not in block and "[P2]" not in block and "[P" not in block
    assert f"{PARAGRAPH_MARK}1, {PARAGRAPH_MARK}2" in block  # the heading names the markers
    back = read_input_block([{"role": "user", "content": block}])
    assert back is not None and back["text"] == TEXT
    prompt = load_prompt("extract")
    assert "¶1, ¶2" in prompt.system and "[P1]" not in prompt.system + prompt.user


def test_a_quote_that_copies_a_marker_is_refused_as_before_and_told_why() -> None:
    """A quote with a paragraph marker is not verbatim (revised, as a [P2] quote was); the
    feedback names the marker. The same quote without it passes."""
    quote = "The yard quoted 18 million euro for a hull in 2024."
    [bad] = _extract_problems(_item(f"{PARAGRAPH_MARK}2 {quote}"))
    assert bad.rule == "verbatim" and bad.field == "evidence[0].quote"
    assert f"paragraph marker {PARAGRAPH_MARK}2" in bad.message
    assert _extract_problems(_item(quote)) == []
    [other] = _extract_problems(_item("The yard quoted 19 million euro."))
    assert other.rule == "verbatim" and "marker" not in other.message


# --- 2. figures: one rule for scale, numbers in words -----------------------------------------
def test_the_extract_prompt_states_one_rule_for_a_figures_value() -> None:
    prompt = load_prompt("extract")
    user = " ".join(prompt.user.split())
    assert ('So "18 million euro" is figure "18 million", value 18000000, unit "euro"; "four '
            'weeks" is figure "four", value 4, unit "weeks".') in user
    assert '"value": the whole number, scale word applied' in user
    assert "never a scale word" in user
    assert 'in digits (years and dates included) or words ("four")' in prompt.system


def test_a_scale_split_either_way_is_one_quantity() -> None:
    as_euro = Q(figure="18", value="18000000", unit="euro")
    as_million = Q(figure="18 million", value="18", unit="million euro")
    scaled_twice = Q(figure="18 million", value="18000000", unit="million euro")
    value_without_scale = Q(figure="18 million", value="18", unit="euro")
    assert {amount(q) for q in (as_euro, as_million, scaled_twice, value_without_scale)} == {
        18_000_000.0}
    assert same_amount(as_euro, as_million)
    assert not same_amount(as_euro, Q(figure="22 million", value="22", unit="million euro"))
    assert not same_amount(as_euro, Q(figure="18", value="18000000", unit="dollars"))


def _hull(eid: str, q: dict[str, str]) -> dict[str, Any]:
    return {"id": eid, "source_id": eid.split("-")[0], "quote": f"quote of {eid}",
            "quantities": [{"metric": "hull price", "entity": "Brisland Yards",
                            "period": "2024", **q}]}


def test_candidate_disagreements_compare_amounts_not_how_the_scale_was_split() -> None:
    """18 (million euro) against 22000000 (euro) is a candidate (before, the units differed
    and no candidate was proposed); 18 (million euro) against 18000000 (euro) is none."""
    [k] = propose([_hull("R1-e1", {"figure": "18 million", "value": "18",
                                   "unit": "million euro"}),
                   _hull("R2-e1", {"figure": "22000000", "value": "22000000", "unit": "euro"})])
    assert [s.evidence_id for s in k.sides] == ["R1-e1", "R2-e1"]
    assert [s.value for s in k.sides] == ["18 million", "22000000"]  # as written
    assert propose([_hull("R1-e1", {"figure": "18 million", "value": "18",
                                    "unit": "million euro"}),
                    _hull("R2-e1", {"figure": "18", "value": "18000000", "unit": "euro"})]) == []


def test_claims_and_calculations_read_a_figure_at_either_scale() -> None:
    quotes = {"R1-e1": "The yard quoted 18 million euro for a hull in 2024.",
              "R2-e1": "The hull price for 2024 is 22000000 euro."}
    assert {18.0, 18_000_000.0, 22_000_000.0} <= quote_values(
        quotes["R1-e1"]) | quote_values(quotes["R2-e1"])
    ids = ["R1-e1", "R2-e1"]
    assert figure_problems("c", "One hull costs 18,000,000 euro.", ["R1-e1"], quotes) == []
    assert figure_problems("c", "One hull costs 22 million euro.", ["R2-e1"], quotes) == []
    for calc in ("22000000 - 18000000 = 4000000", "22 - 18 = 4"):
        assert figure_problems("c", "The quotes differ by 4 million euro.", ids, quotes,
                               calc) == [], calc
    wrong = figure_problems("c", "The quotes differ by 5 million euro.", ids, quotes,
                            "22000000 - 18000000 = 4000000")
    assert {p.rule for p in wrong} == {"calculation_result", "cited_figure"}
    # The citation points at the quote holding the figure, at either scale.
    assert figure_holders("One hull costs 18,000,000 euro.", ids, quotes) == ["R1-e1"]


def test_numbers_in_words_are_figures_the_grounding_checks_accept() -> None:
    assert word_numbers("Delivery takes four weeks, twenty-four months or a dozen days.") == {
        4.0, 24.0, 12.0}
    quotes = {"P1-e2": "Delivery takes four weeks after P2 sign-off."}
    assert figure_problems("c", "Delivery takes 4 weeks.", ["P1-e2"], quotes) == []
    [p] = figure_problems("c", "Delivery takes 5 weeks.", ["P1-e2"], quotes)
    assert p.rule == "cited_figure" and p.value == "5"
    # extract: the figure as written ("four") or in digits (4) is a figure of the quote.
    quote = "Delivery takes four weeks after P2 sign-off."
    for figure in ("four", "4"):
        assert _extract_problems(_item(quote, figures=[figure], quantities=[
            {"figure": figure, "value": "4", "unit": "weeks", "metric": "delivery time"}])
        ) == [], figure
    bad = _extract_problems(_item(quote, figures=["5"], quantities=[
        {"figure": "5", "value": "5", "unit": "weeks", "metric": "delivery time"}]))
    assert {p.rule for p in bad} == {"invented_figure"} and len(bad) == 2


# --- 3. calculation operand rules ---------------------------------------------------------------
def test_the_writing_prompts_state_the_calculation_rules_code_enforces() -> None:
    """synthesize and render (and the Claim schema they share) say what an operand may be,
    that every intermediate result is stated, and what code recomputes — the rules the
    recorded model only learnt from a rejection (model remarks 0011)."""
    for name in ("synthesize", "render"):
        system = " ".join(load_prompt(name).system.split())
        assert "An intermediate result is never an operand" in system, name
        assert '"2600 * 140 = 364000; 2600 * (140 - 120) = 52000"' in system, name
        assert "with their scale (\"18 million euro\" is 18 or 18000000" in system, name
        assert "1, 100, 1000, 7, 12, 24, 52, 60, 365" in system, name
        assert "Code recomputes every step" in system, name
    for schema in (SynthesisAnswer.model_json_schema(), RenderAnswer.model_json_schema()):
        [claim] = schema["$defs"].values()
        assert "an intermediate result is never an operand" in claim["properties"][
            "calculation"]["description"]
    # What the prompt says is what the check does.
    quotes = {"Q1-e1": "Kelvmoor recorded 2,600 port calls in 2024.",
              "Q2-e1": "The berth fee is 140 euro per call.",
              "Q3-e1": "The berth fee was 120 euro per call."}
    ids = list(quotes)
    text = "At 2,600 calls the fee costs 364,000 euro, 52,000 euro more than at 120 euro."
    chained, _ = calculation_problems("c", text, "2600 * 140 = 364000; 2600 * 120 = 312000; "
                                      "364000 - 312000 = 52000", ids, quotes)
    assert {p.rule for p in chained} >= {"calculation_operand", "calculation_result"}
    quoted, accounted = calculation_problems(
        "c", text, "2600 * 140 = 364000; 2600 * (140 - 120) = 52000", ids, quotes)
    assert quoted == [] and accounted == {"364,000", "52,000"}


# --- 4. citable records in the schema -----------------------------------------------------------
def test_the_schemas_say_which_records_a_claim_may_cite() -> None:
    synth = SynthesisAnswer.model_json_schema()["$defs"]["Claim"]["properties"]
    assert "(K1, ...)" in synth["evidence_ids"]["description"]
    assert '"conflicts"' in synth["evidence_ids"]["description"]
    render = RenderAnswer.model_json_schema()["$defs"]["Sentence"]["properties"]
    described = render["evidence_ids"]["description"]
    assert "citable_records" in described and "(K1, ...)" in described
    assert "ranked item (its record_id)" in described
    assert "in evidence_ids" in load_prompt("render").system
    assert "in evidence_ids beside the evidence ids" in load_prompt("synthesize").system


# --- 5. figures stated before their period ended -------------------------------------------------
def test_a_periods_end_and_a_sources_date_are_read_at_their_last_day() -> None:
    from datetime import date

    from keepstep.engine.kinds.stale import period_end, source_date

    assert period_end("2024") == date(2024, 12, 31)
    assert period_end("Q1 2024") == period_end("2024-03") == period_end("March 2024") == \
        date(2024, 3, 31)
    assert period_end("H1 2025") == date(2025, 6, 30)
    assert period_end("2023-2025") == date(2025, 12, 31)
    assert period_end("2024-03-15") == date(2024, 3, 15)
    assert period_end("") is None and period_end("this year") is None
    assert source_date("2024-03-15") == source_date("15 March 2024") == date(2024, 3, 15)
    assert source_date("2024") == date(2024, 12, 31)  # only a period that surely ended later
    assert source_date("undated") is None


STALE_EVIDENCE = [
    {"id": "A1-e1", "source_id": "A1", "group": "A", "topic": "t", "locator": "p. 1",
     "quote": "Readings arrived on time for 97% of meters in 2023.", "figures": ["97%", "2023"],
     "quantities": [{"figure": "97%", "value": "97", "unit": "%", "metric": "on-time readings",
                     "period": "2023"}]},
    {"id": "A1-e2", "source_id": "A1", "group": "A", "topic": "t", "locator": "p. 2",
     "quote": "The pilot covers 1,200 meters in 2024.", "figures": ["1,200", "2024"],
     "quantities": [{"figure": "1,200", "value": "1200", "unit": "meters",
                     "metric": "meters covered", "period": "2024"}]},
    {"id": "B1-e1", "source_id": "B1", "group": "B", "topic": "t", "locator": "Prices",
     "quote": "The list price is NVK 40 per meter in 2025.", "figures": ["40", "2025"],
     "quantities": [{"figure": "40", "value": "40", "unit": "NVK", "metric": "list price",
                     "period": "2025"}]},
]
STALE_META = {"A1": {"title": "Pilot report", "date": "2024-03-15"},
              "B1": {"title": "Price list"}}  # undated: nothing of B1 can be marked


def test_code_marks_a_figure_stated_before_its_period_ended() -> None:
    from keepstep.engine.kinds.stale import label_for, stale_labels, stated_before

    labels = stale_labels(STALE_EVIDENCE, STALE_META)
    assert labels == {"A1-e2": ("stated 15 March 2024", ["1,200"])}
    assert stated_before(stale_labels(STALE_EVIDENCE, STALE_META)) == {
        "A1-e2": "stated 15 March 2024"}
    label = label_for("The pilot covered 1,200 meters.", ["A1-e2"], labels)
    assert label == (" (stated 15 March 2024, before the period it covers had "
                     "ended: not a final figure)")
    # A sentence that says what the figure is, or states none of the marked figures: no label.
    assert label_for("The pilot was expected to cover 1,200 meters.", ["A1-e2"], labels) == ""
    assert label_for("As of March 2024 the pilot covers 1,200 meters.", ["A1-e2"], labels) == ""
    assert label_for("The pilot covers two towns.", ["A1-e2"], labels) == ""
    assert label_for("Readings arrived on time for 97% of meters.", ["A1-e1"], labels) == ""
    # A date only the source register gives is labelled so (relay run 4's review: the
    # document does not carry it); a date the document's header gave is not.
    from keepstep.engine.kinds.extract import DOCUMENT, REGISTER

    registered = stale_labels(STALE_EVIDENCE, STALE_META, {"A1": {"date": REGISTER}})
    assert registered == {"A1-e2": ("stated 15 March 2024 per the source register",
                                    ["1,200"])}
    assert label_for("The pilot covered 1,200 meters.", ["A1-e2"], registered) == (
        " (stated 15 March 2024 per the source register, before the period it covers had "
        "ended: not a final figure)")
    assert stale_labels(STALE_EVIDENCE, STALE_META, {"A1": {"date": DOCUMENT}}) == labels
    # Two marked sources: one label naming both dates.
    both = {**labels, "C1-e1": ("stated 1 May 2024", ["1,200"])}
    assert label_for("The pilot covered 1,200 meters.", ["A1-e2", "C1-e1"], both) == (
        " (stated 15 March 2024 and 1 May 2024, before the period it covers "
        "had ended: not a final figure)")


def test_the_mark_reaches_the_requests_and_the_documents_label_it() -> None:
    """synthesize and render requests carry the marked ids with their label; a finding (and
    a written sentence) stating the figure as an outcome is labelled in the synthesis and the
    document; the evidence table marks the row (CSV column and Markdown table)."""
    import csv
    import io
    import json

    from tests.test_documents import Script, _all_supported, _ctx, _run

    doc = {"evidence": STALE_EVIDENCE, "conflicts": [], "models": ["openai/test-model"],
           "source_meta": STALE_META}
    artifacts = {"V1": {"verified.json": json.dumps(doc).encode()}}
    synth = Script(synthesize=[{"claims": [
        {"text": "The pilot covered 1,200 meters.", "evidence_ids": ["A1-e2"]},
        {"text": "Readings arrived on time for 97% of meters.", "evidence_ids": ["A1-e1"]},
        {"text": "The pilot was expected to cover 1,200 meters.", "evidence_ids": ["A1-e2"]}]}])
    s1 = _ctx("S1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
              else synth(p))
    assert _run(s1).passed
    [asked] = [c["payload"] for c in s1.calls if c["task"] == "synthesize"]
    assert asked["stated_before_period_end"] == {"A1-e2": "stated 15 March 2024"}
    synthesis = json.loads(s1.outputs["synthesis.json"])
    assert [c.get("stated_before") for c in synthesis["claims"]] == [
        "stated 15 March 2024, before the period it covers had ended: not a final "
        "figure", None, None]
    assert "1,200 meters. (stated 15 March 2024, before" in \
        s1.outputs["synthesis.md"].decode()
    rank = Script(rank=[{"risks": [
        {"id": "R1", "title": "Annual subscription", "score": 20, "evidence_ids": ["B1-e1"],
         "criteria": {"price per meter": "NVK 40", "fit": "good"}}]}], check=[{"problems": []}])
    _run(_ctx("R1", artifacts, rank))

    # A written section: the request names the marked id; an outcome-worded sentence is labelled.
    good = {"sentences": [{"text": "By the report, 1,200 meters are covered.",
                           "evidence_ids": ["A1-e2"]}]}
    d2 = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support" else good)
    assert _run(d2).passed
    [asked] = [c["payload"] for c in d2.calls if c["task"] == "render"]
    assert asked["stated_before_period_end"] == {"A1-e2": "stated 15 March 2024"}
    brief = d2.outputs["brief.md"].decode()
    assert "- By the report, 1,200 meters are covered. (stated 15 March 2024, " \
        "before the period it covers had ended: not a final figure)" in brief

    # Offline, the findings a document shows carry the synthesis's label.
    d1 = _ctx("D1", artifacts, lambda p: {}, profile=None)
    _run(d1)
    memo = d1.outputs["memo.md"].decode()
    assert "The pilot covered 1,200 meters. (stated 15 March 2024, before" in memo

    # The evidence table: a stated_before column whatever the template lists.
    t1 = _ctx("T1", artifacts, lambda p: {}, profile=None)
    assert _run(t1).passed
    rows = list(csv.DictReader(io.StringIO(t1.outputs["table.csv"].decode())))
    assert {r["id"]: r["stated_before"] for r in rows} == {
        "A1-e1": "", "A1-e2": "stated 15 March 2024", "B1-e1": ""}
