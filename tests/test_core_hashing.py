"""The core's fingerprints hash exactly like storage's chain: one canonical JSON encoding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keepstep.engine.core import hashing as core
from keepstep.storage import hashing as storage

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_core_and_storage_encode_every_value_the_same(value: object) -> None:
    """canonical_json and sha256_hex agree byte for byte (plan fingerprints stay stable)."""
    assert core.canonical_json(value) == storage.canonical_json(value)
    text = core.canonical_json(value)
    assert core.sha256_hex(text) == storage.sha256_hex(text)
    assert core.sha256_hex(text.encode()) == storage.sha256_hex(text.encode())
