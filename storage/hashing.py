"""Canonical JSON and the hashes the chain is built from.

The state hash is an additive multiset hash: the sum, modulo 2**256, of one
sha256 per (key, value) entry. It can be updated from a delta alone (subtract
the old entry, add the new one), so a commit costs O(changed keys) however
large the plan or long the history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

_MOD = 1 << 256
EMPTY_STATE_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def _entry(key: str, value_json: str) -> int:
    return int(sha256_hex(f"{key}\x00{value_json}"), 16)


def state_hash_update(
    current: str,
    removed: Iterable[tuple[str, str]],
    added: Iterable[tuple[str, str]],
) -> str:
    """Return the state hash after removing and adding (key, canonical value) entries."""
    acc = int(current, 16)
    for key, value_json in removed:
        acc = (acc - _entry(key, value_json)) % _MOD
    for key, value_json in added:
        acc = (acc + _entry(key, value_json)) % _MOD
    return f"{acc:064x}"


def state_hash_of(state: Mapping[str, str]) -> str:
    """Hash of a whole state given as key -> canonical JSON value."""
    return state_hash_update(EMPTY_STATE_HASH, (), state.items())


def file_sha256(path: str, *, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
