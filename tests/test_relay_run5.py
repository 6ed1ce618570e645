"""The conflicts test pack's fifth real-model run, replayed (issue 20).

tests/fixtures/relay_conflicts_pack_run5 holds every request keepstep sent and every answer a
language model gave in that run (its README says how it was made). Unlike run 2's recording
(tests/test_relay_conflicts_pack.py), this one was made after U04 began classifying the
disagreements over advice, so the real model answered that request too: here every request
must be answered from the recording — none by the offline heuristic — and the run must ask
exactly the requests the recording holds (the same number of each unit and task). Their
prompt text may change (other work rewords prompts): a request whose messages differ from the
recording's is answered by its place (tests/support/relay_replay.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.gateway.prompts import read_input_block
from keepstep.engine.kinds.audit import settled_as_open
from keepstep.engine.kinds.common import cited_evidence_ids, expand_footnotes
from keepstep.engine.kinds.parts import conflict_records
from keepstep.engine.kinds.render import without_prose_ids
from tests.support.memo_checks import (
    ADVICE,
    PACK,
    disagreement_lines,
    planted_key,
    sections,
    source_texts,
    unsupported_figures,
)
from tests.support.relay_replay import (
    RelayReplay,
    load_pairs,
    replay_pack,
    replays_reworded_by_place,
    request_key,
)

RECORDING = Path(__file__).parent / "fixtures" / "relay_conflicts_pack_run5"
RUN_4 = Path(__file__).parent / "fixtures" / "relay_conflicts_pack_run4"  # kept as a record
ADVICE_REQUEST = "0009"  # U04's second request: the advice candidates, no claim to judge


def _kinds(requests: list[list[dict[str, Any]]]) -> Counter[tuple[str, str, str, str]]:
    return Counter(request_key(messages) for messages in requests)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The pack run on run 5's recorded answers (api_base a closed port), then
    `conflicts --json` and `export`. A request the recording has no answer for is answered
    by the offline rules and named in ``replay.unrecorded`` (so the run ends and the test
    says which request it was), never passed off as recorded."""
    return replay_pack(PACK, tmp_path_factory.mktemp("replay5") / "pack",
                       RelayReplay(RECORDING, unrecorded="offline"))


def test_every_request_is_answered_from_the_recording(replayed: dict[str, Any]) -> None:
    """No request went unrecorded, none was asked twice or left unasked: the run's requests
    are the recording's, the same number of each (unit, task, source, first id), and each
    recorded answer is used once, in its recorded order within its kind."""
    replay = replayed["replay"]
    assert [key for key, _ in replay.unrecorded] == []
    pairs = load_pairs(RECORDING)
    assert len(pairs) == 16
    assert _kinds(replay.requests) == _kinds([r["messages"] for _, r, _ in pairs])
    numbers = [n for n, _ in replay.matched]
    assert sorted(numbers) == [n for n, _, _ in pairs]
    by_kind: dict[tuple[str, str, str, str], list[str]] = {}
    for number, request, _ in pairs:
        by_kind.setdefault(request_key(request["messages"]), []).append(number)
    for kind, recorded in by_kind.items():
        asked = [n for n, messages in zip(numbers, replay.requests, strict=True)
                 if request_key(messages) == kind]
        assert asked == recorded, kind


def test_the_advice_classification_is_the_real_models(replayed: dict[str, Any]) -> None:
    """U04's request classifying the disagreement over advice (no claims, one candidate over
    advice: the R sources' courses for the hull order) was answered by the recorded model's
    answer to it, and `conflicts` lists that answer's class and reason."""
    replay = replayed["replay"]
    [(number, messages)] = [
        (n, m) for (n, _), m in zip(replay.matched, replay.requests, strict=True)
        if (read_input_block(m) or {}).get("task") == "verify"
        and not (read_input_block(m) or {}).get("claims")]
    assert number == ADVICE_REQUEST and request_key(messages)[:2] == ("U04", "verify")
    block = read_input_block(messages) or {}
    assert [c["about"] for c in block["candidates"]] == ["advice"]
    assert sorted(s["source_id"] for s in block["candidates"][0]["sides"]) == \
        ["R1", "R2", "R3"]
    recorded = json.loads((RECORDING / "answers" / f"{ADVICE_REQUEST}.json").read_text(
        encoding="utf-8"))["content"]
    [answer] = json.loads(recorded)["conflicts"]
    [advice] = [c for c in replayed["conflicts"] if c["about"] == "advice"]
    assert planted_key(advice) == ADVICE
    assert advice["class"] == answer["class"] == "unexplained" and not advice["holds"]
    assert advice["reason"] == answer["reason"]
    # The memo names each side by its source, not its evidence id ("(R1)" for "(R1-e3)").
    assert without_prose_ids(answer["reason"]) in " ".join(
        disagreement_lines(replayed["memo"])[ADVICE].split())


