"""Replay a recorded real-model run: answer each model request from request/answer pairs the
relay (../shared/tools/relay_server.py) wrote, with no network.

A recording is a folder holding ``queue/NNNN.json`` (the request as the relay received it:
``messages``, ``response_format``, ``max_tokens`` ...) and ``answers/NNNN.json``
(``{"content": <the model's message>}``). A request is answered by the pair whose messages
are the same (a hash of them); when none is — the prompts changed since the recording — by
its place: the n-th request of the same (unit, task, source, first id) gets the n-th
recorded answer of that key, in the recording's order. ``RelayReplay.matched`` says how
each request was answered, so a test can tell an exact replay from a positional one.

A request the recording has no answer for raises ``ReplayMiss`` naming it — unless the
replay was made with ``unrecorded="offline"``: then the offline heuristic model answers it
(the rules keepstep runs without a model), and ``RelayReplay.unrecorded`` names each such
request, so a test says exactly which answers did not come from the recorded model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from keepstep.engine.gateway.prompts import read_input_block

_UNIT_RE = re.compile(r"^UNIT\n(\S+?):", re.MULTILINE)


class ReplayMiss(AssertionError):
    """A request the recording holds no answer for."""


def messages_hash(messages: list[dict[str, Any]]) -> str:
    """The identity of a request: its messages (roles and text), canonical JSON."""
    canonical = json.dumps([{"role": m.get("role"), "content": m.get("content")}
                            for m in messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def request_key(messages: list[dict[str, Any]]) -> tuple[str, str, str, str]:
    """(unit id, task, source id, first id) of a request: where it stands in the run,
    whatever its prompt's wording."""
    unit = ""
    for m in messages:
        found = _UNIT_RE.search(str(m.get("content") or ""))
        if found:
            unit = found.group(1)
            break
    block = read_input_block(messages) or {}
    return (unit, str(block.get("task", "")), str(block.get("source_id", "")),
            str(block.get("first_id", "")))


def load_pairs(folder: Path) -> list[tuple[str, dict[str, Any], str]]:
    """(number, request, answer content) of each answered request, in number order."""
    pairs = []
    for path in sorted((folder / "queue").glob("*.json")):
        answer = folder / "answers" / path.name
        if not answer.is_file():
            continue  # the relay timed out on it; the gateway asked again
        request = json.loads(path.read_text(encoding="utf-8"))
        pairs.append((path.stem, request,
                      str(json.loads(answer.read_text(encoding="utf-8"))["content"])))
    return pairs


