"""Real-model runs: litellm over HTTP to a local server that answers like a model would.

The server (tests/support/model_server.py) answers every prompt with what the offline model
says for it, written the way its mode says (clean, fenced, prose, invalid, wrong keys, 429,
slow, mixed), so the run takes the very code path a cloud provider or Ollama would.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway.prompts import read_input_block
from tests.support.engine_harness import RUN, copy_pack, make_small_project
from tests.support.model_server import ModelServer, running_server

MODEL = "openai/gpt-4o-mini"
DUMMY_KEY = "sk-test-keepstep-dummy-0000"


@pytest.fixture(autouse=True)
def _dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", DUMMY_KEY)


def _evidence_count(project: Any, run_id: str) -> int:
    records = project.get_run(run_id).facts_records()
    root = project.store.artifacts.root
    return sum(len(json.loads((root / r.outputs["evidence.json"].path).read_text())["evidence"])
               for r in records.values() if "evidence.json" in r.outputs)


def _price() -> tuple[float, float]:
    from keepstep.engine.gateway.client import _litellm

    info = _litellm().get_model_info(MODEL)
    return float(info["input_cost_per_token"]), float(info["output_cost_per_token"])


# --- the ME-042 pack in mixed mode -----------------------------------------------------------

@pytest.fixture(scope="module")
def mixed_pack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The ME-042 pack run once with openai/gpt-4o-mini against the server in mixed mode."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OPENAI_API_KEY", DUMMY_KEY)
    root = copy_pack(tmp_path_factory.mktemp("real") / "pack")
    with running_server("mixed", every=9) as server:
        from tests.support.small_project import write_config

        write_config(root, default_model=MODEL, api_base=server.api_base)
        with open_project(root) as project:
            status = project.start_run("ME-042").run(approve={"audience": "product team"})
            run = project.get_run("ME-042")
            yield {"status": status, "server": server, "calls": run.calls(),
                   "budget": project.store.get_budget("ME-042"),
                   "evidence": _evidence_count(project, "ME-042"), "root": root}
    mp.undo()


def test_me042_pack_runs_to_done_in_mixed_mode(mixed_pack: dict[str, Any]) -> None:
    """With realistic formatting (1 answer in 9 invalid, one 429) the pack finishes, finds the
    same 163 statements, and every paid call is one the server answered."""
    status, server = mixed_pack["status"], mixed_pack["server"]
    assert status.decision == "done", status.reasons
    assert all(u.state == "succeeded" for u in status.units.values())
    assert mixed_pack["evidence"] == 163
    hows = Counter(e["how"] for e in server.log)
    assert hows["rate_limited"] == 1 and hows["no_json"] + hows["wrong_keys"] + hows[
        "cut_off"] >= 5
    assert hows["fenced"] > 10 and hows["prose"] > 10
    paid = [c for c in mixed_pack["calls"] if c.tokens_in > 0]
    assert len(paid) == len(server.answered())
    outcomes = Counter(c.outcome for c in mixed_pack["calls"])
    assert outcomes["rate_limited"] == 1
    assert outcomes["invalid_output"] == hows["no_json"] + hows["wrong_keys"] + hows["cut_off"]


def test_every_request_has_a_system_and_a_user_message_and_the_schema(
        mixed_pack: dict[str, Any]) -> None:
    """The server sees a system message (role and rules of evidence), a user message with the
    unit's task and one INPUT block, and the answer's schema as a strict response_format."""
    for entry in mixed_pack["server"].log:
        messages = entry["messages"]
        assert messages[0]["role"] == "system" and "Rules of evidence" in messages[0]["content"]
        assert messages[1]["role"] == "user" and "TASK" in messages[1]["content"]
        assert read_input_block(messages) is not None
        fmt = entry["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        schema = fmt["json_schema"]["schema"]
        assert schema["additionalProperties"] is False and schema["properties"]
    extract = mixed_pack["server"].requests_for(task="extract")[0]
    items = extract["response_format"]["json_schema"]["schema"]["properties"]["evidence"]["items"]
    assert "quote" in items["properties"]  # the intake unit's evidence schema is sent


def test_revise_rounds_carry_the_named_problems(mixed_pack: dict[str, Any]) -> None:
    """Each invalid answer is followed by a revise round whose last message names the
    problems (field [rule]) after the rejected answer itself."""
    server = mixed_pack["server"]
    revises = [e for e in server.log if e["feedback"]]
    invalid = [e for e in server.log if e["how"] in ("no_json", "wrong_keys", "cut_off")]
    assert len(revises) == len(invalid)
    texts = "\n".join(e["feedback"] for e in revises)
    assert "[json]" in texts and "[schema:keys]" in texts and "[truncated]" in texts
    for entry in revises:
        assert entry["messages"][-2]["role"] == "assistant"


def test_budget_cost_is_litellms_price_times_the_reported_usage(
        mixed_pack: dict[str, Any]) -> None:
    """The run's cost is exactly the model's price times the tokens the server reported."""
    price_in, price_out = _price()
    usage = mixed_pack["server"].usage
    expected = usage["prompt_tokens"] * price_in + usage["completion_tokens"] * price_out
    used = mixed_pack["budget"].used
    assert used["cost"] == pytest.approx(expected, rel=1e-9)
    assert used["tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert used["calls"] == len(mixed_pack["server"].log)


# --- formatting modes on the small project ---------------------------------------------------

def _small(tmp_path: Path, server: ModelServer, **config: Any) -> Path:
    return make_small_project(tmp_path / "small", default_model=MODEL,
                              api_base=server.api_base, **config)


def _run(root: Path, **kwargs: Any) -> tuple[Any, list[Any]]:
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        status = run.run(**kwargs)
        return status, run.calls()


@pytest.mark.parametrize("mode", ["clean", "fenced", "prose"])
def test_well_formed_answers_pass_without_revising(tmp_path: Path, mode: str) -> None:
    """Clean JSON, fenced JSON and prose around JSON are all read at once: no revise round."""
    with running_server(mode) as server:
        status, calls = _run(_small(tmp_path, server))
    assert status.decision == "done", status.reasons
    assert {c.outcome for c in calls} == {"ok"}
    assert not server.feedback_texts()


def test_one_invalid_answer_is_revised_within_the_attempt(tmp_path: Path) -> None:
    """The first answer to each task has no JSON; the revise round's answer is accepted:
    one attempt per unit, one extra paid call per task."""
    with running_server("invalid_once") as server:
        status, calls = _run(_small(tmp_path, server))
    assert status.decision == "done", status.reasons
    assert {c.attempt_id.rsplit("/", 1)[1] for c in calls} == {"a1"}
    outcomes = Counter(c.outcome for c in calls)
    assert outcomes["invalid_output"] == outcomes["ok"]
    assert all("[json]" in text for text in server.feedback_texts())


def test_wrong_keys_are_fixed_once_the_feedback_names_them(tmp_path: Path) -> None:
    """Renamed keys fail the schema; the feedback names the keys the answer needs, and the
    revised answer (with those keys) is accepted."""
    with running_server("wrong_keys") as server:
        status, calls = _run(_small(tmp_path, server))
    assert status.decision == "done", status.reasons
    first = server.feedback_texts()[0]
    assert "[schema:keys]" in first and "evidence" in first and "items" in first
    assert Counter(c.outcome for c in calls)["invalid_output"] == len(server.feedback_texts())


def test_a_429_is_waited_for_and_retried_inside_the_attempt(tmp_path: Path) -> None:
    """A 429 with Retry-After is retried by the gateway in the same attempt; the wait is the
    provider's state, not the unit's, so it uses none of the retries budget (issue 22 item 4;
    this test pinned the retry as charged before)."""
    with running_server("rate_limited") as server:
        root = _small(tmp_path, server)
        status, calls = _run(root)
    assert status.decision == "done", status.reasons
    assert [c.outcome for c in calls[:2]] == ["rate_limited", "ok"]
    assert calls[0].attempt_id == calls[1].attempt_id
    assert status.budget["used"].get("retries", 0) == 0  # issue 22: no retry charged


def test_an_answer_slower_than_the_time_limit_times_the_attempt_out(tmp_path: Path) -> None:
    """The first answer takes longer than U03's time limit: the attempt stops at its safe
    point as timed out, and the retry reuses that (paid, valid) answer instead of paying
    for it again."""
    from tests.support.small_project import small_units, write_plan

    with running_server("slow", slow_s=1.5) as server:
        root = _small(tmp_path, server)
        units = small_units()
        units[2]["timeout_minutes"] = 0.02  # 1.2 s
        write_plan(root, units)
        status, calls = _run(root)
    assert status.decision == "done", status.reasons
    u03 = [c for c in calls if c.unit == "U03"]
    assert [(c.attempt_id, c.outcome) for c in u03][:1] == [("U03/a1", "ok")]
    assert ("U03/a2", "reused") in [(c.attempt_id, c.outcome) for c in u03]
    assert len(server.requests_for(task="extract", source_id="A1")) == 1  # paid once


# --- Ollama ------------------------------------------------------------------------------------

def test_ollama_chat_gets_the_schema_as_format_and_num_ctx(tmp_path: Path) -> None:
    """ollama_chat/…: litellm calls /api/chat with the answer's JSON Schema as ``format`` and
    the configured window as ``options.num_ctx`` (no key needed on this machine)."""
    with running_server("clean") as server:
        root = make_small_project(tmp_path / "ollama", default_model="ollama_chat/llama3.1",
                                  api_base=server.ollama_base, context_tokens=16384)
        status, calls = _run(root)
    assert status.decision == "done", status.reasons
    assert server.log and all(e["path"] == "/api/chat" for e in server.log)
    for entry in server.log:
        assert isinstance(entry["format"], dict) and entry["format"]["properties"]
        assert entry["options"]["num_ctx"] == 16384
        # Ollama gets the schema in the prompt text too: format alone is a weak hint for
        # some local models.
        assert "OUTPUT SCHEMA" in entry["messages"][1]["content"]
    assert sum(c.cost for c in calls) == 0.0