def test_the_run_ends_done_and_its_audit_passes(replayed: dict[str, Any]) -> None:
    """The run ends done at the audit's first attempt (as the recorded run did), every check
    of it passed, the settled-disagreement one included."""
    assert replayed["status"].decision == "done", replayed["status"]
    [audit] = sorted((replayed["root"] / ".keepstep" / "artifacts" / "T1" / "A01")
                     .glob("a*/audit.json"))
    assert audit.parent.name == "a1"
    report = json.loads(audit.read_text(encoding="utf-8"))
    assert report["passed"] and all(c["passed"] for c in report["checks"]), report
    [conflicts] = [c for c in report["checks"] if c["check"] == "conflicts"]
    assert "none settled offered as open" in conflicts["detail"]


def test_conflicts_json_equals_the_recorded_one(replayed: dict[str, Any]) -> None:
    """`keepstep conflicts --json` after the replay is the recorded run's, record for record
    (the advice record, class unexplained, included)."""
    recorded = json.loads((RECORDING / "conflicts.json").read_text(encoding="utf-8"))
    assert replayed["conflicts"] == recorded["conflicts"]
    assert [c["class"] for c in recorded["conflicts"] if c["about"] == "advice"] == [
        "unexplained"]


def test_every_figure_is_quoted_or_calculated(replayed: dict[str, Any]) -> None:
    """Every figure of every cited line of the replayed memo is in a quote it cites or
    given by a checked calculation from them, and every quote is verbatim in its source."""
    assert unsupported_figures(replayed["memo"], source_texts(replayed["root"])) == []


def test_the_berth_fee_line_is_not_flagged_as_open(replayed: dict[str, Any]) -> None:
    """The recommendation's port-fee line gives both sides of K1 (140 and 120 euro) and says
    which holds: settled_as_open flags no line of the memo for it."""
    memo = replayed["memo"]
    [berth] = [c for c in conflict_records([{"conflicts": replayed["conflicts"]}])
               if c["id"] == "K1"]
    assert berth["metric"] == "berth fee per call" and berth["holds"] == "140"
    [line] = [line for line in sections(memo)["recommendation"].splitlines()
              if "140" in line and "120" in line]
    assert "holds" in line
    assert {"Q1-e1", "Q2-e1"} <= cited_evidence_ids(line)
    assert settled_as_open(line, berth) == []
    assert settled_as_open(expand_footnotes(memo), berth) == []


def test_run_4s_ranking_is_sent_back_by_the_points_rule() -> None:
    """Run 4 (kept as a record in relay_conflicts_pack_run4) was reviewed "do not send":
    among its faults, points on values the evidence does not state ("Option 1 gets 4/5 on a
    hull price that is 'not stated'").
    Today's rank rules send that answer back, naming the option and the criterion; run 5's
    ranking passes them."""
    from keepstep.engine.kinds.synthesize import (
        OptionsAnswer,
        unknown_floors,
        unknown_scored,
    )

    def problems(folder: Path, number: str) -> list[Any]:
        content = json.loads((folder / "answers" / f"{number}.json").read_text(
            encoding="utf-8"))["content"]
        answer = OptionsAnswer.model_validate_json(content)
        floors = unknown_floors(answer.items)
        return [p for n, item in enumerate(answer.items)
                for p in unknown_scored(f"items[{n}]", item, floors)]

    # Its delivery "Not stated for a second yard" got 3 points where "about 30 months from a
    # later order" got 2; its 2026 price "Not stated" got 2, tying the lowest stated (2).
    found = problems(RUN_4, "0010")
    assert [(p.rule, p.message.split(":")[0], p.value) for p in found] == [
        ("unknown_scored", "Seek a second yard's quote before ordering in 2025", "delivery")]
    assert problems(RECORDING, "0012") == []  # run 5's second round, the one it used


def test_a_reworded_prompt_is_answered_by_its_place() -> None:
    """Every recorded request, its system prompt reworded, still gets its recorded answer,
    by its place (prompts change while the requests a run makes do not)."""
    replays_reworded_by_place(RECORDING)
