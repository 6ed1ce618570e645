"""Canonical JSON and sha256 for the engine's own fingerprints (plans, contracts, inputs).

Byte-for-byte the same encoding as ``keepstep.storage.hashing`` (a test pins that), kept
here so that the pure core imports nothing from storage.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    """The hex sha256 of bytes, or of a string encoded as UTF-8."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()
