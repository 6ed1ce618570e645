"""Progress of ``keepstep run`` / ``resume`` while the engine works.

On a terminal: a live rich display — units done of total with a bar, every unit in flight
(several at once when executors or jobs run side by side) with its current step and a
ticking elapsed time, calls, tokens, cost and an ETA from recorded attempt durations — with
each finished attempt printed above it. Not a terminal (a pipe, a CI log) or ``--json``:
plain timestamped lines, one per event that matters (a unit's step in words, not raw fields;
no recovery lines when there was nothing to recover), on stderr with ``--json`` so stdout
stays one JSON document.
``--quiet``: nothing. All of it is driven by the engine's ``on_event`` callbacks through the
engine's ``ProgressTracker``; the worker thread only queues, the main thread draws.
"""

from __future__ import annotations

import queue
import sys
import time
from typing import TYPE_CHECKING, Any

import typer

from keepstep.app.cli import output as out

if TYPE_CHECKING:
    from keepstep.engine import Run
    from keepstep.engine.views import ProgressSnapshot


class QuietDisplay:
    """No progress; messages for the person still go to stderr."""

    def __enter__(self) -> QuietDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def on_event(self, event: dict[str, Any]) -> None:
        return None

    def tick(self) -> None:
        return None

    def say(self, text: str) -> None:
        typer.echo(text, err=True)


class LineDisplay(QuietDisplay):
    """One plain line per event (the unit's outcome with done-of-total when known)."""

    def __init__(self, run: Run | None, *, err: bool) -> None:
        self.err = err
        self.sym = out.symbols(sys.stderr if err else sys.stdout)
        self.tracker = run.progress() if run is not None else None
        self.root = run.project.root if run is not None else None
        self.steps: dict[str, str] = {}

    def on_event(self, event: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.on_event(event)
        line = self._line(event)
        if line is None:
            return
        if self.tracker is not None and event.get("kind") == "attempt":
            snap = self.tracker.snapshot(read=False)
            line += f"  [{snap.done}/{snap.total} done]"
        if self.root is not None:
            line = out.commands_for(line, self.root)
        # A log line says when: CI logs and `| tee` keep no clock of their own.
        typer.echo(f"{time.strftime('%H:%M:%S')} {line}", err=self.err)

    def _line(self, event: dict[str, Any]) -> str | None:
        """Readable words for the events a log reader cares about; None for the rest."""
        kind = str(event.get("kind", ""))
        if kind == "progress":
            unit, step = str(event.get("unit", "")), str(event.get("step", ""))
            if not step or self.steps.get(unit) == step:
                return None
            self.steps[unit] = step
            return f"  {unit} · {step}"
        if kind.startswith("recovery."):
            # A recovery that found nothing to recover (every first run) is not news.
            if kind != "recovery.done" or not event.get("did_work"):
                return None
            reused = event.get("reused")
            return f"  recovery done: {reused} unit(s) reused" if reused is not None else \
                "  recovery done"
        return out.progress_line(event, self.sym)


class LiveDisplay(QuietDisplay):
    """The rich live display (a terminal only)."""

    def __init__(self, run: Run) -> None:
        from rich.console import Console

        self.run = run
        self.tracker = run.progress(clock=None)
        self.console = Console(highlight=False)
        self.sym = out.symbols()
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.live: Any = None

    def __enter__(self) -> LiveDisplay:
        from rich.live import Live

        self.live = Live(self.render(), console=self.console, refresh_per_second=4,
                         transient=True, redirect_stdout=False, redirect_stderr=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._flush()
        if self.live is not None:
            self.live.__exit__(None, None, None)
        snap = self.tracker.snapshot(read=True)
        self.console.print(snap.lines()[0], highlight=False)

    def on_event(self, event: dict[str, Any]) -> None:  # the engine's thread: queue only
        self.tracker.on_event(event)
        if event.get("kind") in ("attempt",) or str(event.get("kind", "")).startswith(
                "recovery.") and event.get("kind") != "recovery.audited":
            line = out.progress_line(event, self.sym)
            if line:
                self.lines.put(line)

    def say(self, text: str) -> None:
        self.lines.put(text)

    def _flush(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if self.live is not None:
                self.live.console.print(line, highlight=False, markup=False)

    def tick(self) -> None:
        self._flush()
        if self.live is not None:
            self.live.update(self.render())

    def render(self) -> Any:
        return live_table(self.tracker.snapshot())


def live_table(snap: ProgressSnapshot) -> Any:
    """The live display of one snapshot (a rich renderable): the bar with the figures, then
    one line per unit in flight."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    from keepstep.engine.views import fmt_count, fmt_duration

    head = Table.grid(padding=(0, 1))
    head.add_column()
    head.add_column()
    figures = (f"{len(snap.in_flight)} in flight · {snap.calls:g} calls · "
               f"{fmt_count(snap.tokens)} tokens · ${snap.cost:.2f} · "
               f"{fmt_duration(snap.elapsed_s)}")
    if snap.eta_s:
        figures += f" · ETA ~{fmt_duration(snap.eta_s)}"
    head.add_row(ProgressBar(total=max(1, snap.total), completed=snap.done, width=30),
                 Text.assemble((f"{snap.done}/{snap.total} units", "bold"), " · ", figures))
    rows: list[Any] = [head]
    for f in snap.in_flight:
        rows.append(Text.assemble(("  ▶ ", "cyan"), (f.unit, "cyan bold"),
                                  f" {f.title[:56]} · {f.step or 'started'} · "
                                  f"{fmt_duration(f.elapsed_s)}"))
    if snap.failed:
        rows.append(Text(f"  ✗ failed: {', '.join(snap.failed)}", style="red"))
    if snap.blocked:
        rows.append(Text(f"  ◼ blocked: {', '.join(snap.blocked)}", style="yellow"))
    return Group(*rows)


def progress_display(run: Run | None, *, quiet: bool, as_json: bool) -> QuietDisplay:
    """The display for this terminal and these options (see the module doc)."""
    if quiet:
        return QuietDisplay()
    if as_json or run is None or not sys.stdout.isatty():
        return LineDisplay(run, err=as_json)
    return LiveDisplay(run)


__all__ = ["LineDisplay", "LiveDisplay", "QuietDisplay", "live_table", "progress_display"]
