"""Reusing an earlier attempt's answers on a retry of a unit (see ``run.attempt``).

An answer is reused only when all of this holds: it belongs to an attempt of the same unit
after the unit's last success that ended with a recorded outcome (failed, timed out,
blocked, cancelled — never an orphan or a fenced attempt: their files stay quarantined);
its ledger row says the answer was valid and points at its recorded file; that file still
has the sha256 the row recorded; it answers the very same request (same request hash); and
the unit's checks pass it again now. A file whose hash does not match is refused with a
``call.reuse_refused`` event.
"""

from __future__ import annotations

import json
from typing import Any

from keepstep.engine.core.state import UnitRecord
from keepstep.engine.gateway.call_ledger import parse_artifact_ref
from keepstep.storage import Store
from keepstep.storage.hashing import sha256_hex

# Attempts whose recorded answers a retry may reuse: they ended with a recorded outcome.
REUSABLE_ATTEMPTS = frozenset({"failed", "timed_out", "blocked", "cancelled"})


class ReuseIndex:
    """The reusable recorded answers of one unit, by request hash; built on first use."""

    def __init__(self, store: Store, run_id: str, branch_id: str, unit: str, attempt_id: str,
                 record: UnitRecord | None) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        self.unit = unit
        self.attempt_id = attempt_id
        self._floor = int(record.attempt.rsplit("/a", 1)[1]) if record is not None else 0
        self._index: dict[str, list[tuple[str, str]]] | None = None

    def _build(self) -> dict[str, list[tuple[str, str]]]:
        eligible = {a.attempt_id for a in self.store.attempts(self.run_id, self.unit)
                    if a.status in REUSABLE_ATTEMPTS and a.attempt_no > self._floor
                    and a.attempt_id != self.attempt_id}
        index: dict[str, list[tuple[str, str]]] = {}
        if not eligible:
            return index
        for row in self.store.calls(self.run_id, unit=self.unit):
            ref = parse_artifact_ref(row.response_artifact)
            if row.attempt_id in eligible and row.outcome == "ok" and ref is not None:
                index.setdefault(row.request_hash, []).append(ref)
        return index

    def answer(self, rhash: str, check: Any) -> tuple[str, str, Any] | None:
        """``(recorded path, content, check(content))`` of a reusable answer to the request
        ``rhash``, or None."""
        if self._index is None:
            self._index = self._build()
        for path, digest in self._index.get(rhash, ()):
            try:
                blob = (self.store.artifacts.root / path).read_bytes()
            except OSError:
                continue  # removed by retention: nothing to reuse
            if sha256_hex(blob) != digest:
                self.store.append_event(
                    self.run_id, "call.reuse_refused", branch_id=self.branch_id,
                    unit=self.unit, attempt_id=self.attempt_id,
                    payload={"artifact": path, "reason": "the recorded answer's sha256 does "
                             "not match the ledger: it was changed after recording"})
                continue
            try:
                data = json.loads(blob)
            except ValueError:
                continue
            if data.get("request_hash") != rhash or not data.get("valid"):
                continue
            checked = check(str(data.get("content", "")))
            if checked[2]:
                continue  # the unit's checks changed since: ask again
            return path, str(data["content"]), checked
        return None


__all__ = ["REUSABLE_ATTEMPTS", "ReuseIndex"]
