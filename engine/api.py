"""The engine's actions: ``open_project(path) -> Project -> Run``.

The CLI, the TUI and notebooks all use these objects (through ``keepstep.engine``); none of
them reaches into SQL. ``Project`` and ``Run`` extend the read side (``run.handle``) with
what changes something — start, run, resume, retry, decide — and with the views a person
reads, each with a typed result. Time, executor ids and the model gateway are injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.explain import Preview, UnitExplanation, explain_unit, preview
from keepstep.engine.core.plan import Plan
from keepstep.engine.errors import ApprovalError, KeepstepError, ProjectError
from keepstep.engine.report.status import RunStatus, run_status
from keepstep.engine.report.views import (
    CompensationPreview,
    Deliverable,
    EffectRow,
    OutputInfo,
    current_deliverables,
    effect_rows,
)
from keepstep.engine.run.baseline import create_run, detect
from keepstep.engine.run.gates import (
    PendingApproval,
    bound_object,
    pending_approvals,
    record_choice,
    revoke_choice,
)
from keepstep.engine.run.handle import GatewayFactory, RunHandle, Workspace
from keepstep.engine.run.recovery import RecoveryReport, recover
from keepstep.storage import ApprovalRecord, Budget, ChainReport, StorageError

if TYPE_CHECKING:
    from keepstep.engine.report.deliverables import DeliverablesExport, Output
    from keepstep.engine.report.progress import NotebookProgress, ProgressTracker
    from keepstep.engine.run.effects import SettleResult

Progress = Callable[[dict[str, Any]], None]


class Project(Workspace):
    """A project folder and its state database: start or open its runs."""

    def __enter__(self) -> Project:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_handle(self, run_id: str, branch_id: str = "main") -> Run:
        return Run(self, run_id, branch_id)

    def default_run_id(self) -> str:
        """The run a face shows when none is named: keepstep.toml's ``default_run``, else
        the newest run, else ``R1`` (the id a first ``keepstep run`` then starts)."""
        configured = self.files.config.default_run
        if configured:
            return configured
        runs = self.runs()
        return runs[-1] if runs else "R1"

    def start_run(self, run_id: str, *, branch_id: str = "main") -> Run:
        """Create a run at plan-v1 / in-v1 from the project files as they are now.

        An approved source that cannot be read raises SourceError (naming it and what to
        do) before anything is written: no run starts on it."""
        from keepstep.engine.files.sources import require_readable_sources

        require_readable_sources(self.reload_if_changed())
        create_run(self, run_id, branch_id=branch_id)
        return self.run_handle(run_id, branch_id)

    def get_run(self, run_id: str, branch_id: str = "main") -> Run:
        """An existing run; a KeepstepError naming the known runs when there is none."""
        if not self.store.run_exists(run_id):
            known = ", ".join(self.runs()) or "none yet"
            raise KeepstepError(f"no run {run_id!r} in {self.root}",
                                hint=f"start it with `keepstep run {self.root} --run {run_id}` "
                                f"(runs: {known})")
        self.store.get_head(run_id, branch_id)
        return Run(self, run_id, branch_id)

    def open_or_start(self, run_id: str, branch_id: str = "main") -> Run:
        """The run if it exists, else a new one (safe when two front ends start it at once)."""
        if self.store.run_exists(run_id):
            return self.get_run(run_id, branch_id)
        try:
            return self.start_run(run_id, branch_id=branch_id)
        except StorageError:
            if not self.store.run_exists(run_id):
                raise
            return self.get_run(run_id, branch_id)  # another front end started it first

    def restart(self, run_id: str, new_run_id: str) -> Run:
        """A new business task: a new run id from the current files; the old run is kept."""
        self.get_run(run_id)
        new = self.start_run(new_run_id)
        self.store.append_event(run_id, "decision.restart", payload={"new_run": new_run_id})
        return new


def _source_progress(on_event: Progress | None) -> Any:
    """The run-start source check's progress as ``sources.convert`` events."""
    if on_event is None:
        return None

    def report(source_id: str, fmt: str) -> None:
        try:
            on_event({"kind": "sources.convert", "source": source_id, "format": fmt})
        except Exception:  # noqa: BLE001 - a display callback must never break the run
            pass

    return report


