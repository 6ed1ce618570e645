"""ApprovalModal: a gate's question, each option with what it reuses, redoes and costs, and
what an approval binds. Dismisses with the chosen option's label, or None for "not now".

The highlighted option is the choice: the arrows move it, and Enter, Space, ``y`` or the
Approve button approve exactly that one. An option the gate would refuse now (it
contradicts contract.md) is shown disabled with the reason, and cannot be highlighted. The
modal shows its own keys (its own footer covers the dashboard's). When this TUI's run just
issued the gate's resume token, it is shown here once. The caller records the choice
(``Run.approve``) and resumes the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, OptionList, Static
from textual.widgets.option_list import Option

from keepstep.app.tui.format import bound_text, option_line

if TYPE_CHECKING:
    from keepstep.engine.plan import Gate
    from keepstep.engine.views import PendingApproval


class ApprovalModal(ModalScreen[str | None]):
    BINDINGS = [
        Binding("y", "approve", "approve highlighted"),
        Binding("space", "approve", "approve", show=False),
        Binding("escape,n", "not_now", "not now"),
    ]

    def __init__(self, request: PendingApproval, *, gate: Gate | None = None,
                 preferred: str | None = None, token: str | None = None) -> None:
        super().__init__()
        self.request = request
        self.gate = gate
        self.token = token
        self.options: list[dict[str, Any]] = [o.model_dump() for o in request.options]
        labels = [o["label"] for o in self.options]
        usable = [i for i, o in enumerate(self.options) if o.get("available", True)]
        start = labels.index(preferred) if preferred in labels else 0
        self.initial = start if start in usable else (usable[0] if usable else 0)

    def compose(self) -> ComposeResult:
        with Vertical(id="approval-box", classes="dialog") as box:
            box.border_title = f"Gate: {self.request.gate} · unit {self.request.unit or '?'}"
            yield Static(self.request.question, id="approval-question", markup=False)
            yield OptionList(*(self._option(n, o) for n, o in enumerate(self.options)),
                             id="approval-options")
            expires = self.gate.expires_days if self.gate is not None else None
            bindings = getattr(self.request, "bindings", [])
            yield Static(f"Binds: {bound_text(self.request.bound_object, expires, bindings)}",
                         id="approval-binds", markup=False)
            if self.token:
                yield Static(f"Resume token (shown once; lets someone without this project "
                             f"answer with `keepstep approve --token`): {self.token}",
                             id="approval-token", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Approve highlighted", id="approve", variant="success")
                yield Button("Not now", id="not-now")
        yield Footer(compact=True)

    @staticmethod
    def _option(n: int, option: dict[str, Any]) -> Option:
        label = str(option.get("label", "?"))
        text = Text(label, style="bold")
        if option.get("available", True):
            text.append(f"\n  {option_line(option)}")
            if option.get("note"):
                text.append(f"\n  ↳ {option['note']}", style="dim")
        else:
            text.append(f"\n  not available: {option.get('note') or 'the gate refuses it'}",
                        style="italic")
        return Option(text, id=f"option-{n}", disabled=not option.get("available", True))

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = self.initial
        options.focus()

    def chosen(self) -> int | None:
        """The highlighted option's index (the one Enter, Space or y approves)."""
        index = self.query_one(OptionList).highlighted
        if index is None or not self.options[index].get("available", True):
            return None
        return index

    @on(OptionList.OptionSelected, "#approval-options")
    @on(Button.Pressed, "#approve")
    def action_approve(self) -> None:
        if not self.options:
            self.dismiss("approve")
            return
        index = self.chosen()
        if index is None:
            self.notify("that option is not available now (see why under it)",
                        severity="warning")
            return
        self.dismiss(self.options[index].get("label"))

    @on(Button.Pressed, "#not-now")
    def action_not_now(self) -> None:
        self.dismiss(None)


__all__ = ["ApprovalModal"]
