"""Disagreements: what the verify units found between sources (``keepstep conflicts``), each
with its class, the value the documents use and why, and every side's evidence."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp


class ConflictsScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "back")]

    app: KeepstepApp

    def compose(self) -> ComposeResult:
        yield Static("Disagreements between sources", classes="screen-title",
                     id="conflicts-title", markup=False)
        with VerticalScroll(id="conflicts-body", classes="panel"):
            yield Static(id="conflicts", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        from keepstep.engine.views import conflicts_text, run_conflicts

        run = self.app.active_run
        found = None if run is None else self.app.guarded(
            "Could not read the disagreements", run_conflicts, run)
        text = "no run yet" if run is None else conflicts_text(found or [])
        self.query_one("#conflicts", Static).update(text)
        self.query_one(VerticalScroll).focus()


__all__ = ["ConflictsScreen"]
