"""What one trivial unit costs the store, and whether resume grows with history (issue 24).

1. Per unit: a plan of ``--units`` independent trivial units (no model: stage one small file,
   verify, commit), run in-process at --jobs 1 after recovery. Counted over the units after
   the first ``--warm`` ones: write transactions (durable and not), durable syncs (a durable
   SQLite commit syncs the WAL once at synchronous=FULL; plus every ``os.fsync``), and the
   wall time per unit. Goals: ≤ 2 write transactions and ≤ 2.5 durable syncs per unit.
   The same counts are taken for one failing unit (its ending is one ``end_attempt``).
2. History (``--skip-history`` to leave it out): start → first claim of a fresh worker
   process after ``--short`` and ``--long`` checkpoints of synthetic history (bench/parallel.py's
   resume measurement, which uses bench/recovery.py's history). Goal: long/short ≤ 1.2.

    python bench/seam.py [--units 300] [--warm 20] [--short 1000] [--long 20000]
                         [--repeat 3] [--skip-history]

Not a test: figures vary by machine; counts per unit do not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

from parallel import RUN, resume_ratio, trivial_kind, wide_plan  # noqa: E402

from keepstep.storage.sqlite.connection import SQLiteBase  # noqa: E402

COUNTS: Counter[str] = Counter()


def _install_counters() -> None:
    """Count write transactions (by durability) and fsyncs, process-wide."""
    write = SQLiteBase._write

    @contextlib.contextmanager
    def counted(self: SQLiteBase, *, durable: bool = True) -> Iterator[Any]:
        COUNTS["write_txn"] += 1
        synced = durable and self._synchronous.upper() not in ("OFF",)
        COUNTS["durable_txn" if synced else "relaxed_txn"] += 1
        with write(self, durable=durable) as db:
            yield db

    SQLiteBase._write = counted  # type: ignore[method-assign]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        COUNTS["fsync"] += 1
        real_fsync(fd)

    os.fsync = fsync


def per_unit(tmp: Path, n: int, warm: int) -> list[str]:
    from keepstep.engine.api import open_project
    from keepstep.engine.kinds.context import REGISTRY
    from keepstep.engine.run.loop import RunLoop

    root = tmp / f"wide-{n}"
    wide_plan(root, n)
    spec, real = REGISTRY["notes"]
    REGISTRY["notes"] = (spec, trivial_kind)
    lines = []
    try:
        with open_project(root) as p:
            run = p.start_run(RUN)
            run.recover()
            RunLoop(run, jobs=1, max_units=warm).loop()
            COUNTS.clear()
            measured = n - warm - 1
            t0 = time.perf_counter()
            RunLoop(run, jobs=1, max_units=measured).loop()
            wall = time.perf_counter() - t0
            c = dict(COUNTS)
            syncs = c.get("durable_txn", 0) + c.get("fsync", 0)
            lines.append(f"  {measured} trivial units at --jobs 1 (plan of {n}): per unit "
                         f"{c.get('write_txn', 0) / measured:.2f} write transactions "
                         f"({c.get('durable_txn', 0) / measured:.2f} durable, "
                         f"{c.get('relaxed_txn', 0) / measured:.2f} relaxed), "
                         f"{syncs / measured:.2f} durable syncs "
                         f"({c.get('durable_txn', 0) / measured:.2f} SQLite + "
                         f"{c.get('fsync', 0) / measured:.2f} file fsyncs), "
                         f"{wall / measured * 1000:.2f} ms")
            wt_ok = c.get("write_txn", 0) / measured <= 2
            syncs_ok = syncs / measured <= 2.5
            lines.append(f"  goals: ≤ 2 write transactions per unit: "
                         f"{'met' if wt_ok else 'NOT met'}; ≤ 2.5 durable syncs: "
                         f"{'met' if syncs_ok else 'NOT met'}")

            def failing(ctx: Any) -> Any:
                raise ValueError("a bug in the kind")

            REGISTRY["notes"] = (spec, failing)
            COUNTS.clear()
            RunLoop(run, jobs=1, max_units=1).loop()
            c = dict(COUNTS)
            lines.append(f"  one failing unit (claim, fail, ending): {c.get('write_txn', 0)} "
                         f"write transactions, {c.get('durable_txn', 0) + c.get('fsync', 0)} "
                         "durable syncs")
    finally:
        REGISTRY["notes"] = (spec, real)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=300)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--short", type=int, default=1000)
    ap.add_argument("--long", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-history", action="store_true")
    args = ap.parse_args(argv)
    _install_counters()
    print("keepstep seam bench — load " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory(prefix="keepstep-seam-") as tmp_name:
        tmp = Path(tmp_name)
        print("\n1. store work per trivial unit")
        for line in per_unit(tmp, args.units, args.warm):
            print(line)
        if not args.skip_history:
            print(f"\n2. resume: start → first claim after {args.short:,} and {args.long:,} "
                  "checkpoints")
            for line in resume_ratio(tmp, args.short, args.long, args.repeat):
                print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
