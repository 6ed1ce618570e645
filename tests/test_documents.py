"""Documents written from the work (issue 20, items 5-8): claims checked against their quotes,
checked calculations, citations that point at the quote holding the figure, rankings of what
a unit ranks, no repetition across sections, disagreements carried through, provenance and
prices."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest

from keepstep.engine.core.inputs import Contract, InputSnapshot
from keepstep.engine.core.plan import parse_plan
from keepstep.engine.errors import BudgetExhausted, PermanentModelError, TransientModelError
from keepstep.engine.gateway.answers import check_answer, parse_json_answer
from keepstep.engine.gateway.call_ledger import StoreCallLedger, UnpricedModel
from keepstep.engine.gateway.classification import classify
from keepstep.engine.gateway.profile import ModelProfile
from keepstep.engine.kinds import get_kind
from keepstep.engine.kinds.claims import CalculationError, evaluate, figure_problems
from keepstep.engine.kinds.common import (
    CALCULATED_RE,
    cited_evidence_ids,
    expand_footnotes,
    recorded_calculation,
    shown_calculation,
)
from keepstep.engine.kinds.model_step import run_model_step
from keepstep.engine.kinds.render import without_prose_ids
from keepstep.engine.kinds.synthesize import SynthesisAnswer
from tests.support.fake_context import FakeContext, PackRunner

MODEL = "openai/test-model"
PROFILE = ModelProfile(model=MODEL, provider="openai", input_tokens=200_000,
                       output_tokens=4096, window_source="default", structured="prompt")

EVIDENCE = [
    {"id": "A1-e1", "source_id": "A1", "group": "A", "topic": "t", "locator": "p. 1",
     "source_title": "Pilot report", "quote": "Readings arrived on time for 97% of meters.",
     "figures": ["97%"]},
    {"id": "A1-e2", "source_id": "A1", "group": "A", "topic": "t", "locator": "p. 2",
     "source_title": "Pilot report", "quote": "The pilot covered 1,200 meters in two towns.",
     "figures": ["1,200"]},
    {"id": "B1-e1", "source_id": "B1", "group": "B", "topic": "t", "locator": "Prices",
     "source_title": "Price list", "quote": "The list price is NVK 40 per meter per year.",
     "figures": ["40"]},
    {"id": "B1-e2", "source_id": "B1", "group": "B", "topic": "t", "locator": "Prices",
     "source_title": "Price list", "quote": "The list price is NVK 46 per meter per year.",
     "figures": ["46"]},
]
CONFLICT = {"id": "K1", "metric": "list price", "entity": "meter", "period": "2025",
            "sides": [{"evidence_id": "B1-e1", "source_id": "B1", "value": "NVK 40"},
                      {"evidence_id": "B1-e2", "source_id": "B1", "value": "NVK 46"}],
            "class": "unexplained", "holds": None, "holds_ids": [],
            "reason": "two lists of the same date give different prices"}

PLAN = """
[plan]
title = "Pilot review"

[[unit]]
id = "V1"
title = "Verify"
phase = "verification"
kind = "verify"
inputs = ["group:A"]
outputs = ["verified.json"]

[[unit]]
id = "S1"
title = "What the pilot showed"
phase = "synthesis"
kind = "synthesize"
outputs = ["synthesis.json", "synthesis.md"]
depends_on = ["V1"]

[[unit]]
id = "R1"
title = "Which pricing option fits"
phase = "synthesis"
kind = "rank"
outputs = ["ranking.json", "ranking.md"]
depends_on = ["V1"]
params = { ranks = "options", criteria = ["price per meter", "fit"], ask = ["rationale"] }

[[unit]]
id = "D1"
title = "Memo"
phase = "deliverables"
kind = "render"
inputs = ["template:memo"]
outputs = ["memo.md"]
depends_on = ["S1", "R1"]
[unit.params]
document = "memo"
template = "memo"
prose = "summary"
fill = { summary = "executive_summary", options = "risks", disagreements = "conflicts" }

[[unit]]
id = "D2"
title = "Brief"
phase = "deliverables"
kind = "render"
inputs = ["template:brief"]
outputs = ["brief.md"]
depends_on = ["S1", "R1"]
[unit.params]
document = "brief"
template = "brief"
fill = { case = { part = "section", of = ["findings", "conflicts"], from = ["S1"] } }

[[unit]]
id = "T1"
title = "Table"
phase = "deliverables"
kind = "render"
inputs = ["template:table"]
outputs = ["table.csv"]
depends_on = ["V1", "S1"]
params = { document = "table", template = "table" }

[[unit]]
id = "A1"
title = "Audit"
phase = "audit"
kind = "audit"
outputs = ["audit.json"]
depends_on = ["D1", "S1"]
params = { checks = [{ check = "conflicts", documents = ["memo"] }] }

[[unit]]
id = "A2"
title = "Audit the figures"
phase = "audit"
kind = "audit"
outputs = ["audit.json"]
depends_on = ["D1", "V1"]
params = { checks = [{ check = "figures", document = "memo", section = "findings" }] }
"""
MEMO = """# {{ title }}

<!-- section: summary -->
## Summary

{{ summary }}

<!-- section: findings -->
## Findings

{{ findings }}

<!-- section: options -->
## Options

{{ options }}

<!-- section: conflicts -->
## Where the sources disagree

{{ disagreements }}

