"""Effects: the side-effect ledger of the run, and the two decisions a person makes on it.

Enter on an action without a receipt opens ``SettleModal``: look it up by key first (the
adapter may know); when it cannot tell, record "it was sent" (with its reference) or "not
sent" (the next resume sends it again, same key), each with a reason. ``u`` undoes a
committed action (compensation): the form shows what it undoes and the ledger entry it
writes before anything is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from keepstep.app.tui.format import error_text
from keepstep.app.tui.screens.form import FormModal

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import Run
    from keepstep.engine.views import (
        EffectRow,
        SettleResult,  # noqa: F401 - named in a string base
    )

COLUMNS = ("unit", "action", "adapter", "status", "remote id", "needs you", "key")


class SettleModal(ModalScreen["SettleResult | None"]):
    """Settle one unknown outcome: lookup first, then a recorded decision."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+l", "lookup", "look it up"),
    ]

    def __init__(self, run: Run, effect: EffectRow, who: str) -> None:
        super().__init__()
        self.run, self.effect, self.who = run, effect, who

    def compose(self) -> ComposeResult:
        e = self.effect
        with Vertical(id="settle-box", classes="dialog") as box:
            box.border_title = f"Settle: {e.action} of {e.unit}"
            yield Static(f"{e.adapter} · key {e.key}\nstatus {e.status}"
                         + (f" · {e.reason}" if e.reason else "")
                         + "\n\nFirst ask the adapter by key. If it cannot tell, say what "
                         "you know: sent (with its reference) or not sent (the next resume "
                         "sends it again with the same key).", id="settle-text", markup=False)
            with Horizontal(classes="field"):
                yield Label("reference", classes="field-label")
                yield Input(placeholder="remote id / receipt, when it was sent", compact=True,
                            id="settle-ref")
            with Horizontal(classes="field"):
                yield Label("reason", classes="field-label")
                yield Input(placeholder="how you know (recorded)", compact=True,
                            id="settle-reason")
            yield Static(id="form-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Look it up", id="lookup", variant="primary")
                yield Button("It was sent", id="sent", variant="warning")
                yield Button("Not sent", id="not-sent", variant="warning")
                yield Button("Cancel", id="cancel")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#lookup", Button).focus()

    def _say(self, text: str) -> None:
        error = self.query_one("#form-error", Static)
        error.update(text)
        error.add_class("visible")

    def _settle(self, sent: bool | None) -> None:
        reason = self.query_one("#settle-reason", Input).value.strip()
        ref = self.query_one("#settle-ref", Input).value.strip() or None
        try:
            result = self.run.settle_effect(self.effect.key, sent=sent, who=self.who,
                                            reason=reason, reference=ref if sent else None)
        except Exception as exc:  # engine refusals (no reason, not waiting) stay in the modal
            self._say("\n→ ".join(x for x in error_text(exc) if x))
            return
        if result.outcome == "unknown":
            self._say(f"the lookup cannot tell ({result.reason}); say what you know: "
                      "'It was sent' or 'Not sent', with a reason")
            return
        self.dismiss(result)

    @on(Button.Pressed, "#lookup")
    def action_lookup(self) -> None:
        self._settle(None)

    @on(Button.Pressed, "#sent")
    def _sent(self) -> None:
        self._settle(True)

    @on(Button.Pressed, "#not-sent")
    def _not_sent(self) -> None:
        self._settle(False)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class EffectsScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("enter", "settle", "settle", show=True, priority=True),
        Binding("u", "undo", "undo (compensate)"),
    ]

    app: KeepstepApp

    def __init__(self, key: str | None = None) -> None:
        super().__init__()
        self.rows: dict[str, EffectRow] = {}
        self.open_key = key

    def compose(self) -> ComposeResult:
        yield Static(id="effects-title", classes="screen-title", markup=False)
        yield DataTable(id="effects-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="effects-help", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.load()
        self.query_one(DataTable).focus()
        if self.open_key and self.open_key in self.rows:
            self.query_one(DataTable).move_cursor(row=list(self.rows).index(self.open_key))
            self.call_after_refresh(self.action_settle)

    def load(self) -> None:
        run = self.app.active_run
        table = self.query_one(DataTable)
        table.clear()
        rows = (self.app.guarded("Could not read the ledger", run.effects) or []) if run else []
        self.rows = {r.key: r for r in rows}
        for r in rows:
            table.add_row(r.unit, r.action, r.adapter, r.status, r.remote_id or "",
                          "yes" if r.needs_person else "", r.key, key=r.key)
        waiting = sum(1 for r in rows if r.status in ("intent", "unknown"))
        self.query_one("#effects-title", Static).update(
            f"Effects · run {self.app.run_id} · {len(rows)} external action(s), {waiting} "
            "without a receipt")
        self.query_one("#effects-help", Static).update(
            "enter settles an action without a receipt (lookup first) · u undoes a committed "
            "one" if rows else "no external actions recorded")

    def _current(self) -> EffectRow | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.rows.get(str(key))

    def action_settle(self) -> None:
        row, run = self._current(), self.app.active_run
        if row is None or run is None:
            return
        if row.status not in ("intent", "unknown"):
            self.notify(f"{row.key} is {row.status}: nothing to settle (u undoes a committed "
                        "action)")
            return

        def settled(result: Any) -> None:
            if result is not None:
                self.notify(f"{row.unit} {row.action}: settled as {result.outcome} by "
                            f"{result.by}; r resumes")
            self.load()
            self.app.dashboard.refresh_status()

        self.app.push_screen(SettleModal(run, row, self.app.who), settled)

    def action_undo(self) -> None:
        row, run = self._current(), self.app.active_run
        if row is None or run is None:
            return
        preview = self.app.guarded("Could not preview the undo", run.compensation_preview,
                                   row.key)
        if preview is None:
            return
        if preview.problems:
            self.app.show_error("; ".join(preview.problems), title="Cannot undo this action")
            return

        def decided(values: dict[str, str] | None) -> None:
            if values is None:
                self.notify("not undone: nothing was recorded")
                return
            done = self.app.guarded("The undo was not recorded", run.compensate_effect,
                                    row.key, who=self.app.who, reason=values["reason"])
            if done is not None:
                self.notify(f"{row.key} is {done.status}")
            self.load()

        self.app.push_screen(FormModal(
            "Undo an external action", preview.render().splitlines(),
            [("reason", "reason", "why it is undone (recorded)", "")], ok="Undo it",
            check=lambda v: None if v["reason"] else "say why it is undone"), decided)


__all__ = ["EffectsScreen", "SettleModal"]
