"""PreviewModal: a dry run's lines (what is reused, invalidated and run, at what cost) and a
keep / undo choice. Dismisses with True (keep) or False (undo)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static


class PreviewModal(ModalScreen[bool]):
    BINDINGS = [
        # Escape leaves without doing anything more: the saved file stays as it is.
        Binding("y,enter,escape", "keep", "keep"),
        Binding("u", "undo", "undo"),
    ]

    def __init__(self, title: str, lines: list[str], *, keep: str = "Keep",
                 undo: str = "Undo") -> None:
        super().__init__()
        self.title_text, self.lines = title, lines
        self.keep_label, self.undo_label = keep, undo

    def compose(self) -> ComposeResult:
        with Vertical(id="preview-box", classes="dialog") as box:
            box.border_title = self.title_text
            with VerticalScroll():
                yield Static("\n".join(self.lines), id="preview-text", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.keep_label, id="keep", variant="primary")
                yield Button(self.undo_label, id="undo")
        yield Footer(compact=True)

    @on(Button.Pressed, "#keep")
    def action_keep(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#undo")
    def action_undo(self) -> None:
        self.dismiss(False)


__all__ = ["PreviewModal"]