{{ notice }}
"""


def _ctx(unit: str, artifacts: dict[str, dict[str, bytes]], responder: Any,
         profile: ModelProfile | None = PROFILE) -> FakeContext:
    plan = parse_plan(PLAN)
    return FakeContext(unit=plan.unit_map()[unit], plan=plan,
                       contract=Contract(fields={"audience": "board"}, body=""),
                       snapshot=InputSnapshot(sources={}, groups={}), sources={}, texts={},
                       artifacts=artifacts, templates={"memo": MEMO, "table": "- id\n- quote\n",
                                  "brief": "# Brief\n\n## The case\n\n{{ case }}\n"},
                       responder=responder, profile=profile)


def _verified(conflicts: list[dict[str, Any]] | None = None) -> dict[str, dict[str, bytes]]:
    doc = {"evidence": EVIDENCE, "conflicts": conflicts or [], "models": [MODEL]}
    return {"V1": {"verified.json": json.dumps(doc).encode()}}


def _run(ctx: FakeContext) -> Any:
    outcome = get_kind(ctx.unit.kind.value)[1](ctx)
    ctx.artifacts[ctx.unit.id] = dict(ctx.outputs)
    return outcome


class Script:
    """A model that answers each task from a list of answers, in turn (the last repeats)."""

    def __init__(self, **answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        task = payload["task"]
        self.seen.append((task, payload))
        n = sum(1 for t, _ in self.seen if t == task) - 1
        options = self.answers[task]
        return options[min(n, len(options) - 1)]


def _all_supported(payload: dict[str, Any]) -> dict[str, Any]:
    return {"verdicts": [{"claim": c["id"], "verdict": "supports"} for c in payload["claims"]]}


# --- claims against their quotes -----------------------------------------------------------
def test_a_claim_its_quotes_do_not_support_is_revised() -> None:
    """The support check says a claim's quotes do not address it: the claim goes back to the
    writer named, and the revised claim is what the synthesis keeps."""
    bad = {"claims": [{"text": "The pilot cut billing complaints.", "evidence_ids": ["A1-e1"]}]}
    good = {"claims": [{"text": "Readings arrived on time for 97% of meters.",
                        "evidence_ids": ["A1-e1"]}]}

    def support(payload: dict[str, Any]) -> dict[str, Any]:
        return {"verdicts": [{"claim": c["id"], "verdict": "does_not_address",
                              "reason": "nothing on complaints"} if "complaints" in c["text"]
                             else {"claim": c["id"], "verdict": "supports"}
                             for c in payload["claims"]]}

    script = Script(synthesize=[bad, good])
    ctx = _ctx("S1", _verified(), lambda p: support(p) if p["task"] == "support" else script(p))
    outcome = _run(ctx)
    assert outcome.passed
    assert [c["task"] for c in ctx.calls] == ["synthesize", "support", "synthesize", "support"]
    revise = ctx.calls[2]["messages"][-1]["content"]
    assert "support:does_not_address" in revise and "nothing on complaints" in revise
    doc = ctx.json_output("synthesis.json")
    assert [c["text"] for c in doc["claims"]] == [good["claims"][0]["text"]]
    assert doc["claims"][0]["support"] == "supports" and doc["models"] == [MODEL]


def test_an_offline_run_asks_the_support_check_of_the_heuristic() -> None:
    """One code path: offline, every synthesis's claims go to the support check, answered by
    the heuristic's own rule, and its verdicts are recorded with the claims."""
    pack = PackRunner()
    pack.run_all(until="U30")
    synth = [u.id for u in pack.plan.units if u.kind.value == "synthesize"]
    assert synth
    for uid in synth:
        tasks = [c["task"] for c in pack.contexts[uid].calls]
        assert tasks == ["synthesize", "support"], (uid, tasks)
        doc = json.loads(pack.artifacts[uid]["synthesis.json"])
        assert doc["claims"] and {c["support"] for c in doc["claims"]} == {"supports"}
        assert pack.outcomes[uid].passed


def test_the_offline_heuristic_finds_an_unsupported_claim_and_it_is_revised() -> None:
    """The heuristic's support rule finds a claim whose quotes do not address it; the claim
    goes back named, and the heuristic's own revise answer (reading the same feedback a model
    reads) is what the synthesis keeps."""
    from keepstep.engine.gateway.offline_model import respond

    bad = {"claims": [{"text": "The pilot cut billing complaints.", "evidence_ids": ["A1-e1"]}]}
    answered: list[str] = []

    def model(payload: dict[str, Any]) -> dict[str, Any]:
        answered.append(payload["task"])
        if payload["task"] == "synthesize" and answered.count("synthesize") == 1:
            return bad  # a first answer like a careless model's
        return respond(payload)

    ctx = _ctx("S1", _verified(), model, profile=None)
    outcome = _run(ctx)
    assert outcome.passed
    assert [c["task"] for c in ctx.calls] == ["synthesize", "support", "synthesize", "support"]
    assert "support:does_not_address" in ctx.calls[2]["messages"][-1]["content"]
    doc = ctx.json_output("synthesis.json")
    assert "complaints" not in json.dumps(doc["claims"])
    assert doc["claims"] and {c["support"] for c in doc["claims"]} == {"supports"}


def test_the_offline_heuristic_revises_the_claims_feedback_names() -> None:
    """A revise round's feedback reaches the heuristic as it reaches a model (the
    conversation): a claim named once is restated in its quote's own words, citing the quote;
    named again, it is dropped."""
    from keepstep.engine.gateway.offline_provider import build_response_content
    from keepstep.engine.gateway.prompts import load_prompt, render_messages, revise_messages

    inputs = {"task": "synthesize", "question": "q", "audience": "board",
              "evidence": EVIDENCE[:2] + [{**EVIDENCE[2], "topic": "u"}],
              "topics": [{"name": "t", "keywords": []}, {"name": "u", "keywords": []}]}
    messages = render_messages(load_prompt("synthesize"), inputs=inputs, contract={},
                               unit={"id": "S1", "title": "t", "question": ""}, schema=None)
    first = json.loads(build_response_content(messages))["claims"]
    assert len(first) >= 2 and all(len(c["evidence_ids"]) == 1 for c in first)
    line = "claims[0].text [support:does_not_address]: its cited quotes do not address it"
    again = revise_messages(load_prompt("revise"), messages, json.dumps(first), [line])
    second = json.loads(build_response_content(again))["claims"]
    quote = {e["id"]: e["quote"] for e in EVIDENCE}[first[0]["evidence_ids"][0]]
    assert second[0] == {"text": quote, "evidence_ids": first[0]["evidence_ids"]}
    assert second[1:] == first[1:]
    third = json.loads(build_response_content(revise_messages(
        load_prompt("revise"), again, json.dumps(second), [line])))["claims"]
    assert third == first[1:]


def test_a_correct_calculation_passes_and_a_wrong_one_fails() -> None:
    """A derived figure passes when its calculation uses cited figures and code gets the
    figure the text states; a wrong result, an uncited operand or a non-arithmetic
    expression is a named problem."""
    quotes = {e["id"]: e["quote"] for e in EVIDENCE}
    ids = ["A1-e1", "A1-e2"]
    text = "About 1,164 of the pilot's meters reported on time."
    assert figure_problems("c", text, ids, quotes, "1,200 * 97% = 1,164") == []
    wrong = figure_problems("c", "About 1,100 meters reported on time.", ids, quotes,
                            "1,200 * 97%")
    assert [p.rule for p in wrong] == ["calculation_result", "cited_figure"]
    uncited = figure_problems("c", "About 1,164 meters reported on time.", ids, quotes,
                              "1,200 * 0.97")
    assert "calculation_operand" in [p.rule for p in uncited]
    no_calc = figure_problems("c", text, ids, quotes)
    assert [p.rule for p in no_calc] == ["cited_figure"]
    assert evaluate("(46 - 40) / 40") == pytest.approx(0.15)
    for bad in ("__import__('os')", "2 ** 10", "abs(-1)", "x + 1"):
        with pytest.raises(CalculationError):
            evaluate(bad)


def test_labels_versions_and_dates_are_not_figures_a_quote_must_hold() -> None:
    """What a real model named behind the relay: a release or version number, a standard's
    number, a priority label, a day and a year name something and need no quote holding
    them; a quantity still does."""
    from keepstep.engine.kinds.claims import stated_figures

    quotes = {e["id"]: e["quote"] for e in EVIDENCE}
    text = ("Release 12.4, due 30 June 2025 and certified to ISO/IEC 27001, SOC 2 and TLS 1.2, "
            "kept P1 readings on time for 97% of meters.")
    assert stated_figures(text) == ["97%"]
    assert figure_problems("c", text, ["A1-e1"], quotes) == []
    wrong = figure_problems("c", text.replace("97%", "95%"), ["A1-e1"], quotes)
    assert [(p.rule, p.value) for p in wrong] == [("cited_figure", "95%")]
    assert stated_figures("Version 3.0 costs AMC 40 million, 1,250 users, in 2023.") == [
        "40", "1,250"]


