"""Live progress from the engine's events: several units in flight at once, each with its
step and elapsed time; done of total, calls, tokens, cost and an ETA from recorded durations;
the same snapshot drawn by the CLI's live display."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from keepstep.engine import open_project
from tests.support.engine_harness import RUN, make_small_project


@pytest.fixture
def run_done(tmp_path: Path):
    root = make_small_project(tmp_path / "small")
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        run.run()
        yield run


def test_several_units_in_flight_each_keep_their_step_and_elapsed_time(run_done) -> None:
    """Two claims, progress for each, one commit: the other stays in flight, ticking."""
    now = [100.0]
    tracker = run_done.progress(clock=lambda: now[0], refresh_s=3600)
    tracker.on_event({"kind": "claimed", "unit": "U02", "attempt": "U02/a9"})
    now[0] += 2
    tracker.on_event({"kind": "claimed", "unit": "U03", "attempt": "U03/a9"})
    tracker.on_event({"kind": "progress", "unit": "U02", "step": "extract A2 (2/4)"})
    tracker.on_event({"kind": "heartbeat", "unit": "U03", "progress": "rank round 1/3"})
    now[0] += 5
    snap = tracker.snapshot(read=False)
    assert [(f.unit, f.step, f.elapsed_s) for f in snap.in_flight] == [
        ("U02", "extract A2 (2/4)", 7.0), ("U03", "rank round 1/3", 5.0)]
    tracker.on_event({"kind": "attempt", "unit": "U02", "attempt": "U02/a9",
                      "outcome": "committed"})
    now[0] += 1
    snap = tracker.snapshot(read=False)
    assert [(f.unit, f.elapsed_s) for f in snap.in_flight] == [("U03", 6.0)]
    assert snap.last == "U02/a9 committed" and snap.total == 8


def test_the_snapshot_reads_done_budget_and_an_eta_from_recorded_durations(run_done) -> None:
    """Done of total and the budget come from the store; the ETA is 0 when all is done and
    derived from the recorded attempt durations otherwise."""
    snap = run_done.progress().snapshot(read=True)
    assert snap.done == snap.total == 8 and snap.eta_s == 0.0
    assert snap.calls > 0 and snap.tokens > 0
    tracker = run_done.progress()
    tracker._current.discard("U08")  # as if U08 were still to run
    tracker._durations = {"render": [4.0, 6.0]}
    assert tracker._eta([]) == pytest.approx(5.0)


def test_the_cli_live_display_draws_every_unit_in_flight(run_done) -> None:
    """The rich display names each unit in flight with its title, step and elapsed time."""
    from rich.console import Console

    from keepstep.app.cli.progress import live_table

    now = [0.0]
    tracker = run_done.progress(clock=lambda: now[0], refresh_s=3600)
    for unit in ("U02", "U03"):
        tracker.on_event({"kind": "claimed", "unit": unit, "attempt": f"{unit}/a9"})
    tracker.on_event({"kind": "progress", "unit": "U03", "step": "check round 2/3"})
    now[0] += 75
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(live_table(tracker.snapshot()))
    text = out.getvalue()
    assert "8/8 units" in text and "2 in flight" in text
    assert "▶ U02" in text and "▶ U03" in text and "check round 2/3 · 1 min 15 s" in text


def test_notebook_progress_prints_lines_outside_ipython(run_done, capsys) -> None:
    """Outside Jupyter, live_progress prints one line per finished unit and the end."""
    progress = run_done.live_progress()
    progress({"kind": "claimed", "unit": "U02", "attempt": "U02/a9"})
    progress({"kind": "attempt", "unit": "U02", "attempt": "U02/a9", "outcome": "committed"})
    progress({"kind": "decision", "decision": "done"})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[-1].startswith("8/8 units done") and "done" in lines[-1]
