"""ApprovalModal: a gate's question, each option with what it reuses, redoes and costs, and
what an approval binds. Dismisses with the chosen option's label, or None for "not now".

The caller records the choice (``Run.approve``) and resumes the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, RadioButton, RadioSet, Static

from keepstep.app.tui.format import bound_text, option_line

if TYPE_CHECKING:
    from keepstep.engine import Gate, PendingApproval


class ApprovalModal(ModalScreen[str | None]):
    BINDINGS = [
        Binding("y", "approve", "approve"),
        Binding("escape,n", "not_now", "not now"),
    ]

    def __init__(self, request: PendingApproval, *, gate: Gate | None = None,
                 preferred: str | None = None) -> None:
        super().__init__()
        self.request = request
        self.gate = gate
        self.options: list[dict[str, Any]] = [o.model_dump() for o in request.options]
        labels = [o.label for o in request.options]
        self.initial = labels.index(preferred) if preferred in labels else 0

    def compose(self) -> ComposeResult:
        with Vertical(id="approval-box", classes="dialog") as box:
            box.border_title = f"Gate: {self.request.gate} · unit {self.request.unit or '?'}"
            yield Static(self.request.question, id="approval-question", markup=False)
            with VerticalScroll(id="approval-options"):
                with RadioSet(id="choices"):
                    for n, option in enumerate(self.options):
                        yield RadioButton(option.get("label", "?"), value=n == self.initial,
                                          id=f"option-{n}")
                yield Static(id="option-detail", markup=False)
            expires = self.gate.expires_days if self.gate is not None else None
            yield Static(f"Binds: {bound_text(self.request.bound_object, expires)}",
                         id="approval-binds", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Approve", id="approve", variant="success")
                yield Button("Not now", id="not-now")

    def on_mount(self) -> None:
        self._show_detail(self.initial)
        self.query_one(RadioSet).focus()

    def _chosen(self) -> int:
        index = self.query_one(RadioSet).pressed_index
        return index if index >= 0 else self.initial

    def _show_detail(self, index: int) -> None:
        lines = []
        for n, option in enumerate(self.options):
            mark = "•" if n == index else " "
            lines.append(f"{mark} {option.get('label', '?')}: {option_line(option)}")
            if option.get("note"):
                lines.append(f"  ↳ {option['note']}")
        self.query_one("#option-detail", Static).update("\n".join(lines))

    @on(RadioSet.Changed)
    def _changed(self, event: RadioSet.Changed) -> None:
        self._show_detail(event.index)

    @on(Button.Pressed, "#approve")
    def action_approve(self) -> None:
        if not self.options:
            self.dismiss("approve")
            return
        self.dismiss(self.options[self._chosen()].get("label"))

    @on(Button.Pressed, "#not-now")
    def action_not_now(self) -> None:
        self.dismiss(None)


__all__ = ["ApprovalModal"]
