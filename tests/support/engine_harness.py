"""Shared helpers for the engine fault tests: projects, worker processes, the call ledger.

A worker is ``python -m keepstep.engine.drills.worker DIR --run ID ...``: a separate executor
process, so a crash point (``KEEPSTEP_CRASH_AT=name[@n]``) kills a real process with
SIGKILL. ``run_worker`` waits for it; ``start_worker`` returns the Popen (for concurrency,
SIGSTOP/SIGCONT). The ledger helpers read the call ledger through the engine API
(``open_project(...).run(ID).calls()``), never through SQL.

Run as a script, this file is a worker whose model call is killed *inside* the provider
call (after the ledger reserved it, before it was settled), which no named crash point
reaches:

    python -m tests.support.engine_harness DIR --run ID --kill-in-call K
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.small_project import PACK, make_small_project, write_config

REPO = Path(__file__).resolve().parents[2]
RUN = "R1"
WORKER = [sys.executable, "-m", "keepstep.engine.drills.worker"]
KILLED = -signal.SIGKILL

__all__ = [
    "KILLED", "PACK", "RUN", "StepClock", "WorkerResult", "attempts_by_unit", "budget_used",
    "calls_by_attempt", "copy_pack", "finish", "in_flight_unit", "ledger_ids",
    "make_small_project", "redone_units", "run_kill_in_call", "run_worker", "start_worker",
    "wait_for", "worker_env", "write_config",
]


# -- projects ------------------------------------------------------------------------------
def copy_pack(dest: Path) -> Path:
    """A fresh copy of the ME-042 pack (without any state)."""
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep"))
    return dest


# -- worker processes --------------------------------------------------------------------------
@dataclass
class WorkerResult:
    returncode: int
    events: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] | None = None
    stderr: str = ""

    @property
    def killed(self) -> bool:
        return self.returncode == KILLED

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]


def worker_env(crash_at: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KEEPSTEP_CRASH_AT", None)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if crash_at:
        env["KEEPSTEP_CRASH_AT"] = crash_at
    env.update(extra)
    return env


def _worker_args(root: Path, run_id: str, *, executor_id: str | None,
                 lease_seconds: float | None, args: Iterable[str]) -> list[str]:
    cmd = [*WORKER, str(root), "--run", run_id]
    if executor_id:
        cmd += ["--executor-id", executor_id]
    if lease_seconds:
        cmd += ["--lease-seconds", str(lease_seconds)]
    return cmd + list(args)


def parse_output(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(events, final status) from a worker's stdout; a killed worker has no status."""
    events, status = [], None
    for line in stdout.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and set(doc) == {"status"}:
            status = doc["status"]
        elif isinstance(doc, dict):
            events.append(doc)
    return events, status


def run_worker(root: Path, run_id: str = RUN, *args: str, crash_at: str | None = None,
               executor_id: str | None = None, lease_seconds: float | None = None,
               timeout: float = 120) -> WorkerResult:
    """Run one worker process to its end (or its crash point) and parse what it printed."""
    proc = subprocess.run(
        _worker_args(root, run_id, executor_id=executor_id, lease_seconds=lease_seconds,
                     args=args),
        env=worker_env(crash_at), capture_output=True, text=True, timeout=timeout,
    )
    events, status = parse_output(proc.stdout)
    return WorkerResult(proc.returncode, events, status, proc.stderr)


