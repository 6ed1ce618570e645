"""LangGraph on the same DAG and latencies: wall time against the critical path, and bookkeeping.

The peer of bench/parallel.py, run in a venv of its own (.venv-peers, made by
`make bench-peers`): LangGraph is never a keepstep dependency, and this script imports the
standard library and langgraph only, never keepstep.

1. The ME-042 pack's DAG as `bench/parallel.py --dump-shape` wrote it (each unit's
   dependencies and model calls from the call ledger of a real run, the latency per call):
   one StateGraph node per unit whose body sleeps the latency once per call (a unit's calls
   are sequential), an edge from each dependency (a node with several runs once after all of
   them: the list-form join edge), the SQLite checkpointer on a file, a thread_id. Run with
   the default executor and with max_concurrency 8 and 16; wall time of ``invoke()`` is printed
   against the critical path (critical_path_calls × latency), against the sum of calls and
   against the superstep bound: LangGraph runs in Pregel supersteps, so a node waits for
   every node of its dependencies' superstep, not only for its dependencies. Every run
   checks that each node ran exactly once and never before all its dependencies ended.
2. Bookkeeping per trivial node with the SQLite checkpointer (LangGraph's default durability
   and durability="sync"): a chain of 36 and 1,000 nodes, one superstep and one checkpoint
   each, as keepstep commits each unit; the median time between consecutive node starts.
   And a fan-out of the same sizes (every node in one superstep): wall / nodes.

    make bench-peers
    .venv-peers/bin/python bench/peers.py SHAPE.json [--sizes 36,1000] [--repeat 3]

Compare with bench/parallel.py's "1." and "2." sections, knowing that a node here only
sleeps (no HTTP call, no prompt, no staged artifact, no verification), so LangGraph's figures
are its orchestration's alone, a floor rather than the same work. Not a test: figures vary
by machine; the ratios are what to watch.
"""

from __future__ import annotations

import argparse
import heapq
import json
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

Shape = dict[str, Any]


class PackState(TypedDict):
    # Parallel nodes of one superstep all append: a reducer, or LangGraph refuses the writes.
    log: Annotated[list[str], operator.add]


class CountState(TypedDict):
    n: Annotated[int, operator.add]


# Start/end stamps of each node body, per run (nodes run on the executor's threads).
STAMPS: dict[str, list[tuple[float, float]]] = {}
_lock = threading.Lock()
_in_flight = [0, 0]  # now, peak


def _saver(db: Path) -> SqliteSaver:
    # check_same_thread=False is what SqliteSaver.from_conn_string does: it locks itself.
    saver = SqliteSaver(sqlite3.connect(str(db), check_same_thread=False))
    saver.setup()  # tables and WAL outside every timing
    return saver


