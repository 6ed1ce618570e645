"""The run dashboard: every unit with its title and state by phase, budget, what needs you
(each with its action), the units in flight with their step and a ticking elapsed time,
the next step, and a tail of recent events.

It owns the engine worker: `r` runs (or resumes) the run in a thread that only posts
messages back (app/messages.py) and feeds the engine's ``ProgressTracker``; `c` sets the
cancel Event, so the engine stops at its next safe point. A one-second timer redraws "Now"
from the tracker (several units may be in flight at once), and while nothing runs here it
re-reads the status, so another executor's progress shows too. Every other page is one key
away; every key is also in the command palette (ctrl+p) and on `?`.
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
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState

from keepstep.app.tui.format import DECISION_LABELS, event_line, progress_text
from keepstep.app.tui.messages import (
    ApprovalRequested,
    RunFailed,
    RunFinished,
    RunProgressed,
    UnitClaimed,
    UnitCommitted,
)
from keepstep.app.tui.screens.dag import DagScreen
from keepstep.app.tui.screens.deliverables import DeliverablesScreen
from keepstep.app.tui.screens.effects import EffectsScreen
from keepstep.app.tui.screens.events import EventsScreen
from keepstep.app.tui.screens.explain import ExplainScreen
from keepstep.app.tui.screens.narrative import NarrativeScreen
from keepstep.app.tui.screens.needs import NeedsYouActions
from keepstep.app.tui.screens.plan_builder import PlanBuilderScreen
from keepstep.app.tui.screens.sources import SourcesScreen
from keepstep.app.tui.screens.takeover import TakeoverScreen
from keepstep.app.tui.widgets.budget_bars import BudgetBars
from keepstep.app.tui.widgets.unit_table import UnitTable
from keepstep.engine import KeepstepError, LeaseLost, RunCancelled
from keepstep.engine.views import fmt_duration

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import Run
    from keepstep.engine.views import Need, ProgressTracker, RunStatus

# action(run, cancel, on_event) -> RunStatus: Run.run, Run.retry… with the worker's Event.
EngineAction = Callable[["Run", threading.Event, Callable[[dict[str, Any]], None]], Any]
STATUS_EVERY_S = 0.3  # a full RunStatus at most this often while units start and commit
WATCH_EVERY_S = 2.0  # while nothing runs here: re-read the status (another executor may)
EVENTS_SHOWN = 6
QUIET_EVENTS = ("checkpoint.committed", "recovery.started", "recovery.audited")
# Shown elsewhere: a stopped recovery is under Needs you; "nothing ready" is the next line.
ALERTS_NOT_SHOWN = ("nothing_ready", "recovery_stopped")
NEED_MARKS = {"approval": "?", "budget": "◼", "effect": "!", "expert": "◼", "failed": "✗",
              "blocked": "◼", "recovery": "!"}


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class DashboardScreen(NeedsYouActions, Screen[None]):
    BINDINGS = [
        Binding("r", "run", "run"),
        Binding("c", "cancel", "cancel"),
        Binding("a", "approvals", "approve"),
        Binding("e", "explain", "explain"),
        Binding("t", "takeover", "takeover"),
        Binding("f", "deliverables", "files"),
        Binding("g", "dag", "DAG"),
        Binding("h", "handover", "handover"),
        Binding("s", "sources", "sources"),
        # Shown on `?` and in the palette; the footer keeps to 100 columns.
        Binding("p", "plan", "plan", show=False),
        Binding("v", "events", "events", show=False),
        Binding("l", "effects", "effects", show=False),
        Binding("k", "conflicts", "disagreements", show=False),
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
        self.tracker: ProgressTracker | None = None
        self._watched = 0.0

    def compose(self) -> ComposeResult:
        with Horizontal(id="title-bar"):
            yield Static(id="title-left", markup=False)
            yield Static(id="title-right", markup=False)
        with Horizontal(id="dash-body"):
            with Vertical(id="units-box", classes="panel") as units:
                units.border_title = "Units by phase"
                yield UnitTable(id="units")
                yield Static(id="counts", markup=False)
            with Vertical(id="side"):
                with Vertical(id="budget-box", classes="panel") as budget:
                    budget.border_title = "Budget"
                    yield BudgetBars(id="budget")
                with Vertical(id="needs-box", classes="panel") as needs:
                    needs.border_title = "Needs you · enter acts"
                    yield OptionList(id="needs")
        with Horizontal(id="dash-bottom"):
            with Vertical(id="now-box", classes="panel") as now:
                now.border_title = "Now"
                yield Static(id="now", markup=False)
            with Vertical(id="events-box", classes="panel") as events:
                events.border_title = "Recent events"
                yield Static(id="recent", markup=False)
        yield Footer(compact=True)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show `r` or `c` by whether a run is in progress, `a` only when a gate waits (the
        footer then fits 100 columns)."""
        if action == "run":
            return not self.running
        if action == "cancel":
            return self.running
        if action == "approvals":
            return bool(self.status and self.status.pending_approvals) and not self.running
        return True

    def on_mount(self) -> None:
        self.refresh_status()
        self.query_one(UnitTable).focus()
        self.set_interval(1.0, self._tick)

    def on_screen_resume(self) -> None:
        if not self.running:
            self.refresh_status()

    # -- showing facts -----------------------------------------------------------------------
    @property
    def selected_unit(self) -> str | None:
        return self.query_one(UnitTable).selected

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
        self.query_one(UnitTable).set_units(
            (u.id, u.phase, u.title, "pending", 0) for u in plan.units)
        name = self.app.project.files.config.name
        self.query_one("#title-left", Static).update(
            f"{name} · run {self.app.run_id} (not started)")
        self.query_one("#title-right", Static).update("· pending")
        self.query_one("#counts", Static).update(f"· pending {len(plan.units)}")
        limits = self.app.project.files.config.budget.as_limits()
        self.query_one(BudgetBars).set_budget({"used": {}, "limits": limits})
        self._show_needs([])
        self.query_one("#now", Static).update(
            f"next   press r to start run {self.app.run_id} from the project files")
        self.query_one("#recent", Static).update("no events yet")

    def show_status(self, status: RunStatus) -> None:
        self.status = status
        self.refresh_bindings()
        table = self.query_one(UnitTable)
        table.set_units(table.rows_for(status))
        name = self.app.project.files.config.name
        self.query_one("#title-left", Static).update(
            f"{name} · run {status.run_id} ({status.branch})")
        state = "● running" if self.running else DECISION_LABELS.get(status.decision,
                                                                    status.decision)
        self.query_one("#title-right", Static).update(
            f"{status.plan_version} · {status.input_version} · checkpoint "
            f"{status.head_version} · {state}")
        self._show_counts()
        self.query_one(BudgetBars).set_budget(status.budget)
        self._show_needs(status.needs)
        self._show_now()
        self._show_events()

    def _show_counts(self) -> None:
        status = self.status
        if status is None:
            return
        c = dict(status.counts)
        if self.running and self.tracker is not None:
            snap = self.tracker.snapshot(read=False)
            # The tracker is fresher than the status read: a unit it reports in flight may
            # still be pending (and ready) there. Move it, so no unit is counted twice.
            for unit in {f.unit for f in snap.in_flight}:
                view = status.units.get(unit)
                if view is not None and view.state in ("pending", "invalidated"):
                    c[view.state] = max(0, c.get(view.state, 0) - 1)
                    c["ready"] = max(0, c.get("ready", 0) - 1)
            c["running"], c["current"] = len(snap.in_flight), snap.done
            others = sum(c.get(k, 0) for k in ("current", "running", "invalidated",
                                                "blocked", "failed", "cancelled"))
            c["pending"] = max(0, len(status.units) - others)
        shown = [f"✓ current {c.get('current', 0)}/{len(status.units)}"]
        for key, label in (("superseded", "superseded"), ("running", "● running"),
                           ("ready", "▶ ready"), ("invalidated", "↺ invalidated"),
                           ("blocked", "◼ blocked"), ("failed", "✗ failed"),
                           ("pending", "· pending"), ("orphans", "⚠ orphans")):
            if c.get(key):
                shown.append(f"{label} {c[key]}")
        self.query_one("#counts", Static).update("  ".join(shown))

    def _show_needs(self, needs: list[Need]) -> None:
        options = self.query_one("#needs", OptionList)
        highlighted = options.highlighted
        options.clear_options()
        self.needs = list(needs)
        if not needs:
            options.add_option(Option("nothing: the run needs no decision from you",
                                      disabled=True))
            return
        for n, need in enumerate(needs):
            options.add_option(Option(f"{NEED_MARKS.get(need.kind, '!')} {need.message}\n"
                                      f"  → {need.action}", id=f"need-{n}"))
        if highlighted is not None and highlighted < len(needs):
            options.highlighted = highlighted

    def _flights(self) -> list[tuple[str, str, str, float]]:
        """(unit, title, step, elapsed seconds) of every unit in flight now."""
        now = self.app.project.clock()
        if self.running and self.tracker is not None:
            snap = self.tracker.snapshot()
            return [(f.unit, f.title, f.step, f.elapsed_s) for f in snap.in_flight]
        status = self.status
        if status is None:
            return []
        return [(f.unit, f.title, f.step or "started",
                 now - f.started_ts if f.started_ts else 0.0) for f in status.in_flight]

    def _show_now(self) -> None:
        status = self.status
        if status is None:
            return
        width = max(40, self.query_one("#now", Static).size.width or 60)
        lines = []
        for unit, title, step, elapsed in self._flights():
            tail = f" · {step or 'started'} · {fmt_duration(elapsed)}"
            room = max(12, width - len(unit) - len(tail) - 3)
            lines.append(f"● {unit} {_short(title, room)}{tail}")
        if self.running and self.tracker is not None:
            snap = self.tracker.snapshot(read=False)
            eta = f" · ETA ~{fmt_duration(snap.eta_s)}" if snap.eta_s else ""
            lines.append(f"{snap.done}/{snap.total} done · {snap.calls:g} calls{eta}")
        elif self.progress:
            lines.append(f"last   {self.progress}")
        for alert in [a for a in status.alerts if a.get("kind") not in ALERTS_NOT_SHOWN][:2]:
            lines.append(f"! {alert.get('kind', 'alert').replace('_', ' ')}: "
                         f"{alert.get('message', '')}")
        since = self._since(status.last_commit_at)
        lines.append(f"last commit {since} · {status.checkpoint_commits} checkpoint commits")
        lines.append(f"next   {self._next_line(status)}")
        self.query_one("#now", Static).update("\n".join(lines))

    def _next_line(self, status: RunStatus) -> str:
        """The next step in this TUI's keys (the CLI command is under Needs you and `?`)."""
        if self.running:
            return "running here: c cancels at the next safe point"
        if status.decision == "done":
            return "done: f shows and exports the deliverables · h the handover"
        if status.needs:
            need = status.needs[0]
            how = "a answers it" if need.kind == "approval" else "enter on it under Needs you"
            return f"{need.action} — {how}"
        if status.decision == "claim":
            return status.next_action.split(" (`")[0] + " — r resumes"
        return status.next_action

    def _since(self, iso: str | None) -> str:
        from keepstep.app.tui.format import ago

        return ago(iso, self.app.project.clock())

    def _show_events(self) -> None:
        run = self.app.active_run
        if run is None:
            return
        found = self.app.guarded("Could not read the events", run.events,
                                 branch_id=run.branch_id, newest_first=True,
                                 limit=EVENTS_SHOWN * 3) or []
        shown = [event_line(e) for e in found if e.kind not in QUIET_EVENTS][:EVENTS_SHOWN]
        self.query_one("#recent", Static).update("\n".join(shown) or "no events yet")

    def _tick(self) -> None:
        """Once a second: the elapsed times tick; without a run here, watch the status."""
        if self.running:
            run = self.app.active_run
            if run is not None and time.monotonic() - self._watched >= WATCH_EVERY_S:
                self._watched = time.monotonic()
                status = self.app.guarded("Could not read the run's status", run.status)
                if status is not None:
                    self.show_status(status)
                    return
            self._show_counts()
            self._show_now()
        elif self.app.screen is self and time.monotonic() - self._watched >= WATCH_EVERY_S:
            self._watched = time.monotonic()
            if self.app.active_run is None:  # started by another executor meanwhile?
                if self.app.run_id not in self.app.project.runs():
                    return
                self.app.active_run = self.app.project.get_run(self.app.run_id,
                                                               self.app.branch_id)
            self.refresh_status()
        elif self.status is not None and self.status.in_flight:
            self._show_now()

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
        self.tracker = run.progress(clock=self.app.project.clock)
        self.running = True
        self.engine_idle.clear()
        self.refresh_bindings()
        self.progress = f"{label}: starting (recovery first)"
        self.refresh_status()
        self._engine(run, action, label, self.cancel_event, self.tracker)
        return True

    @work(thread=True, exclusive=True, exit_on_error=False, group="engine")
    def _engine(self, run: Run, action: EngineAction, label: str,
                cancel: threading.Event, tracker: ProgressTracker) -> None:
        """Thread: run the engine; post messages only (never touch a widget here)."""
        last_status = [0.0]

        def fresh_status() -> RunStatus | None:
            if time.monotonic() - last_status[0] < STATUS_EVERY_S:
                return None
            last_status[0] = time.monotonic()
            return run.status()

        def on_event(event: dict[str, Any]) -> None:
            tracker.on_event(event)
            kind = event.get("kind", "")
            if kind == "claimed":
                self.post_message(UnitClaimed(event.get("unit", ""), event.get("attempt", ""),
                                              fresh_status()))
            elif kind == "attempt":
                self.post_message(UnitCommitted(event.get("unit", ""), event.get("attempt", ""),
                                                event.get("outcome", ""),
                                                event.get("detail", "") or "", fresh_status()))
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
        if message.status is not None:
            self.show_status(message.status)
        self.query_one(UnitTable).set_state(message.unit, "running")
        self.progress = f"{message.attempt} started"
        self._show_counts()
        self._show_now()

    def on_unit_committed(self, message: UnitCommitted) -> None:
        self.progress = f"{message.attempt} {message.outcome}" + (
            f": {message.detail}" if message.detail and message.outcome != "committed" else "")
        if message.status is not None:
            self.show_status(message.status)
        else:
            state = "succeeded" if message.outcome == "committed" else "blocked" \
                if message.outcome == "blocked" else "pending"
            self.query_one(UnitTable).set_state(message.unit, state)
            self._show_now()

    def on_run_progressed(self, message: RunProgressed) -> None:
        if message.text:
            self.progress = message.text

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

    # -- needs you (the actions are NeedsYouActions') ------------------------------------
    # Textual collects @on handlers from the screen class itself, not from a mixin.
    @on(OptionList.OptionSelected, "#needs")
    def _need_chosen(self, event: OptionList.OptionSelected) -> None:
        option_id = event.option.id or ""
        if not option_id.startswith("need-"):
            return
        self.act_on(self.needs[int(option_id.removeprefix("need-"))])

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

    def action_deliverables(self) -> None:
        if self._need_run() is not None:
            self.app.push_screen(DeliverablesScreen())

    def action_dag(self) -> None:
        self.app.push_screen(DagScreen(self.selected_unit))

    def action_effects(self) -> None:
        if self._need_run() is not None:
            self.app.push_screen(EffectsScreen())

    def action_conflicts(self) -> None:
        if self._need_run() is not None:
            from keepstep.app.tui.screens.conflicts import ConflictsScreen

            self.app.push_screen(ConflictsScreen())

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