def start_worker(root: Path, run_id: str = RUN, *args: str, crash_at: str | None = None,
                 executor_id: str | None = None,
                 lease_seconds: float | None = None) -> subprocess.Popen:
    """Start a worker; stdout is a pipe of JSON lines (use ``finish``)."""
    return subprocess.Popen(
        _worker_args(root, run_id, executor_id=executor_id, lease_seconds=lease_seconds,
                     args=args),
        env=worker_env(crash_at), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> WorkerResult:
    out, err = proc.communicate(timeout=timeout)
    events, status = parse_output(out)
    return WorkerResult(proc.returncode, events, status, err)


def run_kill_in_call(root: Path, k: int, run_id: str = RUN, timeout: float = 120) -> WorkerResult:
    """A worker killed (SIGKILL, by itself) inside its k-th provider call."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.engine_harness", str(root), "--run", run_id,
         "--kill-in-call", str(k)],
        env=worker_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    events, status = parse_output(proc.stdout)
    return WorkerResult(proc.returncode, events, status, proc.stderr)


def in_flight_unit(result: WorkerResult) -> str:
    """The unit a killed worker was executing: its last claim without a reported attempt."""
    claimed = result.kinds("claimed")
    assert claimed, f"the worker claimed nothing: {result.stderr[-2000:]}"
    return claimed[-1]["unit"]


def wait_for(predicate: Any, timeout: float = 60, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


# -- time ---------------------------------------------------------------------------------------
class StepClock:
    """An injected clock: every reading moves time on by ``step``; ``advance`` jumps."""

    def __init__(self, start: float = 1_900_000_000.0, step: float = 0.0) -> None:
        self.now = start
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


# -- the call ledger and attempts, through the engine API ---------------------------------
def _with_run(root: Path, run_id: str, fn: Any) -> Any:
    from keepstep.engine.api import open_project

    with open_project(root) as project:
        return fn(project.get_run(run_id))


def calls_by_attempt(root: Path, run_id: str = RUN) -> dict[str, dict[str, list[Any]]]:
    """unit -> attempt id -> its ModelCall rows (reserved and settled)."""
    def read(run: Any) -> dict[str, dict[str, list[Any]]]:
        out: dict[str, dict[str, list[Any]]] = {}
        for c in run.calls():
            out.setdefault(c.unit, {}).setdefault(c.attempt_id, []).append(c)
        return out

    return _with_run(root, run_id, read)


def ledger_ids(ledger: dict[str, dict[str, list[Any]]]) -> dict[str, set[str]]:
    """unit -> the call ids it has in the ledger."""
    return {u: {c.call_id for cs in atts.values() for c in cs} for u, atts in ledger.items()}


def redone_units(ledger: dict[str, dict[str, list[Any]]]) -> set[str]:
    """Units whose model calls span more than one attempt (executed more than once)."""
    return {u for u, atts in ledger.items() if len(atts) > 1}


def attempts_by_unit(root: Path, run_id: str = RUN) -> dict[str, list[Any]]:
    def read(run: Any) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for a in run.store.attempts(run.run_id):
            out.setdefault(a.unit, []).append(a)
        return out

    return _with_run(root, run_id, read)


def budget_used(root: Path, run_id: str = RUN) -> dict[str, float]:
    return _with_run(root, run_id, lambda run: dict(run.store.get_budget(run.run_id).used))


# -- script mode: killed inside the provider call ----------------------------------------------
def _kill_in_call_main(argv: list[str]) -> int:
    import argparse

    from keepstep.engine.api import open_project
    from keepstep.engine.gateway.client import ModelGateway, _litellm

    ap = argparse.ArgumentParser()
    ap.add_argument("project")
    ap.add_argument("--run", required=True)
    ap.add_argument("--kill-in-call", type=int, required=True)
    args = ap.parse_args(argv)
    seen = {"n": 0}

    def completion(**kwargs: Any) -> Any:
        seen["n"] += 1
        if seen["n"] >= args.kill_in_call:
            os.kill(os.getpid(), signal.SIGKILL)
        return _litellm().completion(**kwargs)

    project = open_project(args.project, gateway_factory=lambda ledger: ModelGateway(
        ledger=ledger, completion_fn=completion))
    run = project.open_or_start(args.run)
    status = run.run(on_event=lambda e: print(json.dumps(e, default=str), flush=True))
    print(json.dumps({"status": status.model_dump(mode="json")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_kill_in_call_main(sys.argv[1:]))
