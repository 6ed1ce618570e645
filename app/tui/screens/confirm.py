"""ConfirmModal: every destructive action asks here first, showing what it would change.

Nothing is written until the person answers yes: ``y`` or the "Yes" button; ``n``, Escape
or "No" (focused at first, so a stray Enter declines) dismisses with False.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static


class ConfirmModal(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "yes", "yes, do it"),
        Binding("n,escape", "no", "no"),
    ]

    def __init__(self, title: str, lines: Iterable[str], *, yes: str = "Yes, do it",
                 no: str = "No") -> None:
        super().__init__()
        self.title_text = title
        self.lines = list(lines)
        self.yes_label, self.no_label = yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="dialog") as box:
            box.border_title = self.title_text
            with VerticalScroll():
                yield Static("\n".join(self.lines), id="confirm-text", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.yes_label, id="yes", variant="error")
                yield Button(self.no_label, id="no", variant="primary")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed, "#yes")
    def action_yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#no")
    def action_no(self) -> None:
        self.dismiss(False)


__all__ = ["ConfirmModal"]
