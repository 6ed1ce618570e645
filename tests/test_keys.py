"""Pins API key resolution: environment first, then the OS keyring, one clear message otherwise."""

from __future__ import annotations

import os

os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

import keyring
import keyring.errors
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail, null

from keepstep.engine.errors import KeyringUnavailable, MissingKeyError
from keepstep.engine.gateway import keys


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


class _BrokenKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def get_password(self, service, username):
        raise keyring.errors.KeyringLocked("locked")

    def set_password(self, service, username, password):
        raise keyring.errors.PasswordSetError("refused")

    def delete_password(self, service, username):
        raise keyring.errors.KeyringLocked("locked")


@pytest.fixture
def backend(request):
    """Install a keyring backend for one test and restore the previous one afterwards."""
    previous = keyring.get_keyring()
    keyring.set_keyring(request.param())
    yield keyring.get_keyring()
    keyring.set_keyring(previous)


@pytest.mark.parametrize("backend", [_MemoryKeyring], indirect=True)
def test_env_var_wins_over_keyring(backend):
    """The environment variable is used even when the keyring holds another key."""
    backend.set_password("keepstep", "openai", "sk-from-keyring")
    assert keys.get_api_key("openai", env={"OPENAI_API_KEY": "sk-from-env"}) == "sk-from-env"
    assert keys.key_source("openai", env={"OPENAI_API_KEY": "sk-from-env"}) == "env"


@pytest.mark.parametrize("backend", [_MemoryKeyring], indirect=True)
def test_keyring_is_used_when_env_var_is_empty(backend):
    """An empty environment variable counts as unset and the keyring answers."""
    backend.set_password("keepstep", "anthropic", "sk-ant-from-keyring")
    env = {"ANTHROPIC_API_KEY": ""}
    assert keys.get_api_key("anthropic", env=env) == "sk-ant-from-keyring"
    assert keys.key_source("anthropic", env=env) == "keyring"


@pytest.mark.parametrize("backend", [null.Keyring], indirect=True)
def test_null_keyring_gives_none_and_require_names_env_var_and_command(backend):
    """No env var and an empty keyring: None, and require_api_key says both ways to fix it."""
    assert keys.get_api_key("openai", env={}) is None
    with pytest.raises(MissingKeyError) as caught:
        keys.require_api_key("openai", env={})
    message = str(caught.value)
    assert "OPENAI_API_KEY" in message
    assert "keepstep keys set openai" in message


@pytest.mark.parametrize("backend", [_BrokenKeyring, fail.Keyring], indirect=True)
def test_failing_keyring_is_treated_as_no_key(backend):
    """A keyring raising KeyringError (locked, or no backend at all) yields None, not a crash."""
    assert keys.get_api_key("openai", env={}) is None
    assert keys.key_source("openai", env={}) is None


def test_generic_env_var_name_for_unlisted_provider():
    """Providers without a special name use PROVIDER_API_KEY."""
    assert keys.env_var_name("fireworks_ai") == "FIREWORKS_AI_API_KEY"
    assert keys.get_api_key("fireworks_ai", env={"FIREWORKS_AI_API_KEY": "k-1"}) == "k-1"


@pytest.mark.parametrize("backend", [null.Keyring, fail.Keyring, _BrokenKeyring], indirect=True)
def test_set_api_key_without_usable_keyring_raises_clear_error(backend):
    """Storing a key with no usable keyring raises KeyringUnavailable pointing at the env var."""
    with pytest.raises(KeyringUnavailable) as caught:
        keys.set_api_key("openai", "sk-secret-value-123456")
    assert "OPENAI_API_KEY" in str(caught.value)
    assert "sk-secret" not in str(caught.value)


@pytest.mark.parametrize("backend", [_MemoryKeyring], indirect=True)
def test_set_then_get_then_delete_round_trip(backend):
    """A stored key is found by get_api_key and gone after delete_api_key."""
    keys.set_api_key("openai", "sk-stored-123456")
    assert keys.get_api_key("openai", env={}) == "sk-stored-123456"
    assert keys.delete_api_key("openai") is True
    assert keys.get_api_key("openai", env={}) is None
    assert keys.delete_api_key("openai") is False


def test_keyless_providers_and_local_api_base():
    """local and ollama need no key; neither does any provider at a loopback api_base."""
    assert not keys.key_required("local")
    assert not keys.key_required("ollama")
    assert not keys.key_required("openai", api_base="http://127.0.0.1:8080/v1")
    assert not keys.key_required("openai", api_base="http://localhost:11434")
    assert not keys.key_required("openai", api_base="http://[::1]:8000/v1")
    assert keys.key_required("openai")
    assert keys.key_required("openai", api_base="https://api.example.com/v1")
    assert keys.key_required("openai", api_base="http://localhost.evil.com/v1")
