"""KeepstepApp and make_app(project_path): the TUI over one project and one run.

The app holds the open Project and the Run being shown (None until the first run is
started); screens read facts through the engine API only — never the database.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from keepstep.app.tui.format import error_text
from keepstep.app.tui.screens.dashboard import DashboardScreen
from keepstep.app.tui.screens.error import ErrorModal
from keepstep.app.tui.screens.plan_builder import PlanBuilderScreen
from keepstep.app.tui.screens.raw_plan import PlanRepairApp, toml_error
from keepstep.engine import PlanValidationError, Project, Run, open_project
from keepstep.engine.plan import PLAN_FILE

QUIT_WAIT_S = 60.0
# The dashboard's actions in the command palette: (action, title, help), titled with the
# words a person would type.
PALETTE = (
    ("run", "Run · start or continue the run", "r"),
    ("cancel", "Cancel the run at its next safe point", "c"),
    ("approvals", "Approve · answer a pending approval gate", "a"),
    ("explain", "Explain the highlighted unit", "e"),
    ("takeover", "Takeover · rerun, mark for an expert, branch, skip", "t"),
    ("deliverables", "Deliverables · the run's files: view, open, export", "f"),
    ("dag", "DAG · the plan's graph coloured by state", "g"),
    ("handover", "Handover · narrative and the handover bundle", "h"),
    ("sources", "Sources · list, approve, revoke, add", "s"),
    ("plan", "Plan builder · edit plan.toml (F2: as text)", "p"),
    ("events", "Events · the run's event log", "v"),
    ("effects", "Effects · external actions and their outcomes", "l"),
    ("conflicts", "Conflicts · disagreements between sources and the value used", "k"),
)


class KeepstepApp(App[None]):
    """The keepstep TUI. Build it with ``make_app``; the dashboard is the base screen."""

    CSS_PATH = "keepstep.tcss"
    TITLE = "keepstep"
    BINDINGS = [
        Binding("question_mark,f1", "toggle_keys", "keys", key_display="?"),
        Binding("ctrl+t", "toggle_theme", "light/dark", show=False),
    ]

    def __init__(self, project: Project, run_id: str, *, who: str | None = None,
                 plan_problems: list[str] | None = None) -> None:
        super().__init__()
        self.project = project
        # plan.toml did not validate when the app opened: it starts in the plan builder.
        self.plan_problems = list(plan_problems or [])
        self.run_id = run_id
        self.branch_id = "main"
        self.who = who or _default_who()
        self.active_run: Run | None = project.get_run(run_id) if run_id in project.runs() else None

    # -- the run ---------------------------------------------------------------------------
    def ensure_run(self) -> Run:
        """The run being shown, started from the project files if it does not exist yet."""
        if self.active_run is None:
            self.active_run = self.project.open_or_start(self.run_id, self.branch_id)
        return self.active_run

    def switch_run(self, run: Run) -> None:
        """Show another run or branch (after a branch at a takeover)."""
        self.active_run = run
        self.run_id, self.branch_id = run.run_id, run.branch_id
        self.dashboard.refresh_status()

    @property
    def dashboard(self) -> DashboardScreen:
        return self._dashboard

    def get_default_screen(self) -> DashboardScreen:
        self._dashboard = DashboardScreen()
        return self._dashboard

    def on_mount(self) -> None:
        if self.plan_problems:
            self.push_screen(PlanBuilderScreen())
            shown = "\n".join(f"- {p}" for p in self.plan_problems[:8])
            more = len(self.plan_problems) - 8
            self.show_error(
                f"plan.toml has {len(self.plan_problems)} problem(s):\n{shown}"
                + (f"\n… and {more} more (listed under the form)" if more > 0 else ""),
                title="The plan does not validate",
                hint="fix them here (each is listed under the form), then ctrl+s; runs stay "
                "refused until it validates")

    # -- errors ------------------------------------------------------------------------------
    def show_error(self, error: BaseException | str, *, title: str = "Something went wrong",
                   hint: str = "") -> None:
        """Every error a person should read goes through here (one modal, same wording)."""
        if isinstance(error, BaseException):
            message, hint = error_text(error)
        else:
            message = error
        self.push_screen(ErrorModal(title, message, hint))

    def guarded(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``; an error (engine, storage, file) becomes the error modal, not a crash."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # engine and storage errors have separate bases: show both
            self.show_error(exc, title=what)
        return None

    def action_toggle_keys(self) -> None:
        """`?` / F1: Textual's help panel with the screen's bindings (again: hide it)."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette offers every action: the dashboard's, each named with the words a
        person searches for (export, approve, deliverables…), the exports themselves, and
        every key of the screen shown (and the app's), by its description."""
        yield from super().get_system_commands(screen)
        dashboard = self.dashboard
        seen = set()
        for action, title, help_text in PALETTE:
            yield SystemCommand(title, f"key {help_text} on the dashboard",
                                lambda action=action: self.call_later(self._palette_action,
                                                                      action))
        yield SystemCommand("Export deliverables · Markdown, CSV and manifest",
                            "to deliverables/RUN in the project (x on the files page)",
                            lambda: self.call_later(self.export_deliverables, ()))
        yield SystemCommand("Export deliverables as Word (docx) with charts",
                            "report.docx … and charts/ next to the Markdown",
                            lambda: self.call_later(self.export_deliverables, ("docx",)))
        del dashboard
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if not binding.description or binding.action in seen or not active.enabled:
                continue
            seen.add(binding.action)
            yield SystemCommand(binding.description.capitalize(),
                                f"{binding.key_display or key} · {screen.__class__.__name__}",
                                lambda node=active.node, action=binding.action:
                                self.call_later(self.run_action, action, node))

    async def _palette_action(self, action: str) -> None:
        """A dashboard action from the palette; one its screen disables now says why."""
        dashboard = self.dashboard
        if dashboard.check_action(action, ()) is False:
            why = {"approvals": "no approval is waiting", "run": "the run is running",
                   "cancel": "nothing is running"}.get(action, "not now")
            self.notify(f"{action}: {why}")
            return
        await self.run_action(action, dashboard)

    def export_deliverables(self, formats: tuple[str, ...]) -> None:
        """The run's current deliverables to deliverables/RUN (with Word files for docx)."""
        from keepstep.engine.exports import export_documents

        run = self.active_run
        if run is None:
            self.notify("no run yet: run it first (r)")
            return
        result = self.guarded("The deliverables were not exported", run.export_deliverables)
        if result is None:
            return
        if formats:
            docs = self.guarded("The Word files were not written", export_documents, run,
                                result, formats)
            if docs is None:
                return
        self.notify(f"exported {len(result.files)} file(s) to {result.folder}"
                    + (" with Word files and charts" if formats else ""))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme != "textual-light" else "textual-dark"

    async def action_quit(self) -> None:
        self.dashboard.cancel_event.set()  # the engine stops at its next safe point
        self.exit()

    def on_unmount(self) -> None:
        # Quitting mid-run: the engine stops at its next safe point before the store closes
        # (the unit in flight, if any, is an orphan the next resume finds and redoes).
        self.dashboard.cancel_event.set()
        self.dashboard.engine_idle.wait(QUIT_WAIT_S)
        self.project.close()


def _default_who() -> str:
    try:
        return f"{getpass.getuser()} (tui)"
    except Exception:  # no user name in some containers
        return "tui"


def make_app(project_path: str | Path, run_id: str | None = None, *, who: str | None = None,
             **project_options: Any) -> KeepstepApp | PlanRepairApp:
    """Open the project and build the app on ``run_id`` (default, as everywhere:
    keepstep.toml's default_run, else the newest run, else R1 — started on the first `r`).
    ``project_options`` go to ``open_project`` (tests pass a fixed ``clock``, an
    ``executor_id`` or a ``gateway_factory``). A plan.toml that is not TOML at all gives the
    PlanRepairApp instead: the raw text at the error line (it exits "reopen" once saved)."""
    try:
        project = open_project(Path(project_path), **project_options)
        problems: list[str] = []
    except PlanValidationError as exc:
        # Open anyway (a plan that parses but does not validate), so the plan builder can
        # show and repair it.
        plan_file = Path(project_path) / PLAN_FILE
        if plan_file.is_file() and toml_error(plan_file.read_text(encoding="utf-8")):
            return PlanRepairApp(plan_file)
        project = open_project(Path(project_path), validate=False, **project_options)
        problems = list(exc.errors) or [str(exc)]
    return KeepstepApp(project, run_id or project.default_run_id(), who=who,
                       plan_problems=problems)


__all__ = ["KeepstepApp", "make_app"]
