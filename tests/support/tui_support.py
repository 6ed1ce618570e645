"""Shared helpers for the TUI tests: copies of the ME-042 pack, and one run stopped at its
audience gate that every TUI test file copies instead of running the engine again.

Time and executor ids are fixed so screens (and snapshots) are the same on every machine:
every commit happens at FIXED_NOW, so "last commit 0 s ago" and "wall 0m" are stable.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_projects" / "market-entry"
RUN_ID = "ME-042"
FIXED_NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
EXECUTOR = "laptop:4121:5e1f"
WHO = "tester (tui)"
APP_OPTIONS: dict[str, Any] = {"clock": lambda: FIXED_NOW, "executor_id": EXECUTOR,
                               "who": WHO, "synchronous": "OFF"}

_TEMPLATES: dict[str, Path] = {}


def copy_sample(dest: Path) -> Path:
    """A fresh copy of the ME-042 pack without any state."""
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns(".keepstep", "handover"))
    return dest


def one_at_a_time(root: Path) -> Path:
    """Set ``max_parallel = 1`` in the pack's keepstep.toml: one unit in flight, so a
    screenshot of a running dashboard is the same every time."""
    config = root / "keepstep.toml"
    lines = config.read_text(encoding="utf-8").splitlines(keepends=True)
    first_table = next(i for i, line in enumerate(lines) if line.startswith("["))
    lines.insert(first_table, "max_parallel = 1\n\n")
    config.write_text("".join(lines), encoding="utf-8")
    return root


def gate_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pack after one offline run that stopped at the audience gate (built once per
    test session, shared by every TUI test module)."""
    if "gate" not in _TEMPLATES:
        from keepstep.engine import open_project

        root = copy_sample(tmp_path_factory.mktemp("me042") / "market-entry")
        with open_project(root, clock=lambda: FIXED_NOW, executor_id=EXECUTOR,
                          synchronous="OFF") as project:
            # One unit at a time: the event log (and so every screenshot) is the same each run.
            status = project.open_or_start(RUN_ID).run(jobs=1)
        assert status.decision == "blocked" and status.pending_approvals, status.reasons
        _TEMPLATES["gate"] = root
    return _TEMPLATES["gate"]


def copy_of(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest


def make_test_app(root: Path, run_id: str | None = RUN_ID) -> Any:
    from keepstep.app.tui import make_app

    return make_app(root, run_id, **APP_OPTIONS)


async def wait_for(pilot: Any, condition: Callable[[], bool], *, timeout: float = 120.0,
                   what: str = "condition") -> None:
    """Let the app run until ``condition()`` holds (the engine worker runs in a thread)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pilot.pause(0.05)
        await asyncio.sleep(0)
    await pilot.pause()  # let a screen that just opened compose before it is read


def screen_text(app: Any) -> str:
    """All text the current screen shows in Static widgets, option lists and tables (for
    assertions)."""
    from textual.widgets import DataTable, OptionList, Static

    parts = [str(w.render()) for w in app.screen.query(Static)]
    for options in app.screen.query(OptionList):
        parts += [str(options.get_option_at_index(i).prompt)
                  for i in range(options.option_count)]
    for table in app.screen.query(DataTable):
        parts += [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]
    return "\n".join(parts)


def gate_project(dest: Path, options: tuple[str, ...] = ("summary", "full report")) -> Path:
    """The `keepstep init` example with a gate on U5 whose options the contract does not
    decide (its audience is not among them): every option is accepted."""
    from typer.testing import CliRunner

    from keepstep.app.cli.main import app

    result = CliRunner().invoke(app, ["init", str(dest)])
    assert result.exit_code == 0, result.output
    opts = ", ".join(f'"{o}"' for o in options)
    with open(dest / "plan.toml", "a", encoding="utf-8") as fh:
        fh.write(f'\n[[gate]]\nid = "depth"\nunit = "U5"\nquestion = "How deep should the '
                 f'findings go?"\noptions = [{opts}]\n')
    return dest


class SlowGateway:
    """The offline model, slowed down: every call waits until ``release`` is set, so a unit
    stays in flight while a test looks at the screen. When the dashboard's cancel Event is
    set (quitting, c) the call stops as a cancellation at a safe point."""

    def __init__(self, ledger: Any, release: Any, entered: Any,
                 cancelled: Callable[[], bool]) -> None:
        from keepstep.engine.gateway.client import ModelGateway

        self.inner = ModelGateway(ledger=ledger)
        self.release, self.entered, self.cancelled = release, entered, cancelled

    def complete(self, ctx: Any, request: Any, **estimates: Any) -> Any:
        from keepstep.engine import RunCancelled

        self.entered.set()
        while not self.release.wait(0.05):
            if self.cancelled():
                raise RunCancelled("cancelled while the model was answering")
        return self.inner.complete(ctx, request, **estimates)


def slow_app(root: Path, *, clock: Callable[[], float] | None = None) -> tuple[Any, Any]:
    """(app, release Event): ME-042 whose model calls wait for ``release``; heartbeats every
    50 ms so each unit's step reaches its lease at once."""
    import threading

    from keepstep.app.tui import make_app

    release, entered = threading.Event(), threading.Event()
    holder: dict[str, Any] = {}

    def cancelled() -> bool:
        app = holder.get("app")
        return app is not None and app.dashboard.cancel_event.is_set()

    options = {**APP_OPTIONS, "policy": {"heartbeat_seconds": 0.05}}
    if clock is not None:
        options["clock"] = clock
    app = make_app(root, RUN_ID, gateway_factory=lambda ledger: SlowGateway(
        ledger, release, entered, cancelled), **options)
    holder["app"] = app
    app.entered = entered
    return app, release
