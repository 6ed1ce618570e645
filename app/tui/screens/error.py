"""ErrorModal: one place where an error is shown — what happened and what to do next."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static


class ErrorModal(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter", "close", "close")]

    def __init__(self, title: str, message: str, hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.message = message
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box", classes="dialog") as box:
            box.border_title = self.title_text
            with VerticalScroll():
                yield Static(self.message, id="error-message", markup=False)
                if self.hint:
                    yield Static(f"→ {self.hint}", id="error-hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close", variant="primary")
        yield Footer(compact=True)

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)
