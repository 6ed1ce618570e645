"""Reusable TUI widgets (each carries its own DEFAULT_CSS)."""

from .budget_bars import BudgetBars
from .unit_grid import UnitGrid

__all__ = ["BudgetBars", "UnitGrid"]
