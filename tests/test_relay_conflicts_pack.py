"""The conflicts test pack with a real language model, replayed (issue 20).

tests/fixtures/relay_conflicts_pack holds every request keepstep sent and every answer a
language model gave when the pack ran behind ../shared/tools/relay_server.py (its README
says how the recording was made). Here a transport answers each request from those pairs
(by the request's messages, or — when the prompts changed since the recording — by its
place: unit, task, source, first id and order), the pack runs to the same end with no
network, and its disagreements and memo are held to the same checks as the offline run
(tests/test_conflicts_pack_documents.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.gateway.prompts import read_input_block
from keepstep.engine.kinds.render import over_budget
from tests.support.memo_checks import (
    ADVICE,
    APPARENT,
    PACK,
    PLANTED,
    disagreement_lines,
    gaps_repeated,
    planted_key,
    production_artefacts,
    repeated_across_sections,
    sections,
    source_rows,
    source_texts,
    unsupported_figures,
)
from tests.support.relay_replay import (
    RECORDED_MODEL,
    RelayReplay,
    load_pairs,
    replay_pack,
    replays_reworded_by_place,
    request_key,
)

RECORDING = Path(__file__).parent / "fixtures" / "relay_conflicts_pack"
RUN_B = RECORDING / "run-b"  # the earlier recording (older prompts), kept as a record
RECOMMENDATION_WORDS = 120  # the pack's memo: the recommendation's word budget


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The pack run on the recorded answers, then `conflicts --json` and `export`."""
    # The recording predates disagreements over advice: U04's request classifying them was
    # never sent to the model, so the offline heuristic answers it (named in
    # replay.unrecorded, and checked below); every other request gets its recorded answer.
    return replay_pack(PACK, tmp_path_factory.mktemp("replay") / "pack",
                       RelayReplay(RECORDING, unrecorded="offline"))


def test_the_recorded_recommendation_runs_over_the_packs_word_budget() -> None:
    """The recorded model wrote a 255-word recommendation (the partner's review: "the same
    content appears three times"); under the budget the pack now declares it comes back to
    the writer, the section and its count named."""
    [answer] = [json.loads(content) for _, request, content in load_pairs(RECORDING)
                if request_key(request["messages"])[:2] == ("D01", "render")]
    [p] = over_budget("recommendation", [s["text"] for s in answer["sentences"]],
                      RECOMMENDATION_WORDS)
    assert p.rule == "too_long" and p.message.startswith(
        f"the recommendation section runs to 255 words, over its budget of "
        f"{RECOMMENDATION_WORDS}")


def test_the_replay_runs_the_pack_to_the_recorded_end(replayed: dict[str, Any]) -> None:
    """Every unit succeeds (the audit included) on the recorded answers alone, and every
    recorded answer the run asked for is used once."""
    assert replayed["status"].decision == "done", replayed["status"]
    numbers = [n for n, how in replayed["replay"].matched if how != "offline"]
    assert len(numbers) == len(set(numbers)) == len(load_pairs(RECORDING))


def test_only_the_advice_classification_was_not_recorded(replayed: dict[str, Any]) -> None:
    """Exactly one request had no recorded answer: U04's classification of the disagreements
    over advice (added after the recording; it judges no claim). The offline heuristic
    answered it, so that record's class is the rules' (three different courses, no date:
    unresolved), said here rather than passed off as the recorded model's."""
    [(key, block)] = replayed["replay"].unrecorded
    assert key == ("U04", "verify", "", "")
    assert block["claims"] == [] and [c["about"] for c in block["candidates"]] == ["advice"]
    assert [how for _, how in replayed["replay"].matched].count("offline") == 1
    [advice] = [c for c in replayed["conflicts"] if c["about"] == "advice"]
    assert sorted(s["source_id"] for s in advice["sides"]) == ["R1", "R2", "R3"]
    assert advice["class"] == "unexplained" and "act now" in advice["reason"]
    assert "disagree on what to do" in disagreement_lines(replayed["memo"])[ADVICE]


