"""Small views over a run for the CLI and the demo.

Each function reads stored facts through the engine's objects and returns plain data
or an engine model; none of them changes a state (``backup_state`` only writes a copy
of the database). They exist so that ``app/`` never reaches into ``run.store`` or SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from keepstep.engine.core.plan import UnitKind
from keepstep.storage.hashing import file_sha256

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Project, Run

DELIVERABLE_KINDS = (UnitKind.render, UnitKind.notes)


def input_snapshots(project: Project) -> dict[str, dict[str, Any]]:
    """run id -> the input snapshot its main branch is at ({"label", "sources": {id: sha256}})."""
    out = {}
    for run_id in project.runs():
        info = project.store.read_key(run_id, "inputs") or {}
        out[run_id] = {"label": info.get("label", ""), "sources": dict(info.get("sources", {}))}
    return out


class Deliverable(BaseModel):
    """A committed output of a current document unit: where it lies and whether the file on
    disk still hashes to what was committed."""

    unit: str
    name: str
    path: str  # absolute
    sha256: str
    matches: bool


class EffectRow(BaseModel):
    """One external action of the side-effect ledger, as a person reads it. ``needs_person``
    is True when recovery could not tell the outcome (``reason`` says why): only a person
    settles it (``Run.settle_effect``)."""

    key: str
    unit: str
    attempt: str | None
    action: str
    adapter: str
    status: str
    remote_id: str | None
    updated_at: str
    needs_person: bool = False
    reason: str = ""
    compensates: str | None = None


class OutputInfo(BaseModel):
    """One output of a unit's committed record (nothing is read but its size and hash)."""

    unit: str
    name: str
    attempt: str
    sha256: str
    size: int | None
    path: str  # absolute
    matches: bool
    current: bool  # the record is current (not invalidated)


class CompensationPreview(BaseModel):
    """What undoing a committed external action would do (``Run.compensation_preview``)."""

    key: str
    unit: str
    action: str
    adapter: str
    status: str
    remote_id: str | None
    undo_key: str
    undo_action: str
    records: str
    problems: list[str] = []

    def render(self) -> str:
        lines = [f"Undo {self.action} of {self.unit} via {self.adapter} (key {self.key}, "
                 f"remote id {self.remote_id or 'none'}, now {self.status})",
                 f"  ledger entry: {self.undo_key} ({self.undo_action})",
                 f"  will record: {self.records}"]
        lines += [f"  cannot: {p}" for p in self.problems]
        return "\n".join(lines)


def current_deliverables(run: Run) -> list[Deliverable]:
    """The committed outputs of the run's current render and notes units, in plan order."""
    records = run.facts_records()
    rows = []
    for unit in run.plan.units:
        if unit.kind not in DELIVERABLE_KINDS:
            continue
        rec = records.get(unit.id)
        if rec is None or rec.state.value != "succeeded":
            continue
        for name, ref in sorted(rec.outputs.items()):
            path = run.store.artifacts.root / ref.path
            matches = path.is_file() and file_sha256(str(path)) == ref.sha256
            rows.append(Deliverable(unit=unit.id, name=name, path=str(path),
                                    sha256=ref.sha256, matches=matches))
    return rows


def unit_outputs(run: Run, unit_id: str) -> list[OutputInfo]:
    """The outputs of ``unit_id``'s committed record (empty when it never succeeded)."""
    rec = run.facts_records().get(unit_id)
    if rec is None:
        return []
    rows = []
    for name, ref in sorted(rec.outputs.items()):
        path = run.store.artifacts.root / ref.path
        size = path.stat().st_size if path.is_file() else None
        matches = size is not None and file_sha256(str(path)) == ref.sha256
        rows.append(OutputInfo(unit=unit_id, name=name, attempt=rec.attempt, sha256=ref.sha256,
                               size=size, path=str(path), matches=matches,
                               current=rec.state.value == "succeeded"))
    return rows


EFFECT_FIELDS = ("key", "unit", "attempt", "action", "adapter", "status", "remote_id",
                 "updated_at")


def effect_rows(run: Run) -> list[EffectRow]:
    """The side-effect ledger of the run's branch, oldest first: one row per external action
    (idempotency key, unit, attempt, action, adapter, status, remote id, last change).
    ``status`` is intent, committed, unknown, failed, compensated or compensation-intent;
    an intent without a receipt is ``unknown`` until recovery or a person settles it."""
    return [EffectRow(key=e.idem_key, unit=e.unit, attempt=e.attempt_id, action=e.action,
                      adapter=e.adapter, status=e.status, remote_id=e.remote_id,
                      updated_at=e.updated_at,
                      needs_person=bool(e.detail.get("needs_person")) and e.status in (
                          "intent", "unknown"),
                      reason=str(e.detail.get("reason") or e.detail.get("error") or ""),
                      compensates=e.compensates)
            for e in run.store.effects(run.run_id, branch_id=run.branch_id)]


__all__ = ["EFFECT_FIELDS", "CompensationPreview", "Deliverable", "EffectRow", "OutputInfo",
           "current_deliverables", "effect_rows", "input_snapshots", "unit_outputs"]
