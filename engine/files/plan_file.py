"""plan.toml read through a cache, and written back the way a person left it.

``PlanCache`` keeps the parsed plan and its checked problems in ``.keepstep/plan-cache.json``
(0600), keyed by the sha256 of plan.toml's bytes, keepstep's version and a hash of the
checker's own source (the plan model, its checks, their graph walks and the kind presets): a
second process reads JSON instead of parsing TOML (tomllib takes ~1 s for a 10,000-unit plan)
and does not re-run the checks. Any change of the file, of keepstep or of the checker misses
the cache. The cached plan is still validated by the pydantic model on load (a tampered cache
cannot produce a plan the model refuses), and the unit-id rule is re-checked. A cache that cannot
be read or written is ignored: it is an optimisation only.

``save_plan`` compares the plan being saved with the plan the file holds now, both in the
plan's own TOML form (``Plan.to_toml_dict``), and edits the parsed document (tomlkit) only
where they differ: a changed key of a unit or gate is rewritten in its table, a removed one
is dropped, a new unit or gate is inserted where the plan has it, a deleted one is taken
out. Everything else — comments, blank lines, key order, the way lists are written — stays
byte for byte. A file that is not a readable plan is compared as plain TOML instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Callable
from contextlib import suppress
from importlib import metadata
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import AoT, InlineTable, Table

from keepstep.engine.core import plan as plan_module
from keepstep.engine.core import plan_checks, plan_graph, presets
from keepstep.engine.core.plan import UNIT_ID_RE, Plan, PlanProblem, parse_plan
from keepstep.engine.core.plan_graph import gc_paused
from keepstep.engine.errors import ProjectError

CACHE_NAME = "plan-cache.json"
CACHE_FORMAT = 1
# Above this, plan.toml is parsed and checked without the cache (the cache is not worth
# writing for a handful of units either way; this bounds what one cache file can hold).
CACHE_MAX_BYTES = 256 * 1024 * 1024
_checker_key: str | None = None


def checker_key() -> str:
    """keepstep's version and a hash of the checker's source (computed once per process)."""
    global _checker_key
    if _checker_key is None:
        h = hashlib.sha256()
        try:
            h.update(metadata.version("keepstep").encode())
        except metadata.PackageNotFoundError:
            h.update(b"unknown")
        for module in (plan_module, plan_checks, plan_graph, presets):
            h.update(Path(str(module.__file__)).read_bytes())
        _checker_key = h.hexdigest()
    return _checker_key


class PlanCache:
    """The parsed and checked plan.toml of one project, cached under its state folder."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / CACHE_NAME
        self.key: str | None = None  # sha256 of the plan.toml last loaded
        self.hit = False  # whether that load came from the cache
        self._data: dict[str, Any] | None = None
        self._dirty = False

    def load(self, plan_path: Path) -> Plan:
        """plan.toml as a Plan: from the cache when its bytes, keepstep and the checker are
        unchanged, else parsed (shape errors raise PlanValidationError) and cached."""
        if not plan_path.is_file():
            raise ProjectError(f"{plan_path} is missing",
                               hint="create it with `keepstep init DIR`")
        raw = plan_path.read_bytes()
        self.key = hashlib.sha256(raw).hexdigest() + ":" + checker_key()
        self.hit = False
        data = self._read()
        if data is not None and data.get("key") == self.key:
            plan = self._plan_of(data)
            if plan is not None:
                self._data, self.hit = data, True
                return plan
        try:  # a plan from someone else may not be UTF-8: a named error, not a crash
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProjectError(f"{plan_path} is not valid UTF-8 text (byte {exc.start})",
                               hint="save it as UTF-8, then validate again") from None
        with gc_paused():
            plan = parse_plan(text, origin=str(plan_path))
        if len(raw) <= CACHE_MAX_BYTES:
            self._data = {"format": CACHE_FORMAT, "key": self.key, "checks": {},
                          "plan": plan.model_dump(mode="json", by_alias=True,
                                                  exclude_defaults=True)}
            self._dirty = True
        return plan

    def fingerprint(self, plan: Plan) -> str:
        """``plan.fingerprint()`` of the plan last loaded, remembered in the cache."""
        data = self._data
        if data is None or data.get("key") != self.key:
            return plan.fingerprint()
        found = data.get("fingerprint")
        if not isinstance(found, str):
            found = data["fingerprint"] = plan.fingerprint()
            self._dirty = True
        return found

    def problems(self, context: dict[str, Any],
                 compute: Callable[[], list[PlanProblem]]) -> list[PlanProblem]:
        """``compute()`` (the plan's checks against ``context``), remembered with the plan
        last loaded: the same plan against the same context is not checked again."""
        data = self._data
        if data is None or data.get("key") != self.key:
            return compute()
        ctx = hashlib.sha256(json.dumps(context, sort_keys=True, default=sorted)
                             .encode()).hexdigest()
        cached = data["checks"].get(ctx)
        if isinstance(cached, list):
            with suppress(ValueError, TypeError):
                return [PlanProblem.model_validate(p) for p in cached]
        found = compute()
        if len(data["checks"]) >= 4:  # a few source/contract states, not a history
            data["checks"].clear()
        data["checks"][ctx] = [p.model_dump(mode="json") | {"say_field": p.say_field}
                               for p in found]
        self._dirty = True
        return found

    def flush(self) -> None:
        """Write what this process added to the cache (once, after loading and checking)."""
        if self._dirty:
            self._dirty = False
            self._write()

    # -- the file ----------------------------------------------------------------------------
    def _plan_of(self, data: dict[str, Any]) -> Plan | None:
        try:
            with gc_paused():
                plan = Plan.model_validate(data["plan"])
        except (ValueError, TypeError, KeyError):
            return None
        if not all(UNIT_ID_RE.fullmatch(u.id) for u in plan.units):
            return None  # only ever cached with ids the checks passed or will report: re-parse
        return plan

    def _read(self) -> dict[str, Any] | None:
        try:
            with gc_paused():
                data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or \
                not isinstance(data.get("checks"), dict):
            return None
        return data

    def _write(self) -> None:
        """Atomically, 0600; only into a state folder that exists (reading a project never
        creates one) and is writable (a read-only one is simply not cached)."""
        if self._data is None or not self.path.parent.is_dir():
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._data, fh, separators=(",", ":"))
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError:
            with suppress(OSError):
                tmp.unlink()

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


__all__ = ["CACHE_NAME", "PlanCache", "checker_key", "save_plan"]