def test_the_real_models_disagreements_match_the_recording(replayed: dict[str, Any]) -> None:
    """`keepstep conflicts --json` after the replay lists what the recorded run listed."""
    recorded = json.loads((RECORDING / "conflicts.json").read_text(encoding="utf-8"))

    def shape(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((c["class"], c["holds"], tuple(s["evidence_id"] for s in c["sides"]))
                      for c in records)

    # (the disagreement over advice is not in the recording: its request was never sent;
    # test_only_the_advice_classification_was_not_recorded checks it)
    figures = [c for c in replayed["conflicts"] if c["about"] == "figure"]
    assert shape(figures) == shape(recorded["conflicts"])


def test_each_real_disagreement_has_its_class_and_the_apparent_one_is_closed(
        replayed: dict[str, Any]) -> None:
    """With the real model's extractions and classifications, each planted disagreement is
    listed once with its class, and the student price is closed as not-a-conflict."""
    by_key: dict[Any, list[dict[str, Any]]] = {}
    for c in replayed["conflicts"]:
        by_key.setdefault(planted_key(c), []).append(c)
    assert {k: [c["class"] for c in by_key.get(k, [])] for k in PLANTED} == {
        k: [cls] for k, cls in PLANTED.items()}
    assert [c["class"] for c in by_key.get(APPARENT, [])] in ([], ["not-a-conflict"])
    hull = by_key[("hull", "brisland")][0]
    assert sorted(s["source_id"] for s in hull["sides"]) == ["R1", "R2", "R3"]
    assert not hull["holds"]


def test_the_memos_disagreement_section_names_each(replayed: dict[str, Any]) -> None:
    """The memo's conflicts section has a line for each real disagreement with its class,
    the value used (none for the unresolved one) and the model's reason."""
    lines = disagreement_lines(replayed["memo"])
    assert set(PLANTED) <= set(lines)
    for key in PLANTED:
        record = next(c for c in replayed["conflicts"] if planted_key(c) == key)
        line = lines[key]
        if record["class"] == "unexplained":
            assert "**Unresolved**" in line and "state neither value as fact" in line
        else:
            assert record["holds"] and f"we use {record['holds']}" in line
        # (a date the reason takes from the source register is said to be so)
        assert " ".join(record["reason"].split()).rstrip(".").lower()[:60] in \
            " ".join(line.split()).lower().replace(" in the source register", "")


def test_the_memo_repeats_nothing_cites_what_holds_each_figure_and_names_the_model(
        replayed: dict[str, Any]) -> None:
    """No cited item in two sections; the options as a table of options; every figure of a
    cited line in a quote it cites or given by a checked calculation (the recommendation
    states one); the model named."""
    memo = replayed["memo"]
    assert repeated_across_sections(memo) == []
    assert memo.count("| Rank | Option |") == 1
    # The recorded model's rationale "varying by 4 million euro (18 to 22 million)" states a
    # derived 4 (its remark 0010): since the rank rules check every figure of a ranked item,
    # that difference passes as an implicit calculation — code recomputes 22 - 18 from the
    # two ends written beside it, both in the cited quotes (kinds.claims.range_differences).
    # It was the one figure no check held before; now every figure of every cited line is.
    assert unsupported_figures(memo, source_texts(replayed["root"])) == []
    assert "varying by 4 million euro (18 to 22 million)" in sections(memo)["options"]
    # The recorded answers predate points per criterion: their stated scores are kept (the
    # earlier shape parses) and the line under the table says they cannot be rebuilt.
    assert "it has no points per criterion to rebuild it from" in memo
    assert "offline heuristic" not in memo.lower()
    assert f"_Prepared with the {RECORDED_MODEL} language model; every figure is checked " \
        "against the quoted sources._" in memo and "Models that answered" not in memo
    # The recommendation states a derived figure (the year's berth fees at 2,600 calls) as a
    # checked calculation; unsupported_figures above recomputed it from the cited quotes.
    # (as readable arithmetic, not inline code: "2,600 × 140 = 364,000")
    assert re.search(r"\(calculated: [\d,]+ × [\d,]+ = [\d,]+", sections(memo)["recommendation"])
    assert "`" not in memo


def test_the_real_model_memo_carries_no_production_artefact(replayed: dict[str, Any]) -> None:
    """The recorded run's memo (run B's model gave gaps and confidence tags with no reason):
    no section marker, question line, note stub, bare confidence tag or '.;' join; the gaps
    once; the sources listed with where their metadata came from; the berth-fee reason's
    register date said to be the register's."""
    memo = replayed["memo"]
    assert production_artefacts(memo) == []
    assert sections(memo)["gaps"].count("\n- ") == 5  # the model's five gaps, said once
    assert gaps_repeated(memo) == [] and "Not answered by" not in sections(memo)["findings"]
    assert source_rows(memo)["Q2"][4] == "title, kind, date, publisher: the source register"
    assert "sources.toml" not in memo
    berth = disagreement_lines(memo)[("berth", "kelvmoor")]
    assert "2025-02-01 in the source register" in berth


def test_the_memo_answers_the_decisions_questions_first(replayed: dict[str, Any]) -> None:
    """The decision asks whether to order a new hull and whether to change the 2025 fares:
    the recommendation's first two lines answer those, each with a yes or no; the berth fee
    the conflicts settled is stated there with the value that holds (140), said to hold, and
    not offered as open (the audit's settled check ran on it); no production artefact."""
    from keepstep.engine.kinds.audit import settled_as_open
    from keepstep.engine.kinds.parts import conflict_records

    memo = replayed["memo"]
    decision = next(line for line in memo.splitlines() if line.startswith("Decision sought:"))
    assert "order a new hull" in decision and "change its fares" in decision
    lines = [line[2:] for line in sections(memo)["recommendation"].splitlines()
             if line.startswith("- ")]
    first, second = (line.lower() for line in lines[:2])
    assert first.startswith("new hull:") and re.match(r"new hull: (?:yes|no)\b", first)
    assert "order a new hull" in first
    assert second.startswith("fares:") and re.match(r"fares: (?:yes|no)\b", second)
    assert "change" in second and "fares" in second.split(":", 1)[1]
    assert production_artefacts(memo) == []
    berth = next(c for c in replayed["conflicts"] if planted_key(c) == ("berth", "kelvmoor"))
    assert berth["holds"] == "140" and berth["class"] in ("outdated", "superseded")
    stated = [line for line in lines if "berth fee" in line.lower()]
    assert stated and all("140 euro" in line for line in stated), stated
    assert any(re.search(r"\bholds is 140\b|140 euro[^.]*\b(?:holds|replaces)\b", line)
               and "not the 120" in line for line in stated), stated
    records = conflict_records([{"conflicts": replayed["conflicts"]}])
    settled = next(c for c in records if c["metric"] == berth["metric"])
    assert settled_as_open(sections(memo)["recommendation"], settled) == []


def test_a_request_whose_prompt_changed_is_answered_by_its_place() -> None:
    """Prompts reworded since the recording (every message differs): each request still gets
    the answer recorded for its unit, task, source and turn, matched by place."""
    replays_reworded_by_place(RECORDING)


def test_an_options_ranking_is_asked_and_checked_as_options(replayed: dict[str, Any]) -> None:
    """The ranking of the board's options (ranks = "options", criteria declared): its rank
    and check prompts speak of options scored on the criteria, never of likelihood x impact
    scores (model remarks 0011, 0018, 0022), and the check sees each option's criterion
    values and rationale beside the criteria."""
    asked = {}
    for messages in replayed["replay"].requests:
        block = read_input_block(messages) or {}
        if block.get("task") in ("rank", "check"):
            asked.setdefault(block["task"], (messages, block))
    assert set(asked) == {"rank", "check"}
    for task, (messages, _block) in asked.items():
        system = messages[0]["content"]
        assert "likelihood (1-5) x impact" not in system, task
        assert "ranking of options" in system or "rank the options" in system, task
        assert "criteria" in system, task
    replay = replayed["replay"]
    formats = [json.dumps(replay.formats[n], default=str)
               for n, messages in enumerate(replay.requests)
               if (read_input_block(messages) or {}).get("task") == "rank"]
    # (Since issue 20's rebuildable scores: the options are asked as "items", with points
    # 1-5 per criterion and no score, likelihood, impact, owner or mitigation; code adds the
    # points. This pinned "1-25 on the criteria INPUT declares" before.)
    assert formats and all("likelihood (1-5) x impact" not in f for f in formats)
    for n, messages in enumerate(replay.requests):
        if (read_input_block(messages) or {}).get("task") != "rank":
            continue
        schema = replay.formats[n]["json_schema"]["schema"]
        assert list(schema["properties"])[0] == "items" and "risks" not in schema["properties"]
        item = schema["$defs"]["RankedOption"]["properties"]
        assert not {"score", "likelihood", "impact", "owner", "mitigation"} & set(item)
        assert item["points"]["properties"]["hull price"]["type"] == "integer"
        assert set(item["points"]["required"]) == {"hull price", "delivery"}
        assert "sum of its points" in messages[0]["content"]
        assert '"items"' in messages[1]["content"]
    check = asked["check"][1]
    assert check["criteria"] == ["hull price", "delivery"]
    assert all(set(c["criteria"]) == {"hull price", "delivery"} and c["rationale"]
               for c in check["claims"])


def test_citations_name_a_locator_only_when_it_adds_to_the_title(
        replayed: dict[str, Any]) -> None:
    """A citation names the source's title and id, and a locator only when it says more
    than the title: "(Broker note on newbuild prices (R1), Broker note on newbuild prices)"
    was the recorded memo's; a section heading that is not the title ("Fares") stays. The
    evidence table shows each statement's kind where no topic was assigned, never a column
    of "general"."""
    memo = replayed["memo"]
    body = memo.split("\n[^1]:")[0]
    assert "Broker note on newbuild prices (R1), Broker note on newbuild prices" not in body
    assert "(Broker note on newbuild prices (R1);" in body or \
        "(Broker note on newbuild prices (R1))" in body
    assert "Tarnlake Ferries annual report 2023 (P1), Fares" in body
    assert "(P1), Annual report 2023" not in body
    table = sections(memo)["evidence"]
    assert "| Evidence | Source | Kind | Statement |" in table
    rows = [line for line in table.splitlines() if line.startswith("| P") or
            line.startswith("| Q") or line.startswith("| R")]
    assert rows and not any("| general |" in r for r in rows)
    assert any("| recommendation |" in r for r in rows)
    assert any("| figure |" in r or "| fact |" in r for r in rows)


def test_the_recorded_memo_is_flagged_for_a_settled_disagreement_offered_as_open() -> None:
    """Run B's memo (the earlier recording, kept in run-b/): verify settled the berth fee
    (140 holds, the 2023 notice is out of date) but that memo's recommendation gives 140
    and 120 and tells the board to "confirm which applies": the audit's conflicts check
    names that line and no other; the conflicts section, which says the documents use 140,
    passes."""
    from keepstep.engine.kinds.audit import settled_as_open
    from keepstep.engine.kinds.common import expand_footnotes
    from keepstep.engine.kinds.parts import conflict_records

    memo = expand_footnotes((RUN_B / "memo.md").read_text(encoding="utf-8"))
    records = conflict_records([json.loads((RUN_B / "conflicts.json").read_text(
        encoding="utf-8"))])
    flagged = {c["metric"]: settled_as_open(memo, c) for c in records}
    assert [line[:60] for line in flagged.pop("berth fee per call")] == [
        "- If Tarnlake Ferries boats call at Kelvmoor Port as often i"]
    assert all(lines == [] for lines in flagged.values()), flagged
    fixed = memo.replace("so the board should confirm which applies",
                         "and 140 euro holds: the 2025 schedule replaces the 2023 notice")
    assert all(settled_as_open(fixed, c) == [] for c in records)
    # A relative "which holds" settles it (run 4's memo was failed for this wording): only a
    # question or a verb of finding out leaves it open.
    relative = memo.replace("so the board should confirm which applies",
                            "140 euro, which holds over the 120 euro of the 2023 notice")
    assert all(settled_as_open(relative, c) == [] for c in records)
    asked = memo.replace("so the board should confirm which applies",
                         "so which holds?")
    assert settled_as_open(asked, next(c for c in records
                                       if c["metric"] == "berth fee per call"))


def test_synthesis_and_ranking_are_told_each_sources_metadata(replayed: dict[str, Any]) -> None:
    """Synthesis and ranking requests carry each cited source's title, kind, date and
    publisher as verify recorded them (model remarks 0010, 0012 of run 2: the rank INPUT had
    none, so attributions were inferred); the decision (the contract's goal) is sent only to
    a unit that declares ``contract:goal`` (S01 does since the recording, K01 does not)."""
    blocks = {}
    for messages in replayed["replay"].requests:
        block = read_input_block(messages) or {}
        if block.get("task") in ("synthesize", "rank"):
            blocks.setdefault(block["task"], block)
    assert set(blocks) == {"synthesize", "rank"}
    for task, block in blocks.items():
        sources = block["sources"]
        assert sources["Q2"]["date"] == "2025-02-01", task
        assert sources["Q2"]["publisher"] == "Kelvmoor Port Authority", task
        assert sources["R2"] == {"title": "Interview notes: shipyard sales manager",
                                 "kind": "interview notes"}, task
    assert blocks["synthesize"]["decision"].startswith("Decide whether Tarnlake Ferries")
    assert "decision" not in blocks["rank"]


def test_figures_stated_before_their_period_ended_are_marked(replayed: dict[str, Any]
                                                             ) -> None:
    """The recorded model's remarks 0001 and 0005: a 2024 count in a report dated March
    2024, a 2025 fee in a notice dated January 2023. Code marks them from each figure's
    period and its source's date: the memo's evidence table says so, and any sentence
    stating one as an outcome is labelled."""
    memo = replayed["memo"]
    rows = {line.split("|")[1].strip(): line for line in sections(memo)["evidence"].splitlines()
            if line.startswith("| ") and "-e" in line.split("|")[1]}
    assert "_(stated 10 January 2023, before its period ended)_" in rows["Q1-e1"]
    marked = [i for i, line in rows.items() if "before its period ended" in line]
    assert marked and all(i.split("-e")[0] in {"P1", "P2", "Q1", "Q2"} for i in marked), marked
    # A date only the source register gives (Q2's) is labelled so (h20w2: relay run 4's
    # review, "Q2's date and publisher are not in Q2"); the documents' own dates are not.
    date = r"\d{1,2} \w+ \d{4}(?: per the source register)?"
    assert "_(stated 1 February 2025 per the source register, before its period ended)_" \
        in rows["Q2-e1"]
    for line in memo.splitlines():
        if "before the period it covers had ended" in line:
            assert re.search(rf"\(stated {date}(?: and {date})*, before the period", line), line
            assert "1 February 2025," not in line and "10 January 2023 per" not in line, line


def test_writer_requests_say_which_source_dates_only_the_register_gives(
        replayed: dict[str, Any]) -> None:
    """The synthesize, rank and render requests carry each source's metadata and, under
    ``from_register``, the date and publisher only sources.toml gives (Q2's document has no
    front matter; P1's states its own), so a sentence resting on them can say so (relay
    run 4's review: "Q2's date and publisher are not in Q2")."""
    told: dict[str, dict[str, Any]] = {}
    for messages in replayed["replay"].requests:
        block = read_input_block(messages) or {}
        if block.get("task") in ("synthesize", "rank", "render") and block.get("sources"):
            told.setdefault(str(block["task"]), {}).update(block["sources"])
    assert set(told) == {"synthesize", "rank", "render"}
    for task, sources in told.items():
        assert sources["Q2"]["from_register"] == ["date", "publisher"], task
        assert "from_register" not in sources.get("P1", {}), task


def test_an_entity_the_quote_does_not_name_reaches_no_writer(replayed: dict[str, Any]) -> None:
    """The recorded extract of R2 gave "Delivery takes about 30 months from the order." the
    entity "Brisland Yards", named only in the sentence before it (relay run 4's review: "R2
    never names Brisland Yards"). Code blanks it at extraction, so the synthesize and rank
    requests carry no owner for the delivery time; R2-e1, which names the yard, keeps it."""
    seen = 0
    for messages in replayed["replay"].requests:
        block = read_input_block(messages) or {}
        if block.get("task") not in ("synthesize", "rank"):
            continue
        items = {str(e.get("id")): e for e in block.get("evidence") or []}
        if "R2-e2" not in items:
            continue
        seen += 1
        assert [q["entity"] for q in items["R2-e2"]["quantities"]] == [""]
        assert [q["entity"] for q in items["R2-e1"]["quantities"]] == ["Brisland Yards"]
    assert seen >= 2
