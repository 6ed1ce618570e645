"""Events: the run's append-only event log, newest first, filtered by a kind prefix
('decision.', 'recovery', 'approval.'…) typed into the filter box."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp

LIMIT = 500


class EventsScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("slash", "filter", "filter"),
        Binding("f5", "reload", "reload"),
    ]

    app: KeepstepApp

    def compose(self) -> ComposeResult:
        yield Static("Events", classes="screen-title", id="events-title", markup=False)
        yield Input(placeholder="/ filter by kind prefix, e.g. decision. or recovery",
                    id="events-filter", compact=True)
        yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("seq", "time", "kind", "unit", "details")
        self.load()
        table.focus()

    def load(self) -> None:
        run = self.app.active_run
        table = self.query_one(DataTable)
        table.clear()
        if run is None:
            return
        prefix = self.query_one("#events-filter", Input).value.strip() or None
        found = self.app.guarded("Could not read the events", run.events, kind_prefix=prefix,
                                 branch_id=run.branch_id, newest_first=True, limit=LIMIT) or []
        for ev in found:
            details = json.dumps(ev.payload, sort_keys=True, default=str)
            table.add_row(str(ev.seq), ev.ts[:19].replace("T", " "), ev.kind,
                          ev.unit or ev.attempt_id or "", details[:200], key=str(ev.seq))
        shown = f"{len(found)} event(s)" + (f" of kind {prefix}*" if prefix else "")
        more = f" (newest {LIMIT})" if len(found) >= LIMIT else ""
        self.query_one("#events-title", Static).update(
            f"Events · run {run.run_id} ({run.branch_id}) · {shown}{more}")

    @on(Input.Changed, "#events-filter")
    @on(Input.Submitted, "#events-filter")
    def _filter_changed(self) -> None:
        self.load()

    def action_filter(self) -> None:
        self.query_one("#events-filter", Input).focus()

    def action_reload(self) -> None:
        self.load()


__all__ = ["EventsScreen"]
