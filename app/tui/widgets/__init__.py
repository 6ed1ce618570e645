"""Reusable TUI widgets (each carries its own DEFAULT_CSS)."""

from keepstep.app.tui.widgets.budget_bars import BudgetBars
from keepstep.app.tui.widgets.tick import Tick
from keepstep.app.tui.widgets.unit_grid import UnitGrid
from keepstep.app.tui.widgets.unit_table import UnitTable

__all__ = ["BudgetBars", "Tick", "UnitGrid", "UnitTable"]
