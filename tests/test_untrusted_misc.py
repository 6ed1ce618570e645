"""Smaller untrusted-input holes: a provider error keeps its class, status and first line
only; an unreadable state folder names the missing permission; export refuses a run whose
checkpoint chain is broken."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine import open_project
from keepstep.engine.gateway.classification import classify
from keepstep.engine.gateway.redaction import body_line
from keepstep.storage import ChainBroken
from tests.support.engine_harness import RUN, make_small_project

RUNNER = CliRunner()


def test_a_provider_error_keeps_class_status_and_first_line_only() -> None:
    """A 500 whose body is JSON echoing the prompt and an account id keeps only the body's
    message; an HTML body is dropped; later lines never appear."""

    class Boom(Exception):
        status_code = 500

    body = json.dumps({"error": {"message": "upstream overloaded", "type": "server_error",
                                 "prompt_echo": "CLIENT CONFIDENTIAL plan", "org": "org-9x"}})
    error = classify(Boom(f"InternalServerError: OpenAIException - {body}\nTraceback: x"))
    text = str(error).splitlines()[0]
    assert "HTTP 500" in text and "upstream overloaded" in text
    assert "CONFIDENTIAL" not in str(error) and "org-9x" not in str(error)
    assert "Traceback" not in str(error)
    html = classify(Boom("Bad gateway <html><body>internal host db-7.corp</body></html>"))
    assert "db-7.corp" not in str(html) and "HTTP 500" in str(html)
    assert body_line("x" * 1000).endswith("…") and len(body_line("x" * 1000)) == 160


def test_an_unreadable_state_folder_names_the_missing_permission(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """A PermissionError on the state folder is a clear message naming the path and the
    command that fixes it, not 'internal error … a bug in keepstep'."""
    import keepstep.engine as engine

    root = make_small_project(tmp_path / "p")
    state = root / ".keepstep"
    state.mkdir()

    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(state / "state.db"))
    monkeypatch.setattr(engine, "open_project", denied)
    result = RUNNER.invoke(app, ["status", str(root)])
    assert result.exit_code == 1, result.output
    assert "permission denied" in result.output and str(state) in result.output
    assert "chmod -R u+rwX" in result.output and "bug" not in result.output


def test_export_refuses_a_run_whose_chain_is_broken(tmp_path: Path) -> None:
    """export verifies the checkpoint chain first, as resume and handover do: an edited
    checkpoint stops it naming the version, and nothing is written."""
    root = make_small_project(tmp_path / "p")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    db = sqlite3.connect(root / ".keepstep" / "state.db")
    with db:
        (delta,) = db.execute("SELECT delta FROM checkpoints WHERE run_id = ? AND version = 3",
                              (RUN,)).fetchone()
        db.execute("UPDATE checkpoints SET delta = ? WHERE run_id = ? AND version = 3",
                   (json.dumps({**json.loads(delta), "edited": 1}), RUN))
    db.close()
    out = tmp_path / "exported"
    with open_project(root) as p, pytest.raises(ChainBroken, match="checkpoint 3"):
        p.get_run(RUN).export_deliverables(out)
    assert not out.exists()
    result = RUNNER.invoke(app, ["export", str(root), "--run", RUN, "--out", str(out)])
    assert result.exit_code != 0 and "checkpoint 3" in result.output
    assert not out.exists()


def test_keys_test_inside_a_project_calls_the_projects_api_base(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Run inside a project whose keepstep.toml points api_base at a local server,
    `keys test openai` (no --project) calls that server; `keys status` shows it too."""
    from tests.support.model_server import running_server
    from tests.support.small_project import write_config

    for var in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-SECRET-0123456789")
    root = make_small_project(tmp_path / "p")
    with running_server("clean") as server:
        write_config(root, default_model="openai/gpt-4o-mini", api_base=server.api_base)
        monkeypatch.chdir(root / "sources")
        result = RUNNER.invoke(app, ["keys", "test", "openai"])
        assert result.exit_code == 0, result.output
        assert len(server.log) == 1
        assert f"answered at {server.api_base} (keepstep.toml)" in result.output
        status = RUNNER.invoke(app, ["keys", "status"])
        assert f"openai: key environment OPENAI_API_KEY · calls go to {server.api_base} " \
               "(keepstep.toml)" in status.output


def test_keys_test_never_sends_a_key_to_an_unnamed_address_unasked(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """Outside any project, an OPENAI_API_BASE that is neither OpenAI's nor this machine's
    is named and refused before any call; --yes sends it."""
    import keepstep.engine.gateway.client as client

    calls: list[dict] = []

    def completion(**kwargs):
        calls.append(kwargs)
        raise ConnectionError("no network in tests")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-SECRET-0123456789")
    monkeypatch.setenv("OPENAI_API_BASE", "http://collector.example.test/v1")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    litellm = client._litellm()
    monkeypatch.setattr(litellm, "completion", completion)
    monkeypatch.chdir(tmp_path)
    refused = RUNNER.invoke(app, ["keys", "test", "openai"])
    assert refused.exit_code == 2, refused.output
    assert "http://collector.example.test/v1" in refused.output and "nothing was sent" in \
        refused.output and "--yes" in refused.output
    assert calls == []
    sent = RUNNER.invoke(app, ["keys", "test", "openai", "--yes"])
    assert calls, sent.output  # (a connection error is retried)
    assert "http://collector.example.test/v1 (environment OPENAI_API_BASE)" in sent.output
