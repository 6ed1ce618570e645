"""Which committed artifacts are current, read from the materialised state.

The engine keeps one ``unit:<id>`` key per unit that ever succeeded (engine/state.py
``UnitRecord``): ``{"state": "succeeded" | "invalidated", "attempt": "U07/a2",
"outputs": {name: {"sha256": ..., "path": <relative to the artifact root>}}, ...}``.
Backup, restore and gc need only that much of it: a unit is current when its record
says "succeeded", and then its attempt and its outputs' files must be kept and verify.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

UNIT_PREFIX = "unit:"
SUCCEEDED = "succeeded"


class CurrentUnit(BaseModel):
    unit: str
    attempt: str
    outputs: dict[str, str] = Field(default_factory=dict)  # artifact path -> sha256


def current_unit(key: str, value: Any) -> CurrentUnit | None:
    """The current unit a ``unit:<id>`` state entry describes, or None (not current)."""
    if not key.startswith(UNIT_PREFIX) or not isinstance(value, Mapping):
        return None
    if value.get("state") != SUCCEEDED or not isinstance(value.get("attempt"), str):
        return None
    outputs = {}
    for ref in (value.get("outputs") or {}).values():
        if isinstance(ref, Mapping) and isinstance(ref.get("path"), str):
            outputs[ref["path"]] = str(ref.get("sha256", ""))
    return CurrentUnit(unit=key[len(UNIT_PREFIX):], attempt=value["attempt"], outputs=outputs)


def current_units(state: Mapping[str, Any]) -> dict[str, CurrentUnit]:
    """unit id -> CurrentUnit for every ``unit:*`` entry of a state that is current."""
    out = {}
    for key, value in state.items():
        cur = current_unit(key, value)
        if cur is not None:
            out[cur.unit] = cur
    return out
