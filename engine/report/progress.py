"""Live progress of a run: what every face shows while ``Run.run()`` works.

``ProgressTracker`` is an ``on_event`` callback (pass it, or call it from your own). It keeps
the units in flight — several at once when executors or ``--jobs`` run them side by side —
from the engine's events (``claimed``, ``attempt``, and ``progress``/``heartbeat`` when the
engine sends them), and every ``refresh_s`` it reads the run's leases (the step each unit
last reported), how many units are current and the budget used. ``snapshot()`` returns a
``ProgressSnapshot``: done of total, the units in flight with their step and elapsed time,
calls, tokens, cost and an ETA from recorded attempt durations. It is thread-safe: the
engine's worker calls it, the face reads snapshots from its own thread.

``NotebookProgress`` shows the snapshot in Jupyter (a display refreshed in place) or, outside
IPython, as plain lines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from html import escape
from statistics import fmean
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.timefmt import parse_iso

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run


class InFlight(BaseModel):
    """One unit being worked on now."""

    unit: str
    title: str = ""
    attempt: str = ""
    step: str = ""
    started: float  # on the tracker's clock
    elapsed_s: float = 0.0


class ProgressSnapshot(BaseModel):
    """The run's progress at one instant (``ProgressTracker.snapshot``)."""

    run_id: str
    total: int
    done: int
    in_flight: list[InFlight] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    blocked: list[str] = Field(default_factory=list)
    calls: float = 0.0
    tokens: float = 0.0
    cost: float = 0.0
    eta_s: float | None = None
    elapsed_s: float = 0.0
    last: str = ""  # the newest outcome, in words
    finished: str | None = None  # the decision that ended the run loop (done, blocked…)

    def lines(self) -> list[str]:
        """Plain text: one summary line, then one line per unit in flight."""
        head = (f"{self.done}/{self.total} units done · {len(self.in_flight)} in flight · "
                f"{self.calls:g} calls · {fmt_count(self.tokens)} tokens · ${self.cost:.2f}")
        if self.eta_s is not None and not self.finished:
            head += f" · ETA ~{fmt_duration(self.eta_s)}"
        if self.finished:
            head += f" · {self.finished}"
        out = [head]
        out += [f"  ▶ {f.unit} {f.title[:40]} · {f.step or 'started'} · "
                f"{fmt_duration(f.elapsed_s)}" for f in self.in_flight]
        return out

    def _repr_html_(self) -> str:  # Jupyter
        rows = "".join(
            f"<tr><td>{escape(f.unit)}</td><td>{escape(f.title)}</td>"
            f"<td>{escape(f.step or 'started')}</td><td>{fmt_duration(f.elapsed_s)}</td></tr>"
            for f in self.in_flight) or '<tr><td colspan="4"><i>nothing in flight</i></td></tr>'
        pct = 100.0 * self.done / max(1, self.total)
        eta = "" if self.eta_s is None or self.finished else \
            f" · ETA ~{fmt_duration(self.eta_s)}"
        state = f" · <b>{escape(self.finished)}</b>" if self.finished else ""
        return (
            '<div class="keepstep-progress">'
            f"<p><b>run {escape(self.run_id)}</b>: {self.done}/{self.total} units done{state}"
            f"{eta}<br>{self.calls:g} calls · {fmt_count(self.tokens)} tokens · "
            f"${self.cost:.2f} · {fmt_duration(self.elapsed_s)} elapsed</p>"
            f'<div style="background:#eee;width:320px;height:10px"><div style="background:'
            f'#2da44e;height:10px;width:{pct:.0f}%"></div></div>'
            "<table><tr><th>in flight</th><th>title</th><th>step</th><th>elapsed</th></tr>"
            f"{rows}</table>"
            + (f"<p>{escape(self.last)}</p>" if self.last else "") + "</div>")


