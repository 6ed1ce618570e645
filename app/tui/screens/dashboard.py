"""The run dashboard: versions, the unit grid, budget, what needs you, and what runs now.

It owns the engine worker: `r` runs (or resumes) the run in a thread that only posts
messages back (app/messages.py); `c` sets the cancel Event, so the engine stops at its
next safe point. Every other page is one key away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import Worker, WorkerState

from keepstep.app.tui.format import DECISION_LABELS, ago, expires_in, progress_text, state_symbol
from keepstep.app.tui.messages import (
    ApprovalRequested,
    RunFailed,
    RunFinished,
    RunProgressed,
    UnitClaimed,
    UnitCommitted,
)
from keepstep.app.tui.screens.approval import ApprovalModal
from keepstep.app.tui.screens.events import EventsScreen
from keepstep.app.tui.screens.explain import ExplainScreen
from keepstep.app.tui.screens.narrative import NarrativeScreen
from keepstep.app.tui.screens.plan_builder import PlanBuilderScreen
from keepstep.app.tui.screens.sources import SourcesScreen
from keepstep.app.tui.screens.takeover import TakeoverScreen
from keepstep.app.tui.widgets.budget_bars import BudgetBars
from keepstep.app.tui.widgets.unit_grid import UnitGrid
from keepstep.engine import KeepstepError, LeaseLost, RunCancelled

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import PendingApproval, Run, RunStatus

# action(run, cancel, on_event) -> RunStatus: Run.run, Run.retry… with the worker's Event.
EngineAction = Callable[["Run", threading.Event, Callable[[dict[str, Any]], None]], Any]
STATUS_EVERY_S = 0.3  # a full RunStatus at most this often while units commit


class DashboardScreen(Screen[None]):
    BINDINGS = [
        Binding("r", "run", "run"),
        Binding("c", "cancel", "cancel"),
        Binding("a", "approvals", "approve"),
        Binding("e", "explain", "explain"),
        Binding("t", "takeover", "takeover"),
        Binding("h", "handover", "handover"),
        Binding("s", "sources", "sources"),
        Binding("p", "plan", "plan"),
        Binding("v", "events", "events"),
        Binding("q", "app.quit", "quit"),
    ]

    app: KeepstepApp

    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.cancel_event = threading.Event()
        self.engine_idle = threading.Event()  # cleared while the worker thread is in the engine
        self.engine_idle.set()
        self.running = False
        self.status: RunStatus | None = None
        self.progress = ""

    def compose(self) -> ComposeResult:
        with Horizontal(id="title-bar"):
            yield Static(id="title-left", markup=False)
            yield Static(id="title-right", markup=False)
        with Horizontal(id="dash-body"):
            with Vertical(id="units-box", classes="panel") as units:
                units.border_title = "Units"
                yield UnitGrid(id="units")
                yield Static(id="counts", markup=False)
            with Vertical(id="side"):
                with Vertical(id="budget-box", classes="panel") as budget:
                    budget.border_title = "Budget"
                    yield BudgetBars(id="budget")
                with Vertical(id="needs-box", classes="panel") as needs:
                    needs.border_title = "Needs you"
                    yield Static(id="needs", markup=False)
        with Vertical(id="now-box", classes="panel") as now:
            now.border_title = "Now"
            yield Static(id="now", markup=False)
        yield Footer(compact=True, show_command_palette=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show `r` or `c` by whether a run is in progress, `a` only when a gate waits (the
        footer then fits 80 columns)."""
        if action == "run":
            return not self.running
        if action == "cancel":
            return self.running
        if action == "approvals":
            return bool(self.status and self.status.pending_approvals) and not self.running
        return True

    def on_mount(self) -> None:
        self.refresh_status()
        self.query_one(UnitGrid).focus()

    def on_screen_resume(self) -> None:
        if not self.running:
            self.refresh_status()

    # -- showing facts -----------------------------------------------------------------------
    @property
    def selected_unit(self) -> str | None:
        return self.query_one(UnitGrid).selected

    def refresh_status(self) -> None:
        """Recompute the RunStatus from stored facts and show it (no run yet: the plan)."""
        run = self.app.active_run
        if run is None:
            self.status = None
            self._show_no_run()
            return
        status = self.app.guarded("Could not read the run's status", run.status)
        if status is not None:
            self.show_status(status)

    def _show_no_run(self) -> None:
        plan = self.app.project.files.plan
        grid = self.query_one(UnitGrid)
        grid.set_units((u.id, u.phase) for u in plan.units)
        grid.set_states({})
        name = self.app.project.files.config.name
        self.query_one("#title-left", Static).update(
            f"{name} · run {self.app.run_id} (not started)")
        self.query_one("#title-right", Static).update("· pending")
        self.query_one("#counts", Static).update(f"· pending {len(plan.units)}")
        limits = self.app.project.files.config.budget.as_limits()
        self.query_one(BudgetBars).set_budget({"used": {}, "limits": limits})
        self.query_one("#needs", Static).update("nothing yet")
        self.query_one("#now", Static).update(
            f"next   press r to start run {self.app.run_id} from the project files")

    def show_status(self, status: RunStatus) -> None:
        self.status = status
        self.refresh_bindings()
        run = self.app.active_run
        phases = {u.id: u.phase for u in run.plan.units} if run else {}
        grid = self.query_one(UnitGrid)
        grid.set_units((uid, phases.get(uid, "")) for uid in status.units)
        grid.set_states({uid: view.state for uid, view in status.units.items()})
        name = self.app.project.files.config.name
        self.query_one("#title-left", Static).update(
            f"{name} · run {status.run_id} ({status.branch})")
        state = "● running" if self.running else DECISION_LABELS.get(status.decision,
                                                                    status.decision)
        self.query_one("#title-right", Static).update(
            f"{status.plan_version} · {status.input_version} · checkpoint "
            f"{status.head_version} · {state}")
        c = status.counts
        self.query_one("#counts", Static).update(
            f"✓ current {c.get('current', 0)}  ↺ invalidated {c.get('invalidated', 0)}  "
            f"⚠ orphans {c.get('orphans', 0)}  ▶ ready {c.get('ready', 0)}  "
            f"● running {c.get('running', 0)}  ◼ blocked {c.get('blocked', 0)}  "
            f"✗ failed {c.get('failed', 0)}  · pending {c.get('pending', 0)}")
        self.query_one(BudgetBars).set_budget(status.budget)
        self.query_one("#needs", Static).update("\n".join(self._needs_lines(status)))
        self._show_now()

    def _needs_lines(self, status: RunStatus) -> list[str]:
        lines = [f"? gate {req.gate}: {req.question} "
                 "(a)" for req in status.pending_approvals]
        for uid, view in status.units.items():
            if view.state in ("blocked", "failed") and view.reason:
                lines.append(f"{state_symbol(view.state)} {uid} {view.state}: {view.reason}")
        lines.append(f"! external unknown: {len(status.external_unknown)}")
        lines += [f"! {a.get('kind', 'alert')}: {a.get('message', '')}" for a in status.alerts
                  if a.get("kind") != "nothing_ready"]
        return lines

    def _show_now(self) -> None:
        status = self.status
        if status is None:
            return
        now = self.app.project.clock()
        lines = []
        for lease in status.leases:
            left = expires_in(float(lease.get("expires_at", now)) - now)
            lines.append(f"lease  {lease.get('attempt')} · executor {lease.get('owner')} · "
                         f"expires {left}")
        if self.progress:
            lines.append(f"now    {self.progress}")
        lines.append(f"last commit {ago(status.last_commit_at, now)} · "
                     f"{status.checkpoint_commits} checkpoint commits")
        lines.append(f"next   {status.next_action}")
        self.query_one("#now", Static).update("\n".join(lines))

    # -- the engine worker ---------------------------------------------------------------------
    def start_engine(self, action: EngineAction, label: str = "run") -> bool:
        """Run ``action(run, cancel, on_event)`` in the engine worker; False if one is running."""
        if self.running:
            self.notify("a run is in progress: wait for it, or press c to cancel",
                        severity="warning")
            return False
        run = self.app.guarded("Could not open the run", self.app.ensure_run)
        if run is None:
            return False
        self.cancel_event = threading.Event()
        self.running = True
        self.engine_idle.clear()
        self.refresh_bindings()
        self.progress = f"{label}: starting (recovery first)"
        self.refresh_status()
        self._engine(run, action, label, self.cancel_event)
        return True

    @work(thread=True, exclusive=True, exit_on_error=False, group="engine")
    def _engine(self, run: Run, action: EngineAction, label: str,
                cancel: threading.Event) -> None:
        """Thread: run the engine; post messages only (never touch a widget here)."""
        last_status = [0.0]

        def on_event(event: dict[str, Any]) -> None:
            kind = event.get("kind", "")
            if kind == "claimed":
                self.post_message(UnitClaimed(event.get("unit", ""), event.get("attempt", "")))
            elif kind == "attempt":
                status = None
                if time.monotonic() - last_status[0] >= STATUS_EVERY_S:
                    status = run.status()
                    last_status[0] = time.monotonic()
                self.post_message(UnitCommitted(event.get("unit", ""), event.get("attempt", ""),
                                                event.get("outcome", ""),
                                                event.get("detail", "") or "", status))
            else:
                self.post_message(RunProgressed(progress_text(event), kind))

        try:
            status = action(run, cancel, on_event)
            status = status if hasattr(status, "pending_approvals") else run.status()
        except RunCancelled:
            self.post_message(RunFinished(run.status(), cancelled=True, label=label))
            return
        except LeaseLost as exc:  # a BaseException on purpose; the worker only sees Exception
            raise KeepstepError(f"this executor lost its lease: {exc}",
                                hint="another executor took the unit over; r resumes") from exc
        finally:
            self.engine_idle.set()
        self.post_message(RunFinished(status, cancelled=cancel.is_set(), label=label))
        if status.pending_approvals and not cancel.is_set():
            self.post_message(ApprovalRequested(status.pending_approvals[0]))

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """The one handler that turns an engine error into RunFailed (then an error modal)."""
        if event.worker.group == "engine" and event.state == WorkerState.ERROR:
            error = event.worker.error
            message = str(error.args[0]) if error and error.args else repr(error)
            self.post_message(RunFailed(message, str(getattr(error, "hint", "") or "")))

    def on_unit_claimed(self, message: UnitClaimed) -> None:
        self.query_one(UnitGrid).set_state(message.unit, "running")
        self.progress = f"{message.attempt} claimed"
        self._show_now()

    def on_unit_committed(self, message: UnitCommitted) -> None:
        self.progress = f"{message.attempt} {message.outcome}" + (
            f": {message.detail}" if message.detail and message.outcome != "committed" else "")
        if message.status is not None:
            self.show_status(message.status)
        else:
            state = "succeeded" if message.outcome == "committed" else "blocked" \
                if message.outcome == "blocked" else "pending"
            self.query_one(UnitGrid).set_state(message.unit, state)
            self._show_now()

    def on_run_progressed(self, message: RunProgressed) -> None:
        if message.text:
            self.progress = message.text
            self._show_now()

    def on_run_finished(self, message: RunFinished) -> None:
        self.running = False
        self.refresh_bindings()
        self.progress = (f"{message.label} cancelled at a safe point; r resumes"
                         if message.cancelled else f"{message.label} stopped: "
                         f"{message.status.decision}")
        self.show_status(message.status)

    def on_run_failed(self, message: RunFailed) -> None:
        self.running = False
        self.refresh_bindings()
        first = (message.error.splitlines() or ["(no message)"])[0]
        self.progress = f"stopped with an error: {first}"
        self.refresh_status()
        self.app.show_error(message.error, title=message.title, hint=message.hint)

    def on_approval_requested(self, message: ApprovalRequested) -> None:
        self.open_approval(message.request)

    # -- approvals ---------------------------------------------------------------------------
    def open_approval(self, request: PendingApproval) -> None:
        run = self.app.active_run
        if run is None or isinstance(self.app.screen, ApprovalModal):
            return
        gate = next((g for g in run.plan.gates if g.id == request.gate), None)
        audience = self.app.project.files.contract.audience

        def answered(choice: str | None) -> None:
            if choice is None or gate is None:
                self.notify(f"not now: the run waits at gate {request.gate} (a to answer)")
                return
            recorded = self.app.guarded("The approval was not recorded", run.approve, gate.id,
                                        choice, who=self.app.who)
            if recorded is not None:
                self.notify(f"recorded: gate {gate.id} = {choice!r}; resuming")
                self.action_run()

        self.app.push_screen(ApprovalModal(request, gate=gate, preferred=audience), answered)

    # -- actions -----------------------------------------------------------------------------
    def action_run(self) -> None:
        self.start_engine(lambda run, cancel, on_event: run.run(cancel=cancel, on_event=on_event))

    def action_cancel(self) -> None:
        if not self.running:
            self.notify("nothing is running")
            return
        self.cancel_event.set()
        self.progress = "cancel requested: stopping at the next safe point"
        self._show_now()

    def action_approvals(self) -> None:
        pending = self.status.pending_approvals if self.status else []
        if not pending:
            self.notify("no approval is waiting")
            return
        self.open_approval(pending[0])

    def _need_run(self) -> Run | None:
        if self.app.active_run is None:
            self.notify(f"run {self.app.run_id} has not started: press r first")
        return self.app.active_run

    def action_explain(self) -> None:
        unit = self.selected_unit
        if self._need_run() is not None and unit:
            self.app.push_screen(ExplainScreen(unit))

    def action_takeover(self) -> None:
        if self._need_run() is not None:
            self.app.push_screen(TakeoverScreen(self.selected_unit), self._takeover_done)

    def _takeover_done(self, outcome: tuple[str, str] | None) -> None:
        if outcome is None:
            return
        what, unit = outcome
        if what == "resume":
            self.start_engine(lambda run, cancel, on_event: run.run(cancel=cancel,
                                                                    on_event=on_event),
                              label=f"rerun {unit}" if unit else "run")
        elif what == "cancel" and self.running:
            self.action_cancel()

    def action_handover(self) -> None:
        if self._need_run() is not None:
            self.app.push_screen(NarrativeScreen())

    def action_sources(self) -> None:
        self.app.push_screen(SourcesScreen())

    def action_plan(self) -> None:
        if self.running:
            self.notify("the plan cannot be edited while a run is in progress",
                        severity="warning")
            return
        self.app.push_screen(PlanBuilderScreen())

    def action_events(self) -> None:
        if self._need_run() is not None:
            self.app.push_screen(EventsScreen())


__all__ = ["DashboardScreen"]
