"""The dashboard while a unit runs: the unit in flight with its title, current step and a
ticking elapsed time; counts that say it is running; a next line that does not tell you to
resume what is running; the recent events."""

from __future__ import annotations

import re
from pathlib import Path

from keepstep.app.tui.screens import DashboardScreen
from keepstep.app.tui.widgets import UnitTable
from tests.support.tui_support import (
    FIXED_NOW,
    SlowGateway,
    copy_sample,
    screen_text,
    slow_app,
    wait_for,
)

SIZE = (100, 30)


async def test_the_unit_in_flight_shows_its_title_step_and_ticking_elapsed_time(
        tmp_path: Path) -> None:
    """While U05's model call waits, Now shows U05, its title, the step its lease reports
    and an elapsed time that moves with the clock; the counts say one is running."""
    now = [FIXED_NOW]
    app, release = slow_app(copy_sample(tmp_path / "market-entry"), clock=lambda: now[0])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        await pilot.press("r")
        # Four units start side by side: wait for U05's own line to reach its model call
        # ("model call 1" elsewhere on the screen may be another unit's step).
        await wait_for(pilot, lambda: "● U05 E01 Extract evidence: group A … · model call 1"
                       in screen_text(app), what="U05's step")
        text = screen_text(app)
        assert "● U05 E01 Extract evidence" in text
        assert "● U05 E01 Extract evidence: group A … · model call 1 · 0 s" in text
        # Independent extraction units run side by side (max_parallel 4 by default).
        running = re.search(r"● running (\d+)", text)
        assert running and 1 <= int(running.group(1)) <= 4
        assert "running here: c cancels" in text and "keepstep resume" not in text
        assert dashboard.query_one(UnitTable).state_of("U05") == "running"
        now[0] += 65
        await wait_for(pilot, lambda: "1 min 05 s" in screen_text(app), timeout=10,
                       what="the elapsed time to tick")
        await wait_for(pilot, lambda: "U05/a1 started" in screen_text(app), timeout=30,
                       what="the recent-events tail")
        release.set()
        await pilot.press("c")
        await wait_for(pilot, lambda: not dashboard.running, what="the cancel")


async def test_a_run_driven_elsewhere_shows_in_flight_here_too(tmp_path: Path) -> None:
    """Watching (not running here): the dashboard re-reads the status and shows the unit
    another executor holds, with the step from its lease."""
    import threading

    from keepstep.engine import open_project

    root = copy_sample(tmp_path / "market-entry")
    release, entered, stop = threading.Event(), threading.Event(), threading.Event()
    watcher, _ = slow_app(root)
    with open_project(root, executor_id="other:1:x", policy={"heartbeat_seconds": 0.05},
                      gateway_factory=lambda ledger: SlowGateway(
                          ledger, release, entered, stop.is_set)) as other:
        thread = threading.Thread(target=lambda: other.open_or_start("ME-042").run(
            max_units=5), daemon=True)
        thread.start()
        try:
            assert entered.wait(60)
            async with watcher.run_test(size=SIZE) as pilot:
                await wait_for(pilot, lambda: "● U05" in screen_text(watcher)
                               and "model call 1" in screen_text(watcher), timeout=30,
                               what="the other executor's unit and step")
                assert not watcher.dashboard.running
        finally:
            release.set()
            thread.join(60)