def fmt_duration(seconds: float) -> str:
    """'8 s', '3 min 05 s', '2 h 10 min'."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_count(n: float) -> str:
    """'950', '12.3k', '1.2M'."""
    n = float(n)
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return f"{n:g}"


def recorded_durations(run: Run) -> dict[str, list[float]]:
    """unit kind -> seconds taken by each committed attempt of this run (from the attempts'
    start and end times)."""
    kinds = {u.id: u.kind.value for u in run.plan.units}
    out: dict[str, list[float]] = {}
    for a in run.store.attempts(run.run_id):
        if a.status != "committed" or not a.ended_at:
            continue
        start, end = parse_iso(a.started_at), parse_iso(a.ended_at)
        if start is not None and end is not None and end >= start:
            out.setdefault(kinds.get(a.unit, ""), []).append(end - start)
    return out


class ProgressTracker:
    """An ``on_event`` callback that keeps a live ``ProgressSnapshot`` (see the module doc)."""

    def __init__(self, run: Run, *, clock: Callable[[], float] | None = None,
                 refresh_s: float = 1.0) -> None:
        self.run = run
        self.clock = clock or time.monotonic
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._flight: dict[str, InFlight] = {}
        self._started = self.clock()
        self._last_read = float("-inf")  # on time.monotonic: the display clock may stand still
        self._last = ""
        self._finished: str | None = None
        self._failed: set[str] = set()
        self._blocked: set[str] = set()
        self._most_parallel = 1
        plan = run.plan
        self._titles = {u.id: u.title for u in plan.units}
        self._kinds = {u.id: u.kind.value for u in plan.units}
        self._total = len(plan.units)
        try:
            self._durations = recorded_durations(run)
        except Exception:  # a damaged store: no ETA, the run itself reports the problem
            self._durations = {}
        self._done = 0
        self._current: set[str] = set()
        self._used: dict[str, float] = {}
        self._read()

    # -- events (the engine's thread) ------------------------------------------------------
    def __call__(self, event: dict[str, Any]) -> None:
        self.on_event(event)

    def on_event(self, event: dict[str, Any]) -> None:
        kind = str(event.get("kind", ""))
        unit = str(event.get("unit") or "")
        now = self.clock()
        with self._lock:
            if kind == "claimed" and unit:
                self._flight[unit] = InFlight(unit=unit, title=self._titles.get(unit, ""),
                                              attempt=str(event.get("attempt", "")),
                                              step="started", started=now)
                self._most_parallel = max(self._most_parallel, len(self._flight))
            elif kind == "attempt" and unit:
                flight = self._flight.pop(unit, None)
                outcome = str(event.get("outcome", ""))
                if flight is not None and outcome == "committed":
                    self._durations.setdefault(self._kinds.get(unit, ""), []).append(
                        now - flight.started)
                if outcome == "committed":
                    self._current.add(unit)
                    self._done = len(self._current)
                    self._failed.discard(unit)
                    self._blocked.discard(unit)
                elif outcome == "failed":
                    self._failed.add(unit)
                elif outcome == "blocked":
                    self._blocked.add(unit)
                detail = event.get("detail") or ""
                self._last = f"{event.get('attempt', unit)} {outcome}" + (
                    f": {detail}" if detail and outcome != "committed" else "")
            elif kind in ("progress", "heartbeat") and unit in self._flight:
                step = event.get("step") or event.get("progress")
                if step:
                    self._flight[unit].step = str(step)
            elif kind == "decision":
                decision = str(event.get("decision", ""))
                self._finished = None if decision in ("claim", "waiting") else decision

    # -- reads (the face's thread) ---------------------------------------------------------
    def _read(self) -> None:
        """Current units, budget used and each lease's step, from the store."""
        run = self.run
        records = run.facts_records()
        current = {u for u, r in records.items() if r.state.value == "succeeded"
                   and u in self._titles}
        used = dict(run.store.get_budget(run.run_id, run.branch_id).used)
        leases = {lease.unit: lease for lease in run.store.leases(run.run_id, run.branch_id)}
        with self._lock:
            self._current = current
            self._done = len(current)
            self._used = used
            for unit, lease in leases.items():
                flight = self._flight.get(unit)
                if flight is None:  # claimed by another executor or before we started
                    attempt = run.store.get_attempt(run.run_id, lease.attempt_id)
                    started = parse_iso(attempt.started_at) if attempt else None
                    offset = (run.clock() - started) if started is not None else 0.0
                    flight = self._flight[unit] = InFlight(
                        unit=unit, title=self._titles.get(unit, ""), attempt=lease.attempt_id,
                        started=self.clock() - max(0.0, offset))
                if lease.progress and lease.progress != "claimed":
                    flight.step = lease.progress
            for unit in [u for u in self._flight if u not in leases and u in current]:
                del self._flight[unit]
        self._last_read = time.monotonic()

    def _eta(self, in_flight: list[InFlight]) -> float | None:
        remaining = [u for u in self._titles if u not in self._current]
        everything = [d for ds in self._durations.values() for d in ds]
        if not remaining or not everything:
            return None if remaining else 0.0
        # Units of a kind not timed yet would be guessed from other kinds (three quick
        # intake units said "~1 s" for a 36-unit run): no ETA until most are measured.
        unmeasured = [u for u in remaining if not self._durations.get(self._kinds.get(u, ""))]
        if len(unmeasured) * 2 > len(remaining):
            return None
        overall = fmean(everything)
        total = 0.0
        running = {f.unit: f for f in in_flight}
        for unit in remaining:
            ds = self._durations.get(self._kinds.get(unit, ""))
            mean = fmean(ds) if ds else overall
            flight = running.get(unit)
            total += max(0.0, mean - flight.elapsed_s) if flight else mean
        return total / max(1, self._most_parallel)

    def snapshot(self, *, read: bool | None = None) -> ProgressSnapshot:
        """The progress now; re-reads the store when ``refresh_s`` passed (or ``read``)."""
        if read or (read is None and time.monotonic() - self._last_read >= self.refresh_s):
            try:
                self._read()
            except Exception:  # a busy or closing store: show what the events said
                pass
        now = self.clock()
        with self._lock:
            flights = [f.model_copy(update={"elapsed_s": max(0.0, now - f.started)})
                       for f in sorted(self._flight.values(), key=lambda f: f.started)]
            used = dict(self._used)
            return ProgressSnapshot(
                run_id=self.run.run_id, total=self._total, done=self._done,
                in_flight=flights, failed=sorted(self._failed), blocked=sorted(self._blocked),
                calls=used.get("calls", 0.0), tokens=used.get("tokens", 0.0),
                cost=used.get("cost", 0.0), eta_s=self._eta(flights),
                elapsed_s=now - self._started, last=self._last, finished=self._finished)


