"""keepstep against LangGraph side by side: bookkeeping per trivial unit, and start-up.

The second half of ``make bench-peers`` (bench/peers.py, run in .venv-peers, is the first):
this script runs in keepstep's venv and starts LangGraph's side as children of
``--peers-python`` (LangGraph is never a keepstep dependency), interleaved round by round
with keepstep's own measurement, so both see the same load.

1. Start-up (bench/startup.py's rounds): ``keepstep run`` on the ME-042 pack, offline,
   warm caches: spawn → first unit claimed → first model request (its reservation in the
   call ledger) → first answer, the whole process and its peak RSS; beside it LangGraph's
   twin: spawn → the first node of the same DAG starting (import, graph, SqliteSaver).
   Measured first, while this process is small: a child's peak RSS counts from its parent's.
2. Bookkeeping per trivial unit at ``--sizes`` (36, 1,000, 10,000 units). keepstep:
   bench/parallel.py's measurement (independent trivial units — stage one small file,
   verify, commit — 90 % of the plan committed beforehand, the median time between
   consecutive commits at --jobs 1). LangGraph 1.2.24: a chain of as many nodes, one
   superstep and one checkpoint each, SqliteSaver on a file with durability="sync" (what
   keepstep promises: a finished unit survives a power cut), the median of the last 200
   gaps between node starts (bench/peers.py ``--book-json``; a 10,000-node chain is
   stopped before node 1,000: a full pass takes minutes). Printed: both medians, and the
   ratio keepstep / LangGraph per round and of the medians. Goal: ≤ 1.5×. Then the store's
   work per unit (bench/seam.py's counts): write transactions and durable syncs.

    make bench-peers
    .venv/bin/python bench/peers_ratio.py [--peers-python .venv-peers/bin/python]
        [--shape .venv-peers/shape.json] [--sizes 36,1000,10000] [--rounds 3]
        [--startup-rounds 3] [--skip book|startup]

Not a test: figures vary by machine and load; the interleaved ratios are what to watch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

import parallel  # noqa: E402
import startup  # noqa: E402

PEERS = REPO / "bench" / "peers.py"
GOAL = 1.5


def langgraph_book(python: Path, n: int, tmp: Path) -> float:
    """LangGraph's ms per node for a chain of ``n`` (one child process)."""
    out = tmp / f"langgraph-{n}.json"
    subprocess.run([str(python), str(PEERS), "--book-json", str(out), "--sizes", str(n)],
                   check=True, env=startup.env())
    return float(json.loads(out.read_text())["sizes"][str(n)]["ms"])


def book(python: Path, sizes: list[int], rounds: int, tmp: Path) -> list[str]:
    ours: dict[int, list[float]] = {n: [] for n in sizes}
    theirs: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in sizes:
            # Alternate who goes first, so neither always meets the other's leftover writes.
            order = ("keepstep", "langgraph") if (r + sizes.index(n)) % 2 == 0 else \
                ("langgraph", "keepstep")
            for who in order:
                if who == "keepstep":
                    per, _ = parallel.bookkeeping(tmp / f"round{r}", n)
                    ours[n].append(per * 1e3)
                else:
                    theirs[n].append(langgraph_book(python, n, tmp))
            shutil.rmtree(tmp / f"round{r}", ignore_errors=True)
    lines = []
    for n in sizes:
        k, lg = statistics.median(ours[n]), statistics.median(theirs[n])
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(ours[n], theirs[n], strict=True))
        lines.append(f"  {n:>6} units: keepstep {k:6.2f} ms, LangGraph sync {lg:6.2f} ms per "
                     f"unit → ratio {k / lg:.2f}× (rounds: {per_round}) "
                     f"{'met' if k / lg <= GOAL else 'NOT met'} (goal ≤ {GOAL}×)")
    return lines


def store_work() -> list[str]:
    """bench/seam.py's counts of write transactions and durable syncs per trivial unit."""
    import seam

    seam._install_counters()
    with tempfile.TemporaryDirectory(prefix="keepstep-seam-") as tmp_name:
        return seam.per_unit(Path(tmp_name), 120, 20)


