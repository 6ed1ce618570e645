"""Small views over a run for the CLI and the demo.

Each function reads stored facts through the engine's objects and returns plain data
or an engine model; none of them changes a state (``backup_state`` only writes a copy
of the database). They exist so that ``app/`` never reaches into ``run.store`` or SQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.plan import UnitKind
from keepstep.engine.files.project import STATE_DIR
from keepstep.storage import ChainReport
from keepstep.storage.hashing import file_sha256

if TYPE_CHECKING:
    from keepstep.engine.api import Project, Run

DELIVERABLE_KINDS = (UnitKind.render, UnitKind.notes)


def verify_run_chain(run: Run) -> ChainReport:
    """Verify every checkpoint link and state hash of the run's branch, oldest first."""
    return run.store.verify_chain(run.run_id, run.branch_id)


def input_snapshots(project: Project) -> dict[str, dict[str, Any]]:
    """run id -> the input snapshot its main branch is at ({"label", "sources": {id: sha256}})."""
    out = {}
    for run_id in project.runs():
        info = project.store.read_key(run_id, "inputs") or {}
        out[run_id] = {"label": info.get("label", ""), "sources": dict(info.get("sources", {}))}
    return out


def backup_state(project: Project, target: Path | None = None) -> Path:
    """A consistent copy of the project database (SQLite's online backup API).

    Default target: ``.keepstep/backups/state-<UTC time>.db``. Artifacts are plain
    read-only files under ``.keepstep/artifacts`` and are not copied.
    """
    import datetime as dt

    if target is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        target = project.root / STATE_DIR / "backups" / f"state-{stamp}.db"
    target = Path(target)
    if target.exists():
        from keepstep.engine.errors import KeepstepError

        raise KeepstepError(f"{target} already exists", hint="pick a new file name")
    target.parent.mkdir(parents=True, exist_ok=True)
    project.store.backup_to(target)
    return target


def current_deliverables(run: Run) -> list[dict[str, Any]]:
    """The committed outputs of the run's current render and notes units, in plan order.

    Each row: unit, name, path (absolute), sha256 (from the committed record) and
    ``matches`` (whether the file on disk still hashes to it).
    """
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
            rows.append({"unit": unit.id, "name": name, "path": str(path),
                         "sha256": ref.sha256, "matches": matches})
    return rows


EFFECT_FIELDS = ("key", "unit", "attempt", "action", "adapter", "status", "remote_id",
                 "updated_at")


def effect_rows(run: Run) -> list[dict[str, Any]]:
    """The side-effect ledger of the run's branch, oldest first: one row per external action
    (idempotency key, unit, attempt, action, adapter, status, remote id, last change).
    ``status`` is intent, committed, unknown, failed, compensated or compensation-intent;
    an intent without a receipt is ``unknown`` until recovery or a person settles it."""
    return [{"key": e.idem_key, "unit": e.unit, "attempt": e.attempt_id, "action": e.action,
             "adapter": e.adapter, "status": e.status, "remote_id": e.remote_id,
             "updated_at": e.updated_at}
            for e in run.store.effects(run.run_id, branch_id=run.branch_id)]


def explain_run_unit(run: Run, unit_id: str) -> Any:
    """``engine.explain.explain_unit`` with the run's facts, call ledger and approvals loaded."""
    from keepstep.engine.core.explain import explain_unit
    from keepstep.engine.run.approvals import approval_applies
    from keepstep.engine.run.gates import bound_object

    facts = run.facts()
    counts: dict[str, int] = {}
    for attempt in run.store.attempts(run.run_id):
        if attempt.branch_id == run.branch_id:
            counts[attempt.unit] = counts.get(attempt.unit, 0) + 1
    facts.attempts_count = counts
    rows = []
    for gate in run.plan.gates:
        current = bound_object(run, gate, facts)
        for rec in run.store.approvals(run.run_id, branch_id=run.branch_id, gate_id=gate.id):
            if rec.status not in ("decided", "revoked"):
                continue
            applies, _why = approval_applies(rec, current_bound_object=current, now=facts.now)
            rows.append({"gate": gate.id, "unit": gate.unit, "choice": rec.choice,
                         "applies": applies})
    return explain_unit(run.plan, facts, unit_id, calls=run.calls(), approvals=rows)


def preview_run(run: Run) -> Any:
    """A dry run of the project files' current edits against the run: what is reused,
    invalidated and run, with the estimated cost. Nothing is committed."""
    from keepstep.engine.core.explain import preview
    from keepstep.engine.run.recovery import detect

    found = detect(run)
    return preview(found.files.plan, found.changes, run.facts_records(), run.calls(),
                   high_risk_rules=found.files.config.high_risk_rules,
                   source_groups=found.source_groups)


__all__ = ["EFFECT_FIELDS", "backup_state", "current_deliverables", "effect_rows",
           "explain_run_unit", "input_snapshots", "preview_run", "verify_run_chain"]
