"""FormModal: a few labelled inputs under an explanation — a budget raise, a recovery reset.

Dismisses with {field id: value} on ctrl+s, Enter in the last field or "OK"; None on Escape
or "Cancel". ``check(values)`` may return a problem, shown inside the modal, which then
stays open to be corrected (nothing is recorded until it passes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Static

Field = tuple[str, str, str, str]  # (id, label, placeholder, initial value)


class FormModal(ModalScreen[dict[str, str] | None]):
    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "submit", "record"),
    ]

    def __init__(self, title: str, lines: Iterable[str], fields: Iterable[Field], *,
                 ok: str = "Record", check: Callable[[dict[str, str]], str | None] | None = None
                 ) -> None:
        super().__init__()
        self.title_text, self.lines = title, list(lines)
        self.fields = list(fields)
        self.ok_label = ok
        self.check = check

    def compose(self) -> ComposeResult:
        with Vertical(id="form-box", classes="dialog") as box:
            box.border_title = self.title_text
            yield Static("\n".join(self.lines), id="form-text", markup=False)
            for field_id, label, placeholder, value in self.fields:
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    yield Input(value, placeholder=placeholder, compact=True, id=field_id)
            yield Static(id="form-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.ok_label, id="ok", variant="primary")
                yield Button("Cancel", id="cancel")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.fields:
            self.query_one(f"#{self.fields[0][0]}", Input).focus()

    def values(self) -> dict[str, str]:
        return {f[0]: self.query_one(f"#{f[0]}", Input).value.strip() for f in self.fields}

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def action_submit(self) -> None:
        values = self.values()
        problem = self.check(values) if self.check is not None else None
        if problem:
            error = self.query_one("#form-error", Static)
            error.update(problem)
            error.add_class("visible")
            return
        self.dismiss(values)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["FormModal"]
