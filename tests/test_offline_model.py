"""Pins the offline heuristic model and the 163-statement market-entry sample pack (ME-042):
160 prose sentences plus the 3 rows of E1's volume-tier table (E1 is an Excel workbook)."""

from __future__ import annotations

import copy
import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from keepstep.engine.files.convert import convert
from keepstep.engine.gateway.offline_model import (
    HEURISTIC_NOTICE,
    MODEL_NAME,
    check_ranking,
    count_tokens,
    extract_evidence,
    respond,
)

PACK = Path(__file__).resolve().parent.parent / "sample_projects" / "market-entry"

# Per-group counts the plan's extraction units E01-E12 rely on; change only with ME-042.
EXPECTED_GROUP_COUNTS = {
    "A": 14, "B": 14, "C": 14, "D": 14, "E": 16, "F": 13,
    "G": 13, "H": 13, "I": 13, "J": 13, "K": 13, "L": 13,
}


def _sources() -> list[dict]:
    return tomllib.loads((PACK / "sources.toml").read_text(encoding="utf-8"))["source"]


def _text(source: dict) -> str:
    """A source as units read it: its converted text (the file itself for Markdown)."""
    return convert(PACK / source["path"]).text
def _data(name: str) -> dict:
    return tomllib.loads((PACK / "data" / f"{name}.toml").read_text(encoding="utf-8"))


def _topics() -> list[dict]:
    """The pack's topics as the extract and synthesize prompts carry them."""
    return [{"name": t["name"], "keywords": t["keywords"]} for t in _data("topics")["topic"]]


def _reading(audience: str) -> dict:
    """What a synthesize INPUT carries for ``audience`` (kinds.common.reading_hints)."""
    view = _data("audiences")["audience"].get(audience) or _data("audiences")["default"]
    return {"topics": _topics(), "reading_order": view["order"], "labels": view["labels"]}


def _checklist(audience: str) -> list[dict]:
    """The pack's risk checklist weighed for ``audience`` (kinds.common.risk_checklist)."""
    focus = set(_data("audiences")["audience"][audience]["risk_focus"])
    return [{**r, "impact": min(5, r["impact"] + (r["key"] in focus))}
            for r in _data("risks")["risk"]]


def _pack_evidence() -> list[dict]:
    evidence: list[dict] = []
    for source in _sources():
        evidence += extract_evidence(source["id"], _text(source), topics=[
            (t["name"], tuple(t["keywords"])) for t in _topics()])
    return evidence


def test_pack_lists_48_approved_sources_in_12_groups_of_4() -> None:
    """sources.toml lists 48 approved sources, 4 per group A-L, whose files exist."""
    sources = _sources()
    assert len(sources) == 48
    assert all(s["approved"] is True for s in sources)
    assert Counter(s["group"] for s in sources) == {g: 4 for g in "ABCDEFGHIJKL"}
    for s in sources:
        path = PACK / s["path"]
        assert path.is_file(), s["path"]
        assert path.name.split("-")[0] == s["id"]
        assert s["title"] and s["kind"]


def test_pack_yields_exactly_163_statements() -> None:
    """The extractor finds exactly 163 evidence statements across the whole pack: 160
    sentences and 3 table rows (E1's volume tiers, one holding a figure found nowhere else)."""
    evidence = _pack_evidence()
    assert len(evidence) == 163
    rows = [e for e in evidence if " | " in e["quote"]]
    assert [e["quote"] for e in rows] == ["Standard | 1 | 0%", "Volume | 20,000 | 8%",
                                          "Framework | 50,000 | 12%"]
    assert all(e["source_id"] == "E1" for e in rows)


def test_per_group_counts_are_stable() -> None:
    """Each source group yields its pinned number of statements."""
    counts = Counter(e["source_id"][0] for e in _pack_evidence())
    assert dict(counts) == EXPECTED_GROUP_COUNTS


def test_evidence_ids_are_unique_and_quotes_are_verbatim() -> None:
    """Ids are unique, numbered from 1 per source, and each quote occurs in its source file."""
    evidence = _pack_evidence()
    assert len({e["id"] for e in evidence}) == len(evidence)
    texts = {s["id"]: _text(s) for s in _sources()}
    for e in evidence:
        assert e["quote"] in texts[e["source_id"]], e["id"]
        assert e["figures"], e["id"]
    assert extract_evidence("A1", texts["A1"])[0]["id"] == "A1-e1"


