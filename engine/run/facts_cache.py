"""``FactsCache``: one run's committed facts in memory, kept at the branch head from the
commit deltas (``Run.facts_cache``; the committer applies its own commits to it)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.state import UNIT_PREFIX, UnitRecord, UnitState, records_from_state
from keepstep.storage import Head, SQLiteStore


def plan_n_of(plan_info: Mapping[str, Any] | None) -> int:
    """The plan version recorded in a ``plan`` state value."""
    return int((plan_info or {}).get("n", 1))


def snapshot_of(inputs_info: Mapping[str, Any] | None) -> InputSnapshot:
    """The input snapshot recorded in an ``inputs`` state value."""
    info = inputs_info or {}
    return InputSnapshot(sources=info.get("sources", {}), groups=info.get("groups", {}))


def templates_of(plan_info: Mapping[str, Any] | None) -> dict[str, str]:
    """template name -> sha256, plus ``data:<name>`` -> sha256, from a ``plan`` state value."""
    info = plan_info or {}
    return {**info.get("templates", {}),
            **{f"data:{k}": v for k, v in (info.get("data") or {}).items()}}


class FactsCache:
    """One run's committed facts in memory, kept at the branch head from commit deltas.

    ``refresh()`` reads the head (one query); when it moved, only the checkpoints since the
    cached version are read and their deltas applied (another executor's commits), so a
    refresh costs what changed, not the size of the run. A commit made through this process
    is applied with ``apply`` (no read at all). A gap, a head behind the cache, a hash that
    does not chain or a very long delta list loads everything again (``generation`` then
    moves, so views built on the cache know to rebuild).

    ``keys`` holds the run's other state keys (plan, inputs, versions) but not ``budget``:
    a commit records the budget in its own transaction (``CommitRequest.budget_key``), so
    this process does not know the figure without a read; the live budget is
    ``Store.get_budget``.

    Callers hold ``lock`` while reading ``records``; ``changes`` lists (unit, record or None)
    as applied, for the one consumer that drains it (the run loop's ready set).
    """

    MAX_DELTAS = 2000
    UNMIRRORED = frozenset({"budget"})

    def __init__(self, store: SQLiteStore, run_id: str, branch_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        self.lock = threading.RLock()
        self.version: int | None = None
        self.hash: str | None = None
        self.records: dict[str, UnitRecord] = {}
        self.keys: dict[str, Any] = {}  # plan, inputs, versions, budget (as committed)
        self.invalidated: set[str] = set()
        self.generation = 0
        self.changes: list[tuple[str, UnitRecord | None]] = []

    def refresh(self, head: Head | None = None) -> int:
        """Bring the cache to the branch head (``head`` when the caller read it just now,
        else read here); returns the head version."""
        with self.lock:
            if head is None:
                head = self.store.get_head(self.run_id, self.branch_id)
            elif self.version is not None and head.version < self.version:
                # Read before this process's own newer commit (applied meanwhile, under
                # this lock): the cache is the newer of the two (heads never move back).
                return self.version
            if self.version == head.version and self.hash in (None, head.hash):
                self.hash = head.hash
                return head.version
            if (self.version is None or head.version <= self.version
                    or head.version - self.version > self.MAX_DELTAS):
                return self._reload()
            cps = self.store.list_checkpoints(self.run_id, self.branch_id,
                                              since_version=self.version + 1)
            chained = bool(cps) and cps[0].version == self.version + 1 and \
                cps[-1].version == head.version and cps[-1].hash == head.hash and \
                (self.hash is None or cps[0].parent_hash == self.hash)
            if not chained:
                return self._reload()
            for cp in cps:
                self._apply_delta(cp.delta)
            self.version, self.hash = head.version, head.hash
            return head.version

    def _reload(self) -> int:
        self._load_all()
        assert self.version is not None  # _load_all set it
        return self.version

    def _load_all(self) -> None:
        head = self.store.get_head(self.run_id, self.branch_id)
        state = self.store.read_state(self.run_id, self.branch_id)
        self.records = records_from_state(state)
        self.keys = {k: v for k, v in state.items()
                     if not k.startswith(UNIT_PREFIX) and k not in self.UNMIRRORED}
        self.invalidated = {u for u, r in self.records.items()
                            if r.state == UnitState.invalidated}
        self.version, self.hash = head.version, head.hash
        self.generation += 1
        self.changes.clear()

    def _set(self, unit_id: str, record: UnitRecord | None) -> None:
        if record is None:
            self.records.pop(unit_id, None)
        else:
            self.records[unit_id] = record
        if record is not None and record.state == UnitState.invalidated:
            self.invalidated.add(unit_id)
        else:
            self.invalidated.discard(unit_id)
        self.changes.append((unit_id, record))
        if len(self.changes) > 50_000:  # nobody drains (a read-only handle): views rebuild
            self.changes.clear()
            self.generation += 1

    def _apply_delta(self, delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if key.startswith(UNIT_PREFIX):
                self._set(key[len(UNIT_PREFIX):],
                          None if value is None else UnitRecord.model_validate(value))
            elif key in self.UNMIRRORED:
                continue
            elif value is None:
                self.keys.pop(key, None)
            else:
                if key == "plan" and value != self.keys.get("plan"):
                    self.generation += 1  # a plan change: views on the plan rebuild
                self.keys[key] = value

    def apply(self, version: int, records: Mapping[str, UnitRecord]) -> None:
        """Apply this process's own commit of ``version`` (its records already parsed). A
        cache that is not at ``version - 1`` is left for ``refresh`` to catch up."""
        with self.lock:
            if self.version != version - 1:
                return
            for uid, rec in records.items():
                self._set(uid, rec)
            self.version, self.hash = version, None  # the hash is learnt at the next refresh

    def drain(self) -> list[tuple[str, UnitRecord | None]]:
        with self.lock:
            out, self.changes = self.changes, []
            return out


__all__ = ["FactsCache", "plan_n_of", "snapshot_of", "templates_of"]
