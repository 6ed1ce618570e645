"""Explain: why a unit is in its state — attempts, the invalidation path, the gate or the
budget figures that hold it — in the engine's own sentences (Run.explain(unit).render()),
then the outputs its committed record holds (Run.outputs(unit))."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from keepstep.app.cli.output import outputs_text

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp


class ExplainScreen(Screen[None]):
    BINDINGS = [Binding("escape", "app.pop_screen", "back")]

    app: KeepstepApp

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def compose(self) -> ComposeResult:
        yield Static(f"Explain {self.unit}", classes="screen-title", markup=False)
        with VerticalScroll(id="explain-body", classes="panel"):
            yield Static(id="explanation", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        run = self.app.active_run
        text = "no run yet"
        if run is not None:
            found = self.app.guarded(f"Could not explain {self.unit}", run.explain, self.unit)
            text = found.render() if found is not None else f"no explanation for {self.unit}"
            outputs = self.app.guarded("Could not list the outputs", run.outputs, self.unit)
            if outputs is not None:
                text += "\n\n" + outputs_text(outputs) + "\n  (f lists the deliverables; " \
                    "o there opens one)"
        self.query_one("#explanation", Static).update(text)


__all__ = ["ExplainScreen"]