def test_a_statement_no_topic_fits_may_say_so() -> None:
    """The extraction schema a model is sent has no catch-all topic: a statement no topic
    fits is null, which the strict schema allows (an enum lists null too) and the rules
    accept."""
    import jsonschema

    from keepstep.engine.gateway.answers import strict_schema
    from keepstep.engine.kinds.extract import answer_schema

    schema = strict_schema(answer_schema(None, ["pricing", "operations"]))
    topic = schema["properties"]["evidence"]["items"]["properties"]["topic"]
    assert None in topic["enum"] and "general" not in topic["enum"]
    item = {"id": "A1-e1", "source_id": "A1", "quote": "The report is confidential.",
            "kind": "caveat", "relevance": "low", "figures": [], "quantities": [],
            "qualifies": [], "topic": None}
    item = {k: item.get(k) for k in schema["properties"]["evidence"]["items"]["properties"]}
    jsonschema.validate({"evidence": [item]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"evidence": [{**item, "topic": "general"}]}, schema)


def test_a_calculation_may_convert_periods_read_word_numbers_and_hold_several_parts() -> None:
    """What a real model needed behind the relay: a monthly price over a year (12 is a free
    constant), a count a quote writes as a word ("six sites"), and two derived figures in one
    claim separated by ';' — each part recomputed and each result stated; an operand that is
    neither cited nor a calendar constant still fails."""
    quotes = {"P1-e1": "The subscription costs AMC 2,600 per site per month.",
              "P1-e2": "Harbour runs six sites today."}
    ids = ["P1-e1", "P1-e2"]
    text = "Six sites cost AMC 15,600 a month, AMC 187,200 a year."
    assert figure_problems("c", text, ids, quotes,
                           "2,600 * 6 = 15,600; 2,600 * 6 * 12 = 187,200") == []
    half = figure_problems("c", "Six sites cost AMC 15,600 a month, AMC 190,000 a year.", ids,
                           quotes, "2,600 * 6 = 15,600; 2,600 * 6 * 12")
    # A calculation with a problem accounts for no figure: both derived figures are named.
    assert [p.rule for p in half] == ["calculation_result", "cited_figure", "cited_figure"]
    odd = figure_problems("c", "Nine sites cost AMC 23,400 a month.", ids, quotes, "2,600 * 9")
    assert [p.rule for p in odd] == ["calculation_operand", "cited_figure"]


# --- render: citations, rankings, repetition, provenance ------------------------------------
def _synthesis_and_ranking(conflicts: list[dict[str, Any]] | None = None
                           ) -> dict[str, dict[str, bytes]]:
    artifacts = _verified(conflicts)
    synth = Script(synthesize=[{
        "claims": [{"text": "Readings arrived on time for 97% of meters.",
                    "evidence_ids": ["A1-e1"]},
                   {"text": "The pilot covered 1,200 meters.", "evidence_ids": ["A1-e2"]}],
        "gaps": ["No source gives the cost of the pilot."]}])
    _run(_ctx("S1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
              else synth(p)))
    rank = Script(rank=[{"risks": [
        {"id": "R1", "title": "Annual subscription", "score": 20, "evidence_ids": ["B1-e1"],
         "criteria": {"price per meter": "NVK 40", "fit": "good"},
         "rationale": "the lower list price"},
        {"id": "R2", "title": "Per-reading fee", "score": 12, "evidence_ids": ["A1-e1"],
         "criteria": {"price per meter": "not stated", "fit": "partial"}}]}],
        check=[{"problems": []}])
    _run(_ctx("R1", artifacts, rank))
    return artifacts


def test_a_ranking_of_options_renders_as_a_table_of_options() -> None:
    """A unit that ranks options carries them with their criteria; the document's table is a
    table of options, the criteria its columns, with no process text."""
    artifacts = _synthesis_and_ranking()
    ranking = json.loads(artifacts["R1"]["ranking.json"])
    assert ranking["ranks"] == "options" and ranking["risks"][0]["criteria"]["fit"] == "good"
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    assert _run(ctx).passed
    memo = ctx.outputs["memo.md"].decode()
    assert "| Rank | Option | price per meter | fit | Score | Rationale | Evidence |" in memo
    # The rank is a plain number (the item's id R1 would read as a source id), and a line
    # under the table says what the score is.
    assert re.search(r"\| 1 \| Annual subscription \| NVK 40 \| good \| 20 \|", memo)
    assert "| R1 |" not in memo
    assert "Score: 1-25, higher is better, a judgement of each option on price per meter, " \
        "fit" in memo
    assert "round(s)" not in memo and "likelihood × impact" not in memo


def test_the_prose_of_a_document_over_options_speaks_of_the_top_ranked_option() -> None:
    """A document's model-written prose over a ranking of options is given its top-ranked
    option as "top_ranked" (what it ranks named), no "risks"; the render prompt asks for the
    top risk only when INPUT gives risks (issue 20)."""
    artifacts = _synthesis_and_ranking()
    asked: list[dict[str, Any]] = []

    def writer(payload: dict[str, Any]) -> dict[str, Any]:
        if payload.get("task") == "support":
            return _all_supported(payload)
        asked.append(payload)
        return {"sentences": [{"text": "The annual subscription ranks first of the options.",
                               "evidence_ids": ["B1-e1"]}]}

    ctx = _ctx("D1", artifacts, writer)
    assert _run(ctx).passed
    prose = [p for p in asked if p.get("task") == "render" and "top_ranked" in p]
    assert prose, [(p.get("task"), sorted(p)) for p in asked]
    assert prose[0]["risks"] == []
    assert [(t["ranks"], t["title"]) for t in prose[0]["top_ranked"]] == [
        ("options", "Annual subscription")]
    system = next(c for c in ctx.calls if c["task"] == "render")["messages"]
    text = " ".join(str(m["content"]) for m in system)
    assert 'the top risk when INPUT gives "risks"' in text
    assert 'the top-ranked option when it gives "top_ranked"' in text
    assert "Top risk" not in ctx.outputs["memo.md"].decode()
    # Written by rule (offline), the summary labels the top of a ranking of options as such.
    offline = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    assert _run(offline).passed
    memo = offline.outputs["memo.md"].decode()
    assert "**Top-ranked option**: Annual subscription" in memo and "Top risk" not in memo


def test_no_finding_is_repeated_across_sections() -> None:
    """The summary takes each synthesis's lead finding; the findings section does not show
    it again (ME-042's report and decision brief, and a small memo)."""
    artifacts = _synthesis_and_ranking()
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    assert _run(ctx).passed
    memo = _body(ctx.outputs["memo.md"].decode())
    assert memo.count("Readings arrived on time for 97% of meters.") == 1
    assert memo.count("The pilot covered 1,200 meters.") == 1

    # The template's fill may say so: then the findings section repeats the lead finding.
    unit = ctx.unit.model_copy(update={"params": {**ctx.unit.params, "fill": {
        **ctx.unit.params["fill"], "findings": {"part": "findings", "repeat": True}}}})
    again = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    again.unit = unit
    assert _run(again).passed
    assert _body(again.outputs["memo.md"].decode()).count(
        "Readings arrived on time for 97% of meters.") == 2

    pack = PackRunner()
    pack.run_all(until="U33")
    for doc in (pack.artifacts["U31"]["report.md"], pack.artifacts["U33"]["decision-brief.md"]):
        text = _body(doc.decode())
        for uid in ("U25", "U26", "U27", "U29", "U30"):
            for claim in json.loads(pack.artifacts[uid]["synthesis.json"])["claims"]:
                assert text.count(claim["text"]) <= 1, claim["text"]


