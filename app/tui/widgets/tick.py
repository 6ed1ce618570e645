"""Tick: a checkbox that reads correctly — a tick when checked, an empty box when not
(Textual's Checkbox draws a dimmed X either way, which reads as "checked")."""

from __future__ import annotations

from typing import Any

from textual.widgets import Checkbox


class Tick(Checkbox):
    @property
    def _button(self) -> Any:
        self.BUTTON_INNER = "✓" if self.value else " "
        return super()._button


__all__ = ["Tick"]
