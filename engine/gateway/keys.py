"""API keys: from the environment first, then the OS keyring; never stored by keepstep itself.

Callers may rely on:
- ``get_api_key`` never raising for a missing or broken keyring (it answers None);
- ``require_api_key`` raising one MissingKeyError naming both the environment variable and
  the ``keepstep keys set PROVIDER`` command;
- no function here logging, printing or returning a key other than the ``get_api_key`` family.

keyring is imported lazily: its backend discovery is slow and touches the desktop session.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlparse

from keepstep.engine.errors import KeyringUnavailable, MissingKeyError

KEYRING_SERVICE = "keepstep"

# Names litellm itself reads, so a key set for litellm works here too.
_ENV_VARS: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "groq": "GROQ_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "cohere": "COHERE_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "xai": "XAI_API_KEY",
    "together_ai": "TOGETHERAI_API_KEY",
    "azure": "AZURE_API_KEY",
}

# Providers that run on this machine and take no key.
# The offline heuristic's provider prefix (``gateway.offline_provider``), named here so that
# code that only tells it apart does not load the heuristic.
OFFLINE_PROVIDER = "local"
KEYLESS_PROVIDERS = frozenset({OFFLINE_PROVIDER, "ollama", "ollama_chat", "lm_studio",
                               "llamafile"})

KeySource = Literal["env", "keyring"]


def env_var_name(provider: str) -> str:
    """The environment variable holding ``provider``'s key, e.g. ``OPENAI_API_KEY``."""
    provider = provider.strip().lower()
    return _ENV_VARS.get(provider, f"{provider.upper().replace('-', '_')}_API_KEY")


def is_local_api_base(api_base: str | None) -> bool:
    """True when ``api_base`` points at this machine (localhost or a loopback address)."""
    if not api_base:
        return False
    host = urlparse(api_base if "//" in api_base else f"//{api_base}").hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_required(provider: str, *, api_base: str | None = None) -> bool:
    """Whether a call to ``provider`` (optionally at ``api_base``) needs an API key."""
    return provider.strip().lower() not in KEYLESS_PROVIDERS and not is_local_api_base(api_base)


def key_source(provider: str, *, env: Mapping[str, str] = os.environ) -> KeySource | None:
    """Where ``provider``'s key would come from, without returning it."""
    if env.get(env_var_name(provider)):
        return "env"
    return "keyring" if _keyring_get(provider) else None


def get_api_key(provider: str, *, env: Mapping[str, str] = os.environ) -> str | None:
    """The key for ``provider``: its environment variable when set, else the OS keyring, else None.

    An empty environment variable counts as unset. A missing, locked or failing keyring
    answers None rather than raising.
    """
    value = env.get(env_var_name(provider))
    if value:
        return value
    return _keyring_get(provider)


def missing_key_error(provider: str) -> MissingKeyError:
    """The one error a user sees when ``provider`` has no key anywhere."""
    provider = provider.strip().lower()
    var = env_var_name(provider)
    return MissingKeyError(
        f"no API key for provider '{provider}': set the environment variable {var}, "
        f"or store one in the OS keyring with `keepstep keys set {provider}`",
        hint="or pick a model that needs no key, e.g. local/keepstep-offline",
    )


def require_api_key(provider: str, *, env: Mapping[str, str] = os.environ) -> str:
    """Like ``get_api_key`` but raises MissingKeyError when there is no key."""
    key = get_api_key(provider, env=env)
    if key is None:
        raise missing_key_error(provider)
    return key


def set_api_key(provider: str, key: str) -> None:
    """Store ``key`` for ``provider`` in the OS keyring.

    Raises KeyringUnavailable when no real keyring backend exists (or it refuses the write);
    the message points at the environment variable instead.
    """
    import keyring
    import keyring.errors

    provider = provider.strip().lower()
    if not key.strip():
        raise ValueError("an API key cannot be empty")
    if not _has_real_backend(keyring.get_keyring()):
        raise _keyring_unavailable(provider, "no OS keyring backend is available on this machine")
    try:
        keyring.set_password(KEYRING_SERVICE, provider, key.strip())
    except keyring.errors.KeyringError as exc:
        why = f"the OS keyring refused the key ({type(exc).__name__})"
        raise _keyring_unavailable(provider, why) from None