def _body(text: str) -> str:
    """A document without its footnotes (which quote the sources)."""
    return "\n".join(x for x in text.splitlines() if not re.match(r"\[\^\d+\]: ", x))


def test_citations_point_at_the_quote_that_holds_the_figure() -> None:
    """A model-written sentence citing an id whose quote lacks its figure is revised (the
    finding's text is no longer filed under the ids it cites); the document's footnote for
    the sentence names the source, the locator and the quote holding the figure."""
    artifacts = _synthesis_and_ranking()
    wrong = {"sentences": [{"text": "Readings arrived on time for 97% of meters.",
                            "evidence_ids": ["A1-e2"]}]}
    right = {"sentences": [{"text": "Readings arrived on time for 97% of meters.",
                            "evidence_ids": ["A1-e1"]}]}
    script = Script(render=[wrong, right])
    ctx = _ctx("D1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
               else script(p))
    assert _run(ctx).passed
    renders = [c for c in ctx.calls if c["task"] == "render"]
    assert len(renders) == 2 and "cited_figure" in renders[1]["messages"][-1]["content"]
    memo = ctx.outputs["memo.md"].decode()
    line = next(x for x in memo.splitlines() if x.startswith("- Readings arrived"))
    assert "(Pilot report (A1), p. 1)[^" in line and "A1-e" not in line
    note = re.search(r"\[\^(\d+)\]$", line).group(1)
    definition = next(x for x in memo.splitlines() if x.startswith(f"[^{note}]: "))
    assert "[A1-e1] (A1, p. 1)" in definition and "97% of meters" in definition
    # The audit reads the footnote back in place: the figure sits beside the id holding it.
    expanded = expand_footnotes(memo)
    line = next(x for x in expanded.splitlines() if x.startswith("- Readings arrived"))
    assert cited_evidence_ids(line) == {"A1-e1"}


