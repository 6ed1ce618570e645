"""UnitTable: every unit of the plan by phase — id, state (symbol, word, colour), title and
attempts — one row each, in plan order. The cursor row is the selected unit."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from keepstep.app.tui.format import STATE_STYLES, state_symbol, state_word

COLUMNS = (("phase", "phase"), ("unit", "unit"), ("state", "state"), ("title", "title"),
           ("n", "att"))


class UnitTable(DataTable):
    DEFAULT_CSS = """
    UnitTable { height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False, show_cursor=True)
        self._rows: list[str] = []
        self._states: dict[str, str] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    # -- data ------------------------------------------------------------------------------
    def set_units(self, units: Iterable[tuple[str, str, str, str, int]]) -> None:
        """(id, phase, title, state, attempts) in plan order; keeps the cursor on its unit."""
        rows = list(units)
        ids = [r[0] for r in rows]
        if ids != self._rows:
            selected = self.selected
            self.clear()
            last_phase = None
            for uid, phase, title, state, attempts in rows:
                shown = phase if phase != last_phase else ""
                last_phase = phase
                self.add_row(Text(shown, style="dim"), uid, self._state_cell(state), title,
                             str(attempts or ""), key=uid)
            self._rows = ids
            if selected in ids:
                self.move_cursor(row=ids.index(selected))
        else:
            for uid, _phase, _title, state, attempts in rows:
                if self._states.get(uid) != state:
                    self.update_cell(uid, "state", self._state_cell(state))
                self.update_cell(uid, "n", str(attempts or ""))
        self._states = {r[0]: r[3] for r in rows}

    def set_state(self, unit: str, state: str) -> None:
        if unit in self._rows and self._states.get(unit) != state:
            self._states[unit] = state
            self.update_cell(unit, "state", self._state_cell(state))

    @staticmethod
    def _state_cell(state: str) -> Text:
        return Text(f"{state_symbol(state)} {state_word(state)}", style=STATE_STYLES.get(state,
                                                                                        ""))

    def state_of(self, unit: str) -> str:
        return self._states.get(unit, "pending")

    @property
    def selected(self) -> str | None:
        if not self._rows or self.cursor_row < 0:
            return None
        return self._rows[min(self.cursor_row, len(self._rows) - 1)]

    def select(self, unit: str) -> None:
        if unit in self._rows:
            self.move_cursor(row=self._rows.index(unit))

    def rows_for(self, status: Any) -> list[tuple[str, str, str, str, int]]:
        return [(uid, v.phase, v.title, v.state, v.attempts) for uid, v in status.units.items()]


__all__ = ["UnitTable"]
