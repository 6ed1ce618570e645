"""KeepstepApp and make_app(project_path): the TUI over one project and one run.

The app holds the open Project and the Run being shown (None until the first run is
started); screens read facts through the engine API only — never the database.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding

from keepstep.app.tui.format import error_text
from keepstep.app.tui.screens.dashboard import DashboardScreen
from keepstep.app.tui.screens.error import ErrorModal
from keepstep.engine import Project, Run, open_project

DEFAULT_RUN_ID = "run-1"
QUIT_WAIT_S = 60.0


class KeepstepApp(App[None]):
    """The keepstep TUI. Build it with ``make_app``; the dashboard is the base screen."""

    CSS_PATH = "keepstep.tcss"
    TITLE = "keepstep"
    BINDINGS = [
        Binding("ctrl+t", "toggle_theme", "light/dark", show=False),
    ]

    def __init__(self, project: Project, run_id: str, *, who: str | None = None) -> None:
        super().__init__()
        self.project = project
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
             **project_options: Any) -> KeepstepApp:
    """Open the project and build the app on ``run_id`` (default: the newest run, or
    'run-1' to be started on the first `r`). ``project_options`` go to ``open_project``
    (tests pass a fixed ``clock`` and ``executor_id``)."""
    project = open_project(Path(project_path), **project_options)
    if run_id is None:
        runs = project.runs()
        run_id = runs[-1] if runs else DEFAULT_RUN_ID
    return KeepstepApp(project, run_id, who=who)


__all__ = ["DEFAULT_RUN_ID", "KeepstepApp", "make_app"]
