"""``--json`` output: the fast indented encoder writes exactly what
``json.dumps(indent=2, ensure_ascii=False, default=str)`` writes."""

from __future__ import annotations

import datetime as dt
import enum
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keepstep.app.cli.json_text import indented_json
from keepstep.app.cli.output import to_json
from tests.support.hypothesis_profiles import examples


class Colour(enum.StrEnum):
    red = "red"


class Level(enum.IntEnum):
    high = 3


def stdlib(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text()
           | st.sampled_from([Colour.red, Level.high, -0.0, 1e300, "é\n\"\\\t\u2028", "💡"]))
objects = st.sampled_from([dt.datetime(2026, 12, 2, 11, 30), Path("a/b"), object.__name__,
                           dt.date(2026, 1, 1)])
keys = (st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        | st.booleans() | st.none()
        | st.just(Colour.red))
values = st.recursive(
    scalars | objects,
    lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.dictionaries(keys, inner, max_size=5)),
    max_leaves=40)


@settings(max_examples=examples(400), deadline=None)
@given(values)
def test_the_indented_json_is_the_standard_librarys(data: Any) -> None:
    """Nested dicts, lists and tuples (empty, flat or not) of every scalar JSON knows, str and
    int enums, keys of every allowed type, and objects written through ``default=str``."""
    assert indented_json(data) == stdlib(data)


def test_a_status_shaped_document_is_the_same() -> None:
    """The shape ``keepstep status --json`` prints: flat unit views inside a dict of units."""
    units = {f"U{i:05d}": {"state": "pending", "attempts": i % 3, "current_attempt": None,
                           "reason": None, "problems": [], "answers": [], "title": f"unit {i}",
                           "phase": "p", "kind": "intake", "budget": {}} for i in range(50)}
    units["U00007"]["problems"] = [{"field": "x", "message": "m"}]
    data = {"run_id": "R", "units": units, "counts": {"current": 2}, "leases": [],
            "progress_pct": 12.5, "last_commit_at": dt.datetime(2026, 12, 2)}
    assert to_json(data) == stdlib(data)


def test_a_key_json_cannot_write_is_refused() -> None:
    with pytest.raises(TypeError):
        indented_json({("a", 1): 1, "b": [1, 2]})


def test_a_float_that_is_not_finite_is_written_as_null() -> None:
    """Valid JSON, where json.dumps writes Infinity/NaN (which JSON readers refuse)."""
    assert json.loads(indented_json({"a": float("inf"), "b": [float("nan")]})) == {
        "a": None, "b": [None]}
