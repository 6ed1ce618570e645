"""The model's window: a source too long for one request is split into chunks on paragraph
boundaries (evidence ids as in one piece); a single request that cannot fit is refused
before any call, with a message naming the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway.offline_model import extract_evidence
from keepstep.engine.gateway.prompts import read_input_block
from tests.support.engine_harness import PACK, RUN, make_small_project
from tests.support.model_server import running_server
from tests.support.small_project import extract_only_units

SMALL_MODEL = "openai/keepstep-small-window"  # litellm does not know it: context_tokens rules
WINDOW = {"context_tokens": 3000, "max_tokens": 600}


@pytest.fixture(autouse=True)
def _dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")


def _project(tmp_path: Path, api_base: str, text: str,
             window: dict[str, int] | None = None) -> Path:
    root = make_small_project(tmp_path / "ctx", per_group=1, units=extract_only_units(1),
                              default_model=SMALL_MODEL, api_base=api_base,
                              **(window or WINDOW))
    # A1 (the pack's PDF) becomes a Markdown file holding ``text``.
    (root / "sources" / "A1-long.md").write_text(text, encoding="utf-8")
    toml = root / "sources.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace(
        "sources/A1-market-overview.pdf", "sources/A1-long.md"), encoding="utf-8")
    return root


def _long_text() -> str:
    return "\n\n".join(p.read_text(encoding="utf-8")
                       for p in sorted((PACK / "sources").glob("[A-D]*.md")))


def test_a_long_source_is_chunked_with_stable_evidence_ids(tmp_path: Path) -> None:
    """The source is sent in several paragraph chunks, each request within the window, each
    chunk numbering on from ``first_id``: the evidence equals the one-piece extraction."""
    text = _long_text()
    with running_server("clean") as server:
        root = _project(tmp_path, server.api_base, text)
        with open_project(root) as p:
            status = p.start_run(RUN).run()
            record = p.get_run(RUN).facts_records()["E01"]
            evidence = json.loads((p.store.artifacts.root / record.outputs["evidence.json"].path)
                                  .read_text())["evidence"]
    assert status.decision == "done", status.reasons
    chunks = [read_input_block(e["messages"]) for e in server.requests_for(source_id="A1")]
    assert len(chunks) > 2
    assert [c["first_id"] for c in chunks][0] == 1
    assert "".join(c["text"] for c in chunks).replace("\n", "") == text.replace("\n", "")
    assert all(e["prompt_tokens"] < 3000 for e in server.log)
    assert record.facts["chunked_sources"] == 1
    whole = extract_evidence("A1", text)
    mine = [e for e in evidence if e["source_id"] == "A1"]
    assert [(e["id"], e["quote"]) for e in mine] == [(e["id"], e["quote"]) for e in whole]


def test_an_overlong_single_request_is_refused_before_any_call(tmp_path: Path) -> None:
    """One paragraph longer than any request can hold: the unit fails at once, naming the
    model's limit and where it comes from; no call is reserved or sent."""
    sentence = "The installed base grew by 4% a year in every region of the country. "
    with running_server("clean") as server:
        root = _project(tmp_path, server.api_base, "# One block\n\n" + sentence * 400)
        with open_project(root) as p:
            status = p.start_run(RUN).run()
            calls = p.get_run(RUN).calls()
    unit = status.units["E01"]
    assert unit.state == "failed"
    reason = unit.reason or ""
    assert "keepstep-small-window takes at most 2,400 input tokens" in reason
    assert "context_tokens in keepstep.toml" in reason and "refused before any call" in reason
    assert "tokens 0/" not in reason and "--calls" not in reason
    assert calls == [] and server.log == []
    assert status.units["E01"].attempts == 1  # permanent: not retried