def keyring_available() -> bool:
    """Whether an OS keyring backend that can hold a key exists (not the null or fail
    backend). Asks keyring only which backend it picked; reads and writes nothing."""
    import keyring

    try:
        return _has_real_backend(keyring.get_keyring())
    except Exception:  # a broken backend configuration counts as none
        return False


def require_keyring(provider: str) -> None:
    """Raise KeyringUnavailable (naming ``provider``'s environment variable) when no OS keyring
    backend can hold a key — so a caller can refuse before asking for one."""
    if not keyring_available():
        raise _keyring_unavailable(provider, "no OS keyring backend is available on this machine")


def delete_api_key(provider: str) -> bool:
    """Remove ``provider``'s key from the OS keyring; False when there was none to remove."""
    import keyring
    import keyring.errors

    try:
        keyring.delete_password(KEYRING_SERVICE, provider.strip().lower())
    except keyring.errors.PasswordDeleteError:
        return False
    except keyring.errors.KeyringError as exc:
        raise _keyring_unavailable(provider, f"the OS keyring failed ({type(exc).__name__})"
                                   ) from None
    return True


def _keyring_get(provider: str) -> str | None:
    import keyring
    import keyring.errors

    try:
        return keyring.get_password(KEYRING_SERVICE, provider.strip().lower()) or None
    except keyring.errors.KeyringError:
        return None


def _has_real_backend(backend: object) -> bool:
    # The null backend silently drops writes and the fail backend raises on every call;
    # neither can hold a key.
    from keyring.backends import fail, null

    return not isinstance(backend, fail.Keyring | null.Keyring)


def _keyring_unavailable(provider: str, why: str) -> KeyringUnavailable:
    return KeyringUnavailable(
        f"cannot store the key for '{provider}': {why}",
        hint=f"set the environment variable {env_var_name(provider)} instead "
        "(or install a keyring backend, e.g. `pip install keyrings.alt`)",
    )


# --- where a provider is called --------------------------------------------------------------

# The address litellm calls when nothing else is configured.
DEFAULT_ADDRESSES: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "mistral": "https://api.mistral.ai/v1",
    "groq": "https://api.groq.com/openai/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "deepseek": "https://api.deepseek.com",
    "xai": "https://api.x.ai/v1",
    "together_ai": "https://api.together.xyz/v1",
    "cohere": "https://api.cohere.ai",
    "ollama": "http://localhost:11434",
    "ollama_chat": "http://localhost:11434",
    "local": "(in process: the offline heuristic model)",
}
# Environment variables litellm reads for a provider's address, in the order it reads them.
_ADDRESS_ENV: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_BASE"),
    "anthropic": ("ANTHROPIC_API_BASE", "ANTHROPIC_BASE_URL"),
    "ollama": ("OLLAMA_API_BASE",),
    "ollama_chat": ("OLLAMA_API_BASE",),
}


def known_providers() -> list[str]:
    """Providers keepstep knows the key variable or the default address of."""
    return sorted(set(_ENV_VARS) | set(DEFAULT_ADDRESSES) - {"local"})


def provider_address(provider: str, *, configured: str | None = None,
                     env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """``(address, where it comes from)`` of the calls to ``provider``: keepstep.toml's
    ``api_base``/``api_bases`` first (passed as ``configured``), then the environment
    variable litellm honours (e.g. OPENAI_API_BASE), then litellm's default."""
    provider = provider.strip().lower()
    if configured:
        return configured, "keepstep.toml"
    for var in _ADDRESS_ENV.get(provider, (f"{provider.upper()}_API_BASE",)):
        if env.get(var):
            return env[var], f"environment {var}"
    return DEFAULT_ADDRESSES.get(provider, "(litellm's default for the provider)"), "default"


def unexpected_address(provider: str, address: str) -> bool:
    """True when a key for ``provider`` would go somewhere other than its default address
    and not to this machine — the case a person must see before a key is sent there."""
    default = DEFAULT_ADDRESSES.get(provider.strip().lower())
    return default is not None and address.rstrip("/") != default.rstrip("/") and \
        not is_local_api_base(address)


# A small, cheap model per provider for `keepstep keys test` when none is named.
TEST_MODELS: dict[str, str] = {
    "openai": "openai/gpt-4o-mini",
    "anthropic": "anthropic/claude-3-5-haiku-latest",
    "gemini": "gemini/gemini-1.5-flash",
    "mistral": "mistral/mistral-small-latest",
    "groq": "groq/llama-3.1-8b-instant",
    "local": "local/keepstep-offline",
}
