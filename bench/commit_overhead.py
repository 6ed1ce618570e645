"""What keepstep's commit protocol costs per unit, against the raw durable primitives it needs.

The protocol for one unit is two SQLite transactions (claim, commit) and one durable file,
so the baseline is ``2 × txn + 1 × file`` (each raw: a synced transaction; write +
fsync(file) + fsync(dir)). keepstep does less than that baseline: its claim is not synced on
its own (the commit syncs the log with it) and a staged file is renamed into place and then
fsynced once, with no folder fsync (storage/artifacts.py says why) — 2 syncs per unit. Both
sides run interleaved, iteration by iteration, in one temporary directory on the same disk.

As the engine does at run start, the run's unit folders are created once
(``ArtifactStore.prepare_units``) before the loop; that one-off cost is printed
separately, and per unit. Each timed keepstep unit still creates its attempt folder.

    python bench/commit_overhead.py [--n 200] [--size 20480] [--dir PATH]
    python bench/commit_overhead.py --syncs [--n 200]   # disk syncs per unit (needs strace)

Not a test: it prints figures and a ratio against the goal (keepstep ≤ 1.5 × baseline).
``--syncs`` counts fsync + fdatasync system calls (strace -c) of N units of two shapes:
a unit with no model call, and one with a model call (reserve, response file, settle),
both committed as the engine does (usage and the current pointer in the commit).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from keepstep.storage import SQLiteStore

GOAL = 1.5
RUN = "BENCH"


def raw_transaction(path: Path) -> Callable[[int], None]:
    """One BEGIN IMMEDIATE … INSERT … COMMIT on a plain WAL, synchronous=FULL connection."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")

    def step(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", [f"row {i}"])
        conn.execute("COMMIT")

    return step


def raw_durable_file(directory: Path, payload: bytes) -> Callable[[int], None]:
    """Write a new file, fsync it, fsync its directory."""
    directory.mkdir(parents=True, exist_ok=True)

    def step(i: int) -> None:
        with open(directory / f"f{i}.bin", "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    return step


def keepstep_unit(store: SQLiteStore, payload: bytes, phases: dict[str, list[float]],
                  units: int) -> tuple[Callable[[int], None], float]:
    """claim → stage one artifact → commit_checkpoint, as the engine does for one unit.

    Also returns the seconds ``prepare_units`` took for all ``units`` (run start).
    """
    store.create_run(RUN, {"plan": "bench"})
    t0 = time.perf_counter()
    store.artifacts.prepare_units(RUN, [f"U{i:05d}" for i in range(units)])
    prepare = time.perf_counter() - t0

    def step(i: int) -> None:
        unit = f"U{i:05d}"
        t0 = time.perf_counter()
        head = i  # every iteration commits exactly one checkpoint
        claim = store.claim(RUN, "main", unit, expected_version=head, owner="bench",
                            lease_seconds=60)
        t1 = time.perf_counter()
        entry = store.artifacts.stage(RUN, claim.attempt_id, "out.json", payload,
                                      media_type="application/json", producer_version="bench",
                                      created_at="2024-01-01T00:00:00+00:00")
        t2 = time.perf_counter()
        store.commit_checkpoint(RUN, "main", head, {f"unit/{unit}": {"sha256": entry.sha256}},
                                [entry], claim.fencing_token, unit=unit,
                                attempt_id=claim.attempt_id)
        t3 = time.perf_counter()
        phases["claim"].append(t1 - t0)
        phases["stage"].append(t2 - t1)
        phases["commit"].append(t3 - t2)

    return step, prepare


def engine_shaped_units(root: Path, n: int, calls: int) -> None:
    """n units as the engine commits them, each making ``calls`` model calls."""
    store = SQLiteStore(root)
    store.create_run(RUN, {"plan": "bench"})
    store.artifacts.prepare_units(RUN, [f"U{i:05d}" for i in range(n)])
    for i in range(n):
        unit = f"U{i:05d}"
        claim = store.claim(RUN, "main", unit, expected_version=i, owner="bench",
                            lease_seconds=60)
        entries = []
        for c in range(calls):
            call_id = store.reserve_call(RUN, branch_id="main", unit=unit,
                                         attempt_id=claim.attempt_id, round=1, model="m",
                                         request_hash=f"h{c}", budget_delta={"calls": 1})
            entries.append(store.artifacts.stage(
                RUN, claim.attempt_id, f"calls/r1-{c:03d}.json", b"{}",
                media_type="application/json", producer_version="bench", created_at="t"))
            store.settle_call(call_id, tokens_in=1, tokens_out=1, cost=0.0, latency_ms=1,
                              outcome="ok")
        entries.append(store.artifacts.stage(RUN, claim.attempt_id, "out.json", b"{}" * 64,
                                             media_type="application/json",
                                             producer_version="bench", created_at="t"))
        store.commit_checkpoint(RUN, "main", i, {f"unit:{unit}": {"a": claim.attempt_id}},
                                entries, claim.fencing_token, unit=unit,
                                attempt_id=claim.attempt_id, current={unit: claim.attempt_id},
                                usage={"wall_time_s": 0.1})
    store.close()


def _syncs(n: int, calls: int, parent: str | None) -> int:
    """fsync + fdatasync calls made by a child process running ``n`` units."""
    with tempfile.TemporaryDirectory(prefix="keepstep-syncs-", dir=parent) as tmp:
        out = Path(tmp) / "strace.txt"
        subprocess.run(["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out),
                        sys.executable, __file__, "--units", str(n), "--calls", str(calls),
                        "--dir", tmp], check=True, capture_output=True)
        total = re.search(r"^100\.00\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?total$",
                          out.read_text(), re.M)
        return int(total[1]) if total else 0


def count_syncs(n: int, parent: str | None) -> int:
    if shutil.which("strace") is None:
        print("--syncs needs strace on the PATH")
        return 1
    print(f"disk syncs (fsync + fdatasync) per unit, n={n}, "
          f"{platform.system()} {platform.machine()}, SQLite {sqlite3.sqlite_version}")
    for calls in (0, 1, 3):
        per_unit = (_syncs(n, calls, parent) - _syncs(0, calls, parent)) / n
        print(f"  unit with {calls} model call(s): {per_unit:.2f}")
    return 0


def timed(step: Callable[[int], None], i: int) -> float:
    t0 = time.perf_counter()
    step(i)
    return time.perf_counter() - t0


def ms(values: list[float]) -> tuple[float, float]:
    return statistics.median(values) * 1e3, statistics.fmean(values) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="iterations of each (default 200)")
    parser.add_argument("--size", type=int, default=20 * 1024, help="artifact bytes (20 KB)")
    parser.add_argument("--dir", default=None, help="parent of the temp dir (default: system)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--syncs", action="store_true", help="count disk syncs per unit")
    parser.add_argument("--units", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.units is not None:  # the child of --syncs
        engine_shaped_units(Path(args.dir) / ".keepstep", args.units, args.calls)
        return 0
    if args.syncs:
        return count_syncs(args.n, args.dir)
    payload = os.urandom(args.size // 2).hex().encode()[: args.size]

    with tempfile.TemporaryDirectory(prefix="keepstep-bench-", dir=args.dir) as tmp:
        base = Path(tmp)
        txn = raw_transaction(base / "raw.db")
        durable_file = raw_durable_file(base / "raw-files", payload)
        store = SQLiteStore(base / ".keepstep")
        phases: dict[str, list[float]] = {"claim": [], "stage": [], "commit": []}
        total = args.warmup + args.n
        unit, prepare = keepstep_unit(store, payload, phases, total)
        samples: dict[str, list[float]] = {"txn": [], "file": [], "keepstep": []}
        try:
            for i in range(total):
                # Interleaved so that disk and cache drift hit both sides alike.
                t_txn = timed(txn, i)
                t_file = timed(durable_file, i)
                t_unit = timed(unit, i)
                if i >= args.warmup:
                    samples["txn"].append(t_txn)
                    samples["file"].append(t_file)
                    samples["keepstep"].append(t_unit)
            for values in phases.values():
                del values[: args.warmup]
        finally:
            store.close()

    baseline = [2 * a + b for a, b in zip(samples["txn"], samples["file"], strict=True)]
    txn_med, txn_mean = ms(samples["txn"])
    file_med, file_mean = ms(samples["file"])
    base_med, base_mean = ms(baseline)
    ks_med, ks_mean = ms(samples["keepstep"])
    ratio_med, ratio_mean = ks_med / base_med, ks_mean / base_mean

    print(f"keepstep commit overhead — n={args.n} (+{args.warmup} warm-up), "
          f"artifact {args.size} bytes, {platform.system()} {platform.machine()}, "
          f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}")
    print(f"temp dir under: {args.dir or tempfile.gettempdir()}; load average at the end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print()
    print(f"{'':44}{'median ms':>11}{'mean ms':>11}")
    rows = [
        ("raw: 1 SQLite txn (WAL, synchronous=FULL)", txn_med, txn_mean),
        ("raw: 1 file 20 KB + fsync(file) + fsync(dir)", file_med, file_mean),
        ("baseline = 2 × txn + 1 × file", base_med, base_mean),
        ("keepstep: claim + stage + commit_checkpoint", ks_med, ks_mean),
    ]
    for label, med, mean in rows:
        print(f"{label:44}{med:11.3f}{mean:11.3f}")
    print()
    print("keepstep phases:")
    for name, values in phases.items():
        med, mean = ms(values)
        print(f"  {name:42}{med:11.3f}{mean:11.3f}")
    print(f"  {'prepare_units, once per run (all units)':42}{prepare * 1e3:11.3f}"
          f"   = {prepare * 1e3 / total:.3f} ms per unit, outside the loop")
    print()
    verdict = "meets" if ratio_med <= GOAL else "MISSES"
    print(f"ratio keepstep / baseline: median {ratio_med:.2f}×, mean {ratio_mean:.2f}× "
          f"(goal ≤ {GOAL}×: {verdict} the goal on medians)")
    per_unit = prepare * 1e3 / total
    print(f"with prepare_units spread over the units: median "
          f"{(ks_med + per_unit) / base_med:.2f}×, mean {(ks_mean + per_unit) / base_mean:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