def test_a_finding_cites_only_the_quotes_that_hold_its_figures() -> None:
    """A finding that rests on several ids is cited, in the document, at the quotes holding
    the figures it states (or its calculation's operands), not at every id; a finding that
    states no figure keeps all its ids. Model-written sentences are cited the same way."""
    artifacts = _verified()
    all_ids = ["A1-e1", "A1-e2", "B1-e1"]
    synth = Script(synthesize=[{"claims": [
        {"text": "Readings arrived on time for 97% of meters.", "evidence_ids": all_ids},
        {"text": "About 1,164 of the pilot's meters reported on time.", "evidence_ids": all_ids,
         "calculation": "1,200 * 97% = 1,164"},
        {"text": "The pilot reported readings and priced meters.", "evidence_ids": all_ids}]}])
    assert _run(_ctx("S1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                     else synth(p))).passed
    _run(_ctx("R1", artifacts, Script(rank=[{"risks": [
        {"id": "R1", "title": "Annual subscription", "score": 20, "evidence_ids": ["B1-e1"],
         "criteria": {"price per meter": "NVK 40", "fit": "good"}}]}], check=[{"problems": []}])))
    ctx = _ctx("D2", artifacts, lambda p: {}, profile=None)
    ctx.templates["brief"] = "# Brief\n\n{{ findings }}\n"
    assert _run(ctx).passed
    memo = expand_footnotes(ctx.outputs["brief.md"].decode())

    def cited(start: str) -> set[str]:
        return cited_evidence_ids(next(x for x in memo.splitlines() if start in x))

    assert cited("1. Readings arrived") == {"A1-e1"}
    assert cited("2. About 1,164") == {"A1-e1", "A1-e2"}
    assert cited("3. The pilot reported") == set(all_ids)

    script = Script(render=[{"sentences": [
        {"text": "Readings arrived on time for 97% of meters.", "evidence_ids": all_ids}]}])
    written = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                   else script(p))
    assert _run(written).passed
    brief = expand_footnotes(written.outputs["brief.md"].decode())
    line = next(x for x in brief.splitlines() if x.startswith("- Readings arrived"))
    assert cited_evidence_ids(line) == {"A1-e1"}


def test_a_figure_sentence_keeps_the_quotes_behind_its_other_clauses() -> None:
    """A sentence that states a figure and also rests on advice or a requirement keeps the
    quotes that state no quantity (they hold its other clauses); only a quote whose
    quantities the sentence does not state is left out of its citation."""
    from keepstep.engine.kinds.claims import figure_holders

    quotes = {"A1-e1": "Delivery takes about 30 months from the order.",
              "A1-e2": "Buyers should order a hull in 2025, before steel prices rise again.",
              "A1-e3": "The yard advises buyers to wait for its next price list.",
              "B1-e1": "The yard quoted 22 million euro for a hull."}
    text = ("One source advises ordering in 2025, the yard advises waiting; delivery takes "
            "about 30 months from the order.")
    assert figure_holders(text, list(quotes), quotes) == ["A1-e1", "A1-e2", "A1-e3"]
    # none of the cited quotes holds the stated figure: every id stays, as before
    assert figure_holders("It costs 99 euro.", ["A1-e2", "B1-e1"], quotes) == ["A1-e2", "B1-e1"]


def test_the_offline_heuristic_cites_one_quote_per_finding() -> None:
    """The offline heuristic's findings state their lead statement and cite that quote only,
    never several sources where one holds the figure."""
    from keepstep.engine.kinds.claims import figure_holders

    pack = PackRunner()
    pack.run_all(until="U30")
    claims = [c for u in pack.plan.units if u.kind.value == "synthesize"
              for c in json.loads(pack.artifacts[u.id]["synthesis.json"])["claims"]]
    assert claims
    for c in claims:
        assert len(c["evidence_ids"]) == 1 and len(c["source_ids"]) == 1, c
    quotes = {k: v for u in pack.plan.units if u.kind.value == "synthesize"
              for k, v in json.loads(pack.artifacts[u.id]["synthesis.json"])["quotes"].items()}
    assert all(figure_holders(c["text"], c["evidence_ids"], quotes) == c["evidence_ids"]
               for c in claims)


def test_provenance_names_the_answering_model_and_the_offline_notice_comes_first() -> None:
    """Every document names the models that answered (recorded by the units that called
    them), not a notice read from an answer; an offline heuristic's document says so in its
    first line whatever the template; the CSV can carry the models as a column."""
    artifacts = _synthesis_and_ranking()
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    _run(ctx)
    memo = ctx.outputs["memo.md"].decode()
    # A closing line a client reads (issue 20): the model named, no production wording.
    assert (f"\n_Prepared with the {MODEL} language model; every figure is checked against "
            "the quoted sources._\n") in memo
    assert "Models that answered" not in memo
    assert "offline heuristic" not in memo and memo.startswith("# Pilot review")
    ctx.templates["table"] = "- id\n- models\n"
    table = _ctx("T1", artifacts, lambda p: {}, profile=None)
    table.templates["table"] = "- id\n- models\n"
    _run(table)
    assert table.outputs["table.csv"].decode().splitlines()[1] == f"A1-e1,{MODEL}"

    pack = PackRunner()
    pack.run_all(until="U33")
    for uid, name in (("U31", "report.md"), ("U33", "decision-brief.md")):
        text = pack.artifacts[uid][name].decode()
        assert text.startswith("> **Written by keepstep's offline heuristic model")
        assert "Prepared with keepstep's offline heuristic model (local/keepstep-offline: " \
            "rules, no language model)" in text
        assert "Research pack" not in text


def test_every_csv_names_the_models_that_answered_and_offline_says_so_first() -> None:
    """A CSV gets a models column whatever its template lists: the model the units recorded
    for their calls, the offline heuristic named as such; an offline run's Markdown documents
    open with the offline notice."""
    artifacts = _synthesis_and_ranking()
    table = _ctx("T1", artifacts, lambda p: {}, profile=None)
    table.templates["table"] = "- id\n- quote\n"
    assert _run(table).passed
    rows = list(csv.DictReader(io.StringIO(table.outputs["table.csv"].decode())))
    assert list(rows[0]) == ["id", "quote", "models"] and {r["models"] for r in rows} == {MODEL}

    pack = PackRunner()
    pack.run_all()
    deliverables = [u.id for u in pack.plan.units if u.kind.value == "render"]
    assert deliverables
    for uid in deliverables:
        for name, data in pack.artifacts[uid].items():
            text = data.decode()
            if name.endswith(".csv"):
                models = {r["models"] for r in csv.DictReader(io.StringIO(text))}
                assert models == {"local/keepstep-offline (offline heuristic: rules, no "
                                  "language model)"}, (uid, models)
            elif name.endswith(".md"):
                assert text.startswith("> **Written by keepstep's offline heuristic"), uid


def test_a_derived_figure_reaches_the_document_as_a_checked_calculation() -> None:
    """A finding's calculation from cited figures passes synthesize, shows in the document
    beside its figure, and passes the audit's figures check; a wrong one fails it."""
    artifacts = _verified()
    synth = Script(synthesize=[{"claims": [
        {"text": "Readings arrived on time for 97% of meters.", "evidence_ids": ["A1-e1"]},
        {"text": "About 1,164 of the pilot's meters reported on time.",
         "evidence_ids": ["A1-e1", "A1-e2"], "calculation": "1,200 * 97% = 1,164",
         "confidence": "medium", "confidence_reason": "the on-time share is for the pilot "
         "only"}, {"text": "The pilot had 1,200 meters.", "evidence_ids": ["A1-e2"],
         "confidence": "low"}]}])
    assert _run(_ctx("S1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                     else synth(p))).passed
    _run(_ctx("R1", artifacts, Script(rank=[{"risks": []}], check=[{"problems": []}])))
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    _run(ctx)
    memo = ctx.outputs["memo.md"].decode()
    # Readable arithmetic, not inline code (issue 20); the audit reads it back below.
    assert "1,164 of the pilot's meters reported on time. (calculated: 1,200 × 97% = 1,164)" \
        " This is held with medium confidence: the on-time share is for the pilot only." in memo
    # A confidence the finding gives no reason for is not shown (no bare tag).
    assert "The pilot had 1,200 meters. (Pilot report" in memo and "confidence: low" not in memo
    assert "_(confidence" not in memo
    audit = _ctx("A2", artifacts, lambda p: {}, profile=None)
    assert _run(audit).passed, audit.json_output("audit.json")
    artifacts["D1"]["memo.md"] = memo.replace("1,164", "1,100").encode()
    audit = _ctx("A2", artifacts, lambda p: {}, profile=None)
    assert not _run(audit).passed
    assert "states 1,100" in audit.json_output("audit.json")["checks"][0]["detail"]


def test_a_ranking_must_carry_the_criteria_and_fields_its_unit_asks_for() -> None:
    """An option without a value for a criterion, or without the asked rationale, is revised.
    (Options are answered as "items" with points per criterion since issue 20's rebuildable
    scores: the feedback names items[0], not risks[0] as before; code adds the points.)"""
    artifacts = _verified()
    thin = {"items": [{"id": "R1", "title": "Annual subscription", "evidence_ids": ["B1-e1"],
                       "criteria": {"fit": "good"}, "points": {"fit": 4}}]}
    full = {"items": [{"id": "R1", "title": "Annual subscription",
                       "evidence_ids": ["B1-e1"], "rationale": "lower price",
                       "criteria": {"fit": "good", "price per meter": "NVK 40"},
                       "points": {"fit": 4, "price per meter": 5}}]}
    ctx = _ctx("R1", artifacts, Script(rank=[thin, full], check=[{"problems": []}]))
    assert _run(ctx).passed
    ranks = [c for c in ctx.calls if c["task"] == "rank"]
    assert len(ranks) == 2
    feedback = ranks[1]["messages"][-1]["content"]
    assert "items[0].criteria [criterion]" in feedback and "items[0].rationale [asked]" in feedback
    assert "items[0].points [points]" in feedback
    ranked = ctx.json_output("ranking.json")["risks"][0]
    assert ranked["rationale"] == "lower price" and ranked["score"] == 9


def test_gaps_are_a_list_in_the_findings_only_when_no_section_lists_them() -> None:
    """A synthesis's gaps: with no gaps section in the template, the findings end with them
    as a list (never a ".;" run-on); with one, the findings leave them to it."""
    artifacts = _verified()
    synth = Script(synthesize=[{"claims": [
        {"text": "Readings arrived on time for 97% of meters.", "evidence_ids": ["A1-e1"]}],
        "gaps": ["No source gives the pilot's cost.", "The towns are not named."]}])
    assert _run(_ctx("S1", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                     else synth(p))).passed
    _run(_ctx("R1", artifacts, Script(rank=[{"risks": []}], check=[{"problems": []}])))
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    ctx.templates["memo"] = "# {{ title }}\n\n## Findings\n\n{{ findings }}\n"
    assert _run(ctx).passed
    memo = ctx.outputs["memo.md"].decode()
    assert "Not answered by the sources:\n\n- No source gives the pilot's cost.\n" \
        "- The towns are not named." in memo and ".;" not in memo
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    ctx.templates["memo"] = ("# {{ title }}\n\n## Findings\n\n{{ findings }}\n\n"
                             "## Open questions\n\n{{ gaps }}\n")
    assert _run(ctx).passed
    memo = ctx.outputs["memo.md"].decode()
    assert "Not answered by the sources" not in memo
    assert memo.count("No source gives the pilot's cost.") == 1


def test_the_prompts_ask_for_the_decision_answered_first_with_its_figures() -> None:
    """The synthesize and render prompts (written for real models; the offline heuristic
    answers the same prompts) tell the model to answer each question of the decision first
    (yes/no/which, with the figures, derived ones by a checked calculation) and to say the
    evidence does not support a change rather than only "not found"; a written section's
    INPUT carries the contract's decision when the unit reads it (declares contract:goal, or
    depends on a contract intake), and only then: an undeclared goal would not invalidate
    the render when it is edited (issue 20)."""
    from keepstep.engine.gateway.prompts import load_prompt

    for name in ("synthesize", "render"):
        prompt = load_prompt(name)
        system = " ".join(prompt.system.split())
        assert "Answer the decision first" in system, name
        assert "yes or no, or which option" in system and "calculation" in system, name
        assert '"the evidence does not support a change to X"' in system, name
        assert 'not only "not found in the evidence"' in system, name
        assert "yes/no/which" in prompt.user, name
    artifacts = _synthesis_and_ranking()
    good = {"sentences": [{"text": "The pilot covered 1,200 meters.",
                           "evidence_ids": ["A1-e2"]}]}
    ctx = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
               else good)
    ctx.contract = Contract(fields={"audience": "board",
                                    "goal": "Decide whether to extend the pilot"}, body="")
    assert _run(ctx).passed
    first = next(c["payload"] for c in ctx.calls if c["task"] == "render")
    assert "decision" not in first  # D2 does not declare contract:goal
    declared = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                    else good)
    declared.unit = declared.unit.model_copy(
        update={"inputs": [*declared.unit.inputs, "contract:goal"]})
    declared.contract = ctx.contract
    assert _run(declared).passed
    first = next(c["payload"] for c in declared.calls if c["task"] == "render")
    assert first["decision"] == "Decide whether to extend the pilot"


def test_a_section_is_written_from_what_it_declares_and_checked_before_it_is_accepted() -> None:
    """A `section` fill names what it is made of: the model gets those inputs only (no
    ranking here), its sentences are checked (an unsupported one is revised); offline the
    same section is composed by rule from the same inputs."""
    artifacts = _synthesis_and_ranking([CONFLICT])
    unsupported = {"sentences": [{"text": "The pilot pleased every customer.",
                                  "evidence_ids": ["A1-e1"]}]}
    good = {"sentences": [{"text": "The pilot covered 1,200 meters, and 97% reported on time.",
                           "evidence_ids": ["A1-e1", "A1-e2"]}]}

    def support(payload: dict[str, Any]) -> dict[str, Any]:
        return {"verdicts": [{"claim": c["id"], "verdict": "contradicts" if "pleased" in
                              c["text"] else "supports"} for c in payload["claims"]]}

    script = Script(render=[unsupported, good])
    ctx = _ctx("D2", artifacts, lambda p: support(p) if p["task"] == "support" else script(p))
    assert _run(ctx).passed
    first = next(c["payload"] for c in ctx.calls if c["task"] == "render")
    assert first["made_of"] == ["findings", "conflicts"] and "rankings" not in first
    assert first["conflicts"][0]["cls"] == "unexplained"
    assert set(first["evidence"]) == {"A1-e1", "A1-e2", "B1-e1", "B1-e2"}
    assert [c["task"] for c in ctx.calls] == ["render", "support", "render", "support"]
    brief = ctx.outputs["brief.md"].decode()
    assert "- The pilot covered 1,200 meters, and 97% reported on time. (Pilot report (A1), " \
        "p. 1 · p. 2)[^1]" in brief and "pleased" not in brief

    offline = _ctx("D2", artifacts, lambda p: {}, profile=None)
    assert _run(offline).passed and offline.calls == []
    brief = offline.outputs["brief.md"].decode()
    assert "- Readings arrived on time for 97% of meters." in brief and "**Unresolved**" in brief
    assert "| Rank |" not in brief


# --- disagreements ---------------------------------------------------------------------------
def test_the_conflicts_section_names_each_side_and_the_audit_holds_documents_to_it() -> None:
    """An unexplained disagreement is listed with both sides and "unresolved"; a document that
    says none were found, or states one side as fact, fails the audit's conflicts check."""
    artifacts = _synthesis_and_ranking([CONFLICT])
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    _run(ctx)
    memo = ctx.outputs["memo.md"].decode()
    section = memo[memo.index("## Where the sources disagree"):]
    assert "NVK 40 (Price list (B1), Prices)[^" in section and "NVK 46" in section
    assert "**Unresolved**" in section
    # The options table states one side (NVK 40, B1-e1) as a plain fact: the audit fails it.
    audit = _ctx("A1", artifacts, lambda p: {}, profile=None)
    assert not _run(audit).passed
    [check] = audit.json_output("audit.json")["checks"]
    assert "states NVK 40 (list price, B1-e1) as fact" in check["detail"]
    memo = "\n".join(x for x in memo.splitlines() if not x.startswith("| 1 |"))
    artifacts["D1"]["memo.md"] = memo.encode()
    audit = _ctx("A1", artifacts, lambda p: {}, profile=None)
    assert _run(audit).passed, audit.json_output("audit.json")

    artifacts["D1"]["memo.md"] += b"\nNo conflicting figures were found.\n"
    _run(audit := _ctx("A1", artifacts, lambda p: {}, profile=None))
    [check] = audit.json_output("audit.json")["checks"]
    assert not check["passed"] and "says no disagreement was found" in check["detail"]

    artifacts["D1"]["memo.md"] = memo.encode() + (
        b"\n- The list price is NVK 46 per meter. [B1-e2] (B1, Prices)\n")
    _run(audit := _ctx("A1", artifacts, lambda p: {}, profile=None))
    [check] = audit.json_output("audit.json")["checks"]
    assert not check["passed"] and "states NVK 46 (list price, B1-e2) as fact" in check["detail"]


# --- honesty of the answer and the price -----------------------------------------------------
def test_a_repaired_answer_is_treated_as_truncated_and_revised() -> None:
    """JSON that stops before it closes (json-repair would invent its end) is a `truncated`
    problem and the step asks again; trailing commas are still simply read."""
    value, problems = parse_json_answer('{"claims": [{"text": "Readings arrived on time for 9')
    assert value is not None and [p.rule for p in problems] == ["truncated"]
    assert parse_json_answer('{"a": [1, 2,],}') == ({"a": [1, 2]}, [])
    _, parsed, problems = check_answer('{"claims": [{"text": "x"', SynthesisAnswer)
    assert parsed and problems[0].rule == "truncated"

    full = json.dumps({"claims": [{"text": "Readings arrived on time for 97% of meters.",
                                   "evidence_ids": ["A1-e1"]}]})
    answers = [full[:60], full]

    class Cut(FakeContext):
        def call_model(self, call: Any, *, check: Any) -> Any:
            from keepstep.engine.kinds.model_step import CheckedAnswer
            self.calls.append({"revision": call.revision, "messages": call.messages})
            content = answers[min(len(self.calls) - 1, 1)]
            value, parsed, problems = check(content)
            return CheckedAnswer(content=content, value=value, parsed=parsed,
                                 problems=problems)

    base = _ctx("S1", _verified(), lambda p: {})
    ctx = Cut(**{f: getattr(base, f) for f in ("unit", "plan", "contract", "snapshot",
                                                "sources", "texts", "artifacts", "responder")})
    step = run_model_step(ctx, prompt="synthesize", inputs={"task": "synthesize"},
                          schema=SynthesisAnswer)
    assert step.ok and step.calls == 2
    assert "truncated" in ctx.calls[1]["messages"][-1]["content"]


def test_an_unknown_price_under_a_cost_budget_blocks(tmp_path: Any) -> None:
    """A model litellm has no price for, called at its provider under a cost limit, is
    refused before the call (a budget block that says what to do); behind the person's own
    server (api_base), or without a cost limit, or offline, it is called."""
    from types import SimpleNamespace

    from keepstep.storage.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "state")
    store.create_run("R", {}, limits={"calls": 10, "cost": 1.0})
    store.create_run("N", {}, limits={"calls": 10})
    ctx = SimpleNamespace(unit="U1", attempt="U1/a1", round=1)
    hosted = StoreCallLedger(store, "R", "main", api_base_for=lambda m: None)
    with pytest.raises(UnpricedModel) as info:
        hosted.reserve(ctx, model="anthropic/unpriced-model", request_hash="h", est_tokens=10)
    assert isinstance(info.value, BudgetExhausted)
    assert "no known price" in str(info.value) and "keepstep.toml" in info.value.hint
    assert hosted.reserve(ctx, model="anthropic/priced", request_hash="h", est_tokens=10,
                          est_cost=0.01)
    assert hosted.reserve(ctx, model="local/keepstep-offline", request_hash="h", est_tokens=1)
    served = StoreCallLedger(store, "R", "main", api_base_for=lambda m: "http://127.0.0.1:1")
    assert served.reserve(ctx, model="openai/own-server", request_hash="h", est_tokens=10)
    free = StoreCallLedger(store, "N", "main", api_base_for=lambda m: None)
    assert free.reserve(ctx, model="anthropic/unpriced-model", request_hash="h", est_tokens=10)
    store.close()


