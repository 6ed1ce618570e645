"""Prompt templates and the one prompt format every model answers — the offline heuristic
included: it reads the INPUT block of the rendered prompt, and nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.errors import PermanentModelError, ProjectError
from keepstep.engine.gateway import offline_provider
from keepstep.engine.gateway.client import CallContext, ModelGateway, ModelRequest, _litellm
from keepstep.engine.gateway.prompts import (
    load_prompt,
    packaged_names,
    prompt_hashes,
    read_input_block,
    render_messages,
)
from tests.support.engine_harness import RUN, make_small_project

ENGINE = Path(__file__).resolve().parents[1] / "engine"


def test_packaged_prompts_have_versions_and_both_sections() -> None:
    """Every model-calling kind's prompt ships with a version, a system and a user section
    stating the rules of evidence."""
    assert {"extract", "verify", "synthesize", "rank", "check", "render", "revise"} <= set(
        packaged_names())
    for name in packaged_names():
        prompt = load_prompt(name)
        assert prompt.version and prompt.origin == "package" and len(prompt.sha256) == 64
        if name != "revise":
            assert "Rules of evidence" in prompt.system
            assert "verbatim" in prompt.system or "cite" in prompt.system.lower()
            assert "{{ input }}" in prompt.user


def test_a_project_prompt_overrides_the_packaged_one(tmp_path: Path) -> None:
    """prompts/<name>.md in the project replaces the packaged template (and its hash)."""
    own = tmp_path / "prompts" / "verify.md"
    own.parent.mkdir()
    own.write_text('+++\nversion = "7"\n+++\n=== system ===\nBe brief.\n=== user ===\n'
                   "{{ input }}\n", encoding="utf-8")
    prompt = load_prompt("verify", tmp_path)
    assert prompt.version == "7" and prompt.origin == str(own)
    assert prompt_hashes(tmp_path)["prompt:verify"] == prompt.sha256 != load_prompt(
        "verify").sha256


def test_a_malformed_prompt_names_its_file(tmp_path: Path) -> None:
    """A prompt without front matter, version or user section is a ProjectError that names
    the file; an unknown placeholder fails when it is rendered."""
    own = tmp_path / "prompts" / "rank.md"
    own.parent.mkdir()
    own.write_text("just text\n", encoding="utf-8")
    with pytest.raises(ProjectError, match="rank.md: no front matter"):
        load_prompt("rank", tmp_path)
    own.write_text('+++\nversion = "1"\n+++\n=== user ===\n{{ nonsense }}\n', encoding="utf-8")
    prompt = load_prompt("rank", tmp_path)
    with pytest.raises(ProjectError, match="does not render"):
        render_messages(prompt, inputs={}, contract={}, unit={}, schema=None)


def test_the_input_block_round_trips_whatever_the_text_holds() -> None:
    """Source text with fences, newlines and quotes survives the INPUT block unchanged."""
    inputs = {"task": "extract", "source_id": "X1",
              "text": 'A ```fence```\n\n```json\n{"x": 1}\n```\n"quoted" — 4.5%'}
    messages = render_messages(load_prompt("extract"), inputs=inputs,
                               contract={"goal": "Decide"}, unit={"id": "U1", "title": "T",
                                                                  "question": ""},
                               schema={"type": "object"})
    assert read_input_block(messages) == inputs
    assert messages[1]["content"].count("INPUT\n```json\n") == 1
    assert "OUTPUT SCHEMA" in messages[1]["content"] and "goal: Decide" in messages[1]["content"]


def test_the_offline_model_refuses_a_bare_json_payload() -> None:
    """There is no second payload format: a bare JSON user message is refused (400,
    permanent) with a message saying what the offline model reads."""
    with pytest.raises(offline_provider.OfflinePayloadError, match="INPUT block"):
        offline_provider.build_response_content(
            [{"role": "user", "content": json.dumps({"task": "check", "claims": [],
                                                     "evidence_ids_known": []})}])

    class Ledger:
        def reserve(self, ctx: Any, **_: Any) -> str:
            return "c"

        def settle(self, call_id: str, **_: Any) -> None:
            pass

    gateway = ModelGateway(ledger=Ledger(), api_key_lookup=lambda p: None)
    with pytest.raises(PermanentModelError, match="INPUT block"):
        gateway.complete(CallContext(run_id="r", unit="u", attempt="u/a1"), ModelRequest(
            model=offline_provider.MODEL,
            messages=[{"role": "user", "content": '{"task": "summarise", "text": "x"}'}]))


def test_an_offline_run_sends_the_same_rendered_prompts(tmp_path: Path) -> None:
    """Every call of an offline run is the rendered prompt a real model gets: a system
    message with the rules of evidence, a user message with the task and an INPUT block."""
    seen: list[dict[str, Any]] = []

    def recording(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return _litellm().completion(**kwargs)

    root = make_small_project(tmp_path / "small")
    with open_project(root, gateway_factory=lambda ledger: ModelGateway(
            ledger=ledger, completion_fn=recording)) as p:
        assert p.start_run(RUN).run().decision == "done"
    assert len(seen) >= 7
    for kwargs in seen:
        messages = kwargs["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert "Rules of evidence" in messages[0]["content"]
        assert "TASK" in messages[1]["content"] and read_input_block(messages) is not None
        assert "OUTPUT SCHEMA" in messages[1]["content"]  # no structured output: as text


def test_no_bare_payload_path_is_left_in_the_engine() -> None:
    """No engine code sends a payload as the user message or reads one back from it."""
    offenders = []
    for path in ENGINE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if re.search(r'"content":\s*canonical_json\(', text) or re.search(
                r"json\.loads\(\s*_text\(", text):
            offenders.append(str(path.relative_to(ENGINE)))
    assert offenders == []
    provider = (ENGINE / "gateway" / "offline_provider.py").read_text(encoding="utf-8")
    assert "read_input_block(messages)" in provider


def test_the_packaged_prompts_are_package_data() -> None:
    """Every packaged prompt file matches a package-data pattern, so a wheel carries it."""
    import fnmatch
    import tomllib

    data = tomllib.loads((ENGINE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["keepstep.engine.gateway"]
    for path in (ENGINE / "gateway" / "prompt_templates").glob("*.md"):
        rel = str(path.relative_to(ENGINE / "gateway"))
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in data), rel


def test_the_rank_prompt_never_shows_a_literal_round_and_speaks_of_options() -> None:
    """Without a schema in the prompt, the answer's form names no literal round (model
    remark 0020: the form said "round": 1 while INPUT said 2); a ranking of options is
    asked as options on criteria, a risk ranking as likelihood x impact."""
    from keepstep.engine.gateway.prompts import render_messages

    def asked(ranks: str) -> list[dict[str, str]]:
        return render_messages(load_prompt("rank"), inputs={"task": "rank", "round": 2},
                               contract={}, unit={"id": "K1", "title": "Rank",
                                                  "question": "", "ranks": ranks},
                               schema=None)

    system, user = (m["content"] for m in asked("options"))
    assert '"round": 1' not in user and '"round": 2' in user
    assert "likelihood (1-5) x impact" not in system
    assert "rank the options" in system and "criteria INPUT declares" in system
    risks = asked("risks")[0]["content"]
    assert "likelihood (1-5) x impact (1-5)" in risks and "options" not in risks


def test_the_extract_prompt_has_one_rule_for_years() -> None:
    """"figures" lists every number, years included, and a dating year is no quantity: one
    rule, stated the same way in both places (model remarks 0003, 0004)."""
    prompt = load_prompt("extract")
    text = prompt.system + prompt.user
    assert "years that only date the statement are not quantities" not in text
    assert "years and dates included" in text
    assert "a year that only dates the statement stays in \"figures\" without a quantity" \
        in text