def test_headings_front_matter_and_link_lists_with_digits_are_not_counted() -> None:
    """Digits in headings, front matter, link lists and list markers never make evidence."""
    text = (
        "---\ndate: 2025-01-01\n---\n"
        "# Report 2026\n\n## 2026 outlook\n\n"
        "- [Notice 2024/17](https://example.org/2024-17)\n"
        "- https://example.org/stats/2024\n\n"
        "1. A numbered item without figures.\n"
        "Plain prose with no figures at all. Demand rose 12% last year.\n"
    )
    evidence = extract_evidence("X1", text)
    assert [e["quote"] for e in evidence] == ["Demand rose 12% last year."]


def test_decimals_and_abbreviations_do_not_split_sentences() -> None:
    """'4.5%', 'approx.', 'No.' and 'e.g.' stay inside one sentence."""
    text = ("Imports attract a duty of 4.5% of the value. Rulings take approx. 8 weeks under "
            "Notice No. 17 of the Authority. Growth was 11.5% in 2024, e.g. Ostmark added "
            "2,000 meters.")
    quotes = [e["quote"] for e in extract_evidence("X1", text)]
    assert quotes == [
        "Imports attract a duty of 4.5% of the value.",
        "Rulings take approx. 8 weeks under Notice No. 17 of the Authority.",
        "Growth was 11.5% in 2024, e.g. Ostmark added 2,000 meters.",
    ]
    assert extract_evidence("X1", text)[0]["figures"] == ["4.5%"]


def test_pack_decimal_statement_is_one_sentence() -> None:
    """The pack's import-duty statement with '4.5%' is extracted whole."""
    quotes = {e["quote"] for e in _pack_evidence()}
    assert ("Water meters imported from outside Norvania attract an import duty of 4.5% of the "
            "customs value.") in quotes


def test_topics_come_from_the_packs_topics() -> None:
    """Every statement is tagged with one of the pack's six topics (data/topics.toml); without
    topics in the prompt, every statement is filed under 'general'."""
    topics = {"market", "regulation", "competition", "pricing", "customer", "operations"}
    assert {t["name"] for t in _topics()} == topics
    assert {e["topic"] for e in _pack_evidence()} <= topics
    markdown = next(s for s in _sources() if s["path"].endswith(".md"))
    text = (PACK / markdown["path"]).read_text(encoding="utf-8")
    assert {e["topic"] for e in extract_evidence(markdown["id"], text)} == {"general"}


def test_verify_supports_quote_present_and_rejects_altered_figure() -> None:
    """A verbatim quote is supported; a changed figure or an absent quote is not."""
    passage = "Norvania has 1.9 million   connections.\nDuty is 4.5% of the value."
    result = respond({"task": "verify", "claims": [
        {"id": "c1", "quote": "duty is 4.5% of the value.", "source_id": "F4", "passage": passage},
        {"id": "c2", "quote": "Duty is 4.7% of the value.", "source_id": "F4", "passage": passage},
        {"id": "c3", "quote": "Duty is high.", "source_id": "F4", "passage": passage},
    ]})
    by_id = {r["id"]: r for r in result["results"]}
    assert by_id["c1"]["supported"] is True
    assert by_id["c2"]["supported"] is False and "4.7%" in by_id["c2"]["reason"]
    assert by_id["c3"]["supported"] is False and "not found" in by_id["c3"]["reason"]


def test_synthesize_cites_only_given_ids_and_differs_by_audience() -> None:
    """Findings cite only supplied evidence ids, number 3-6, and are ordered per audience."""
    evidence = _pack_evidence()
    known = {e["id"] for e in evidence}
    outputs = {}
    for audience in ("product team", "investment committee"):
        out = respond({"task": "synthesize", "question": "Enter Norvania?",
                       "audience": audience, "evidence": evidence, **_reading(audience)})
        assert 3 <= len(out["claims"]) <= 6
        for claim in out["claims"]:
            assert claim["evidence_ids"] and set(claim["evidence_ids"]) <= known
            for eid in claim["evidence_ids"]:
                assert f"[{eid}]" in out["summary"]
        outputs[audience] = out
    assert outputs["product team"]["summary"] != outputs["investment committee"]["summary"]
    assert outputs["product team"]["claims"][0]["text"].startswith("Pricing")
    assert outputs["investment committee"]["claims"][0]["text"].startswith("Market size")


def test_synthesize_tops_up_to_three_findings_from_few_topics() -> None:
    """With evidence in only one topic, it still states three findings when it can."""
    evidence = [{"id": f"P-e{n}", "quote": f"Price is NVK {n} per unit.", "source_id": "P",
                 "topic": "pricing", "figures": [str(n)]} for n in range(1, 8)]
    out = respond({"task": "synthesize", "question": "q", "audience": "product team",
                   "evidence": evidence, **_reading("product team")})
    cited = [i for c in out["claims"] for i in c["evidence_ids"]]
    assert len(out["claims"]) == 3 and len(cited) == len(set(cited))


