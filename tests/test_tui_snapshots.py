"""Committed screenshots of the main screens (pytest-textual-snapshot).

Deterministic by construction: a fixed run id, executor id and clock (every commit at the
same instant, so no "n min ago" drifts), a fixed terminal size, and a run stopped at the
audience gate built the same way every time. Update on purpose with
``pytest tests/test_tui_snapshots.py --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tui_support import copy_of, gate_template, make_test_app

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
    """The approval modal for the audience gate: options, reuse/redo, what it binds."""
    assert snap_compare(make_test_app(at_gate), press=["a"], terminal_size=SIZE)


def test_takeover_preview_snapshot(snap_compare, at_gate: Path) -> None:
    """The takeover page with the resume preview highlighted."""
    assert snap_compare(make_test_app(at_gate), press=["t"], terminal_size=SIZE)


def test_dashboard_snapshot_at_80x24_light(snap_compare, at_gate: Path) -> None:
    """The smallest supported terminal, in the light theme."""
    app = make_test_app(at_gate)
    app.theme = "textual-light"
    assert snap_compare(app, terminal_size=(80, 24))
