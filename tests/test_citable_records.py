"""Disagreements and ranked items a claim may cite beside its quotes (issue 20, from the
real model's remarks on the conflicts pack: 0014-0017 "140 holds" could not be said because
the reason rests on source dates in no quote; 0024-0025 "deferral ranks last" was revised
away because a recommendation could only restate quotes)."""

from __future__ import annotations

import json
from typing import Any

from keepstep.engine.core.inputs import Contract, InputSnapshot
from keepstep.engine.core.plan import parse_plan
from keepstep.engine.kinds.citable import conflict_text, human_date, ranking_text
from tests.support.fake_context import FakeContext
from tests.test_documents import (
    MEMO,
    PLAN,
    PROFILE,
    Script,
    _ctx,
    _run,
    _synthesis_and_ranking,
    _verified,
)

SETTLED = {"id": "K1", "metric": "list price", "entity": "meter", "period": "",
           "sides": [{"evidence_id": "B1-e1", "source_id": "B1", "value": "NVK 40",
                      "source_title": "Price list", "source_date": "2023-01-10",
                      "quote": "The list price is NVK 40 per meter per year."},
                     {"evidence_id": "B1-e2", "source_id": "B1", "value": "NVK 46",
                      "source_title": "Price list", "source_date": "2025-02-01",
                      "quote": "The list price is NVK 46 per meter per year."}],
           "class": "superseded", "holds": "NVK 46", "holds_ids": ["B1-e2"],
           "reason": "the list of 1 February 2025 replaces the 2023 list"}
HOLDS = "The list price is NVK 46 per meter: the list of 1 February 2025 replaces the 2023 one."


def _record_backed(payload: dict[str, Any]) -> dict[str, Any]:
    """A support check that reads what it is given: a claim is supported when one of its
    cited texts states the value that holds and the date it states, else not addressed."""
    verdicts = []
    for c in payload["claims"]:
        texts = " ".join(q["quote"] for q in c["quotes"])
        ok = "NVK 46" not in c["text"] or (
            "The value that holds: NVK 46" in texts and "1 February 2025" in texts)
        verdicts.append({"claim": c["id"], "verdict": "supports" if ok else
                         "does_not_address", "reason": "" if ok else "no quote says which holds"})
    return {"verdicts": verdicts}


def test_a_disagreement_record_names_sides_dates_class_value_and_reason() -> None:
    text = conflict_text(SETTLED)
    assert text.startswith("Disagreement K1 on list price (meter): superseded")
    assert "NVK 40 in B1-e1 from Price list (B1), dated 10 January 2023" in text
    assert "NVK 46 in B1-e2 from Price list (B1), dated 1 February 2025" in text
    assert "The value that holds: NVK 46 (B1-e2)." in text
    assert text.endswith("Why: the list of 1 February 2025 replaces the 2023 list")
    assert human_date("2024-13-40") == "2024-13-40" and human_date("") == ""


def test_a_claim_citing_the_settled_disagreement_passes_and_cites_its_sides() -> None:
    """Citing only the newer quote, nothing the claim cites says which list holds (the support
    check sends it back, as the real model's did, remark 0015); citing the disagreement K1,
    its dates, value and reason are in the record, the support check sees the record and
    passes it, and the synthesis cites the sides' evidence with the disagreement beside it."""
    quote_only = {"claims": [{"text": HOLDS, "evidence_ids": ["B1-e2"]}]}
    with_record = {"claims": [{"text": HOLDS, "evidence_ids": ["B1-e2", "K1"]}]}
    script = Script(synthesize=[quote_only, with_record])
    ctx = _ctx("S1", _verified([SETTLED]),
               lambda p: _record_backed(p) if p["task"] == "support" else script(p))
    assert _run(ctx).passed
    assert [c["task"] for c in ctx.calls] == ["synthesize", "support", "synthesize", "support"]
    first = ctx.calls[0]["payload"]
    assert first["conflicts"][0]["id"] == "K1"
    revise = ctx.calls[2]["messages"][-1]["content"]
    assert "support:does_not_address" in revise and "no quote says which holds" in revise
    [claim] = ctx.calls[3]["payload"]["claims"]
    assert [q["id"] for q in claim["quotes"]] == ["B1-e2", "K1"]
    doc = ctx.json_output("synthesis.json")
    [finding] = doc["claims"]
    assert finding["text"] == HOLDS and finding["support"] == "supports"
    assert finding["evidence_ids"] == ["B1-e2", "B1-e1"] and finding["conflict_ids"] == ["K1"]
    assert "K1" not in ctx.outputs["synthesis.md"].decode()


def test_a_written_section_may_cite_the_disagreement_and_the_document_cites_its_quotes() -> None:
    """A section made of findings and disagreements gets the records it may cite; a sentence
    saying which value holds cites K1 and the document's citation is the sides' quotes."""
    artifacts = _synthesis_and_ranking([SETTLED])
    script = Script(render=[{"sentences": [{"text": HOLDS, "evidence_ids": ["K1"]}]}])
    ctx = _ctx("D2", artifacts, lambda p: _record_backed(p) if p["task"] == "support"
               else script(p))
    assert _run(ctx).passed
    render = next(c["payload"] for c in ctx.calls if c["task"] == "render")
    assert "The value that holds: NVK 46" in render["citable_records"]["K1"]
    brief = ctx.outputs["brief.md"].decode()
    # one footnote per quote the record rests on (each with its source title and place)
    assert f"- {HOLDS} (Price list (B1), Prices)[^1][^2]" in brief
    assert "[^1]: [B1-e1] (B1, Prices) — Price list (B1), Prices: “" in brief
    assert "[^2]: [B1-e2] (B1, Prices) — Price list (B1), Prices: “" in brief
    assert "K1" not in brief