def test_rank_loop_converges_by_round_two() -> None:
    """Round 1 has one unsupported risk that check_ranking flags; round 2 drops it, clean."""
    evidence = _pack_evidence()
    checklist = _checklist("product team")
    first = respond({"task": "rank", "audience": "product team", "evidence": evidence,
                     "round": 1, "feedback": None, "checklist": checklist})
    problems = check_ranking(first["risks"])
    unsupported = [r["id"] for r in first["risks"] if not r["evidence_ids"]]
    assert len(first["risks"]) > 5 and len(unsupported) == 1
    assert problems == [f"{unsupported[0]} cites no evidence"]
    second = respond({"task": "rank", "audience": "product team", "evidence": evidence,
                      "round": 2, "feedback": problems, "checklist": checklist})
    assert check_ranking(second["risks"], {e["id"] for e in evidence}) == []
    assert len(second["risks"]) == len(first["risks"]) - 1
    assert [r["id"] for r in second["risks"]] == [f"R{n}" for n in
                                                  range(1, len(second["risks"]) + 1)]
    assert all(1 <= r["score"] <= 25 for r in second["risks"])


def test_rank_small_evidence_has_no_unsupported_risk() -> None:
    """With 5 or fewer candidate risks, round 1 is already clean."""
    evidence = [{"id": "J2-e1", "quote": "Battery life was 13.2 years.", "figures": ["13.2"]}]
    out = respond({"task": "rank", "audience": "product team", "evidence": evidence,
                   "round": 1, "checklist": _checklist("product team")})
    assert out["risks"] and check_ranking(out["risks"]) == []
    assert out["risks"][0]["title"] == "Battery life below tender requirement"


def test_rank_without_a_checklist_reads_generic_risk_words() -> None:
    """A pack with no risk checklist still gets risks, from generic risk words in the
    statements, titled by the statement that shows each; none from a pack's own rules."""
    evidence = [{"id": "X1-e1", "quote": "Go-live slipped after a 6 week delay at two sites.",
                 "figures": ["6"]},
                {"id": "X2-e1", "quote": "The vendor had a backlog of 40 tickets.",
                 "figures": ["40"]},
                {"id": "X3-e1", "quote": "Battery life was 13.2 years.", "figures": ["13.2"]}]
    out = respond({"task": "rank", "audience": "operations director", "evidence": evidence,
                   "round": 1})
    titles = [r["title"] for r in out["risks"]]
    assert titles and all(t.startswith(("Go-live slipped", "The vendor had")) for t in titles)
    assert check_ranking(out["risks"], {"X1-e1", "X2-e1", "X3-e1"}) == []


def test_check_reports_claims_with_no_or_unknown_evidence() -> None:
    """The check task names claims citing no evidence or evidence it does not know."""
    out = respond({"task": "check", "evidence_ids_known": ["A1-e1"], "claims": [
        {"text": "fine", "evidence_ids": ["A1-e1"]},
        {"text": "bare", "evidence_ids": []},
        {"text": "made up", "evidence_ids": ["Z9-e9"]},
    ]})
    assert out["problems"] == ["claim 2 cites no evidence", "claim 3 cites unknown evidence Z9-e9"]


def test_summarise_respects_max_sentences() -> None:
    """Summarise returns at most max_sentences sentences taken from the text."""
    text = (PACK / "sources" / "B2-type-approval.md").read_text(encoding="utf-8")
    out = respond({"task": "summarise", "text": text, "max_sentences": 2})
    assert out["summary"] and out["summary"].count(". ") <= 1
    assert all(part in text for part in out["summary"].split(". "))


def test_same_input_gives_identical_output() -> None:
    """Every task is deterministic: the same payload twice gives byte-identical JSON."""
    evidence = _pack_evidence()
    payloads = [
        {"task": "extract", "source_id": "A1",
         "text": _text(_sources()[0])},
        {"task": "synthesize", "question": "q", "audience": "investment committee",
         "evidence": evidence, **_reading("investment committee")},
        {"task": "rank", "audience": "investment committee", "evidence": evidence, "round": 1,
         "checklist": _checklist("investment committee")},
        {"task": "summarise", "text": "A 1. B 2. C 3.", "max_sentences": 2},
    ]
    for payload in payloads:
        a = json.dumps(respond(copy.deepcopy(payload)), sort_keys=True)
        b = json.dumps(respond(copy.deepcopy(payload)), sort_keys=True)
        assert a == b
    assert _pack_evidence() == evidence


