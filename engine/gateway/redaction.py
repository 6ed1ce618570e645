"""Key-like strings, found and replaced, for everything that leaves the engine as text.

The database never holds keys (the gateway scrubs provider errors before they are stored);
this is the second line: the handover bundle and the narrative pass every string through
``redact``, and ``verify_bundle`` reports any file where ``find_secrets`` still finds one.
"""

from __future__ import annotations

import re

SECRET_PATTERNS = (
    ("openai-style key", re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}")),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("google api key", re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-]{12,}")),
    ("api_key", re.compile(r"(?i)\bapi[_-]?key\b(?:[\"']?\s*[:=]\s*[\"']?[^\s,;\"']+)?")),
    ("named hex secret", re.compile(
        r"(?i)[\w-]*(?:key|secret|token|password)[\w-]*[\"']?\s*[:=]\s*[\"']?[0-9a-f]{24,}")),
)


def find_secrets(text: str) -> list[str]:
    """The names of the key-like patterns found in ``text`` (empty when clean)."""
    return [name for name, rx in SECRET_PATTERNS if rx.search(text)]


def redact(text: str) -> str:
    """``text`` with every key-like string replaced by ``[redacted]``."""
    for _name, rx in SECRET_PATTERNS:
        text = rx.sub("[redacted]", text)
    return text


__all__ = ["SECRET_PATTERNS", "find_secrets", "redact"]
