"""The TUI's views of what a run produced and did: deliverables (view, open, export), the
DAG by phase, and the effects ledger with settling an unknown outcome from Needs you."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from textual.widgets import Button, Input, Markdown, OptionList

from keepstep.app.tui import make_app
from keepstep.app.tui.screens import (
    DagScreen,
    DeliverablesScreen,
    EffectsScreen,
    FormModal,
    SettleModal,
)
from keepstep.app.tui.screens.deliverables import viewer_command
from keepstep.app.tui.widgets import UnitGrid
from keepstep.engine import open_project
from tests.support.effects_support import blocked_on_unknown_webhook
from tests.support.engine_harness import RUN
from tests.support.tui_support import (
    APP_OPTIONS,
    copy_of,
    gate_template,
    make_test_app,
    screen_text,
    wait_for,
)
from tests.support.webhook_server import WebhookServer

SIZE = (100, 30)


@pytest.fixture
def at_gate(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    return copy_of(gate_template(tmp_path_factory), tmp_path / "market-entry")


async def test_deliverables_lists_shows_and_exports_with_matching_hashes(at_gate: Path) -> None:
    """f lists the current deliverables; the highlighted one is shown; x exports them all
    to deliverables/ME-042 with a manifest whose sha256 match the files."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, DeliverablesScreen)
        text = screen_text(app)
        assert "U32 evidence-table.csv" in text and "matches" in text
        assert "id,source_id" in app.screen.query_one(Markdown).source
        await pilot.press("x")
        await pilot.pause()
        assert "exported 2 file(s)" in screen_text(app)
    folder = at_gate / "deliverables" / "ME-042"
    manifest = json.loads((folder / "manifest.json").read_text())
    for f in manifest["files"]:
        assert hashlib.sha256((folder / f["file"]).read_bytes()).hexdigest() == f["sha256"]
    assert manifest["missing"] == ["U31", "U33", "U36"]


def test_opening_a_deliverable_uses_the_editor_or_the_system_viewer(monkeypatch) -> None:
    """$EDITOR (with its arguments) when set, else the platform's opener."""
    monkeypatch.setenv("EDITOR", "nano -v")
    monkeypatch.delenv("VISUAL", raising=False)
    assert viewer_command(Path("/x/report.md")) == ["nano", "-v", "/x/report.md"]
    assert viewer_command(Path("/x/dag.svg"), editor=False)[-1] == "/x/dag.svg"
    monkeypatch.delenv("EDITOR")
    assert viewer_command(Path("/x/report.md"))[0] in ("xdg-open", "open", "cmd")


async def test_the_dag_draws_units_by_phase_with_their_edges(at_gate: Path) -> None:
    """g shows every unit by phase with its state; the highlighted unit's edges are named."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "down", "down", "down", "g")
        await pilot.pause()
        assert isinstance(app.screen, DagScreen)
        grid = app.screen.query_one(UnitGrid)
        assert grid.selected == "U05" and grid.state_of("U27") == "pending"
        text = screen_text(app)
        assert "needs:   U04 [structure] ✓" in text and "used by: U17 [content]" in text


@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


async def test_needs_you_settles_an_unknown_outcome_by_lookup(tmp_path: Path, server) -> None:
    """Enter on the Needs-you item opens the settle modal; 'Look it up' finds the key at the
    server: the effect is committed and the unit released, recorded as a decision."""
    root, key = blocked_on_unknown_webhook(tmp_path / "small", server.url)
    app = make_app(root, RUN, **APP_OPTIONS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        needs = app.screen.query_one("#needs", OptionList)
        assert "outcome unknown" in str(needs.get_option_at_index(0).prompt)
        needs.focus()
        needs.highlighted = 0
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, SettleModal), what="the modal")
        app.screen.query_one("#lookup", Button).press()
        await wait_for(pilot, lambda: isinstance(app.screen, EffectsScreen), what="settled")
        assert "committed" in screen_text(app)
    with open_project(root) as p:
        row = next(e for e in p.get_run(RUN).effects() if e.key == key)
        assert row.status == "committed"
        [event] = p.get_run(RUN).events(kinds=["decision.effect"])
        assert event.payload["by"] == "lookup"


async def test_settling_by_hand_needs_a_reason_and_records_not_sent(tmp_path: Path,
                                                                    server) -> None:
    """With the server down the lookup cannot tell; 'Not sent' without a reason is refused
    in the modal, with one it is recorded (the effect failed, the unit released)."""
    root, key = blocked_on_unknown_webhook(tmp_path / "small", server.url)
    server.stop()
    app = make_app(root, RUN, **APP_OPTIONS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("l")
        assert isinstance(app.screen, EffectsScreen)
        app.screen.query_one("#effects-table").move_cursor(
            row=list(app.screen.rows).index(key))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, SettleModal), what="the modal")
        modal = app.screen
        modal.query_one("#lookup", Button).press()
        await pilot.pause()
        assert app.screen is modal and "cannot tell" in screen_text(app)
        modal.query_one("#not-sent", Button).press()
        await pilot.pause()
        assert app.screen is modal and "needs a reason" in screen_text(app)
        modal.query_one("#settle-reason", Input).value = "their log shows nothing"
        modal.query_one("#not-sent", Button).press()
        await wait_for(pilot, lambda: isinstance(app.screen, EffectsScreen), what="settled")
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert next(e for e in run.effects() if e.key == key).status == "failed"
        assert "U09" not in run.store.unit_statuses(RUN, "main")


async def test_undoing_an_action_shows_what_it_undoes_and_cancel_records_nothing(
        tmp_path: Path, server) -> None:
    """u on a committed action opens a form with the preview; Cancel leaves it committed."""
    root, key = blocked_on_unknown_webhook(tmp_path / "small", server.url)
    with open_project(root) as p:
        p.get_run(RUN).settle_effect(key, who="t")
    app = make_app(root, RUN, **APP_OPTIONS)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("l")
        app.screen.query_one("#effects-table").move_cursor(
            row=list(app.screen.rows).index(key))
        await pilot.press("u")
        await pilot.pause()
        assert isinstance(app.screen, FormModal)
        assert "ledger entry" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
    assert server.deleted[key] == 0
    with open_project(root) as p:
        assert next(e for e in p.get_run(RUN).effects() if e.key == key).status == "committed"
