"""A retry of a unit pays only for the calls that failed: every other answer of the earlier
attempt is reused — once its recorded file still has the hash the ledger recorded."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from tests.support.engine_harness import RUN, make_small_project
from tests.support.model_server import running_server

MODEL = "openai/gpt-4o-mini"
# U03 extracts A1 then A2; A2's answer has no JSON in all three rounds of its first step.
A2_BAD = {"match": {"task": "extract", "source_id": "A2"}, "do": "no_json", "times": 3}


@pytest.fixture(autouse=True)
def _dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")


def _u03(root: Path) -> list[Any]:
    with open_project(root) as p:
        return [c for c in p.get_run(RUN).calls() if c.unit == "U03"]


def test_a_retry_after_one_bad_call_repays_only_that_call(tmp_path: Path) -> None:
    """U03/a1 fails on A2 (three rejected answers); U03/a2 reuses A1's answer (outcome
    reused, no tokens, cost 0) and pays for A2 once more."""
    with running_server("clean", rules=[A2_BAD]) as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base)
        with open_project(root) as p:
            status = p.start_run(RUN).run()
    assert status.decision == "done", status.reasons
    rows = _u03(root)
    by_attempt = {a: [c.outcome for c in rows if c.attempt_id == a]
                  for a in ("U03/a1", "U03/a2")}
    assert by_attempt == {"U03/a1": ["ok", "invalid_output", "invalid_output",
                                     "invalid_output"],
                          "U03/a2": ["reused", "ok"]}
    reused = next(c for c in rows if c.outcome == "reused")
    assert (reused.tokens_in, reused.tokens_out, reused.cost) == (0, 0, 0.0)
    assert len(server.requests_for(task="extract", source_id="A1")) == 1
    assert len(server.requests_for(task="extract", source_id="A2")) == 4
    with open_project(root) as p:
        used = p.store.get_budget(RUN).used["calls"]
        paid = [c for c in p.get_run(RUN).calls() if c.outcome != "reused"]
        record = p.get_run(RUN).facts_records()["U03"]
    assert used == len(paid)
    assert record.facts["reused_calls"] == 1 and record.attempt == "U03/a2"


def test_a_tampered_recorded_answer_is_not_reused(tmp_path: Path) -> None:
    """After U03/a1 failed, its recorded A1 answer is edited on disk: the retry refuses it
    (an event says why) and pays for A1 again."""
    with running_server("clean", rules=[A2_BAD]) as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base,
                                  policy={"max_unit_retries": 2})
        with open_project(root) as p:
            p.start_run(RUN).run(max_units=3)  # U01, U02, U03/a1 (failed)
            [a1] = [c for c in p.get_run(RUN).calls() if c.unit == "U03" and c.outcome == "ok"]
            path = p.store.artifacts.root / a1.response_artifact.split(" sha256:")[0]
        data = json.loads(path.read_text())
        data["content"] = data["content"].replace("22%", "23%")
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        path.write_text(json.dumps(data))
        with open_project(root) as p:
            run = p.get_run(RUN)
            status = run.run()
            refused = run.events(kinds=["call.reuse_refused"])
    assert status.decision == "done", status.reasons
    assert [e.attempt_id for e in refused] == ["U03/a2"]
    assert "sha256" in refused[0].payload["reason"]
    outcomes = Counter(c.outcome for c in _u03(root) if c.attempt_id == "U03/a2")
    assert outcomes == {"ok": 2}
    assert len(server.requests_for(task="extract", source_id="A1")) == 2


def test_an_orphaned_attempts_answers_are_never_reused(tmp_path: Path) -> None:
    """A killed attempt's files stay quarantined: its recorded answers are not taken again."""
    from tests.support.engine_harness import run_worker

    root = make_small_project(tmp_path / "small")
    crashed = run_worker(root, crash_at="unit.after_stage:U03")
    assert crashed.killed, crashed.stderr[-2000:]
    with open_project(root) as p:
        status = p.get_run(RUN).resume()
        rows = [c for c in p.get_run(RUN).calls() if c.unit == "U03"]
    assert status.decision == "done", status.reasons
    assert {c.outcome for c in rows} == {"ok"}
    assert Counter(c.attempt_id for c in rows) == {"U03/a1": 2, "U03/a2": 2}
