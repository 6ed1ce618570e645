"""Deliverables: the run's current documents, a look inside one, opening it, exporting all.

The list is ``Run.deliverables()`` (each file re-hashed against its record); enter shows the
highlighted one here (Markdown rendered, other text as is); ``o`` opens it in ``$EDITOR``
(the TUI steps aside meanwhile) or, without one, the system viewer; ``x`` exports them all
with their manifest to ``deliverables/<run>/`` (``Run.export_deliverables``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Markdown, Static

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine.views import Deliverable


def viewer_command(path: Path, *, editor: bool = True) -> list[str]:
    """$VISUAL / $EDITOR when set (and ``editor``), else the system's opener for the file."""
    editor_cmd = (os.environ.get("VISUAL") or os.environ.get("EDITOR")) if editor else None
    if editor_cmd:
        return [*shlex.split(editor_cmd), str(path)]
    if sys.platform == "darwin":
        return ["open", str(path)]
    if sys.platform.startswith("win"):
        return ["cmd", "/c", "start", "", str(path)]
    return ["xdg-open", str(path)]


def open_file(app: KeepstepApp, path: Path, *, editor: bool = True) -> None:
    """Open ``path`` for the person: an editor in this terminal (the TUI suspends), or the
    system viewer in its own window. A missing program is an error modal, not a crash."""
    command = viewer_command(path, editor=editor)
    in_terminal = editor and bool(os.environ.get("VISUAL") or os.environ.get("EDITOR"))
    try:
        if in_terminal:
            with app.suspend():
                subprocess.run(command, check=False)
        else:
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
            app.notify(f"opened {path.name} with {command[0]}")
    except (OSError, Exception) as exc:  # no viewer installed, or no terminal to suspend
        app.show_error(f"could not open {path}: {exc}", title="Not opened",
                       hint="set $EDITOR, or open the file yourself: " + str(path))


class DeliverablesScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("o", "open", "open"),
        Binding("x", "export", "export all"),
    ]

    app: KeepstepApp

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, Deliverable] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="deliverables-title", classes="screen-title", markup=False)
        with Horizontal(id="deliverables-body"):
            yield DataTable(id="deliverables-table", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="deliverable-view", classes="panel") as view:
                view.border_title = "Content"
                yield Markdown(id="deliverable-markdown")
        yield Static(id="deliverables-export", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("unit", "file", "sha256", "on disk")
        run = self.app.active_run
        rows = (self.app.guarded("Could not list the deliverables", run.deliverables) or []) \
            if run else []
        for d in rows:
            key = f"{d.unit}/{d.name}"
            self.rows[key] = d
            table.add_row(d.unit, d.name, d.sha256[:12] + "…",
                          "matches" if d.matches else "CHANGED", key=key)
        self.query_one("#deliverables-title", Static).update(
            f"Deliverables · run {self.app.run_id} · {len(rows)} current file(s) · enter "
            "shows one · o opens it · x exports them all")
        table.focus()
        self._show()

    def _current(self) -> Deliverable | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.rows.get(str(key))

    @on(DataTable.RowHighlighted)
    def _show(self) -> None:
        d, run = self._current(), self.app.active_run
        view = self.query_one(Markdown)
        if d is None or run is None:
            view.update("_no deliverables yet: they appear when their units are current_")
            return
        out = self.app.guarded(f"Could not read {d.name}", run.output, d.unit, d.name)
        if out is None:
            return
        text = out.text
        if not d.name.endswith(".md"):
            text = "```\n" + text[:20000] + "\n```"
        view.update(text[:40000])

    def action_open(self) -> None:
        d = self._current()
        if d is not None:
            open_file(self.app, Path(d.path))

    def action_export(self) -> None:
        run = self.app.active_run
        if run is None:
            return
        result = self.app.guarded("The deliverables were not exported",
                                  run.export_deliverables)
        if result is not None:
            self.query_one("#deliverables-export", Static).update(
                f"exported {len(result.files)} file(s) with manifest.json to {result.folder}")
            self.notify(f"exported to {result.folder}")


__all__ = ["DeliverablesScreen", "open_file", "viewer_command"]
