"""plan.toml as text: the plan builder's raw view, and what the TUI opens on when plan.toml
is not valid TOML (the cursor on the line the parser stopped at).

ctrl+s writes the text when it parses as TOML (the plan's own problems are then the plan
builder's to show); a text that does not parse is refused with the line and column, and
the file stays as it was. escape leaves (asking first with unsaved edits).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static, TextArea

from keepstep.app.tui.screens.confirm import ConfirmModal
from keepstep.app.tui.screens.error import ErrorModal

_AT = re.compile(r"at line (\d+), column (\d+)")


def toml_error(text: str) -> tuple[str, int, int] | None:
    """(message, line, column) — 1-based — when ``text`` is not TOML, else None."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _AT.search(str(exc))
        line, col = (int(m.group(1)), int(m.group(2))) if m else (1, 1)
        return str(exc), line, col
    return None


class RawPlanScreen(Screen[bool]):
    """plan.toml in a TextArea; dismisses True when it was saved."""

    BINDINGS = [
        Binding("ctrl+s", "save", "save"),
        Binding("escape", "back", "back"),
    ]

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.original = path.read_text(encoding="utf-8")

    def compose(self) -> ComposeResult:
        yield Static(f"plan.toml as text · {self.path}", classes="screen-title", markup=False)
        yield Static(id="raw-problem", markup=False)
        yield TextArea(self.original, language=None, show_line_numbers=True, id="raw-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.check()
        area = self.query_one(TextArea)
        area.focus()
        found = toml_error(area.text)
        if found is not None:
            area.move_cursor((found[1] - 1, max(0, found[2] - 1)))
            area.scroll_cursor_visible(center=True)

    def check(self) -> tuple[str, int, int] | None:
        found = toml_error(self.query_one(TextArea).text)
        shown = self.query_one("#raw-problem", Static)
        if found is None:
            shown.update("✓ plan.toml parses as TOML · ctrl+s saves")
        else:
            shown.update(f"✗ not valid TOML: {found[0]} · fix it here, then ctrl+s")
        shown.set_class(found is not None, "has-problems")
        return found

    @on(TextArea.Changed)
    def _changed(self) -> None:
        self.check()

    @property
    def cursor_line(self) -> int:
        """The cursor's line, 1-based."""
        return self.query_one(TextArea).cursor_location[0] + 1

    def action_save(self) -> None:
        found = self.check()
        if found is not None:
            self.app.push_screen(ErrorModal(
                "plan.toml was not saved", f"not valid TOML: {found[0]}",
                f"fix line {found[1]}, then ctrl+s again (the file is unchanged)"))
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(self.query_one(TextArea).text, encoding="utf-8")
        tmp.replace(self.path)
        self.dismiss(True)

    def action_back(self) -> None:
        if self.query_one(TextArea).text == self.original:
            self.dismiss(False)
            return

        def decided(yes: bool | None) -> None:
            if yes:
                self.dismiss(False)

        self.app.push_screen(ConfirmModal(
            "Discard your edits to plan.toml?",
            ["The text on this page is not saved: plan.toml is unchanged."],
            yes="Discard them", no="Keep editing"), decided)


class PlanRepairApp(App[str]):
    """What `keepstep tui` opens when plan.toml is not TOML at all: the raw view at the
    error line. Saving exits with "reopen" (the CLI then opens the project as usual)."""

    CSS_PATH = "../keepstep.tcss"
    TITLE = "keepstep · repair plan.toml"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def on_mount(self) -> None:
        def done(saved: bool | None) -> None:
            self.exit("reopen" if saved else "")

        self.push_screen(RawPlanScreen(self.path), done)


__all__ = ["PlanRepairApp", "RawPlanScreen", "toml_error"]
