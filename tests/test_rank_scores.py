"""Rankings a partner can rebuild and check (issue 20).

An options ranking gives each item's value and points (1-5) on every criterion; code computes
the score from the points (the sum, or weight x points when the unit declares ``weights``)
and never takes a total from the model. Every figure of a ranked item (title, criterion
values, rationale) is in a quote it cites, or given by its checked ``calculation``, or is the
difference of a range written beside both its cited ends; otherwise the feedback names it.
A risk keeps likelihood x impact, which code recomputes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway.answers import check_answer
from keepstep.engine.gateway.client import ModelGateway
from keepstep.engine.gateway.offline_provider import build_response_content
from keepstep.engine.gateway.prompts import read_input_block
from keepstep.engine.kinds.claims import range_differences
from keepstep.engine.kinds.synthesize import (
    OptionsAnswer,
    RankAnswer,
    _options_rules,
    _rank_rules,
    _risks_of,
    points_score,
)

PACK = Path(__file__).parent / "fixtures" / "conflicts_pack"
QUOTES = {
    "R1-e1": "Brisland Yards quoted 18 million euro for the hull in 2024.",
    "R2-e1": "The yard's quote was 22 million euro in 2024.",
    "R2-e2": "Delivery takes about 30 months from the order.",
    "R3-e2": "We recommend that the board seeks a second yard's quote.",
}
ASKS = {"ranks": "options", "criteria": ["hull price", "delivery"], "ask": ["rationale"]}


def _option(**over: Any) -> dict[str, Any]:
    item = {"id": "R1", "title": "Seek a second yard's quote",
            "criteria": {"hull price": "18 or 22 million euro", "delivery": "about 30 months"},
            "points": {"hull price": 4, "delivery": 3},
            "rationale": "A second quote tests the price; delivery is unchanged.",
            "evidence_ids": ["R1-e1", "R2-e1", "R2-e2", "R3-e2"]}
    return {**item, **over}


def _problems(items: list[dict[str, Any]], asks: dict[str, Any] | None = None) -> list[Any]:
    answer, _, problems = check_answer(json.dumps({"items": items}), OptionsAnswer)
    assert problems == [] and answer is not None
    return _options_rules(set(QUOTES), QUOTES, asks or ASKS)(answer, {})


def test_code_computes_an_options_score_from_its_points() -> None:
    """The score is the sum of the points (weights when declared); a total the model
    states is not taken; a missing or off-scale point is named; the order is the computed
    scores'."""
    assert points_score({"hull price": 4, "delivery": 3}, ASKS) == 7
    from keepstep.engine.core.presets import RankParams
    declared = RankParams.model_validate({**ASKS, "weights": {"hull price": 2}})
    assert declared.weights == {"hull price": 2}  # a plan may declare weights
    weighted = {**ASKS, "weights": {"hull price": 2}}
    assert points_score({"hull price": 4, "delivery": 3}, weighted) == 11
    assert points_score({"hull price": 4}, ASKS) is None
    assert points_score({"hull price": 6, "delivery": 3}, ASKS) is None
    items = _risks_of({"items": [_option(score=25)]}, {}, ASKS)
    assert items[0]["score"] == 7 and items[0]["score_from"] == "points"
    assert _problems([_option()]) == []
    missing = _problems([_option(points={"hull price": 4, "delivery": 0})])
    assert [(p.rule, p.value) for p in missing] == [("points", "delivery")]
    disordered = _problems([_option(), _option(id="R2", title="Order now",
                                               points={"hull price": 5, "delivery": 5})])
    assert [(p.field, p.rule, p.value) for p in disordered] == [("items[1].points", "order", "10")]
    # With hull price weighed twice, 4/3 (11) ranks above 2/5 (9); unweighted it would not.
    assert _problems([_option(), _option(id="R2", title="Order now",
                                         points={"hull price": 2, "delivery": 5})],
                     weighted) == []


def test_a_risk_keeps_likelihood_times_impact_recomputed_by_code() -> None:
    """A risk's score is code's likelihood x impact; a stated product that differs is named."""
    risk = {"id": "R1", "title": "Steel prices rise", "score": 12, "likelihood": 3,
            "impact": 4, "evidence_ids": ["R1-e1"]}
    assert _risks_of({"risks": [risk]}, {})[0]["score"] == 12
    answer, _, _ = check_answer(json.dumps({"risks": [{**risk, "score": 15}]}), RankAnswer)
    found = _rank_rules(set(QUOTES), QUOTES)(answer, {})
    assert [(p.rule, p.value) for p in found] == [("product", "15")]
    assert _risks_of({"risks": [{**risk, "score": 15}]}, {})[0]["score"] == 12


