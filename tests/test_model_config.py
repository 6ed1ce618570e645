"""Model configuration a user can find and check: which model a unit calls and where,
`keepstep validate`'s model checks (no call made), and the `keepstep keys` commands."""

from __future__ import annotations

import os
from pathlib import Path

import keyring
import keyring.errors
import pytest
from keyring.backend import KeyringBackend
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.files.project import ProjectConfig
from tests.support.engine_harness import copy_pack
from tests.support.model_server import running_server
from tests.support.small_project import write_config

SECRET = "sk-test-keepstep-SECRET-0123456789"
RUNNER = CliRunner()


class _MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.store.get((service, username))

    def set_password(self, service, username, password):
        self.store[(service, username)] = password

    def delete_password(self, service, username):
        if (service, username) not in self.store:
            raise keyring.errors.PasswordDeleteError("none")
        del self.store[(service, username)]


@pytest.fixture
def memory_keyring():
    previous = keyring.get_keyring()
    backend = _MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in list(os.environ):
        if var.endswith(("_API_KEY", "_API_BASE", "_BASE_URL")):
            monkeypatch.delenv(var, raising=False)
    return monkeypatch


def cli(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


def test_a_unit_model_wins_over_its_kind_and_the_default() -> None:
    """unit_models[unit] > models[kind] > default_model; api_bases[provider] > api_base."""
    cfg = ProjectConfig(name="x", default_model="openai/gpt-4o-mini",
                        models={"verify": "anthropic/claude-3-5-haiku-latest"},
                        unit_models={"U21": "ollama_chat/llama3.1"},
                        api_base="http://proxy.local:4000",
                        api_bases={"ollama_chat": "http://127.0.0.1:11434"})
    assert cfg.model_for("U05", "extract") == "openai/gpt-4o-mini"
    assert cfg.model_for("U17", "verify") == "anthropic/claude-3-5-haiku-latest"
    assert cfg.model_for("U21", "verify") == "ollama_chat/llama3.1"
    assert cfg.api_base_for("ollama_chat/llama3.1") == "http://127.0.0.1:11434"
    assert cfg.api_base_for("openai/gpt-4o-mini") == "http://proxy.local:4000"


def test_validate_says_did_you_mean_and_which_key_is_missing(tmp_path: Path,
                                                             clean_env) -> None:
    """A misspelt model name gets a suggestion from litellm's list, a provider without a key
    an error naming the variable and the command; validate exits 2."""
    root = copy_pack(tmp_path / "pack")
    write_config(root, default_model="openai/gpt-4o-mni")
    result = cli("validate", root)
    assert result.exit_code == 2, result.output
    assert "did you mean 'openai/gpt-4o-mini'?" in result.output
    assert "no API key for provider 'openai': set OPENAI_API_KEY" in result.output
    assert "keepstep keys set openai" in result.output


def test_validate_passes_a_known_model_with_a_key_without_calling_it(
        tmp_path: Path, clean_env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known model and a key: plan OK, and no model was called."""
    from keepstep.engine.gateway.client import _litellm

    def no_call(**_: object) -> None:
        raise AssertionError("validate must not call a model")

    monkeypatch.setattr(_litellm(), "completion", no_call)
    clean_env.setenv("OPENAI_API_KEY", SECRET)
    root = copy_pack(tmp_path / "pack")
    write_config(root, default_model="openai/gpt-4o-mini", models={"verify": "openai/gpt-4o"})
    result = cli("validate", root)
    assert result.exit_code == 0, result.output
    assert "model openai/gpt-4o-mini: known, key available" in result.output
    assert "model openai/gpt-4o: known" in result.output and "plan OK" in result.output
    assert SECRET not in result.output


def test_keys_status_shows_where_each_provider_is_called_never_the_key(
        tmp_path: Path, clean_env) -> None:
    """keys status: the key's source and the address (here OPENAI_API_BASE, flagged as
    unexpected), and the project's providers; the key itself never appears."""
    clean_env.setenv("OPENAI_API_KEY", SECRET)
    clean_env.setenv("OPENAI_API_BASE", "http://example.test/v1")
    root = copy_pack(tmp_path / "pack")
    write_config(root, default_model="openai/gpt-4o-mini",
                 models={"verify": "ollama_chat/llama3.1"})
    result = cli("keys", "status", "--project", root)
    assert result.exit_code == 0, result.output
    assert ("openai: key environment OPENAI_API_KEY · calls go to http://example.test/v1 "
            "(environment OPENAI_API_BASE)") in result.output
    assert "warning: the openai key is sent to http://example.test/v1" in result.output
    assert "ollama_chat: key not needed · calls go to http://localhost:11434" in result.output
    assert SECRET not in result.output
    as_json = cli("keys", "status", "--json")
    assert SECRET not in as_json.output and '"unexpected_address": true' in as_json.output


def test_keys_list_and_delete_work_on_the_keyring(clean_env, memory_keyring) -> None:
    """list names the providers with a key and where it is; delete removes a keyring key."""
    memory_keyring.set_password("keepstep", "anthropic", SECRET)
    clean_env.setenv("OPENAI_API_KEY", SECRET)
    listed = cli("keys", "list")
    assert "anthropic: OS keyring" in listed.output
    assert "openai: environment OPENAI_API_KEY" in listed.output
    assert SECRET not in listed.output
    deleted = cli("keys", "delete", "anthropic")
    assert "removed the key for anthropic" in deleted.output
    assert "anthropic" not in cli("keys", "list").output
    assert "holds no key for anthropic" in cli("keys", "delete", "anthropic").output


def test_keys_test_makes_one_call_at_the_address_litellm_uses(clean_env) -> None:
    """keys test asks the model once, at the address the environment names, and says so."""
    clean_env.setenv("OPENAI_API_KEY", SECRET)
    with running_server("clean") as server:
        clean_env.setenv("OPENAI_API_BASE", server.api_base)
        result = cli("keys", "test", "openai")
        assert result.exit_code == 0, result.output
        assert len(server.log) == 1 and server.log[0]["model"] == "gpt-4o-mini"
    assert f"ok: openai/gpt-4o-mini answered at {server.api_base}" in result.output
    assert SECRET not in result.output