def test_an_unreachable_api_base_says_so_at_once() -> None:
    """A refused connection or an unresolvable host is a permanent error naming the api_base;
    a reset connection is still retried."""
    refused = classify(ConnectionRefusedError(111, "Connection refused"))
    assert isinstance(refused, PermanentModelError) and "unreachable" in str(refused)
    assert "api_base" in (refused.hint or "")
    assert isinstance(classify(ConnectionResetError("reset")), TransientModelError)


CONFLICTS_PACK = __import__("pathlib").Path(__file__).parent / "fixtures" / "conflicts_pack"
DOCUMENT_UNITS = """
[[unit]]
id = "U05"
title = "What the sources say about the ferries"
phase = "synthesis"
kind = "synthesize"
outputs = ["synthesis.json", "synthesis.md"]
depends_on = ["U04"]

[[unit]]
id = "U07"
title = "Memo"
phase = "deliverables"
kind = "render"
inputs = ["template:memo"]
outputs = ["memo.md"]
depends_on = ["U05"]
params = { document = "memo", template = "memo" }

[[unit]]
id = "U08"
title = "Audit"
phase = "audit"
kind = "audit"
outputs = ["audit.json"]
depends_on = ["U07", "U04"]
params = { checks = [{ check = "conflicts", documents = ["memo"] }] }
"""