# -- DAG arithmetic (the same as bench/parallel.py's, on the shape alone) ---------------------
def topo(units: dict[str, Any]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()

    def visit(uid: str) -> None:
        if uid not in seen:
            seen.add(uid)
            for d in units[uid]["deps"]:
                visit(d)
            order.append(uid)

    for uid in sorted(units):
        visit(uid)
    return order


def critical_path(units: dict[str, Any]) -> int:
    longest: dict[str, int] = {}
    for uid in topo(units):
        longest[uid] = units[uid]["calls"] + max((longest[d] for d in units[uid]["deps"]),
                                                 default=0)
    return max(longest.values())


def supersteps(units: dict[str, Any]) -> dict[str, int]:
    """The superstep each node runs in: a node is triggered in the step after the last of
    its dependencies ran (an edge's or a join's channel is read at the next step)."""
    step: dict[str, int] = {}
    for uid in topo(units):
        step[uid] = 1 + max((step[d] for d in units[uid]["deps"]), default=-1)
    return step


def superstep_bound(units: dict[str, Any], slots: int) -> int:
    """Wall time, in calls, with no overhead but the superstep barrier: each step lasts as
    long as its nodes on ``slots`` threads (longest first), and the next starts after it."""
    by_step: dict[int, list[int]] = {}
    for uid, s in supersteps(units).items():
        by_step.setdefault(s, []).append(units[uid]["calls"])
    total = 0
    for calls in by_step.values():
        free = [0] * min(slots, len(calls))
        for c in sorted(calls, reverse=True):
            heapq.heappush(free, heapq.heappop(free) + c)
        total += max(free)
    return total


# -- 1. the pack's DAG ------------------------------------------------------------------------
def unit_node(uid: str, calls: int, latency: float) -> Callable[[PackState], dict[str, Any]]:
    def body(state: PackState) -> dict[str, Any]:
        t0 = time.perf_counter()
        with _lock:
            _in_flight[0] += 1
            _in_flight[1] = max(_in_flight[1], _in_flight[0])
        for _ in range(calls):  # one sleep per model call: a unit's calls are sequential
            time.sleep(latency)
        with _lock:
            _in_flight[0] -= 1
        STAMPS.setdefault(uid, []).append((t0, time.perf_counter()))
        return {"log": [uid]}

    return body


def pack_graph(units: dict[str, Any], latency: float, saver: SqliteSaver,
               make: Callable[..., Callable[[PackState], dict[str, Any]]] = unit_node) -> Any:
    g = StateGraph(PackState)
    for uid, u in units.items():
        g.add_node(uid, make(uid, u["calls"], latency))
    children = {d for u in units.values() for d in u["deps"]}
    for uid, u in units.items():
        deps = u["deps"]
        if not deps:
            g.add_edge(START, uid)
        elif len(deps) == 1:
            g.add_edge(deps[0], uid)
        else:
            # The join: one waiting edge from all deps, so the node runs once, after the last
            # of them. (One add_edge per dep instead would run it after each dep's step.)
            g.add_edge(list(deps), uid)
        if uid not in children:
            g.add_edge(uid, END)
    return g.compile(checkpointer=saver)


def check_order(units: dict[str, Any], log: list[str]) -> float:
    """Each node ran exactly once, never before all its deps ended; returns the longest
    wait of a node after its last dependency ended (the superstep barrier's cost)."""
    once = {uid: len(STAMPS.get(uid, [])) for uid in units}
    assert all(n == 1 for n in once.values()), {u: n for u, n in once.items() if n != 1}
    assert sorted(log) == sorted(units), "the state's log is not each unit once"
    wait = 0.0
    for uid, u in units.items():
        start = STAMPS[uid][0][0]
        ready = max((STAMPS[d][0][1] for d in u["deps"]), default=start)
        assert start >= ready, f"{uid} started before one of its deps ended"
        wait = max(wait, start - ready)
    return wait


def pack_wall(tmp: Path, shape: Shape, repeat: int) -> list[str]:
    units, latency = shape["units"], shape["latency"]
    cp = shape["critical_path_calls"]
    assert cp == critical_path(units), "the shape's critical path does not match its DAG"
    crit, serial = cp * latency, shape["total_calls"] * latency
    default_workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    lines = []
    for label, extra, slots in (
            (f"default executor ({default_workers} threads)", {}, default_workers),
            ("max_concurrency 8", {"max_concurrency": 8}, 8),
            ("max_concurrency 16", {"max_concurrency": 16}, 16)):
        walls, waits, peak = [], [], 0
        for n in range(repeat):
            saver = _saver(tmp / f"pack-{slots}-{n}.sqlite")
            graph = pack_graph(units, latency, saver)
            STAMPS.clear()
            _in_flight[:] = [0, 0]
            config = {"configurable": {"thread_id": f"pack-{n}"}, **extra}
            t0 = time.perf_counter()
            out = graph.invoke({"log": []}, config)
            walls.append(time.perf_counter() - t0)
            waits.append(check_order(units, out["log"]))
            peak = max(peak, _in_flight[1])
            saver.conn.close()
        wall = statistics.median(walls)
        best = superstep_bound(units, slots) * latency
        runs = "" if repeat == 1 else " (median of " + ", ".join(
            f"{w:.2f}" for w in walls) + ")"
        lines.append(f"  {label}: wall {wall:6.2f} s{runs}  ({len(units)} nodes, "
                     f"{shape['total_calls']} calls, peak {peak} in flight)  critical path "
                     f"{cp} calls = {crit:.2f} s → {wall / crit:.2f}×   superstep bound on "
                     f"{slots} threads {best / latency:g} calls = {best:.2f} s → "
                     f"{wall / best:.2f}×   sum of calls {serial:.2f} s → {wall / serial:.2f}×"
                     f"   longest wait after deps ended {max(waits):.2f} s")
    steps = supersteps(units)
    lines.append(f"  {max(steps.values()) + 1} supersteps; each node ran once, after all its "
                 "deps (checked every run)")
    return lines


# -- 2. bookkeeping per trivial node ----------------------------------------------------------
def trivial_graph(n: int, chain: bool, saver: SqliteSaver, starts: list[float],
                  stop_at: int | None = None) -> Any:
    def body(state: CountState) -> dict[str, int]:
        starts.append(time.perf_counter())
        return {"n": 1}

    g = StateGraph(CountState)
    names = [f"t{i:05d}" for i in range(n)]
    for name in names:
        g.add_node(name, body)
    if chain:
        for a, b in zip([START, *names], [*names, END], strict=True):
            g.add_edge(a, b)
    else:
        for name in names:
            g.add_edge(START, name)
            g.add_edge(name, END)
    # A chain stopped before node ``stop_at`` (an interrupt): the first nodes of a long plan.
    stop = [names[stop_at]] if chain and stop_at is not None and stop_at < n else None
    return g.compile(checkpointer=saver, interrupt_before=stop)


def bookkeeping(tmp: Path, n: int, chain: bool, durability: str, repeat: int,
                stop_at: int | None = None, tail: int | None = None) -> tuple[float, int]:
    """Chain: median seconds between consecutive node starts (pooled over the repeats), over
    the first ``stop_at`` nodes when given, of the last ``tail`` gaps when given. Fan-out:
    median over the repeats of invoke's wall time / n."""
    samples: list[float] = []
    ran = n if not chain or stop_at is None else min(n, stop_at)
    for r in range(repeat):
        starts: list[float] = []
        saver = _saver(tmp / f"trivial-{n}-{chain}-{durability}-{r}.sqlite")
        graph = trivial_graph(n, chain, saver, starts, stop_at)
        config = {"configurable": {"thread_id": "t"}, "recursion_limit": n + 10}
        t0 = time.perf_counter()
        out = graph.invoke({"n": 0}, config, durability=durability)
        wall = time.perf_counter() - t0
        saver.conn.close()
        assert out["n"] == ran == len(starts), (out["n"], len(starts))
        if chain:
            gaps = [b - a for a, b in zip(starts[2:], starts[3:], strict=False)]
            samples += gaps[-tail:] if tail else gaps
        else:
            samples.append(wall / n)
    return statistics.median(samples), len(samples)


def warm_up(tmp: Path) -> None:
    """LangGraph's lazy imports and first-call paths, paid once outside every timing."""
    saver = _saver(tmp / "warm-up.sqlite")
    trivial_graph(3, True, saver, []).invoke({"n": 0}, {"configurable": {"thread_id": "w"}})
    saver.conn.close()


def book_json(out: Path, sizes: list[int], stop_at: int) -> int:
    """One chain, durability="sync", per size: the median of the last 200 gaps between node
    starts (ms) into ``out`` as JSON, the chain stopped before node ``stop_at`` (the child of
    bench/peers_ratio.py, which interleaves it with keepstep's own rounds)."""
    with tempfile.TemporaryDirectory(prefix="keepstep-peers-") as tmp_name:
        tmp = Path(tmp_name)
        warm_up(tmp)
        figures = {}
        for n in sizes:
            per, samples = bookkeeping(tmp, n, True, "sync", 1, stop_at, tail=200)
            figures[str(n)] = {"ms": per * 1e3, "samples": samples,
                               "nodes_run": min(n, stop_at)}
    out.write_text(json.dumps({"langgraph": version("langgraph"), "sizes": figures}))
    return 0


def first_node(shape_path: Path) -> int:
    """Print the epoch second at which the first node of the ME-042 DAG starts, counted by
    the parent from its spawn (bench/peers_ratio.py's start-up twin), then stop."""
    shape = json.loads(shape_path.read_text())
    started: list[float] = []

    class Started(Exception):
        pass

    def body(state: PackState) -> dict[str, Any]:
        started.append(time.time())
        raise Started

    with tempfile.TemporaryDirectory(prefix="keepstep-peers-") as tmp_name:
        saver = _saver(Path(tmp_name) / "first.sqlite")
        graph = pack_graph(shape["units"], 0.0, saver, lambda *_a: body)
        try:
            graph.invoke({"log": []}, {"configurable": {"thread_id": "first"}},
                         durability="sync")
        except Started:
            pass
        saver.conn.close()
    print(f"{started[0]:.6f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--book-json":  # bench/peers_ratio.py's children
        ap = argparse.ArgumentParser()
        ap.add_argument("--book-json", type=Path, required=True)
        ap.add_argument("--sizes", default="36")
        ap.add_argument("--stop-at", type=int, default=1000)
        a = ap.parse_args(argv)
        return book_json(a.book_json, [int(s) for s in a.sizes.split(",")], a.stop_at)
    if argv and argv[0] == "--first-node":
        return first_node(Path(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", help="the JSON of `bench/parallel.py --dump-shape PATH`")
    ap.add_argument("--sizes", default="36,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", action="append", default=[], choices=["wall", "book"])
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)
    shape = json.loads(Path(args.shape).read_text())
    with tempfile.TemporaryDirectory(prefix="keepstep-peers-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        print(f"LangGraph peers bench — langgraph {version('langgraph')}, "
              f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}, "
              f"{os.cpu_count()} cores, load " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        warm_up(tmp)
        if "wall" not in args.skip:
            print(f"\n1. ME-042 DAG in LangGraph, {shape['latency']:g} s per call (sleep), "
                  "SqliteSaver")
            for line in pack_wall(tmp, shape, args.repeat):
                print(line)
        if "book" not in args.skip:
            print("\n2. bookkeeping per trivial node (SqliteSaver on a file)")
            for chain, durability in ((True, "async"), (True, "sync"), (False, "async"),
                                      (False, "sync")):
                base = None
                what = "chain  " if chain else "fan-out"
                for n in (int(s) for s in args.sizes.split(",")):
                    per, samples = bookkeeping(tmp, n, chain, durability, args.repeat)
                    base = base or per
                    print(f"  {what} durability={durability:5} {n:>6} nodes: "
                          f"{per * 1e3:7.2f} ms per node (median of {samples}) "
                          f"→ {per / base:.2f}× the first size")
    return 0


if __name__ == "__main__":
    sys.exit(main())