def langgraph_first_node(python: Path, shape: Path, work: Path) -> tuple[float, float, float]:
    """(spawn → first node start, whole process, peak RSS MB) of LangGraph's twin."""
    with tempfile.TemporaryFile("w+") as out:
        t_epoch, t0 = time.time(), time.perf_counter()
        proc = subprocess.Popen([str(python), str(PEERS), "--first-node", str(shape)],
                                cwd=work, env=startup.env(), stdout=out,
                                stderr=subprocess.DEVNULL, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError("bench/peers.py --first-node failed")
        out.seek(0)
        first = float(out.read().strip().splitlines()[-1])
    return first - t_epoch, wall, usage.ru_maxrss / 1024


def start_up(python: Path, shape: Path, rounds: int, max_units: int) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="keepstep-startup-"))
    try:
        ours, theirs = [], []
        for n in range(rounds):
            ours.append(startup.keepstep_round(work, n, max_units))
            theirs.append(langgraph_first_node(python, shape, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in ours) for k in ours[0]}
    lg_first = statistics.median(t[0] for t in theirs)
    lg_wall = statistics.median(t[1] for t in theirs)
    lg_rss = statistics.median(t[2] for t in theirs)
    return [
        f"  keepstep run --max-units {max_units} (offline, warm caches), median of {rounds}:",
        f"    spawn → first claim     {med['claim']:6.2f} s",
        f"    spawn → first request   {med['request']:6.2f} s   "
        f"({med['request'] - med['claim']:.2f} s after the claim; goal ≤ 1.5 s on a quiet machine: "
        f"{'met' if med['request'] <= 1.5 else 'NOT met'})",
        f"    spawn → first answer    {med['answer']:6.2f} s",
        f"    whole process           {med['wall']:6.2f} s   peak RSS {med['rss']:.0f} MB "
        f"(goal ≤ 200 MB: {'met' if med['rss'] <= 200 else 'NOT met'})",
        f"  LangGraph twin (same DAG, SqliteSaver, sync), median of {rounds}:",
        f"    spawn → first node      {lg_first:6.2f} s   whole process {lg_wall:.2f} s   "
        f"peak RSS {lg_rss:.0f} MB",
        f"  ratio spawn → first request / LangGraph's spawn → first node: "
        f"{med['request'] / lg_first:.2f}×",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers-python", type=Path, default=REPO / ".venv-peers" / "bin" / "python")
    ap.add_argument("--shape", type=Path, default=REPO / ".venv-peers" / "shape.json")
    ap.add_argument("--sizes", default="36,1000,10000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--startup-rounds", type=int, default=3)
    ap.add_argument("--max-units", type=int, default=8)
    ap.add_argument("--skip", action="append", default=[], choices=["book", "startup"])
    args = ap.parse_args(argv)
    # Absolute: the keepstep side changes the working folder while it runs.
    args.peers_python, args.shape = args.peers_python.absolute(), args.shape.absolute()
    if not args.peers_python.exists():
        print(f"no LangGraph venv at {args.peers_python}: run `make bench-peers` (it makes "
              ".venv-peers)")
        return 2
    print(f"keepstep vs LangGraph, interleaved — {os.cpu_count()} cores, load "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    # Start-up first: a child's peak RSS (wait4's ru_maxrss) starts from its parent's at the
    # fork, and the in-process bookkeeping below grows this process to ~200 MB.
    if "startup" not in args.skip:
        if not args.shape.exists():
            print(f"\n1. start-up: no DAG shape at {args.shape} (`bench/parallel.py "
                  "--dump-shape` writes it; `make bench-peers` runs it first)")
            return 2
        print("\n1. start-up: spawn → first claim → first request")
        for line in start_up(args.peers_python, args.shape, args.startup_rounds,
                             args.max_units):
            print(line)
    if "book" not in args.skip:
        sizes = [int(s) for s in args.sizes.split(",")]
        print(f"\n2. bookkeeping per trivial unit, keepstep / LangGraph SqliteSaver "
              f"durability=\"sync\", {args.rounds} interleaved rounds")
        with tempfile.TemporaryDirectory(prefix="keepstep-peers-ratio-") as tmp_name:
            for line in book(args.peers_python, sizes, args.rounds, Path(tmp_name)):
                print(line)
        print("  store work per unit (bench/seam.py):")
        for line in store_work():
            print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
