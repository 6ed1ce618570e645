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
from typing import Any

from keepstep.engine.core.explain import Preview, UnitExplanation, explain_unit, preview
from keepstep.engine.errors import ApprovalError, KeepstepError, ProjectError
from keepstep.engine.report.status import RunStatus, run_status
from keepstep.engine.report.views import Deliverable, EffectRow, current_deliverables, effect_rows
from keepstep.engine.run.baseline import create_run
from keepstep.engine.run.gates import (
    PendingApproval,
    bound_object,
    pending_approvals,
    record_choice,
    revoke_choice,
)
from keepstep.engine.run.handle import GatewayFactory, RunHandle, Workspace
from keepstep.engine.run.recovery import RecoveryReport, detect, recover
from keepstep.storage import ApprovalRecord, Budget, ChainReport, StorageError

Progress = Callable[[dict[str, Any]], None]


class Project(Workspace):
    """A project folder and its state database: start or open its runs."""

    def __enter__(self) -> Project:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_handle(self, run_id: str, branch_id: str = "main") -> Run:
        return Run(self, run_id, branch_id)

    def start_run(self, run_id: str, *, branch_id: str = "main") -> Run:
        """Create a run at plan-v1 / in-v1 from the project files as they are now."""
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
        one unit at a time, in plan order)."""
        from keepstep.engine.run.loop import RunLoop

        self.preload_model_client()  # litellm's import overlaps recovery
        if recover:
            report = self.recover(on_event=on_event)
            if report.blocked:
                return self.status()
        RunLoop(self, cancel=cancel, on_event=on_event, approve=approve,
                max_units=max_units, stop_after=stop_after, jobs=jobs).loop()
        return self.status()

    def resume(self, **kwargs: Any) -> RunStatus:
        """Continue after a restart or interruption: the same as ``run()``, recovery first."""
        return self.run(**kwargs)

    def recover(self, *, on_event: Progress | None = None) -> RecoveryReport:
        """Recovery alone (audit, reconcile leases and effects, apply detected changes)."""
        return recover(self, on_event=on_event)

    def retry(self, unit_id: str, *, who: str = "user", **kwargs: Any) -> RunStatus:
        """Same unit, new attempt: clears a failed/blocked status (a recorded decision),
        then runs. A unit blocked by the budget needs ``raise_budget`` first."""
        if unit_id not in self.plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label')}")
        st = self.store.unit_statuses(self.run_id, self.branch_id).get(unit_id)
        if st is not None and st.details.get("kind") == "budget":
            raise KeepstepError(f"{unit_id} is blocked by the budget",
                                hint="raise the limit with `keepstep budget raise` first")
        self.store.clear_unit_status(self.run_id, self.branch_id, unit_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=self.branch_id,
                                unit=unit_id, payload={"action": "retry", "who": who})
        return self.run(**kwargs)

    def raise_budget(self, *, reason: str, who: str = "user", **limits: float) -> Budget:
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

    def effects(self) -> list[EffectRow]:
        """The side-effect ledger of this branch, oldest first."""
        return effect_rows(self)

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
                           hint="create one with `keepstep init DIR`")
    return Project(root, validate=validate, read_only=read_only, clock=clock or time.time,
                   executor_id=executor_id, gateway_factory=gateway_factory,
                   synchronous=synchronous, policy=policy)


__all__ = ["Project", "Run", "open_project"]