def test_every_figure_of_a_ranked_item_is_checked_and_named() -> None:
    """A figure in the title, a criterion value or the rationale that no cited quote holds
    is named with its field; a checked calculation gives it; a wrong one is named."""
    found = _problems([_option(rationale="The quote is 25 million euro at most.")])
    assert [(p.field, p.rule, p.value) for p in found] == [
        ("items[0].rationale", "cited_figure", "25")]
    found = _problems([_option(criteria={"hull price": "19 million euro", "delivery": "30"})])
    assert [(p.field, p.value) for p in found] == [("items[0].criteria.hull price", "19")]
    found = _problems([_option(title="Order 3 hulls")])
    assert [(p.field, p.value) for p in found] == [("items[0].title", "3")]
    spread = "The quotes differ by 4 million euro, the highest less the lowest."
    assert [p.value for p in _problems([_option(rationale=spread)])] == ["4"]
    assert _problems([_option(rationale=spread, calculation="22 - 18 = 4")]) == []
    wrong = _problems([_option(rationale=spread.replace("4", "5"),
                               calculation="22 - 18 = 5")])
    assert {(p.rule, p.value) for p in wrong} == {
        ("calculation_stated", "22 - 18 = 5"), ("calculation_result", "22 - 18 = 5"),
        ("cited_figure", "5")}
    uncited = _problems([_option(rationale=spread, calculation="23 - 19 = 4")])
    assert {(p.rule, p.value) for p in uncited} == {("calculation_operand", "23"),
                                                   ("calculation_operand", "19"),
                                                   ("cited_figure", "4")}


def test_a_difference_beside_both_its_cited_ends_passes_as_an_implicit_calculation() -> None:
    """'varying by 4 million euro (18 to 22 million)': code recomputes 22 - 18 from the ends
    written in the same field, both in the cited quotes; a wrong difference, an end no
    cited quote holds, or ends written in another field do not pass."""
    ok = "The quote varies by 4 million euro (18 to 22 million)."
    assert _problems([_option(rationale=ok)]) == []
    assert range_differences(ok, {"18", "22"}) == {"4"}
    wrong = _problems([_option(rationale=ok.replace("by 4", "by 5"))])
    assert [(p.field, p.value) for p in wrong] == [("items[0].rationale", "5")]
    uncited = _problems([_option(rationale="It varies by 6 million (18 to 24 million).")])
    assert sorted(p.value for p in uncited) == ["24", "6"]
    apart = _problems([_option(criteria={"hull price": "18 to 22 million euro",
                                         "delivery": "30 months"},
                               rationale="The quotes vary by 4 million euro.")])
    assert [(p.field, p.value) for p in apart] == [("items[0].rationale", "4")]
    # Not for a claim: a synthesis finding's derived figure needs its calculation.
    from keepstep.engine.kinds.claims import figure_problems
    assert [p.value for p in figure_problems("claims[0]", ok, ["R1-e1", "R2-e1"], QUOTES)] \
        == ["4"]


def test_an_earlier_shaped_answer_keeps_its_stated_score_and_says_so() -> None:
    """A recorded answer of the earlier shape (options under "risks", a stated 1-25 score,
    no points) parses and keeps its score, marked stated; the document says it cannot be
    rebuilt from points."""
    from keepstep.engine.kinds.parts import score_scale

    legacy = {"risks": [{"id": "R1", "title": "Order now", "score": 13,
                         "criteria": {"hull price": "18 million", "delivery": "30 months"},
                         "evidence_ids": ["R1-e1", "R2-e2"], "rationale": "Soonest."}]}
    answer, _, problems = check_answer(json.dumps(legacy), OptionsAnswer)
    assert problems == [] and answer is not None
    assert _options_rules(set(QUOTES), QUOTES, ASKS)(answer, {}) == []
    items = _risks_of(legacy, {}, ASKS)
    assert items[0]["score"] == 13 and items[0]["score_from"] == "stated"
    line = score_scale({"ranks": "options", "criteria": ASKS["criteria"], "risks": items})
    assert "no points per criterion to rebuild it from" in line
    # A new-shaped answer that leaves the points out is sent back, not taken as stated.
    answer, _, _ = check_answer(json.dumps({"items": [
        {k: v for k, v in _option(score=20).items() if k != "points"}]}), OptionsAnswer)
    assert {p.rule for p in _options_rules(set(QUOTES), QUOTES, ASKS)(answer, {})} == {"points"}


