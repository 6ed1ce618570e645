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
from keepstep.engine import Project, Run, open_project

QUIT_WAIT_S = 60.0


class KeepstepApp(App[None]):
    """The keepstep TUI. Build it with ``make_app``; the dashboard is the base screen."""

    CSS_PATH = "keepstep.tcss"
    TITLE = "keepstep"
    BINDINGS = [
        Binding("question_mark,f1", "toggle_keys", "keys", key_display="?"),
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

    def action_toggle_keys(self) -> None:
        """`?` / F1: Textual's help panel with the screen's bindings (again: hide it)."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette offers every key of the screen (and the app's), by its description."""
        yield from super().get_system_commands(screen)
        seen = set()
        for key, active in screen.active_bindings.items():
            binding = active.binding
            if not binding.description or binding.action in seen or not active.enabled:
                continue
            seen.add(binding.action)
            yield SystemCommand(binding.description.capitalize(),
                                f"{binding.key_display or key} · {screen.__class__.__name__}",
                                lambda node=active.node, action=binding.action:
                                self.call_later(self.run_action, action, node))

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
    """Open the project and build the app on ``run_id`` (default, as everywhere:
    keepstep.toml's default_run, else the newest run, else R1 — started on the first `r`).
    ``project_options`` go to ``open_project`` (tests pass a fixed ``clock``, an
    ``executor_id`` or a ``gateway_factory``)."""
    project = open_project(Path(project_path), **project_options)
    return KeepstepApp(project, run_id or project.default_run_id(), who=who)


__all__ = ["KeepstepApp", "make_app"]
