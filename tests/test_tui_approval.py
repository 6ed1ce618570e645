"""The approval modal chooses what is highlighted, shows its own keys and the resume token
once, and records exactly that choice (the event log says so)."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Footer, OptionList

from keepstep.app.tui import make_app
from keepstep.app.tui.screens import ApprovalModal, DashboardScreen
from keepstep.engine import open_project
from tests.support.tui_support import APP_OPTIONS, gate_project, screen_text, wait_for

SIZE = (100, 30)


def _app(root: Path):
    return make_app(root, "R1", **APP_OPTIONS)


async def _at_the_gate(app, pilot) -> ApprovalModal:
    await pilot.pause()
    await pilot.press("r")
    await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal), what="the gate")
    return app.screen


def _decided(root: Path) -> list[str]:
    with open_project(root) as project:
        return [e.payload["choice"] for e in
                project.get_run("R1").events(kinds=["approval.decided"])]


async def test_y_approves_the_highlighted_second_option(tmp_path: Path) -> None:
    """Down to highlight 'full report', then y: 'full report' is recorded, not the first."""
    root = gate_project(tmp_path / "proj")
    app = _app(root)
    async with app.run_test(size=SIZE) as pilot:
        modal = await _at_the_gate(app, pilot)
        assert modal.options[modal.chosen()]["label"] == "summary"
        await pilot.press("down")
        assert modal.options[modal.chosen()]["label"] == "full report"
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen)
                       and not app.dashboard.running, what="the resumed run")
        assert app.dashboard.status.decision == "done"
    assert _decided(root) == ["full report"]


async def test_enter_and_space_choose_the_highlighted_option(tmp_path: Path) -> None:
    """Enter (and Space) on the highlighted option approve that option."""
    for key in ("enter", "space"):
        root = gate_project(tmp_path / key)
        app = _app(root)
        async with app.run_test(size=SIZE) as pilot:
            await _at_the_gate(app, pilot)
            await pilot.press("down", key)
            await wait_for(pilot, lambda app=app: not isinstance(app.screen, ApprovalModal)
                           and not app.dashboard.running, what="the resumed run")
        assert _decided(root) == ["full report"], key


async def test_the_modal_shows_its_own_keys_and_the_token_once(tmp_path: Path) -> None:
    """The modal's footer names y and esc (it covers the dashboard's); the resume token the
    run just issued is shown in the modal, then forgotten (a second opening lacks it)."""
    root = gate_project(tmp_path / "proj")
    app = _app(root)
    async with app.run_test(size=SIZE) as pilot:
        modal = await _at_the_gate(app, pilot)
        footer = modal.query_one(Footer)
        keys = {b.key: b.description for _, b, enabled, *_ in
                modal.active_bindings.values() if enabled and b.show}
        assert keys.get("y") == "approve highlighted" and "not now" in keys.values()
        assert footer.region.y == SIZE[1] - 1  # the bottom row: the dashboard's is hidden
        assert "Resume token (shown once" in screen_text(app) and modal.token
        token = modal.token
        await pilot.press("escape")
        await pilot.press("a")
        again = app.screen
        assert isinstance(again, ApprovalModal) and again.token is None
        assert token not in screen_text(app)
        await pilot.press("escape")
    with open_project(root) as project:  # the token works once, from anywhere
        project.get_run("R1").approve("depth", "summary", who="client", token=token)
    assert _decided(root) == ["summary"]


async def test_the_highlight_cannot_rest_on_a_disabled_option(tmp_path: Path) -> None:
    """With contract.md naming one option, the other is disabled: arrows skip it."""
    root = gate_project(tmp_path / "proj", options=("owners", "investors"))
    app = _app(root)
    async with app.run_test(size=SIZE) as pilot:
        modal = await _at_the_gate(app, pilot)
        options = modal.query_one(OptionList)
        assert options.get_option_at_index(1).disabled
        await pilot.press("down", "down")
        assert modal.options[modal.chosen()]["label"] == "owners"
        assert "not available: needs contract.md's audience changed to 'investors'" in \
            screen_text(app)
        await pilot.press("escape")
