"""Reusable TUI widgets (each carries its own DEFAULT_CSS)."""

from keepstep.app.tui.widgets.budget_bars import BudgetBars
from keepstep.app.tui.widgets.unit_grid import UnitGrid

__all__ = ["BudgetBars", "UnitGrid"]
