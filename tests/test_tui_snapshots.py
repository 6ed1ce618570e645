"""Committed screenshots of the main screens (pytest-textual-snapshot).

Deterministic by construction: a fixed run id, executor id and clock (every commit at the
same instant, so no "n min ago" drifts and an elapsed time of 0 s), a fixed terminal size,
and a run stopped at the audience gate built the same way every time. The running
dashboards hold U05's model call until the app exits (a slow fake model). Update on purpose
with ``pytest tests/test_tui_snapshots.py --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tui_support import (
    copy_of,
    copy_sample,
    gate_template,
    make_test_app,
    one_at_a_time,
    screen_text,
    slow_app,
    wait_for,
)

SIZE = (100, 30)


@pytest.fixture(scope="session")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gate_template(tmp_path_factory)


@pytest.fixture
def at_gate(gate: Path, tmp_path: Path) -> Path:
    return copy_of(gate, tmp_path / "market-entry")


def test_dashboard_snapshot(snap_compare, at_gate: Path) -> None:
    """The dashboard of ME-042 waiting at the audience gate."""
    assert snap_compare(make_test_app(at_gate), terminal_size=SIZE)


def test_approval_modal_snapshot(snap_compare, at_gate: Path) -> None:
    """The approval modal for the audience gate: options (one refused, with why), reuse/redo,
    what it binds, and its own keys."""
    assert snap_compare(make_test_app(at_gate), press=["a"], terminal_size=SIZE)


def test_takeover_preview_snapshot(snap_compare, at_gate: Path) -> None:
    """The takeover page with the resume preview highlighted."""
    assert snap_compare(make_test_app(at_gate), press=["t"], terminal_size=SIZE)


def test_dashboard_snapshot_at_80x24_light(snap_compare, at_gate: Path) -> None:
    """The smallest supported terminal, in the light theme."""
    app = make_test_app(at_gate)
    app.theme = "textual-light"
    assert snap_compare(app, terminal_size=(80, 24))


async def _running(pilot) -> None:
    app = pilot.app
    await pilot.press("r")
    await wait_for(pilot, lambda: "model call 1" in screen_text(app)
                   and "U04/a1 succeeded" in screen_text(app), what="U05 in flight")
    await pilot.pause(1.2)  # one more tick of the timer: the screen is settled


@pytest.mark.parametrize("size", [(100, 30), (160, 45)], ids=["100x30", "160x45"])
def test_dashboard_while_a_unit_runs_snapshot(snap_compare, tmp_path: Path, size) -> None:
    """While U05 runs: it is in flight with its title, step and elapsed time; titles of
    every unit by phase; the counts say one runs; the recent events."""
    app, _release = slow_app(one_at_a_time(copy_sample(tmp_path / "market-entry")))
    assert snap_compare(app, terminal_size=size, run_before=_running)
