"""Settling an unknown delivery outcome (lookup first, then a recorded decision), undoing a
committed one, and pre-send webhook failures classified as "not sent"."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine import KeepstepError, open_project
from keepstep.engine.errors import EffectRejected, SideEffectError
from keepstep.engine.run.adapters import WebhookAdapter
from tests.support.effects_support import blocked_on_unknown_webhook
from tests.support.engine_harness import RUN
from tests.support.webhook_server import WebhookServer

RUNNER = CliRunner()


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def waiting(tmp_path: Path, server: WebhookServer) -> tuple[Path, str]:
    return blocked_on_unknown_webhook(tmp_path / "small", server.url)


def _row(root: Path, key: str):
    with open_project(root) as p:
        return next(e for e in p.get_run(RUN).effects() if e.key == key)


# --- pre-send failures --------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/hooks",  # connection refused: nothing was written
    "http://keepstep-no-such-host.invalid/hooks",  # the name does not resolve
    "http://[::1/hooks",  # not a URL at all
])
def test_a_webhook_failure_before_sending_is_not_sent(url: str) -> None:
    """Refused, unresolvable or invalid: EffectRejected ("nothing sent"), never unknown."""
    adapter = WebhookAdapter(url.format(port=_closed_port()), timeout=2)
    with pytest.raises(EffectRejected, match="nothing sent"):
        adapter.perform("ks-key", {"name": "report.md"})


def test_a_webhook_that_takes_the_request_but_never_answers_is_unknown() -> None:
    """Connected and sent, then no answer: the outcome is unknown (SideEffectError)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection in the backlog, never answers
        adapter = WebhookAdapter(f"http://127.0.0.1:{listener.getsockname()[1]}/hooks",
                                 timeout=0.5)
        with pytest.raises(SideEffectError, match="outcome unknown") as err:
            adapter.perform("ks-key", {"name": "report.md"})
    assert not isinstance(err.value, EffectRejected)


def test_validate_refuses_a_webhook_url_with_a_password(tmp_path: Path) -> None:
    """A user and password in the URL is refused, and the password is never echoed."""
    from tests.support.small_project import make_small_project

    root = make_small_project(tmp_path / "p", adapters={"crm": {
        "type": "webhook", "url": "https://bob:hunter2@crm.example.com/hooks"}})
    result = invoke("validate", root)
    assert result.exit_code == 2, result.output
    assert "carries a user or password" in result.output and "hunter2" not in result.output


# --- settle -------------------------------------------------------------------------------
def test_settle_looks_the_key_up_first_and_records_sent(waiting, server) -> None:
    """The server has the POST: settle finds it by key, records it sent, releases the unit,
    and the resume finishes without sending it again."""
    root, key = waiting
    posts = server.posts
    result = invoke("effects", "settle", root, key, "--run", RUN, "--who", "tester")
    assert result.exit_code == 0, result.output
    assert "settled as sent by lookup" in result.output
    row = _row(root, key)
    assert row.status == "committed" and not row.needs_person
    with open_project(root) as p:
        run = p.get_run(RUN)
        [event] = run.events(kinds=["decision.effect"])
        assert event.payload["by"] == "lookup" and event.payload["who"] == "tester"
        assert run.resume().decision == "done"
    assert server.applied[key] == 1 and server.posts == posts + 1  # only the second file


def test_settle_without_an_answer_asks_for_a_decision_then_records_it(waiting, server) -> None:
    """The adapter cannot tell (server down): nothing is recorded and exit 3; then
    --sent --ref with a reason records the person's decision."""
    root, key = waiting
    server.stop()
    asked = invoke("effects", "settle", root, key, "--run", RUN)
    assert asked.exit_code == 3, asked.output
    assert "cannot tell" in asked.output and "nothing recorded" in asked.output
    assert _row(root, key).status == "unknown"
    no_reason = invoke("effects", "settle", root, key, "--run", RUN, "--sent")
    assert no_reason.exit_code == 1 and "needs a reason" in no_reason.output
    done = invoke("effects", "settle", root, key, "--run", RUN, "--sent", "--ref", "evt-77",
                  "--reason", "the client confirmed it", "--who", "tester")
    assert done.exit_code == 0, done.output
    row = _row(root, key)
    assert row.status == "committed" and row.remote_id == "evt-77"
    with open_project(root) as p:
        [event] = p.get_run(RUN).events(kinds=["decision.effect"])
        assert event.payload["decision"] == "done" and event.payload["reason"] == \
            "the client confirmed it"


def test_settle_as_not_sent_lets_the_next_resume_send_it_with_the_same_key(
        waiting, server) -> None:
    """'not sent' marks it failed and releases the unit; the resume sends it (same key)."""
    root, key = waiting
    server.stop()
    result = invoke("effects", "settle", root, key, "--run", RUN, "--not-sent", "--reason",
                    "their log shows nothing", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "not sent"
    assert _row(root, key).status == "failed"
    server.start()
    with open_project(root) as p:
        assert p.get_run(RUN).resume().decision == "done"
    assert server.applied[key] == 1  # the server deduplicates the same key


def test_the_rerun_preview_does_not_claim_it_settles_an_unknown_effect(waiting) -> None:
    """takeover rerun of the blocked unit says a rerun does NOT settle the action."""
    root, key = waiting
    result = invoke("takeover", root, "rerun", "U09", "--run", RUN)
    assert result.exit_code == 0, result.output
    assert "does NOT settle" in result.output and "releases it" not in result.output
    assert f"effects settle {key}" in result.output


def test_needs_you_names_the_unknown_effect_with_its_settle_command(waiting) -> None:
    """status lists the waiting effect under Needs you, with `keepstep effects settle KEY`."""
    root, key = waiting
    status = json.loads(invoke("status", root, "--run", RUN, "--json").stdout)
    [need] = [n for n in status["needs"] if n["kind"] == "effect"]
    assert need["key"] == key and f"keepstep effects settle --run {RUN} {key}" in need["command"]
    assert f"effects settle --run {RUN} {key}" in status["next_action"]


# --- compensate ---------------------------------------------------------------------------
def test_compensate_previews_then_records_the_undo(waiting, server) -> None:
    """compensate prints what it undoes and the ledger entry first; without --yes (no
    terminal) nothing is recorded; with --yes the undo is a decision and a DELETE."""
    root, key = waiting
    assert invoke("effects", "settle", root, key, "--run", RUN).exit_code == 0
    preview = invoke("effects", "compensate", root, key, "--run", RUN, "--reason", "wrong file")
    assert preview.exit_code == 0, preview.output
    assert "ledger entry" in preview.output and "not recorded" in preview.output
    assert _row(root, key).status == "committed" and server.deleted[key] == 0
    done = invoke("effects", "compensate", root, key, "--run", RUN, "--reason", "wrong file",
                  "--yes", "--who", "tester")
    assert done.exit_code == 0, done.output
    assert _row(root, key).status == "compensated" and server.deleted[key] == 1
    with open_project(root) as p:
        decisions = [e.payload["decision"] for e in
                     p.get_run(RUN).events(kinds=["decision.effect"])]
    assert decisions[-1] == "compensate"


def test_compensating_what_was_not_committed_is_refused(waiting) -> None:
    """An unknown effect cannot be undone: the preview names why; nothing changes."""
    root, key = waiting
    with open_project(root) as p, pytest.raises(KeepstepError, match="only a committed"):
        p.get_run(RUN).compensate_effect(key, who="t", reason="x")
    assert _row(root, key).status == "unknown"
