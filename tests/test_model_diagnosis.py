"""Diagnosis: every validator problem of a failed attempt is stored with it (safe text, no
source copy beyond the offending value), the rejected raw answers are kept as hashed attempt
artifacts, and explain, events and status --json show them."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.api import open_project
from tests.support.engine_harness import RUN, make_small_project
from tests.support.model_server import running_server

MODEL = "openai/gpt-4o-mini"
# "vary": each wrong answer is laid out differently, like a sampling model's: byte-identical
# rejected answers would stop U06 after its second attempt as a repeated failure (issue 21).
BAD_SYNTHESIS = {"match": {"task": "synthesize"}, "do": "wrong_keys", "times": None,
                 "vary": True}


@pytest.fixture(autouse=True)
def _dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The small project with a synthesis answer that never has the right keys: U06 fails."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")
    # The server renames keys the feedback does not name; a rule answers every synthesis
    # with renamed keys whatever the feedback says.
    with running_server("clean", rules=[{**BAD_SYNTHESIS}]) as server:
        from tests.support import model_server

        original = model_server.ModelServer.content

        def stubborn(self: Any, messages: Any, how: str) -> tuple[str, str]:
            if how == "wrong_keys":
                return original(self, messages[:2], how)  # ignore the feedback
            return original(self, messages, how)

        model_server.ModelServer.content = stubborn  # type: ignore[method-assign]
        try:
            root = make_small_project(tmp_path_factory.mktemp("diag") / "small",
                                      default_model=MODEL, api_base=server.api_base)
            with open_project(root) as p:
                status = p.start_run(RUN).run()
        finally:
            model_server.ModelServer.content = original  # type: ignore[method-assign]
    mp.undo()
    return {"root": root, "status": status}


def test_the_failed_units_problems_are_in_its_status(failed: dict[str, Any]) -> None:
    """status: U06 failed; its view carries each problem as field, rule, message, value."""
    u06 = failed["status"].units["U06"]
    assert u06.state == "failed"
    assert u06.problems, u06
    rules = {p["rule"] for p in u06.problems}
    assert {"schema:keys", "schema:missing"} <= rules
    assert all(set(p) == {"field", "rule", "message", "value"} for p in u06.problems)
    assert u06.answers and all(a.startswith(f"{RUN}/U06/a3/calls/") for a in u06.answers)


def test_explain_lists_the_problems_and_points_to_the_rejected_answers(
        failed: dict[str, Any]) -> None:
    """explain names every problem and the recorded raw answers, which exist on disk and
    match their ledger hash."""
    with open_project(failed["root"]) as p:
        run = p.get_run(RUN)
        result = run.explain("U06")
        text = result.render()
        rows = {c.response_artifact.split(" sha256:")[0]: c.response_artifact.split(" sha256:")[1]
                for c in run.calls() if c.response_artifact}
        for path in result.answers:
            blob = (p.store.artifacts.root / path).read_bytes()
            from keepstep.storage.hashing import sha256_hex

            assert rows[path] == sha256_hex(blob)
            assert json.loads(blob)["valid"] is False
    assert "problems (" in text and "[schema:keys]" in text
    assert f"rejected answer: .keepstep/artifacts/{RUN}/U06/a3/calls/" in text


def test_each_failed_attempt_keeps_its_problems_in_its_event_and_artifact(
        failed: dict[str, Any]) -> None:
    """Every failed attempt of U06 has an attempt.failed event with its diagnosis and a
    problems.json artifact in its own folder."""
    with open_project(failed["root"]) as p:
        events = p.get_run(RUN).events(kinds=["attempt.failed"], unit="U06")
        root = p.store.artifacts.root
    assert [e.attempt_id for e in events] == ["U06/a1", "U06/a2", "U06/a3"]
    for event in events:
        diagnosis = event.payload["diagnosis"]
        assert diagnosis["problems"] and diagnosis["validators"]
        saved = json.loads((root / diagnosis["file"]).read_text())
        assert saved["problems"] == diagnosis["problems"]


def test_the_cli_shows_the_problems(failed: dict[str, Any]) -> None:
    """`keepstep explain` prints them; `status --json` and `events --json` carry them."""
    runner = CliRunner()
    root = str(failed["root"])
    explained = runner.invoke(app, ["explain", root, "--run", RUN, "U06"])
    assert explained.exit_code == 0, explained.output
    assert "[schema:keys]" in explained.output and "rejected answer:" in explained.output
    status = runner.invoke(app, ["status", root, "--run", RUN, "--json"])
    assert json.loads(status.output)["units"]["U06"]["problems"]
    events = runner.invoke(app, ["events", root, "--run", RUN, "--kind", "attempt.failed",
                                 "--json"])
    assert all(e["payload"]["diagnosis"]["problems"] for e in json.loads(events.output))


def test_no_source_text_beyond_the_offending_value_reaches_the_database(
        failed: dict[str, Any]) -> None:
    """The database holds problems and pointers, not the sources: a long source sentence is
    nowhere in it, and no stored problem value is longer than the cap."""
    db = sqlite3.connect(failed["root"] / ".keepstep" / "state.db")
    dump = "\n".join(db.iterdump())
    db.close()
    assert "1.9 million metered water connections" not in dump
    for p in failed["status"].units["U06"].problems:
        assert len(p["value"]) <= 160