class NotebookProgress(ProgressTracker):
    """A ProgressTracker that shows itself: in Jupyter a display refreshed in place at most
    every ``every_s`` (and once more when the run loop stops); elsewhere a plain line per
    finished unit. Pass it as ``on_event`` (``Run.live_progress()`` builds one)."""

    def __init__(self, run: Run, *, every_s: float = 0.5, **kwargs: Any) -> None:
        super().__init__(run, **kwargs)
        self.every_s = every_s
        self._shown = float("-inf")
        self._handle: Any = None
        try:
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is not None:
                self._handle = display(self.snapshot(read=True), display_id=True)
        except ImportError:  # no IPython: plain lines
            self._handle = None

    def on_event(self, event: dict[str, Any]) -> None:
        super().on_event(event)
        kind = event.get("kind")
        final = kind == "decision" and event.get("decision") not in ("claim", "waiting")
        if self._handle is None:
            if kind == "attempt" or final:
                print(self.snapshot(read=final).lines()[0], flush=True)
            return
        if final or self.clock() - self._shown >= self.every_s:
            self._handle.update(self.snapshot(read=final))
            self._shown = self.clock()


__all__ = ["InFlight", "NotebookProgress", "ProgressSnapshot", "ProgressTracker",
           "fmt_count", "fmt_duration", "recorded_durations"]
