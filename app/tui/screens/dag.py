"""DAG: the plan drawn by phase in the terminal, each unit coloured by its state, and for
the highlighted unit what it depends on (with the edge type) and what depends on it.
``o`` writes the SVG (the same drawing as the handover's dag.svg) and opens it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from keepstep.app.tui.format import state_symbol, state_word
from keepstep.app.tui.screens.deliverables import open_file
from keepstep.app.tui.screens.explain import ExplainScreen
from keepstep.app.tui.widgets.unit_grid import UnitGrid

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp


class DagScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("e", "explain", "explain"),
        Binding("o", "open", "open the SVG"),
    ]

    app: KeepstepApp

    def __init__(self, unit: str | None = None) -> None:
        super().__init__()
        self.start_unit = unit

    def compose(self) -> ComposeResult:
        yield Static(id="dag-title", classes="screen-title", markup=False)
        with VerticalScroll(id="dag-box", classes="panel") as box:
            box.border_title = "Units by phase (state colours) · arrows move"
            yield UnitGrid(id="dag-grid")
        with Vertical(id="dag-edges-box", classes="panel") as edges:
            edges.border_title = "Edges of the highlighted unit"
            yield Static(id="dag-edges", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        run = self.app.active_run
        plan = run.plan if run is not None else self.app.project.files.plan
        status = self.app.dashboard.status
        grid = self.query_one(UnitGrid)
        grid.set_units((u.id, u.phase) for u in plan.units)
        if status is not None:
            grid.set_states({uid: v.state for uid, v in status.units.items()})
        if self.start_unit:
            grid.select(self.start_unit)
        self.query_one("#dag-title", Static).update(
            f"DAG · run {self.app.run_id} · {len(plan.units)} units, "
            f"{sum(len(u.depends_on) for u in plan.units)} dependencies")
        grid.focus()
        self._edges()

    @on(UnitGrid.Selected)
    def _edges(self) -> None:
        run = self.app.active_run
        plan = run.plan if run is not None else self.app.project.files.plan
        grid = self.query_one(UnitGrid)
        uid = grid.selected
        if uid is None:
            return
        unit = plan.unit_map()[uid]
        state = grid.state_of(uid)
        needs = ", ".join(f"{d.unit} [{d.edge.value}] {state_symbol(grid.state_of(d.unit))}"
                          for d in unit.depends_on) or "nothing (a root)"
        users = [f"{u.id} [{d.edge.value}]" for u in plan.units for d in u.depends_on
                 if d.unit == uid]
        self.query_one("#dag-edges", Static).update(
            f"{uid} {unit.title} · {unit.kind.value} · {state_symbol(state)} "
            f"{state_word(state)}\n"
            f"needs:   {needs}\n"
            f"used by: {', '.join(users) or 'nothing (a final unit)'}")

    def action_explain(self) -> None:
        uid = self.query_one(UnitGrid).selected
        if uid and self.app.active_run is not None:
            self.app.push_screen(ExplainScreen(uid))

    def action_open(self) -> None:
        run = self.app.active_run
        if run is None:
            self.notify("no run yet: nothing to draw", severity="warning")
            return
        svg = self.app.guarded("Could not draw the DAG", run.dag_svg)
        if svg is None:
            return
        path = Path(self.app.project.root) / "handover" / f"dag-{run.run_id}-{run.branch_id}.svg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        open_file(self.app, path, editor=False)


__all__ = ["DagScreen"]