def test_the_audit_fails_a_line_offering_a_settled_disagreement_as_open() -> None:
    """Verify settled NVK 46; a memo line giving NVK 40 and NVK 46 and asking the reader to
    confirm which applies fails the conflicts check; the line saying NVK 46 holds passes."""
    artifacts = _synthesis_and_ranking([SETTLED])
    ctx = _ctx("D1", artifacts, lambda p: {"sentences": []}, profile=None)
    _run(ctx)
    memo = ctx.outputs["memo.md"].decode()
    open_line = ("\n- The list price is NVK 40 or NVK 46 per meter; the board should confirm "
                 "which applies. [B1-e1, B1-e2] (B1, Prices)\n")
    artifacts["D1"]["memo.md"] = (memo + open_line).encode()
    _run(audit := _ctx("A1", artifacts, lambda p: {}, profile=None))
    [check] = audit.json_output("audit.json")["checks"]
    assert not check["passed"]
    assert "offers the sides of a settled disagreement (list price: NVK 40, NVK 46) as open, " \
        "but NVK 46 holds (superseded)" in check["detail"]
    settled_line = open_line.replace("the board should confirm which applies",
                                     "NVK 46 holds, as the newer list replaces NVK 40")
    artifacts["D1"]["memo.md"] = (memo + settled_line).encode()
    _run(audit := _ctx("A1", artifacts, lambda p: {}, profile=None))
    assert audit.json_output("audit.json")["checks"][0]["passed"]


def test_a_recommendation_resting_on_the_ranking_cites_it_and_passes() -> None:
    """A section made of the ranking: each ranked option is a record (its place, score,
    criteria, rationale); "the per-reading fee ranks last" cites R1.R2, the support check
    reads the ranking and passes it (it is not sent back to restate quotes), and the
    document cites the option's evidence."""
    plan = parse_plan(PLAN.replace('of = ["findings", "conflicts"], from = ["S1"]',
                                   'of = ["rankings"], from = ["R1"]'))
    artifacts = _synthesis_and_ranking()
    assert "ranks 2 of 2 (last)" in ranking_text(
        "R1", json.loads(artifacts["R1"]["ranking.json"]),
        json.loads(artifacts["R1"]["ranking.json"])["risks"][1])
    sentence = "The per-reading fee ranks last of the two pricing options."
    script = Script(render=[{"sentences": [{"text": sentence, "evidence_ids": ["R1.R2"]}]}])

    def support(payload: dict[str, Any]) -> dict[str, Any]:
        return {"verdicts": [{"claim": c["id"], "verdict": "supports" if any(
            "ranks 2 of 2 (last)" in q["quote"] for q in c["quotes"]) else "does_not_address"}
            for c in payload["claims"]]}

    ctx = FakeContext(unit=plan.unit_map()["D2"], plan=plan,
                      contract=Contract(fields={"audience": "board"}, body=""),
                      snapshot=InputSnapshot(sources={}, groups={}), sources={}, texts={},
                      artifacts=artifacts, templates={
                          "memo": MEMO, "brief": "# Brief\n\n## The case\n\n{{ case }}\n"},
                      responder=lambda p: support(p) if p["task"] == "support" else script(p),
                      profile=PROFILE)
    assert _run(ctx).passed
    render = next(c["payload"] for c in ctx.calls if c["task"] == "render")
    assert render["rankings"][0]["items"][1]["record_id"] == "R1.R2"
    assert [c["task"] for c in ctx.calls] == ["render", "support"]
    brief = ctx.outputs["brief.md"].decode()
    assert f"- {sentence} (" in brief and "[A1-e1]" in brief and "R1.R2" not in brief


def test_a_documents_text_carries_no_bare_record_id() -> None:
    """A writer's "(K1)" after a settled value points a reader nowhere (the record is cited
    by footnote as its evidence): it is removed; a parenthesis holding anything else, or an
    id that is not a cited record (a source may be called K1), stays."""
    from keepstep.engine.kinds.citable import drop_record_labels

    text = ("The fee is 140 euro, replacing the 2023 notice (K1); ridership is 398,000 "
            "(K4, K5). Staff count 450 (see P1).")
    assert drop_record_labels(text, ["K1", "K4", "K5"]) == (
        "The fee is 140 euro, replacing the 2023 notice; ridership is 398,000. "
        "Staff count 450 (see P1).")
    assert drop_record_labels("A figure (K1).", []) == "A figure (K1)."
    assert drop_record_labels("A figure (K1).", ["K2"]) == "A figure (K1)."


def test_a_gap_names_its_synthesis_only_when_several_name_gaps() -> None:
    """One synthesis's title after every gap line says nothing to a reader: it is shown only
    when several syntheses name gaps (then it says which one found it)."""
    from types import SimpleNamespace
    from typing import Any, cast

    from keepstep.engine.kinds.parts import gaps

    one = SimpleNamespace(syntheses=[{"title": "What the figures say", "gaps": ["No price."]},
                                     {"title": "Risks", "gaps": []}])
    assert gaps(cast(Any, one)) == "- No price."
    two = SimpleNamespace(syntheses=[{"title": "Prices", "gaps": ["No price."]},
                                     {"title": "Risks", "gaps": ["No owner."]}])
    assert gaps(cast(Any, two)) == "- No price. (Prices)\n- No owner. (Risks)"
