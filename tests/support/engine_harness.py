"""Shared helpers for the engine fault tests: projects, worker processes, the call ledger.

A worker runs ``keepstep.engine.drills.worker.main(["DIR", "--run", "ID", ...])`` — the code of
``python -m keepstep.engine.drills.worker`` — in a separate executor process, so a crash point
(``KEEPSTEP_CRASH_AT=name[@n]``) kills a real process with SIGKILL. The process is forked from
the test process's zygote (tests/faults/zygote.py: an interpreter with litellm and the engine
imported once), not started as a new interpreter that imports them again: its own pid, and
signals, crash points and exit codes behave as for ``python -m``. ``run_worker`` waits for
it; ``start_worker`` returns a ``WorkerProcess`` (the part of ``Popen`` the tests use: pid,
poll, send_signal, communicate; for concurrency, SIGSTOP/SIGCONT). The ledger helpers read
the call ledger through the engine API (``open_project(...).run(ID).calls()``), never
through SQL.

``kill_in_call_main`` is a worker whose model call is killed *inside* the provider call
(after the ledger reserved it, before it was settled), which no named crash point reaches;
``run_kill_in_call`` forks it from the zygote, and run as a script this file is that worker:

    python -m tests.support.engine_harness DIR --run ID --kill-in-call K
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.small_project import PACK, make_small_project, write_config

REPO = Path(__file__).resolve().parents[2]
RUN = "R1"
KILLED = -signal.SIGKILL

__all__ = [
    "KILLED", "PACK", "RUN", "StepClock", "WorkerProcess", "WorkerResult", "attempts_by_unit",
    "budget_used", "calls_by_attempt", "copy_pack", "finish", "in_flight_unit",
    "kill_in_call_main", "ledger_ids", "make_small_project", "redone_units",
    "run_kill_in_call", "run_worker", "second_host", "start_kill_in_call", "start_worker",
    "wait_for",
    "worker_env", "write_config",
]


# -- projects ------------------------------------------------------------------------------
def copy_pack(dest: Path) -> Path:
    """A fresh copy of the ME-042 pack (without any state)."""
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep"))
    return dest


def second_host(a: Path, root: Path) -> Path:
    """Project ``a``'s checkout on a second host: its files (no state) under
    ``root/hostB/<a's folder name>``, as a git checkout or a synced folder gives it."""
    b = root / "hostB" / a.name
    shutil.copytree(a, b, ignore=shutil.ignore_patterns(".keepstep"))
    return b


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
    cmd = [str(root), "--run", run_id]
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


_outputs: Path | None = None
_spawned = iter(range(1, 1_000_000_000))


def _output_paths() -> tuple[Path, Path]:
    global _outputs
    if _outputs is None:
        _outputs = Path(tempfile.mkdtemp(prefix="keepstep-workers-"))
        atexit.register(shutil.rmtree, _outputs, ignore_errors=True)
    n = next(_spawned)
    return _outputs / f"worker-{n}.out", _outputs / f"worker-{n}.err"


class WorkerProcess:
    """A worker forked from the zygote, with the part of ``subprocess.Popen`` the tests use
    (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``
    returning its stdout and stderr as text). Output goes to files, read when it has ended."""

    def __init__(self, argv: list[str], env: dict[str, str], *, entry: str | None = None,
                 cwd: Path | None = None) -> None:
        from tests.faults.zygote import shared

        self._zygote = shared()
        self.stdout_path, self.stderr_path = _output_paths()
        self.args = argv
        self.pid = self._zygote.spawn(argv, env=env, stdout=self.stdout_path,
                                      stderr=self.stderr_path, cwd=cwd, entry=entry)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.poll(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._zygote.wait(self.pid, 3600.0 if timeout is None
                                                    else timeout)
            except TimeoutError as exc:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from exc
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the zygote has reaped
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return (self.stdout_path.read_text(encoding="utf-8", errors="replace"),
                self.stderr_path.read_text(encoding="utf-8", errors="replace"))


def run_worker(root: Path, run_id: str = RUN, *args: str, crash_at: str | None = None,
               executor_id: str | None = None, lease_seconds: float | None = None,
               timeout: float = 120) -> WorkerResult:
    """Run one worker process to its end (or its crash point) and parse what it printed."""
    proc = start_worker(root, run_id, *args, crash_at=crash_at, executor_id=executor_id,
                        lease_seconds=lease_seconds)
    return finish(proc, timeout=timeout)


def start_worker(root: Path, run_id: str = RUN, *args: str, crash_at: str | None = None,
                 executor_id: str | None = None,
                 lease_seconds: float | None = None) -> WorkerProcess:
    """Start a worker; its stdout is JSON lines (use ``finish``)."""
    return WorkerProcess(
        _worker_args(root, run_id, executor_id=executor_id, lease_seconds=lease_seconds,
                     args=args), worker_env(crash_at))


def finish(proc: WorkerProcess | subprocess.Popen, timeout: float = 120) -> WorkerResult:
    out, err = proc.communicate(timeout=timeout)
    events, status = parse_output(out)
    assert proc.returncode is not None
    return WorkerResult(proc.returncode, events, status, err)


def start_kill_in_call(root: Path, k: int, run_id: str = RUN) -> WorkerProcess:
    """A worker that SIGKILLs itself inside its k-th provider call (``kill_in_call_main``)."""
    return WorkerProcess([str(root), "--run", run_id, "--kill-in-call", str(k)], worker_env(),
                         entry="kill_in_call", cwd=REPO)


def run_kill_in_call(root: Path, k: int, run_id: str = RUN, timeout: float = 120) -> WorkerResult:
    """A worker killed (SIGKILL, by itself) inside its k-th provider call."""
    return finish(start_kill_in_call(root, k, run_id), timeout=timeout)


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
def kill_in_call_main(argv: list[str]) -> int:
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
    sys.exit(kill_in_call_main(sys.argv[1:]))