@pytest.fixture()
def tampered(tmp_path: Path) -> dict[str, Any]:
    """The conflicts pack run through the real gateway with the offline heuristic answering
    every request, except that the first rank answer's derived figure is made wrong
    ("by 5 million", "22 - 18 = 5")."""
    import litellm

    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    toml = root / "keepstep.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace(
        'default_model = "local/keepstep-offline"',
        'default_model = "openai/gpt-4o-mini"\napi_base = "http://127.0.0.1:9/v1"'),
        encoding="utf-8")
    asked: list[list[dict[str, Any]]] = []

    def completion(**kwargs: Any) -> Any:
        messages = kwargs["messages"]
        content = build_response_content(messages)
        block = read_input_block(messages) or {}
        if block.get("task") == "rank":
            asked.append(messages)
            if len(asked) == 1:
                content = content.replace("by 4 million", "by 5 million").replace(
                    "22 - 18 = 4", "22 - 18 = 5")
        return litellm.ModelResponse(
            model=str(kwargs.get("model", "")),
            choices=[{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": content}}],
            usage=litellm.Usage(prompt_tokens=100, completion_tokens=100, total_tokens=200))

    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    mp.setenv("OPENAI_API_KEY", "sk-test")
    try:
        with open_project(root, gateway_factory=lambda ledger: ModelGateway(
                ledger=ledger, completion_fn=completion)) as project:
            status = project.open_or_start("T1").run()
    finally:
        mp.undo()
    ranking = json.loads(next((root / ".keepstep" / "artifacts").glob(
        "T1/K01/*/ranking.json")).read_text(encoding="utf-8"))
    return {"status": status, "asked": asked, "ranking": ranking}


def test_a_wrong_calculation_fails_the_check_and_is_revised(tampered: dict[str, Any]) -> None:
    """The rank rules recompute the wrong calculation, send it back naming it and the
    unsupported figure, and the revised answer (the right calculation) goes forward."""
    assert tampered["status"].decision == "done", tampered["status"]
    asked = tampered["asked"]
    assert len(asked) >= 2
    feedback = asked[1][-1]["content"]
    assert "22 - 18 = 5" in feedback and "the arithmetic gives 4, not 5" in feedback
    assert "[calculation_stated]: the arithmetic gives 4, not 5" in feedback, feedback
    assert "criteria.hull price [cited_figure]: the figure is in none of the cited quotes" \
        in feedback, feedback
    top = tampered["ranking"]["risks"][0]
    assert top["calculation"] == "22 - 18 = 4"
    assert "by 4 million" in top["criteria"]["hull price"]


def test_a_value_not_stated_scored_above_the_lowest_is_sent_back_naming_item_and_criterion(
) -> None:
    """Points rest on the value shown: a criterion whose value is "not stated" (or starts
    so, with a reason after it) gets no more than the lowest a stated value gets on it (1
    when no item states one); more points come back as feedback naming the item and the
    criterion (relay run 4: "Option 1 gets 4/5 on a hull price that is 'not stated'"). A
    stated value keeps whatever points the model gives it."""
    unknown = _option(criteria={"hull price": "Not stated: a second yard's price is not in "
                                              "the evidence", "delivery": "about 30 months"},
                      points={"hull price": 4, "delivery": 3})
    found = _problems([unknown])
    assert [(p.field, p.rule, p.value) for p in found] == [
        ("items[0].points", "unknown_scored", "hull price")]
    assert "Seek a second yard's quote" in found[0].message
    assert "gets 4 points" in found[0].message and "gets 1 here at most" in found[0].message
    assert _problems([{**unknown, "points": {"hull price": 1, "delivery": 3}}]) == []
    plain = _option(criteria={"hull price": "not stated", "delivery": "not stated"},
                    points={"hull price": 1, "delivery": 2})
    assert [p.value for p in _problems([plain])] == ["delivery"]
    # A value that only mentions an unknown later is a stated value: not this rule's.
    stated = _option(criteria={"hull price": "18 or 22 million euro; a second yard's price "
                                             "is not stated", "delivery": "about 30 months"})
    assert _problems([stated]) == []
    # Beside a stated value: the unknown may tie the lowest stated points, never pass them
    # (relay run 5: the option falling back on the quoted price was given 1 against 5).
    known = _option(id="R1", title="Order now", points={"hull price": 2, "delivery": 3})
    tied = {**unknown, "id": "R2", "points": {"hull price": 2, "delivery": 3}}
    assert _problems([known, tied]) == []
    above = {**unknown, "id": "R2", "points": {"hull price": 3, "delivery": 3}}
    [p] = _problems([above, known])  # listed from the highest score down (6, then 5)
    assert (p.field, p.rule, p.value) == ("items[0].points", "unknown_scored", "hull price")
    assert "gets 3 points" in p.message and "gets 2 here at most" in p.message


def test_the_rank_prompt_anchors_the_points_on_the_value_shown() -> None:
    """The options prompt anchors the 1-5 scale (5 best value among the items, 1 worst, an
    unknown never above a known value, equal values equal points) and the schema's points say
    the same."""
    from keepstep.engine.gateway.prompts import load_prompt
    from keepstep.engine.kinds.synthesize import _rank_schema

    text = load_prompt("rank").system
    assert "5 = the cited evidence shows the best value among the items" in text
    assert "An unknown is never scored as good" in text
    assert "Items with the same value on a criterion get the same points" in text
    points = _rank_schema(ASKS)["$defs"]["RankedOption"]["properties"]["points"]
    assert "never scored as good" in points["description"]
