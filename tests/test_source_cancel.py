"""Ctrl-C during the conversion of a large source stops the run at the next safe point within
2 s — whether the conversion happens in the run-start source check or inside the extract
unit — leaving no unit running and no lease."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.errors import RunCancelled
from tests.support.small_project import extract_only_units, make_small_project
from tests.support.source_files import write_large_csv

RUN = "R"
BIG_MB = 20  # a CSV converts at ~5-10 MB/s: seconds of work, so the cancel lands inside it


def _big_project(tmp_path: Path) -> tuple[Path, Path]:
    """One extract unit over group A, whose only source is a large CSV."""
    root = make_small_project(tmp_path / "p", per_group=1, groups=("A", "B"),
                              units=extract_only_units(1))
    big = write_large_csv(root / "sources" / "A1-readings.csv", BIG_MB)
    toml = root / "sources.toml"
    toml.write_text(toml.read_text().replace("sources/A1-market-overview.pdf",
                                             "sources/A1-readings.csv"))
    return root, big


def _run_in_thread(run: Any, cancel: threading.Event, on_event) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["status"] = run.run(cancel=cancel, on_event=on_event)
        except BaseException as exc:  # noqa: BLE001 - the test looks at what was raised
            box["error"] = exc

    box["thread"] = threading.Thread(target=target, daemon=True)
    box["thread"].start()
    return box


def _cancel_when(seen: threading.Event, cancel: threading.Event, box: dict[str, Any]) -> float:
    assert seen.wait(120), "the conversion never started"
    time.sleep(0.3)  # well inside a conversion of several seconds
    cancel.set()
    t0 = time.monotonic()
    box["thread"].join(30)
    assert not box["thread"].is_alive()
    return time.monotonic() - t0


def test_cancel_during_the_run_start_conversion_stops_before_any_claim(tmp_path: Path) -> None:
    """The source changed since the run started (now a large CSV): the run-start check
    converts it, a cancel stops that conversion, and no unit is claimed."""
    root, big = _big_project(tmp_path)
    small = root / "sources" / "A1-small.csv"
    small.write_text("Tier,Churn\nBasic,6.2%\n", encoding="utf-8")
    toml = root / "sources.toml"
    toml.write_text(toml.read_text().replace("A1-readings.csv", "A1-small.csv"))
    with open_project(root) as p:
        run = p.start_run(RUN)
    toml.write_text(toml.read_text().replace("A1-small.csv", "A1-readings.csv"))

    seen, cancel = threading.Event(), threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("kind") == "sources.convert" and event.get("source") == "A1":
            seen.set()

    with open_project(root) as p:
        run = p.get_run(RUN)
        box = _run_in_thread(run, cancel, on_event)
        elapsed = _cancel_when(seen, cancel, box)
        assert isinstance(box.get("error"), RunCancelled), box
        assert elapsed < 2.0, elapsed
        assert p.store.attempts(RUN) == [] and p.store.leases(RUN) == []
    assert not list((root / ".keepstep" / "converted").glob("*.tmp"))


def test_cancel_during_a_units_conversion_stops_at_the_next_safe_point(tmp_path: Path) -> None:
    """The unit converts the large source itself (its cached conversion was removed after the
    check): a cancel mid-conversion ends the attempt as cancelled within 2 s, lease released,
    nothing committed for it."""
    root, _ = _big_project(tmp_path)
    with open_project(root) as p:
        p.start_run(RUN)
    cache = root / ".keepstep" / "converted"
    seen, cancel = threading.Event(), threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        if event.get("kind") == "progress" and str(event.get("step", "")).startswith(
                "convert A1"):
            shutil.rmtree(cache)  # the unit must convert the file itself
            seen.set()

    with open_project(root) as p:
        run = p.get_run(RUN)
        box = _run_in_thread(run, cancel, on_event)
        elapsed = _cancel_when(seen, cancel, box)
        assert isinstance(box.get("error"), RunCancelled), box
        assert elapsed < 2.0, elapsed
        attempts = p.store.attempts(RUN)
        assert [(a.unit, a.status) for a in attempts] == [("E01", "cancelled")]
        assert run.calls() == []  # stopped inside the conversion, before any model call
        assert p.store.leases(RUN) == []
        assert p.get_run(RUN).status().units["E01"].state != "running"


@pytest.mark.parametrize("mb", [BIG_MB])
def test_a_large_source_is_converted_once_and_read_from_the_cache(tmp_path: Path,
                                                                  mb: int) -> None:
    """start_run's check converts and caches the large source; the run's own check and the
    unit then read the cached conversion (the cache holds one entry for it)."""
    root, big = _big_project(tmp_path)
    with open_project(root) as p:
        run = p.start_run(RUN)
        cache = root / ".keepstep" / "converted"
        stamp = {f.name: f.stat().st_mtime_ns for f in cache.iterdir()}
        converted: list[str] = []
        status = run.run(max_units=0, on_event=lambda e: converted.append(e.get("source"))
                         if e.get("kind") == "sources.convert" else None)
        assert status is not None and converted == []
        assert {f.name: f.stat().st_mtime_ns for f in cache.iterdir()} == stamp
    assert len([f for f in cache.glob("*.md")]) == 2  # A1 (the CSV) and B1
    assert big.stat().st_size > mb * 1024 * 1024 * 0.9
