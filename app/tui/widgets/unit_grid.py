"""UnitGrid: every unit of the plan, one row group per phase, a symbol and colour per state.

Keyboard: arrows move the cursor (left/right within the plan order, up/down by a row);
the mouse selects a unit. ``selected`` is the unit under the cursor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from keepstep.app.tui.format import state_symbol

CELL = 6  # "U01 ✓ "
STATES = ("succeeded", "invalidated", "blocked", "failed", "running", "pending", "cancelled")


class UnitGrid(Widget, can_focus=True):
    DEFAULT_CSS = """
    UnitGrid { height: auto; min-height: 3; padding: 0 1; }
    UnitGrid > .unit-grid--phase { color: $text-muted; }
    UnitGrid > .unit-grid--succeeded { color: $success; }
    UnitGrid > .unit-grid--invalidated { color: $warning; }
    UnitGrid > .unit-grid--blocked { color: $error; text-style: bold; }
    UnitGrid > .unit-grid--failed { color: $error; }
    UnitGrid > .unit-grid--running { color: $accent; text-style: bold; }
    UnitGrid > .unit-grid--pending { color: $text-muted; }
    UnitGrid > .unit-grid--cancelled { color: $text-muted; }
    UnitGrid > .unit-grid--cursor { background: $accent 30%; }
    UnitGrid:focus > .unit-grid--cursor { background: $accent; color: $text; }
    """
    COMPONENT_CLASSES = {"unit-grid--phase", "unit-grid--cursor",
                         *(f"unit-grid--{s}" for s in STATES)}
    BINDINGS = [
        Binding("right", "move(1)", "next", show=False),
        Binding("left", "move(-1)", "previous", show=False),
        Binding("down", "row(1)", "down", show=False),
        Binding("up", "row(-1)", "up", show=False),
    ]

    cursor: reactive[int] = reactive(0)

    @dataclass
    class Selected(Message):
        """The cursor moved to a unit."""

        grid: UnitGrid
        unit: str

        @property
        def control(self) -> UnitGrid:
            return self.grid

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._units: list[tuple[str, str]] = []  # (unit id, phase) in plan order
        self._states: dict[str, str] = {}
        self._hits: list[tuple[int, int, int, int]] = []  # (line, x0, x1, unit index)
        self._rows: list[list[int]] = []  # unit indexes per rendered line

    # -- data ------------------------------------------------------------------------------
    def set_units(self, units: Iterable[tuple[str, str]]) -> None:
        """The plan's units as (id, phase) in plan order; keeps the cursor on the same id."""
        current = self.selected
        self._units = list(units)
        index = next((i for i, (uid, _) in enumerate(self._units) if uid == current), 0)
        self.cursor = min(index, max(0, len(self._units) - 1))
        self.refresh(layout=True)

    def set_states(self, states: Mapping[str, str]) -> None:
        self._states = dict(states)
        self.refresh()

    def set_state(self, unit: str, state: str) -> None:
        self._states[unit] = state
        self.refresh()

    def state_of(self, unit: str) -> str:
        return self._states.get(unit, "pending")

    @property
    def selected(self) -> str | None:
        if not self._units:
            return None
        return self._units[min(self.cursor, len(self._units) - 1)][0]

    def select(self, unit: str) -> None:
        for i, (uid, _) in enumerate(self._units):
            if uid == unit:
                self.cursor = i

    # -- layout ------------------------------------------------------------------------------
    def _phases(self) -> list[tuple[str, list[int]]]:
        out: list[tuple[str, list[int]]] = []
        for i, (_, phase) in enumerate(self._units):
            if not out or out[-1][0] != phase:
                out.append((phase, []))
            out[-1][1].append(i)
        return out

    def _label_width(self) -> int:
        return min(14, max((len(p) for _, p in self._units), default=6) + 1)

    def _layout(self, width: int) -> list[tuple[str, list[int]]]:
        """Lines of (phase label or '', unit indexes) wrapped to ``width``."""
        per_line = max(1, (width - self._label_width()) // CELL)
        lines = []
        for phase, members in self._phases():
            for start in range(0, len(members), per_line):
                lines.append((phase if start == 0 else "", members[start:start + per_line]))
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._layout(width)))

    def render(self) -> Text:
        width = self.content_size.width or 40
        label_w = self._label_width()
        phase_style = self.get_component_rich_style("unit-grid--phase")
        cursor_style = self.get_component_rich_style("unit-grid--cursor")
        text = Text(no_wrap=True, overflow="crop")
        self._hits, self._rows = [], []
        if not self._units:
            return Text("no units in the plan", style=phase_style)
        for n, (phase, members) in enumerate(self._layout(width)):
            if n:
                text.append("\n")
            text.append(f"{phase[:label_w - 1]:<{label_w}}", style=phase_style)
            x = label_w
            for i in members:
                uid = self._units[i][0]
                state = self.state_of(uid)
                style = self.get_component_rich_style(f"unit-grid--{state}") \
                    if state in STATES else Style()
                cell = f"{uid} {state_symbol(state)}"
                if i == self.cursor:
                    style = style + cursor_style
                text.append(cell, style=style)
                text.append(" ")
                self._hits.append((n, x, x + len(cell), i))
                x += len(cell) + 1
            self._rows.append(members)
        return text

    # -- interaction ------------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        if self._units and old != new:
            self.post_message(self.Selected(self, self._units[new][0]))

    def action_move(self, step: int) -> None:
        if self._units:
            self.cursor = max(0, min(len(self._units) - 1, self.cursor + step))

    def action_row(self, step: int) -> None:
        rows = self._rows or [list(range(len(self._units)))]
        for r, members in enumerate(rows):
            if self.cursor in members:
                target = rows[max(0, min(len(rows) - 1, r + step))]
                col = members.index(self.cursor)
                self.cursor = target[min(col, len(target) - 1)]
                return

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        for line, x0, x1, i in self._hits:
            if line == offset.y and x0 <= offset.x < x1:
                self.cursor = i
                return


__all__ = ["UnitGrid"]
