"""Every destructive action asks first, showing what it would change; declining writes
nothing: revoking a source, removing a unit, discarding plan edits, each takeover action."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from textual.widgets import Input

from keepstep.app.tui.screens import (
    ConfirmModal,
    DashboardScreen,
    PlanBuilderScreen,
    SourcesScreen,
    TakeoverScreen,
)
from keepstep.engine import open_project
from tests.support.db_rows import rows_digest
from tests.support.tui_support import RUN_ID, copy_of, gate_template, make_test_app, screen_text

SIZE = (100, 30)


@pytest.fixture
def at_gate(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    return copy_of(gate_template(tmp_path_factory), tmp_path / "market-entry")


def _disk(root: Path) -> dict[str, str]:
    """Hashes of the project files and the state database's rows (what "nothing written"
    means; the database's bytes may move when its log is checkpointed)."""
    names = ["sources.toml", "plan.toml", "contract.md"]
    out = {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in names}
    out[".keepstep/state.db"] = rows_digest(root / ".keepstep" / "state.db")
    return out


def _events(root: Path) -> int:
    with open_project(root) as project:
        return len(project.get_run(RUN_ID).events())


async def test_revoking_a_source_shows_its_impact_and_declining_writes_nothing(
        at_gate: Path) -> None:
    """d on A1: the modal names what the next resume would invalidate; n keeps sources.toml."""
    before = _disk(at_gate)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        assert isinstance(app.screen, SourcesScreen)
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        text = screen_text(app)
        assert "Revoke source A1?" in app.screen.title_text
        assert "source A1 was removed or revoked" in text and "Invalidated (" in text
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, SourcesScreen)
    assert _disk(at_gate) == before


async def test_removing_a_unit_asks_with_its_dependents(at_gate: Path) -> None:
    """ctrl+r names who depends on the unit; No keeps it; Yes removes it in memory only."""
    before = _disk(at_gate)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        assert isinstance(builder, PlanBuilderScreen)
        await pilot.pause()
        await builder.select_unit("U05")
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        assert "Depends on it: U17" in screen_text(app)
        await pilot.press("n")
        await pilot.pause()
        assert "U05" in builder.plan.unit_map() and not builder.dirty
        await pilot.press("ctrl+r", "y")
        await pilot.pause()
        assert "U05" not in builder.plan.unit_map() and builder.dirty
    assert _disk(at_gate) == before  # nothing saved


async def test_leaving_with_unsaved_edits_asks_and_no_keeps_you_there(at_gate: Path) -> None:
    """Escape with edits asks; No stays on the form with the edit; Yes leaves, file unchanged."""
    before = _disk(at_gate)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        await pilot.pause()
        builder.query_one("#f-title", Input).value = "A changed title"
        await pilot.pause()
        assert builder.dirty
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        assert "Discard your plan edits?" in app.screen.title_text
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is builder and builder.plan.units[0].title == "A changed title"
        await pilot.press("escape", "y")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
    assert _disk(at_gate) == before


@pytest.mark.parametrize("downs, arg", [
    (0, None), (1, "U31 U33"), (2, "U32"), (3, None), (4, None), (5, "U02"),
])
async def test_each_takeover_action_asks_with_its_preview_and_declining_records_nothing(
        at_gate: Path, downs: int, arg: str | None) -> None:
    """resume, narrow, rerun, branch, cancel, expert: ctrl+s shows the preview in a
    confirmation; n records no event and changes no file."""
    before, events = _disk(at_gate), _events(at_gate)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("t", *["down"] * downs)
        takeover = app.screen
        assert isinstance(takeover, TakeoverScreen)
        if arg is not None:
            takeover.query_one("#takeover-arg", Input).value = arg
        takeover.query_one("#takeover-note", Input).value = "a note"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal), takeover.action
        assert "record this decision?" in app.screen.title_text
        assert "Recorded:" in screen_text(app)  # the preview says what would be recorded
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is takeover
    assert _disk(at_gate) == before and _events(at_gate) == events
