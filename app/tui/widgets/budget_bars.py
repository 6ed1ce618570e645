"""BudgetBars: used / limit for each limited budget counter, as a bar that fits the width."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.geometry import Size
from textual.widget import Widget

from keepstep.app.tui.format import figure

ORDER = ("calls", "tokens", "cost", "tool_calls", "wall_time_s", "retries", "recoveries",
         "storage_bytes")
LABELS = {"tool_calls": "tools", "wall_time_s": "wall", "recoveries": "recover",
          "storage_bytes": "storage"}
SHOWN = 7  # storage is in the status and the handover; eight rows do not fit 24 lines


class BudgetBars(Widget):
    DEFAULT_CSS = """
    BudgetBars { height: auto; padding: 0 1; }
    BudgetBars > .budget-bars--label { color: $text-muted; }
    BudgetBars > .budget-bars--fill { color: $success; }
    BudgetBars > .budget-bars--high { color: $warning; }
    BudgetBars > .budget-bars--full { color: $error; text-style: bold; }
    BudgetBars > .budget-bars--empty { color: $text-disabled; }
    """
    COMPONENT_CLASSES = {"budget-bars--label", "budget-bars--fill", "budget-bars--high",
                         "budget-bars--full", "budget-bars--empty"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._used: dict[str, float] = {}
        self._limits: dict[str, float] = {}
        self.note = ""

    def set_budget(self, budget: Mapping[str, Mapping[str, float]], note: str = "") -> None:
        """``budget`` is RunStatus.budget: {"used": {...}, "limits": {...}, "left": {...}}."""
        self._used = dict(budget.get("used", {}))
        self._limits = dict(budget.get("limits", {}))
        self.note = note
        self.refresh(layout=True)

    def _keys(self) -> list[str]:
        return [k for k in ORDER if k in self._limits][:SHOWN]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self._keys()) + (1 if self.note else 0))

    def render(self) -> Text:
        width = self.content_size.width or 40
        text = Text(no_wrap=True, overflow="crop")
        keys = self._keys()
        if not keys:
            return Text("no budget limits set", style=self.get_component_rich_style(
                "budget-bars--label"))
        label_style = self.get_component_rich_style("budget-bars--label")
        empty_style = self.get_component_rich_style("budget-bars--empty")
        rows = []
        for k in keys:
            used, limit = self._used.get(k, 0.0), self._limits[k]
            rows.append((LABELS.get(k, k), f"{figure(k, used)} / {figure(k, limit)}", used, limit))
        fig_w = max(len(r[1]) for r in rows)
        for n, (label, figures, used, limit) in enumerate(rows):
            if n:
                text.append("\n")
            text.append(f"{label:<8}", style=label_style)
            text.append(f"{figures:>{fig_w}} ")
            bar_w = max(4, width - 8 - fig_w - 1)
            ratio = 0.0 if limit <= 0 else min(1.0, used / limit)
            filled = round(ratio * bar_w)
            fill = "full" if ratio >= 1.0 else "high" if ratio >= 0.8 else "fill"
            text.append("█" * filled, style=self.get_component_rich_style(f"budget-bars--{fill}"))
            text.append("░" * (bar_w - filled), style=empty_style)
        if self.note:
            text.append("\n" + self.note, style=label_style)
        return text


__all__ = ["BudgetBars"]
