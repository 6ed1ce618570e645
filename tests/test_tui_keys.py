"""Keys: `?` and F1 open the screen's bindings, the footer names the command palette, every
action is in the palette, and a key means one thing on every screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Footer

from keepstep.app.tui import screens
from tests.support.tui_support import copy_of, gate_template, make_test_app

SIZE = (100, 30)

# What each key's description means, in one word: a key must mean the same thing on every
# screen (Enter is the focused or primary button of each screen, so it is left out).
MEANING = {
    "back": "leave", "not now": "leave", "no": "leave", "cancel": "leave", "close": "leave",
    "keep": "accept", "approve highlighted": "accept", "approve": "accept",
    "yes, do it": "accept", "save": "save", "record (asks)": "save", "record": "save",
    "new source": "new", "add unit": "new", "remove unit (asks)": "remove",
    "export all": "export", "export handover": "export", "export bundle": "export",
    "open": "open", "open the SVG": "open", "undo": "undo", "undo (compensate)": "undo",
    "approve/revoke": "choose", "revoke (asks)": "revoke",
}
SCREENS = [getattr(screens, name) for name in screens.__all__]


@pytest.fixture
def at_gate(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    return copy_of(gate_template(tmp_path_factory), tmp_path / "market-entry")


def test_each_key_means_one_thing_on_every_screen() -> None:
    """Across all screens and modals, one key never does two different things: ctrl+r is
    'remove unit' only, confirming a takeover is ctrl+s like every save, Escape and n only
    ever leave, y only ever accepts."""
    meanings: dict[str, set[str]] = {}
    for screen in SCREENS:
        for binding in screen.BINDINGS:
            meaning = MEANING.get(binding.description, binding.description)
            for key in binding.key.split(","):
                # After a save, Escape leaves it saved: nothing more is done.
                leaves = screen is screens.PreviewModal and key == "escape"
                meanings.setdefault(key, set()).add("leave" if leaves else meaning)
    meanings.pop("enter")
    clashes = {k: m for k, m in meanings.items() if len(m) > 1 and not
               (k == "space" and m <= {"choose", "accept"})}
    assert clashes == {}, clashes
    assert meanings["ctrl+r"] == {"remove"} and meanings["ctrl+s"] == {"save"}
    assert meanings["escape"] == {"leave"} and meanings["n"] == {"leave"}
    assert meanings["y"] == {"accept"}


async def test_question_mark_and_f1_open_the_screens_bindings(at_gate: Path) -> None:
    """`?` shows Textual's help panel with the screen's keys; `?` again hides it; F1 too."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert app.screen.query("HelpPanel")
        await pilot.press("question_mark")
        await pilot.pause()
        assert not app.screen.query("HelpPanel")
        await pilot.press("f1")
        await pilot.pause()
        assert app.screen.query("HelpPanel")


async def test_the_footer_names_the_palette_and_the_palette_has_every_action(
        at_gate: Path) -> None:
    """The footer shows the command palette key; the palette's commands include every
    binding of the dashboard, the footer's hidden ones too."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        footer = app.screen.query_one(Footer)
        assert footer.show_command_palette
        names = {c.title for c in app.get_system_commands(app.screen)}
        wanted = {b.description.capitalize() for b in screens.DashboardScreen.BINDINGS
                  if b.action not in ("run", "cancel")}  # only one of the two is active
        assert wanted <= names, wanted - names
        assert {"Plan", "Events", "Effects", "Keys"} <= names


async def test_a_palette_command_runs_the_screens_action(at_gate: Path) -> None:
    """Choosing 'Sources' in the palette opens the sources screen, like `s`."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Sources")
        command.callback()
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.screen, screens.SourcesScreen)


async def test_checkboxes_draw_a_tick_only_when_checked() -> None:
    """'approve now' and 'required final' read correctly: empty unchecked, ✓ checked (not
    Textual's dimmed X either way)."""
    from textual.app import App

    from keepstep.app.tui.widgets import Tick

    class One(App[None]):
        def compose(self):
            yield Tick("approve now", id="tick")

    async with One().run_test() as pilot:
        tick = pilot.app.query_one(Tick)
        assert "X" not in tick._button.plain and tick._button.plain.strip("▐▌ ") == ""
        tick.value = True
        await pilot.pause()
        assert "✓" in tick._button.plain