@pytest.mark.parametrize(("context_tokens", "counts"), [(100_000, 1), (3000, 2)])
def test_a_source_whose_bytes_fit_is_sent_whole_without_counting_it_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, context_tokens: int,
        counts: int) -> None:
    """No tokenizer makes more tokens than a text has UTF-8 bytes: a source whose request
    bytes fit the window is sent in one piece and tokenized once (for the request's own
    reservation), not also rendered and counted beforehand to decide whether it must be
    split. In a 3,000-token window the same request's bytes do not fit: it is counted
    exactly first (the reservation then reuses that count), and still sent whole."""
    from keepstep.engine.gateway import profile

    marker = "Zebra-marker paragraph: the churn rate was 4.1% in 2024."
    counted: list[int] = []
    real = profile._count

    def counting(model: str, messages: list[dict[str, object]]) -> int:
        if any(marker in str(m.get("content")) for m in messages):
            counted.append(1)
        return real(model, messages)

    monkeypatch.setattr(profile, "_count", counting)
    profile._count_cached.cache_clear()
    with running_server("clean") as server:
        root = _project(tmp_path, server.api_base, f"# Notes\n\n{marker}\n",
                        window={"context_tokens": context_tokens, "max_tokens": 600})
        with open_project(root) as p:
            status = p.start_run(RUN).run()
    assert status.decision == "done", status.reasons
    requests = server.requests_for(source_id="A1")
    assert len(requests) == 1 and marker in read_input_block(requests[0]["messages"])["text"]
    assert len(counted) == counts


def test_max_tokens_is_sized_per_request_from_the_expected_answer(tmp_path: Path) -> None:
    """Each request's max_tokens comes from its expected answer (claims × a verdict, claims ×
    a support verdict, a source's statements quoted), within the model's output limit; a
    request with no estimate sends the configured max_tokens. With a small output limit in
    keepstep.toml's model settings, the claim check is split into batches whose expected
    answers fit it, and no request asks for more."""
    from keepstep.engine.gateway.profile import model_profile
    from keepstep.engine.kinds.extract import expected_answer
    from keepstep.engine.kinds.synthesize import support_answer_tokens
    from keepstep.engine.kinds.verify import expected_answer as verify_answer

    model = "openai/gpt-4o-mini"
    profile = model_profile(model, max_tokens=4096)
    with running_server("clean") as server:
        root = make_small_project(tmp_path / "sized", default_model=model,
                                  api_base=server.api_base)
        with open_project(root) as p:
            assert p.start_run(RUN).run().decision == "done"
        sent = [(read_input_block(e["messages"]) or {}, e["max_tokens"]) for e in server.log]
    by_task: dict[str, list[tuple[dict, int]]] = {}
    for payload, max_tokens in sent:
        by_task.setdefault(payload["task"], []).append((payload, max_tokens))
    assert {"extract", "verify", "support", "synthesize"} <= set(by_task)
    for payload, max_tokens in by_task["extract"]:
        assert max_tokens == profile.max_tokens_for(expected_answer(payload["text"]))
    for payload, max_tokens in by_task["verify"]:
        expected = verify_answer(payload["claims"], payload["candidates"])
        assert max_tokens == profile.max_tokens_for(expected)
    for payload, max_tokens in by_task["support"]:
        assert max_tokens == profile.max_tokens_for(support_answer_tokens(len(payload["claims"])))
    # A full sentence of reason per claim: six claims no longer get the 512-token floor the
    # recorded real model found too tight (model remarks 0013, 0019).
    assert profile.max_tokens_for(support_answer_tokens(6)) > 512
    assert {m for _, m in by_task["synthesize"]} == {4096}
    assert len({m for _, m in sent}) > 3 and max(m for _, m in sent) <= profile.answer_limit

    limit = 700
    with running_server("clean") as server:
        root = make_small_project(tmp_path / "capped", default_model=model,
                                  api_base=server.api_base,
                                  model_settings={model: {"max_output_tokens": limit}})
        with open_project(root) as p:
            assert p.start_run(RUN).run().decision == "done"
        checks = [(read_input_block(e["messages"]), e["max_tokens"])
                  for e in server.requests_for(task="verify")]
        assert all(e["max_tokens"] <= limit for e in server.log)
    assert len(checks) > 1  # split: one request's answer would not fit 700 tokens
    assert sum(len(c["claims"]) for c, _ in checks) == sum(
        len(c["claims"]) for c, _ in by_task["verify"])
    for payload, _ in checks:
        assert verify_answer(payload["claims"], payload["candidates"]) <= limit * 0.8