class Run(RunHandle):
    """One run (and branch) of a project: its actions and the views of it."""

    project: Project

    # -- actions ---------------------------------------------------------------
    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        on_event: Progress | None = None,
        approve: dict[str, str] | None = None,
        max_units: int | None = None,
        stop_after: set[str] | None = None,
        recover: bool = True,
        jobs: int | None = None,
    ) -> RunStatus:
        """Recover (audit, reconcile, apply detected changes), then run units until done,
        blocked or cancelled (``RunCancelled`` is raised after the units in flight stopped at
        their next safe point). ``approve`` answers gates (``{"<gate id>": "<option>"}``).
        ``jobs``: units in flight at once (default keepstep.toml's ``max_parallel``; 1 runs
        one unit at a time, in plan order). An approved source that cannot be read (no text,
        over ``max_source_mb``, unsupported or undecodable) raises SourceError before
        anything is claimed."""
        from keepstep.engine.files.sources import require_readable_sources
        from keepstep.engine.run.loop import RunLoop

        # Every approved source must convert to text before any unit is claimed: a file that
        # cannot be read is refused here, naming it, never mid-run (conversions are cached,
        # so this converts only what no earlier check or run did).
        require_readable_sources(self.project.reload_if_changed(), cancel=cancel,
                                 progress=_source_progress(on_event))
        if recover:
            report = self.recover(on_event=on_event)
            if report.blocked:
                return self.status()
        RunLoop(self, cancel=cancel, on_event=self._preload_at_first_claim(on_event),
                approve=approve, max_units=max_units, stop_after=stop_after, jobs=jobs).loop()
        return self.status()

    def _preload_at_first_claim(self, on_event: Progress | None) -> Progress:
        """``on_event``, and litellm's background import started when the first unit is
        claimed. Started earlier (before recovery) it competes for the GIL with recovery and
        the first claim, which are CPU-bound Python too: on two cores it delayed the first
        claim by 0.2–0.3 s and brought the first model call no sooner. From the claim on it
        overlaps the unit's own preparation (reading and converting its sources, rendering
        the prompt); a run that claims nothing never pays for it."""
        started = threading.Event()

        def forward(event: dict[str, Any]) -> None:
            if event.get("kind") == "claimed" and not started.is_set():
                started.set()
                self.preload_model_client()
            if on_event is not None:
                on_event(event)

        return forward

    def resume(self, **kwargs: Any) -> RunStatus:
        """Continue after a restart or interruption: the same as ``run()``, recovery first."""
        return self.run(**kwargs)

    def recover(self, *, on_event: Progress | None = None) -> RecoveryReport:
        """Recovery alone (audit, reconcile leases and effects, apply detected changes)."""
        return recover(self, on_event=on_event)

    def retry(self, unit_id: str, *, who: str = "user", **kwargs: Any) -> RunStatus:
        """Same unit, new attempt: clears a failed/blocked status (a recorded decision),
        then runs; a current unit whose final validator failed is rerun. A unit blocked by
        the budget needs ``raise_budget`` first."""
        if unit_id not in self.plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label')}")
        st = self.store.unit_statuses(self.run_id, self.branch_id).get(unit_id)
        if st is not None and st.details.get("kind") == "budget":
            raise KeepstepError(f"{unit_id} is blocked by the budget",
                                hint="raise the limit with `keepstep budget raise` first")
        if self.final_check_failed(unit_id):
            # Current, but its final validator did not pass (e.g. the audit's check was fixed
            # since): clearing a status would leave nothing to run, so the unit is rerun —
            # invalidated with what uses its content, a recorded decision — and tried again.
            from keepstep.engine.run.takeover import rerun_unit

            rerun_unit(self, unit_id, who=who,
                       note="retry of a current unit whose final validator did not pass")
            return self.run(**kwargs)
        self.store.clear_unit_status(self.run_id, self.branch_id, unit_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=self.branch_id,
                                unit=unit_id, payload={"action": "retry", "who": who})
        return self.run(**kwargs)

    def final_check_failed(self, unit_id: str) -> bool:
        """Whether ``unit_id`` is current but its final validator did not pass (a retry
        reruns such a unit)."""
        from keepstep.engine.core.state import UnitState

        rec = self.facts_records().get(unit_id)
        return (rec is not None and rec.state == UnitState.succeeded
                and not rec.validators_passed)

    def is_current_and_passed(self, unit_id: str) -> bool:
        """Whether ``unit_id`` is current and its validators passed (a retry of it makes no
        new attempt: nothing failed)."""
        from keepstep.engine.core.state import UnitState

        rec = self.facts_records().get(unit_id)
        return (rec is not None and rec.state == UnitState.succeeded
                and rec.validators_passed)

    def raise_budget(self, *, reason: str, who: str = "user",
                     **limits: float | None) -> Budget:
        """Record a budget decision raising limits; units blocked by the budget are released.
        Raises BudgetDecisionError (nothing recorded) for a bad counter, value or reason."""
        from keepstep.engine.run.budget import raise_budget

        return raise_budget(self, reason=reason, who=who, limits=limits)

    def reset_recovery(self, *, reason: str, who: str = "user") -> None:
        """Close recovery's circuit breaker after a person looked (a recorded decision);
        the next resume runs recovery again from the start."""
        if not reason.strip():
            raise KeepstepError("a recovery reset needs a reason", hint="pass --reason '...'")
        self.store.append_event(self.run_id, "decision.recovery_reset", branch_id=self.branch_id,
                                payload={"who": who, "reason": reason})

    def branch(self, at_version: int, branch_id: str) -> Run:
        """Fork this run at a checkpoint version under its own branch id and head."""
        self.store.fork_branch(self.run_id, self.branch_id, at_version, branch_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=branch_id,
                                payload={"action": "branch", "from": self.branch_id,
                                         "at_version": at_version})
        return Run(self.project, self.run_id, branch_id)

    def replay(self, new_run_id: str | None = None, **kwargs: Any) -> Run:
        """Re-execute this run into a new run from the recorded responses: no model calls."""
        from keepstep.engine.run.replay import replay_run

        new = replay_run(self, new_run_id or f"{self.run_id}-replay", **kwargs)
        return Run(self.project, new.run_id, new.branch_id)

    # -- approvals -------------------------------------------------------------
    def pending_approvals(self) -> list[PendingApproval]:
        """Open approval requests, each option's reuse/redo/cost recomputed now."""
        return pending_approvals(self)

    def approve(self, gate_id: str, choice: str, *, who: str,
                token: str | None = None) -> ApprovalRecord:
        """Record a person's answer to a gate. ApprovalError (nothing recorded) for an
        unknown gate or option, an answer contradicting contract.md, or a refused token."""
        return record_choice(self, self._gate(gate_id), choice, who=who, token=token)

    def issue_resume_token(self, gate_id: str) -> str:
        """A new resume token for the gate's open request (the old token stops working):
        someone who has only the token can answer the gate once, with
        ``keepstep approve --token``. Returned once; stored only as its sha256."""
        from keepstep.engine.run.gates import issue_resume_token

        return issue_resume_token(self, self._gate(gate_id))

    def revoke(self, gate_id: str, *, who: str, reason: str) -> ApprovalRecord:
        """Revoke a gate's decision; the gate asks again when the run next reaches it."""
        return revoke_choice(self, self._gate(gate_id), who=who, reason=reason)

    def _gate(self, gate_id: str) -> Any:
        gate = next((g for g in self.plan.gates if g.id == gate_id), None)
        if gate is None:
            known = ", ".join(g.id for g in self.plan.gates) or "none"
            raise ApprovalError(f"no gate {gate_id!r} in {self.plan_info.get('label')}",
                                hint=f"gates: {known}")
        return gate

    # -- what a person reads -------------------------------------------------------
    def status(self) -> RunStatus:
        """The dashboard's facts and views, recomputed from stored facts."""
        return run_status(self)

    def next_action(self) -> str:
        return self.status().next_action

    def preview(self) -> Preview:
        """What the changes detected now would invalidate and reuse, with the estimated
        re-do cost — nothing is committed."""
        found = detect(self)
        return preview(found.files.plan, found.changes, self.facts_records(), self.calls(),
                       high_risk_rules=found.files.config.high_risk_rules,
                       source_groups=found.source_groups)

    def explain(self, unit_id: str) -> UnitExplanation:
        """Why a unit is current, invalidated, blocked or pending — from stored facts: this
        branch's attempts, the call ledger and the gate's decisions."""
        from keepstep.engine.run.approvals import approval_applies

        plan = self.plan
        if unit_id not in plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label', 'the plan')}",
                                hint="units: " + ", ".join(u.id for u in plan.units))
        facts = self.facts()
        counts: dict[str, int] = {}
        for attempt in self.store.attempts(self.run_id):
            if attempt.branch_id == self.branch_id:
                counts[attempt.unit] = counts.get(attempt.unit, 0) + 1
        facts.attempts_count = counts
        rows = []
        for gate in plan.gates:
            current = bound_object(self, gate, facts)
            for rec in self.store.approvals(self.run_id, branch_id=self.branch_id,
                                            gate_id=gate.id):
                if rec.status not in ("decided", "revoked"):
                    continue
                applies, _why = approval_applies(rec, current_bound_object=current,
                                                 now=facts.now)
                rows.append({"gate": gate.id, "unit": gate.unit, "choice": rec.choice,
                             "applies": applies})
        return explain_unit(plan, facts, unit_id, calls=self.calls(), approvals=rows)

    def verify(self) -> ChainReport:
        """Verify every checkpoint link and state hash of this branch, oldest first."""
        return self.store.verify_chain(self.run_id, self.branch_id)

    def deliverables(self) -> list[Deliverable]:
        """The committed outputs of the current document units, in plan order."""
        return current_deliverables(self)

    def output(self, unit_id: str, name: str) -> Output:
        """One committed output of a unit (``.data`` bytes, ``.text``), its sha256 checked;
        KeepstepError naming the unit's outputs when there is no such one."""
        from keepstep.engine.report.deliverables import unit_output

        return unit_output(self, unit_id, name)

    def outputs(self, unit_id: str) -> list[OutputInfo]:
        """What a unit's committed record holds: each output's name, sha256, size and
        whether the file still matches (read by explain; nothing is loaded)."""
        from keepstep.engine.report.views import unit_outputs

        return unit_outputs(self, unit_id)

    def export_deliverables(self, out: str | Path | None = None) -> DeliverablesExport:
        """Copy the current deliverables and their manifest (sha256 of each) to ``out``,
        default ``deliverables/<run>/`` in the project."""
        from keepstep.engine.report.deliverables import export_deliverables

        return export_deliverables(self, out)

    def effects(self) -> list[EffectRow]:
        """The side-effect ledger of this branch, oldest first."""
        return effect_rows(self)

    def _effect(self, key: str) -> Any:
        row = self.store.get_effect(key)
        if row is None or row.run_id != self.run_id:
            known = ", ".join(e.key for e in self.effects()) or "none"
            raise KeepstepError(f"no external action with key {key!r} in run {self.run_id}",
                                hint=f"keys: {known}")
        return row

    def settle_effect(self, key: str, *, sent: bool | None = None, who: str, reason: str = "",
                      reference: str | None = None) -> SettleResult:
        """Settle an external action whose outcome is unknown: the adapter is asked by key
        first; when it cannot tell, ``sent`` records the person's decision (True: it
        happened, ``reference`` its remote id; False: it did not — the next resume sends it
        again with the same key). ``sent=None`` only looks it up. A decision event either
        way; the unit it blocked is released."""
        from keepstep.engine.run.effects import settle_effect

        row = self._effect(key)
        return settle_effect(self.store, self.project.effect_adapters.get(row.adapter), key,
                             sent=sent, who=who, reason=reason, remote_id=reference)

    def compensation_preview(self, key: str) -> CompensationPreview:
        """What compensating a committed external action would undo, and the ledger entry
        it would write (nothing is changed)."""
        from keepstep.engine.run.effects import compensation_key

        row = self._effect(key)
        adapter = self.project.effect_adapters.get(row.adapter)
        problems = []
        if row.compensates is not None:
            problems.append(f"{key} is itself an undo")
        elif row.status != "committed":
            problems.append(f"{key} is {row.status}; only a committed action can be undone")
        if adapter is None:
            problems.append(f"no adapter named {row.adapter!r} is configured")
        elif getattr(adapter, "compensate", None) is None:
            problems.append(f"adapter {row.adapter!r} cannot undo; undo it by hand")
        return CompensationPreview(
            key=key, unit=row.unit, action=row.action, adapter=row.adapter, status=row.status,
            remote_id=row.remote_id, undo_key=compensation_key(key),
            undo_action=f"compensate:{row.action}", problems=problems,
            records=f"a ledger entry {compensation_key(key)} (intent, then receipt) and the "
            f"original moved to compensated; a decision.effect event")

    def compensate_effect(self, key: str, *, who: str, reason: str) -> EffectRow:
        """Undo a committed external action through its own ledger entry (a recorded
        decision). KeepstepError, nothing done, when the preview names a problem."""
        from keepstep.engine.run.effects import compensate
        from keepstep.storage import EventIn

        preview = self.compensation_preview(key)
        if preview.problems:
            raise KeepstepError(f"cannot compensate {key}: " + "; ".join(preview.problems))
        if not reason.strip():
            raise KeepstepError("a compensation needs a reason", hint="pass --reason '...'")
        row = self._effect(key)
        adapter = self.project.effect_adapters[row.adapter]
        self.store.append_event(self.run_id, "decision.effect", branch_id=row.branch_id,
                                unit=row.unit, payload=EventIn(kind="decision.effect", payload={
                                    "key": key, "decision": "compensate", "who": who,
                                    "reason": reason}).payload)
        compensate(self.store, adapter, row, who=who, reason=reason)
        return next(e for e in self.effects() if e.key == key)

    def preview_sources(self, approved: dict[str, bool]) -> Preview:
        """What approving or revoking sources (``{"A3": False}``) would invalidate and
        reuse, before sources.toml is written — nothing is changed."""
        return self._preview_candidate(approved=approved)

    def preview_plan(self, plan: Plan) -> Preview:
        """What saving ``plan`` as plan.toml would invalidate and reuse, before the file is
        written — nothing is changed."""
        return self._preview_candidate(plan=plan)

    def _preview_candidate(self, *, approved: dict[str, bool] | None = None,
                           plan: Plan | None = None) -> Preview:
        files = self.project.reload()
        approved = approved or {}
        sources = files.sources.model_copy(deep=True)
        for entry in sources.sources:
            if entry.id in approved:
                entry.approved = approved[entry.id]
        unknown = sorted(set(approved) - {e.id for e in sources.sources})
        if unknown:
            raise KeepstepError(f"no source {', '.join(unknown)} in sources.toml")
        found = detect(self, sources=sources, plan=plan)
        return preview(found.files.plan if plan is None else plan, found.changes,
                       self.facts_records(), self.calls(),
                       high_risk_rules=files.config.high_risk_rules,
                       source_groups=found.source_groups)

    def progress(self, **kwargs: Any) -> ProgressTracker:
        """A live-progress tracker to pass as ``on_event`` (see ``report.progress``)."""
        from keepstep.engine.report.progress import ProgressTracker

        return ProgressTracker(self, **kwargs)

    def live_progress(self, **kwargs: Any) -> NotebookProgress:
        """``run.run(on_event=run.live_progress())``: a display refreshed in place in
        Jupyter while the run works (plain lines elsewhere)."""
        from keepstep.engine.report.progress import NotebookProgress

        return NotebookProgress(self, **kwargs)

    def dag_svg(self) -> str:
        """The DAG coloured by unit state, as an SVG document."""
        from keepstep.engine.report.dag_svg import run_dag_svg

        return run_dag_svg(self)

    def handover(self, out: str | Path) -> Path:
        """Export the handover bundle (a folder, or a .zip when ``out`` ends so)."""
        from keepstep.engine.report.handover import export_handover

        return export_handover(self, out)

    def narrative(self) -> str:
        """The handover narrative, generated from stored state only."""
        from keepstep.engine.report.narrative import narrative

        return narrative(self)


def open_project(
    path: str | Path,
    *,
    validate: bool = True,
    read_only: bool = False,
    clock: Callable[[], float] | None = None,
    executor_id: str | None = None,
    gateway_factory: GatewayFactory | None = None,
    synchronous: str = "FULL",
    policy: Mapping[str, Any] | None = None,
) -> Project:
    """Open a project folder and its state database.

    ``validate=False`` opens a project whose plan does not validate yet (running still
    validates); ``read_only`` opens the database for looking only (nothing is created or
    migrated). ``clock``, ``executor_id`` and ``gateway_factory`` are injectable for tests;
    ``policy`` overrides keepstep.toml's ``[policy]`` values for this process."""
    root = Path(path)
    if not (root / "keepstep.toml").is_file():
        raise ProjectError(f"{root} is not a keepstep project (no keepstep.toml)",
                           hint=f"create one with `keepstep init {root}`")
    return Project(root, validate=validate, read_only=read_only, clock=clock or time.time,
                   executor_id=executor_id, gateway_factory=gateway_factory,
                   synchronous=synchronous, policy=policy)


__all__ = ["Project", "Run", "open_project"]