def test_a_pack_with_planted_disagreements_comes_out_with_each_shown_offline() -> None:
    """The conflicts test pack, offline, to a memo: its disagreement section names each real
    disagreement with its class and the value used (none for the unresolved one, all three
    sides shown), lists the apparent one apart, a finding citing a superseded or out-of-date
    figure says so, and the audit's conflicts check passes."""
    plan = parse_plan((CONFLICTS_PACK / "plan.toml").read_text() + DOCUMENT_UNITS)
    runner = PackRunner(CONFLICTS_PACK, plan=plan)
    runner.templates["memo"] = ("# {{ title }}\n\n## Findings\n\n{{ findings }}\n\n"
                                "## Where the sources disagree\n\n{{ conflicts }}\n")
    runner.run_all()
    assert runner.outcomes["U07"].passed and runner.outcomes["U08"].passed
    memo = runner.artifacts["U07"]["memo.md"].decode()
    section = _body(memo[memo.index("## Where the sources disagree"):])
    lines = {line.split("**")[1]: line for line in section.splitlines()
             if line.startswith("- **")}
    assert "**Superseded**: we use 398,000." in lines[
        "passengers travelled (Tarnlake, 2023)"]
    assert "**Out of date**: we use 140." in lines["euro berth (Kelvmoor, 2025)"]
    assert "**Two definitions, both valid**" in lines["full-time staff (Tarnlake, 2024)"]
    hull = lines["euro hull (Brisland, 2024)"]
    assert "**Unresolved**" in hull and all(v in hull for v in ("18 million", "22 million",
                                                                  "20 million"))
    apparent = section[section.index("Figures that look alike"):]
    assert "960" in apparent and "720" in apparent
    findings = _body(memo[:memo.index("## Where the sources disagree")])
    # The disagreements section says which value holds: a finding carries no note stub.
    assert "_(Note:" not in findings and "figure from P1 is superseded" not in findings
    assert "No conflicting figures" not in memo
    # A template with no disagreements section: the finding says it in a plain sentence.
    runner.templates["memo"] = "# {{ title }}\n\n## Findings\n\n{{ findings }}\n"
    runner.run("U07")
    findings = _body(runner.artifacts["U07"]["memo.md"].decode())
    assert "The passengers travelled figure from P1 is superseded by a later source; " \
        "another source's value holds." in findings
    assert "_(Note:" not in findings


def test_validate_warns_of_a_model_whose_calls_the_cost_budget_will_block() -> None:
    """`keepstep validate`'s model check names an unpriced model under a cost budget (the
    docs' own anthropic/claude-3-5-haiku-latest), not a priced one, not one behind an
    api_base, and not without a cost limit."""
    from types import SimpleNamespace

    from keepstep.engine.gateway.model_check import check_project_models

    def config(cost: float | None, api_base: str | None = None) -> Any:
        return SimpleNamespace(
            budget=SimpleNamespace(cost=cost), api_base_for=lambda m: api_base,
            models_in_use=lambda units: {"anthropic/claude-3-5-haiku-latest": ["U5"],
                                         "openai/gpt-4o-mini": ["U6"]})

    env = {"ANTHROPIC_API_KEY": "x" * 20, "OPENAI_API_KEY": "x" * 20}
    found = check_project_models(config(5.0), [("U5", "synthesize")], env=env)
    unpriced = [f for f in found if "no known price" in f.message]
    assert [(f.level, f.model, f.units) for f in unpriced] == [
        ("warning", "anthropic/claude-3-5-haiku-latest", ["U5"])]
    for quiet in (config(None), config(5.0, api_base="http://127.0.0.1:9")):
        assert not [f for f in check_project_models(quiet, [], env=env)
                    if "no known price" in f.message]


