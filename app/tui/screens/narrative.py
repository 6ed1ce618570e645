"""Narrative: the handover story generated from the run's structured state
(``Run.narrative``), rendered as Markdown; `x` exports the handover bundle."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Markdown, Static

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import Run

def bundle_path(run: Run) -> Path:
    """Where the TUI exports a run's handover bundle: <project>/handover/<run>-<branch>."""
    return run.project.root / "handover" / f"{run.run_id}-{run.branch_id}"


def export_bundle(app: KeepstepApp) -> Path | None:
    """Export the shown run's handover bundle; notifies and returns the path (None if not)."""
    run = app.active_run
    if run is None:
        app.notify("no run yet", severity="warning")
        return None
    path = app.guarded("The handover bundle was not exported", run.handover, bundle_path(run))
    if path is not None:
        app.notify(f"handover bundle: {path}")
    return path


class NarrativeScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("x", "export", "export bundle"),
    ]

    app: KeepstepApp

    def compose(self) -> ComposeResult:
        yield Static("Handover narrative", classes="screen-title", id="narrative-title",
                     markup=False)
        with VerticalScroll(id="narrative-body", classes="panel"):
            yield Markdown(id="narrative")
        yield Static(id="export-path", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        run = self.app.active_run
        if run is None:
            text = "_no run yet_"
        else:
            text = self.app.guarded("Could not write the narrative", run.narrative) or ""
        self.query_one(Markdown).update(text)
        self.query_one(VerticalScroll).focus()

    def action_export(self) -> None:
        path = export_bundle(self.app)
        self.query_one("#export-path", Static).update(
            f"exported: {path}" if path is not None else "")


__all__ = ["NarrativeScreen", "bundle_path", "export_bundle"]
