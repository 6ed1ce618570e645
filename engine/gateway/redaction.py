"""Key-like strings, found and replaced, for everything that leaves the engine as text.

The database never holds keys (the gateway scrubs provider errors before they are stored);
this is the second line: the handover bundle and the narrative pass every string through
``redact``, and ``verify_bundle`` reports any file where ``find_secrets`` still finds one.
"""

from __future__ import annotations

import json
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


BODY_LINE_LIMIT = 160
_BODY_START = re.compile(r"[{\[<]")


def body_line(text: str, limit: int = BODY_LINE_LIMIT) -> str:
    """What may be kept of a provider's error body: its first line, and of a JSON body only
    its ``message`` (an HTML or other markup body is dropped), redacted, at most ``limit``
    characters. The status and the error class are kept by the caller; the rest of the
    body (echoed prompts, request ids, account details) is never stored or printed."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else ""
    match = _BODY_START.search(line)
    if match:
        head, body = line[:match.start()].rstrip(" -:"), line[match.start():]
        message = _json_message(body)
        line = f"{head}: {message}" if head and message else (message or head)
    line = redact(line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _json_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    for _ in range(3):  # {"error": {"message": ...}} or {"message": ...}
        if not isinstance(data, dict):
            return ""
        if isinstance(data.get("message"), str):
            return data["message"].strip().splitlines()[0] if data["message"].strip() else ""
        data = data.get("error")
    return ""


__all__ = ["BODY_LINE_LIMIT", "SECRET_PATTERNS", "body_line", "find_secrets", "redact"]