def test_unknown_task_raises_value_error_listing_known_tasks() -> None:
    """An unknown task raises ValueError whose message lists the known tasks."""
    with pytest.raises(ValueError, match="known tasks: check, extract, rank"):
        respond({"task": "dream"})


def test_every_response_carries_the_notice() -> None:
    """Every task's response includes the heuristic notice and is JSON-serialisable."""
    evidence = _pack_evidence()[:20]
    payloads = [
        {"task": "extract", "source_id": "X1", "text": "Growth was 5%."},
        {"task": "verify", "claims": [{"id": "c", "quote": "a 1", "source_id": "X",
                                       "passage": "a 1"}]},
        {"task": "synthesize", "question": "q", "audience": "product team", "evidence": evidence},
        {"task": "rank", "audience": "product team", "evidence": evidence, "round": 1},
        {"task": "check", "claims": [], "evidence_ids_known": []},
        {"task": "summarise", "text": "One 1. Two 2.", "max_sentences": 1},
    ]
    for payload in payloads:
        out = respond(payload)
        assert out["notice"] == HEURISTIC_NOTICE, payload["task"]
        json.dumps(out)
    assert MODEL_NAME in HEURISTIC_NOTICE


def test_count_tokens_is_ceil_of_quarter_length() -> None:
    """count_tokens is ceil(len/4): a stable, cheap estimate."""
    assert count_tokens("") == 0
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2


def test_verify_flags_conflicting_figures_for_the_same_metric() -> None:
    """Two sources giving one quantity (same metric, same name) different values are a
    conflict with both ids, both values and a reason; a revised figure resolves it."""
    claims = [
        {"id": "X1-e1", "source_id": "X1", "quote": "Aquilon holds 46% of installed smart "
         "meters.", "passage": "Aquilon holds 46% of installed smart meters."},
        {"id": "Y1-e1", "source_id": "Y1", "quote": "Aquilon holds 41% of installed smart "
         "meters, a revised figure.", "passage": "Aquilon holds 41% of installed smart meters, "
         "a revised figure."},
        {"id": "Z1-e1", "source_id": "Z1", "quote": "Kestrel holds 12% of installed smart "
         "meters.", "passage": "Kestrel holds 12% of installed smart meters."},
    ]
    out = respond({"task": "verify", "claims": claims})
    assert [r["supported"] for r in out["results"]] == [True, True, True]
    [conflict] = out["conflicts"]
    assert conflict["ids"] == ["X1-e1", "Y1-e1"] and conflict["values"] == ["46%", "41%"]
    assert conflict["status"] == "conflict-resolved" and "newer" in conflict["reason"]
    unexplained = respond({"task": "verify", "claims": [claims[0], {
        **claims[1], "quote": "Aquilon holds 41% of installed smart meters.",
        "passage": "Aquilon holds 41% of installed smart meters."}]})
    assert unexplained["conflicts"][0]["status"] == "conflict-open"


def test_extract_numbers_a_later_chunk_from_first_id() -> None:
    """A chunk numbers its evidence from first_id, so chunked ids equal one-piece ids."""
    text = "The pilot ran for 9 months.\n\nReadings arrived for 97% of meters.\n"
    whole = respond({"task": "extract", "source_id": "X1", "text": text})["evidence"]
    first = respond({"task": "extract", "source_id": "X1", "text": text.split("\n\n")[0]})
    second = respond({"task": "extract", "source_id": "X1", "text": text.split("\n\n")[1],
                      "first_id": 2})
    assert [e["id"] for e in first["evidence"] + second["evidence"]] == [
        e["id"] for e in whole] == ["X1-e1", "X1-e2"]


def test_the_pack_has_no_conflicting_figures_within_a_verification_unit() -> None:
    """The rule does not fire on the pack: one supplier's share and another's differ, and
    different subjects are not one quantity."""
    from keepstep.engine.gateway.offline_rules import find_conflicts

    plan = tomllib.loads((PACK / "plan.toml").read_text(encoding="utf-8"))
    groups = {s["id"]: s["group"] for s in _sources()}
    evidence = _pack_evidence()
    for unit in (u for u in plan["unit"] if u["kind"] == "verify"):
        mine = {i.split(":", 1)[1] for i in unit["inputs"] if i.startswith("group:")}
        assert find_conflicts([e for e in evidence if groups[e["source_id"]] in mine]) == [], \
            unit["id"]
