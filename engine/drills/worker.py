"""A bare executor process: ``python -m keepstep.engine.drills.worker DIR --run ID``.

Crash tests, drills and the story start it as a separate process so that a real
SIGKILL (``KEEPSTEP_CRASH_AT``) hits a real executor; it prints the final
RunStatus as JSON on its last line.

``--jobs N`` runs up to N units at once (default: keepstep.toml's ``max_parallel``).
SIGINT and SIGTERM stop it the same way: no new claims, every unit in flight stops at its
next safe point (or is cancelled from the scheduler after a short grace), leases are released,
a line on stderr says how to continue, and the exit code is 128 + the signal number. A second
signal quits at once (what was in flight is then an orphan the next resume redoes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from keepstep.engine.errors import KeepstepError, RunCancelled
from keepstep.storage.errors import StorageError


def _install_stop_signals(cancel: threading.Event) -> dict[str, int]:
    """SIGINT and SIGTERM set ``cancel``; a second one exits at once. Returns a box that
    records which signal came first."""
    got: dict[str, int] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if cancel.is_set():
            os._exit(128 + signum)
        got["signal"] = signum
        cancel.set()
        print(f"{signal.Signals(signum).name}: stopping at the next safe point",
              file=sys.stderr, flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="keepstep-worker")
    ap.add_argument("project")
    ap.add_argument("--run", required=True)
    ap.add_argument("--approve", action="append", default=[], help="gate=choice")
    ap.add_argument("--stop-after", action="append", default=[])
    ap.add_argument("--max-units", type=int)
    ap.add_argument("--executor-id")
    ap.add_argument("--lease-seconds", type=float)
    ap.add_argument("--jobs", type=int, help="units in flight at once (default: max_parallel)")
    args = ap.parse_args(argv)
    cancel = threading.Event()
    got = _install_stop_signals(cancel)
    from keepstep.engine.api import open_project

    approve = dict(a.split("=", 1) for a in args.approve)
    policy = {}
    if args.lease_seconds:
        policy = {"lease_seconds": args.lease_seconds,
                  "heartbeat_seconds": max(0.05, args.lease_seconds / 3)}
    try:
        project = open_project(args.project, executor_id=args.executor_id, policy=policy)
        run = project.open_or_start(args.run)
        status = run.run(approve=approve, stop_after=set(args.stop_after),
                         max_units=args.max_units, jobs=args.jobs, cancel=cancel,
                         on_event=lambda e: print(json.dumps(e, default=str), flush=True))
    except RunCancelled:
        signum = got.get("signal", signal.SIGINT)
        print(f"stopped: every unit in flight stopped at a safe point and released its lease; "
              f"continue with `keepstep resume {args.project} --run {args.run}`",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Everything is in the database already; a thread still inside a provider call would
        # hold the interpreter's shutdown for seconds, so leave at once.
        os._exit(128 + signum)
    except (KeepstepError, StorageError) as exc:  # e.g. SchemaTooNew: a message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"status": status.model_dump(mode="json")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
