"""plan.toml written back the way a person left it: comments, order and layout kept.

``save_plan`` compares the plan being saved with the plan the file holds now, both in the
plan's own TOML form (``Plan.to_toml_dict``), and edits the parsed document (tomlkit) only
where they differ: a changed key of a unit or gate is rewritten in its table, a removed one
is dropped, a new unit or gate is inserted where the plan has it, a deleted one is taken
out. Everything else — comments, blank lines, key order, the way lists are written — stays
byte for byte. A file that is not a readable plan is compared as plain TOML instead.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import AoT, InlineTable, Table

from keepstep.engine.core.plan import Plan

# Tables of tables keyed by id (``[[unit]]``, ``[[gate]]``).
_KEYED = ("unit", "gate")


def save_plan(path: Path, plan: Plan) -> None:
    """Write ``plan`` to ``path`` (atomically), keeping what the file already says the same
    way: only the keys that changed are rewritten."""
    new = plan.to_toml_dict()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        doc = tomlkit.parse(text)
        _merge(doc, _normalised(text), new)
        out = tomlkit.dumps(doc)
    else:
        out = tomlkit.dumps(_pruned(new))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(out, encoding="utf-8")
    os.replace(tmp, path)


def _normalised(text: str) -> dict[str, Any]:
    """The file's plan in ``to_toml_dict`` form (so defaults compare equal), else its TOML."""
    raw = tomllib.loads(text)
    try:
        return Plan.model_validate(raw).to_toml_dict()
    except Exception:  # noqa: BLE001 - an invalid plan is compared key by key as written
        return raw


def _pruned(value: Any) -> Any:
    """``value`` without empty lists, tables and None (what a person would not write)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v not in (None, [], {}, "")}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _merge(container: Any, old: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if key in _KEYED and isinstance(value, list) and isinstance(container.get(key), AoT):
            _merge_keyed(container[key], before or [], value)
        elif isinstance(value, dict) and isinstance(container.get(key), Table):
            _merge(container[key], before if isinstance(before, dict) else {}, value)
        elif isinstance(value, dict) and isinstance(container.get(key), InlineTable):
            # Written inline ({ step = "inventory" }): edited in place, it stays inline.
            _merge(container[key], before if isinstance(before, dict) else {}, value)
        elif key in container or value not in (None, [], {}, ""):
            container[key] = _pruned(value)
    for key in [k for k in old if k not in new]:
        if key in container:
            del container[key]


def _merge_keyed(tables: AoT, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """Match ``[[unit]]``/``[[gate]]`` tables by id; edit, drop or insert only what changed."""
    old_by_id = {str(t.get("id")): t for t in old}
    new_ids = [str(t.get("id")) for t in new]
    for i in reversed(range(len(tables))):
        if str(tables[i].get("id")) not in new_ids:
            del tables[i]
    for position, entry in enumerate(new):
        uid = str(entry.get("id"))
        at = next((i for i, t in enumerate(tables) if str(t.get("id")) == uid), None)
        if at is None:
            table = tomlkit.table()
            table.update(_pruned(entry))
            tables.insert(min(position, len(tables)), table)
            continue
        _merge(tables[at], old_by_id.get(uid, {}), entry)


__all__ = ["save_plan"]
