"""AddSourceModal: a file, an id, a group, a title and kind, and whether to approve it now.

As the file path is typed, the modal shows what keepstep detected in it before anything is
added or approved: the type (PDF, Word, Excel, CSV, PowerPoint, web page, text, Markdown),
pages or sheets or slides, the size and a text preview — or why the file cannot be a source
(no text layer, password, too large, another type, undecodable text) and what to do. The
file is converted in a worker thread, so a large one never blocks the screen; the conversion
is cached, so adding it (and the run after) converts nothing again.

Submitting calls engine.sources.add_source; a problem (duplicate id, missing file, a file
that yields no text…) is shown inside the modal, which stays open to be corrected. Dismisses
with the new SourceEntry, or None when cancelled.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Static

from keepstep.app.tui.format import error_text
from keepstep.app.tui.widgets.tick import Tick
from keepstep.engine.sources import SourceEntry, add_source, inspect_file

if TYPE_CHECKING:
    from textual.timer import Timer

PREVIEW_DELAY_S = 0.4  # after the last keystroke in the path field
PREVIEW_LINES = 6

FIELDS = (  # (input id, label, placeholder)
    ("add-path", "file", "path, relative to the project folder, or absolute"),
    ("add-id", "id", "a new, unique id: letters, digits, _ - ."),
    ("add-group", "group", "its source group, e.g. A"),
    ("add-title", "title", "optional: defaults to the file name"),
    ("add-kind", "kind", "optional: e.g. market report"),
)


class AddSourceModal(ModalScreen[SourceEntry | None]):
    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "add", "save"),
    ]

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.previewed: str = ""  # the path the preview shows
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="add-source-box", classes="dialog") as box:
            box.border_title = "Add a source"
            for field_id, label, placeholder in FIELDS:
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    yield Input(placeholder=placeholder, compact=True, id=field_id)
            with Horizontal(classes="field"):
                yield Label("", classes="field-label")
                yield Tick("approve now", compact=True, id="add-approve")
            yield Static("type a file path to see what it holds", id="add-source-preview",
                         markup=False)
            yield Static(id="add-source-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Add", id="add", variant="primary")
                yield Button("Cancel", id="cancel")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#add-path", Input).focus()

    def _value(self, field_id: str) -> str:
        return self.query_one(f"#{field_id}", Input).value.strip()

    def _path(self) -> Path:
        # Relative to the project, not to wherever the TUI was started: that is what the
        # table shows (sources/…), so it is what a person types.
        path = Path(self._value("add-path")).expanduser()
        return path if path.is_absolute() else self.root / path

    def _show_problem(self, message: str, hint: str = "") -> None:
        error = self.query_one("#add-source-error", Static)
        error.update(message + (f"\n→ {hint}" if hint else ""))
        error.add_class("visible")

    # -- the preview -----------------------------------------------------------------------
    @on(Input.Changed, "#add-path")
    def _path_changed(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(PREVIEW_DELAY_S, self.refresh_preview)

    def refresh_preview(self) -> None:
        """Inspect the file in the path field (in a thread) and show what it holds."""
        raw = self._value("add-path")
        if not raw:
            self.query_one("#add-source-preview", Static).update(
                "type a file path to see what it holds")
            return
        self.query_one("#add-source-preview", Static).update(f"reading {raw} …")
        self._inspect(raw, self._path())

    @work(thread=True, exclusive=True, exit_on_error=False, group="preview")
    def _inspect(self, raw: str, path: Path) -> None:
        """Thread: convert the file; hand the text to show back to the screen."""
        try:
            info = inspect_file(self.root, path)
        except Exception as exc:  # engine refusals and file-system errors alike
            message, hint = error_text(exc)
            text = f"cannot be a source: {message}" + (f"\n→ {hint}" if hint else "")
        else:
            lines = [line for line in info.preview.splitlines() if line.strip()]
            text = "\n".join([f"detected: {info.describe()}", *info.warnings,
                              *(f"  {line}" for line in lines[:PREVIEW_LINES])])
        self.app.call_from_thread(self._show_preview, raw, text)

    def _show_preview(self, raw: str, text: str) -> None:
        if raw != self._value("add-path"):
            return  # the path changed meanwhile: a newer preview is on its way
        self.previewed = raw
        self.query_one("#add-source-preview", Static).update(text)

    @on(Input.Submitted)
    @on(Button.Pressed, "#add")
    def action_add(self) -> None:
        if not self._value("add-path"):
            self._show_problem("give the file to add", "a path such as sources/C1-notes.md")
            self.query_one("#add-path", Input).focus()
            return
        try:
            entry = add_source(self.root, self._path(), source_id=self._value("add-id"),
                               group=self._value("add-group"), title=self._value("add-title"),
                               kind=self._value("add-kind"),
                               approved=self.query_one("#add-approve", Tick).value)
        except Exception as exc:  # engine errors, and the file system refusing the copy
            self._show_problem(*error_text(exc))
            return
        self.dismiss(entry)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["AddSourceModal"]