class RelayReplay:
    """A ``completion_fn`` for ``ModelGateway`` answering from a recording."""

    def __init__(self, folder: Path, unrecorded: str = "raise") -> None:
        self.pairs = load_pairs(folder)
        self.fallback = unrecorded
        # (unit, task, source id, first id) and the INPUT block of each request the recording
        # had no answer for, answered by the offline heuristic instead.
        self.unrecorded: list[tuple[tuple[str, str, str, str], dict[str, Any]]] = []
        self._by_hash: dict[str, list[str]] = defaultdict(list)
        self._by_key: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
        self._answers = {}
        for number, request, content in self.pairs:
            self._answers[number] = content
            self._by_hash[messages_hash(request["messages"])].append(number)
            self._by_key[request_key(request["messages"])].append(number)
        self._seen: dict[tuple[str, str, str, str], int] = defaultdict(int)
        self._used: set[str] = set()
        self.matched: list[tuple[str, str]] = []  # (recorded number, "exact" | "position")
        self.requests: list[list[dict[str, Any]]] = []  # the messages asked, in order
        self.formats: list[Any] = []  # each call's response_format (None: not sent)

    def answer_for(self, messages: list[dict[str, Any]]) -> str:
        self.requests.append(messages)
        key = request_key(messages)
        place = self._seen[key]
        self._seen[key] += 1
        exact = [n for n in self._by_hash.get(messages_hash(messages), [])
                 if n not in self._used]
        if exact:
            number, how = exact[0], "exact"
        else:
            recorded = self._by_key.get(key, [])
            if place >= len(recorded):
                if self.fallback != "offline":
                    raise ReplayMiss(f"no recorded answer for request {place + 1} of {key}")
                from keepstep.engine.gateway.offline_model import respond

                block = read_input_block(messages) or {}
                self.unrecorded.append((key, block))
                self.matched.append(("-", "offline"))
                return json.dumps(respond(block))
            number, how = recorded[place], "position"
        self._used.add(number)
        self.matched.append((number, how))
        return self._answers[number]

    def __call__(self, **kwargs: Any) -> Any:
        import litellm  # the injected fn runs with litellm imported (ModelGateway says so)

        self.formats.append(kwargs.get("response_format"))
        content = self.answer_for(kwargs["messages"])
        prompt = sum(len(str(m.get("content") or "")) for m in kwargs["messages"]) // 4
        return litellm.ModelResponse(
            model=str(kwargs.get("model", "")),
            choices=[{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": content}}],
            usage=litellm.Usage(prompt_tokens=prompt, completion_tokens=len(content) // 4,
                                total_tokens=prompt + len(content) // 4))


RECORDED_MODEL = "openai/gpt-4o-mini"


def as_recorded(root: Path, model: str = RECORDED_MODEL) -> None:
    """A copy of the conflicts pack's keepstep.toml as a recorded run had it (the recorded
    model, ``request_timeout_s = 1500``), but its api_base a closed port: the replay
    transport answers every request, nothing may reach a server. The plan is the pack's own
    (the audit runs every check) but for its sections' word budgets (``words = N``), which the
    recordings predate: a recorded section over its budget would be sent back, and the
    recording holds no shorter one (test_relay_conflicts_pack checks that run 2's
    recommendation would be)."""
    plan = root / "plan.toml"
    text = plan.read_text(encoding="utf-8")
    plan.write_text(re.sub(r",\s*words\s*=\s*\d+", "", text), encoding="utf-8")
    path = root / "keepstep.toml"
    path.write_text(path.read_text(encoding="utf-8").replace(
        'default_model = "local/keepstep-offline"',
        f'default_model = "{model}"\napi_base = "http://127.0.0.1:9/v1"\n'
        "request_timeout_s = 1500"), encoding="utf-8")


def replay_pack(pack: Path, root: Path, replay: RelayReplay) -> dict[str, Any]:
    """Copy ``pack`` to ``root`` (no .keepstep), run it (run T1) with ``replay`` answering
    every model request, then list its disagreements (``keepstep conflicts --json``) and
    export its deliverables, as the recorded runs were: the status, the replay, the
    conflicts records and the exported memo. The environment is the recorded run's while it
    runs (``OPENAI_API_KEY=sk-relay``, no keyring)."""
    import shutil

    import pytest
    from typer.testing import CliRunner

    from keepstep.app.cli.main import app
    from keepstep.engine.api import open_project
    from keepstep.engine.gateway.client import ModelGateway

    shutil.copytree(pack, root, ignore=shutil.ignore_patterns(".keepstep"))
    as_recorded(root)
    cli = CliRunner()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
        mp.setenv("OPENAI_API_KEY", "sk-relay")
        with open_project(root, gateway_factory=lambda ledger: ModelGateway(
                ledger=ledger, completion_fn=replay)) as project:
            status = project.open_or_start("T1").run()
        listed = cli.invoke(app, ["conflicts", str(root), "--json"])
        exported = cli.invoke(app, ["export", str(root), "--out", str(root / "out")])
    assert listed.exit_code == 0 and exported.exit_code == 0, listed.output + exported.output
    return {"root": root, "status": status, "replay": replay,
            "conflicts": json.loads(listed.output)["conflicts"],
            "memo": (root / "out" / "memo.md").read_text(encoding="utf-8")}


def replays_reworded_by_place(folder: Path) -> None:
    """Each recorded request of ``folder``, its system prompt reworded (so no message is the
    same), gets its recorded answer, by its place (unit, task, source, first id, turn)."""
    replay = RelayReplay(folder)
    pairs = load_pairs(folder)
    for number, request, content in pairs:
        reworded = [{**m, "content": str(m["content"]) + "\nAnswer as a careful analyst."}
                    if m["role"] == "system" else m for m in request["messages"]]
        assert replay.answer_for(reworded) == content, number
    assert {how for _, how in replay.matched} == {"position"}
    assert [n for n, _ in replay.matched] == [n for n, _, _ in pairs]


__all__ = ["RECORDED_MODEL", "RelayReplay", "ReplayMiss", "as_recorded", "load_pairs",
           "messages_hash", "replay_pack", "replays_reworded_by_place", "request_key"]
