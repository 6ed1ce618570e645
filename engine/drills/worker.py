"""A bare executor process: ``python -m keepstep.engine.drills.worker DIR --run ID``.

Crash tests, drills and the story start it as a separate process so that a real
SIGKILL (``KEEPSTEP_CRASH_AT``) hits a real executor; it prints the final
RunStatus as JSON on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys

from keepstep.engine.errors import KeepstepError
from keepstep.storage.errors import StorageError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="keepstep-worker")
    ap.add_argument("project")
    ap.add_argument("--run", required=True)
    ap.add_argument("--approve", action="append", default=[], help="gate=choice")
    ap.add_argument("--stop-after", action="append", default=[])
    ap.add_argument("--max-units", type=int)
    ap.add_argument("--executor-id")
    ap.add_argument("--lease-seconds", type=float)
    args = ap.parse_args(argv)
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
                         max_units=args.max_units,
                         on_event=lambda e: print(json.dumps(e, default=str), flush=True))
    except (KeepstepError, StorageError) as exc:  # e.g. SchemaTooNew: a message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"status": status.model_dump(mode="json")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