def test_a_written_section_does_not_repeat_what_the_document_already_says() -> None:
    """A section written after the findings gets only findings not shown yet, and a sentence
    repeating one is revised."""
    artifacts = _synthesis_and_ranking([CONFLICT])
    repeated = {"sentences": [{"text": "Readings arrived on time for 97% of meters.",
                               "evidence_ids": ["A1-e1"]}]}
    new = {"sentences": [{"text": "Two price lists disagree on the list price.",
                          "evidence_ids": ["B1-e1", "B1-e2"]}]}
    script = Script(render=[repeated, new])
    ctx = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
               else script(p))
    ctx.templates["brief"] = "# Brief\n\n{{ findings }}\n\n## The case\n\n{{ case }}\n"
    assert _run(ctx).passed
    first, second = [c for c in ctx.calls if c["task"] == "render"]
    assert first["payload"]["findings"] == []  # every finding is shown above it
    assert "sentences[0].text [repeated]" in second["messages"][-1]["content"]
    brief = _body(ctx.outputs["brief.md"].decode())
    assert brief.count("Readings arrived on time for 97% of meters.") == 1
    assert "- Two price lists disagree on the list price." in brief
    # Its template has no {{ notice }}: the models that answered are named all the same.
    assert f"\n_Prepared with the {MODEL} language model; every figure is checked against " \
        "the quoted sources._\n" in brief


def test_a_section_over_its_word_budget_is_sent_back_naming_the_section_and_its_count(
) -> None:
    """A written section may declare a word budget (`words`): the writer is told it, a
    section more than a quarter over it comes back with the section named and its count,
    and one within it is accepted; without a budget the long one would have passed."""
    artifacts = _synthesis_and_ranking([CONFLICT])
    long = {"sentences": [{"text": "The pilot covered 1,200 meters, and 97% of them reported "
                           "their readings on time, which the pilot report states on its first "
                           "and on its second page for every meter it covered.",
                           "evidence_ids": ["A1-e1", "A1-e2"]}]}
    short = {"sentences": [{"text": "The pilot covered 1,200 meters; 97% reported on time.",
                            "evidence_ids": ["A1-e1", "A1-e2"]}]}
    budgeted = PLAN.replace('fill = { case = { part = "section", of = ["findings", '
                            '"conflicts"], from = ["S1"] } }', 'fill = { case = { part = '
                            '"section", of = ["findings", "conflicts"], from = ["S1"], words = '
                            '12 } }')
    assert budgeted != PLAN

    def written(plan_text: str) -> tuple[FakeContext, Any]:
        script = Script(render=[long, short])
        ctx = _ctx("D2", artifacts, lambda p: _all_supported(p) if p["task"] == "support"
                   else script(p))
        plan = parse_plan(plan_text)
        ctx.plan, ctx.unit = plan, plan.unit_map()["D2"]
        return ctx, _run(ctx)

    ctx, outcome = written(budgeted)
    assert outcome.passed
    first, second = [c for c in ctx.calls if c["task"] == "render"]
    assert first["payload"]["words"] == 12
    assert "sentences [too_long]: the case section runs to 32 words, over its budget of 12" \
        in second["messages"][-1]["content"]
    brief = ctx.outputs["brief.md"].decode()
    assert "- The pilot covered 1,200 meters; 97% reported on time." in brief
    assert "their readings on time" not in brief

    ctx, outcome = written(PLAN)  # no budget: the long section is accepted as it is
    assert outcome.passed and [c["task"] for c in ctx.calls].count("render") == 1
    assert "words" not in ctx.calls[0]["payload"]


def test_footnotes_are_one_per_quote_and_read_back_as_one_citation() -> None:
    """A sentence citing several quotes gets one footnote per quote (its evidence id, source
    title and place, and the quote), a quote cited again reuses its number, and the audit's
    reading puts the notes of one citation back together as a single ``[ids] (places)``."""
    from types import SimpleNamespace

    from keepstep.engine.kinds.render import with_footnotes

    src = SimpleNamespace(
        index={"A1-e1": {"source_id": "A1", "locator": "p. 1"},
               "A1-e2": {"source_id": "A1", "locator": "p. 2"},
               "B1-e1": {"source_id": "B1", "locator": ""}},
        titles={"A1": "Pilot report", "B1": "Price list"},
        quotes={"A1-e1": "1,200 meters were fitted.", "A1-e2": "97% reported on time.",
                "B1-e1": "The list price is NVK 46."})
    text = ("- Fitted and on time. [A1-e1, A1-e2, B1-e1] (A1, p. 1; A1, p. 2; B1)\n"
            "- On time. [A1-e2] (A1, p. 2)\n")
    out = with_footnotes(text, src)  # type: ignore[arg-type]
    assert "- Fitted and on time. (Pilot report (A1), p. 1 · p. 2; Price list (B1))[^1][^2][^3]" \
        in out
    assert "- On time. (Pilot report (A1), p. 2)[^2]\n" in out  # the same quote, its number
    assert "[^2]: [A1-e2] (A1, p. 2) — Pilot report (A1), p. 2: “97% reported on time.”" in out
    assert out.count("[^2]: ") == 1 and "[^4]" not in out
    back = expand_footnotes(out)
    assert "- Fitted and on time. [A1-e1, A1-e2, B1-e1] (A1, p. 1; A1, p. 2; B1)" in back
    assert "- On time. [A1-e2] (A1, p. 2)" in back and "[^" not in back


def test_evidence_ids_leave_the_prose_and_stay_in_citations_and_the_appendix() -> None:
    """A disagreement's reason naming an evidence id ("the first list (B1-e1)") reaches the
    memo with the source's id instead; the footnotes keep theirs, as does a table cell holding
    only an id (an evidence appendix) and a bracketed citation."""
    conflict = {**CONFLICT, "reason": "the first list (B1-e1) and the second (B1-e2) are of "
                "the same date"}
    artifacts = _synthesis_and_ranking([conflict])
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    _run(ctx)
    memo = ctx.outputs["memo.md"].decode()
    assert "The first list (B1) and the second (B1) are of the same date." in memo
    assert "[^1]: [A1-e1]" in memo  # the footnotes are the citations
    assert without_prose_ids("| B1-e1 | B1 | figure | the list (B1-e2) |\n"
                             "- NVK 40 [B1-e1] (B1, Prices); see B1-e2.") == (
        "| B1-e1 | B1 | figure | the list (B1) |\n- NVK 40 [B1-e1] (B1, Prices); see B1.")


def test_a_calculation_reads_as_arithmetic_and_reads_back_for_the_checks() -> None:
    """A recorded calculation is shown with grouped thousands and ×, ÷, − (a year is not
    grouped); the checks read the shown form back to arithmetic they recompute, and still
    read an older document's inline-code form."""
    shown = shown_calculation("2600 * 140 = 364000; 2600 * (140 - 120) = 52000")
    assert shown == "(calculated: 2,600 × 140 = 364,000; 2,600 × (140 − 120) = 52,000)"
    assert shown_calculation("2026 - 2024 = 2") == "(calculated: 2026 − 2024 = 2)"
    match = CALCULATED_RE.search(f"the fees come to 364,000 euro {shown} [Q2-e1]")
    assert match and recorded_calculation(match) == \
        "2,600 * 140 = 364,000; 2,600 * (140 - 120) = 52,000"
    assert evaluate("2,600 * (140 - 120)") == 52000
    old = CALCULATED_RE.search("(calculated: `22 - 18 = 4`)")
    assert old and recorded_calculation(old) == "22 - 18 = 4"
