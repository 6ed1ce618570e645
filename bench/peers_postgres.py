"""LangGraph's PostgresSaver: bookkeeping per trivial node, the peer of bench/postgres.py.

Runs in .venv-peers only (LangGraph is never a keepstep dependency; this script imports the
standard library, langgraph and psycopg, never keepstep). A chain of N trivial nodes, one
superstep and one checkpoint each (as keepstep commits each unit), durability="sync" (each
checkpoint written before the next node starts, as a keepstep commit is); the figure is the
median time between consecutive node starts. Prints one JSON line per size:
{"nodes": N, "ms_per_node": x}.

``--cap-seconds S``: a chain that has not finished after S seconds is stopped there (its
cost per node grows with its position: a 10,000-node chain ran 13 min here). The line then
says ``"reached": k`` and ``ms_per_node`` is the median over the last 200 nodes it ran
(nodes k-200..k: a floor for nodes 9,800..10,000, which come later); ``"windows"`` gives
the median of every 1,000 nodes, so the growth shows.

    .venv-peers/bin/python -m pip install langgraph==1.2.24 langgraph-checkpoint-postgres \
        'psycopg[binary,pool]'        # once (bench/postgres.py runs this script itself)
    .venv-peers/bin/python bench/peers_postgres.py postgresql://…/db [--sizes 36,1000]
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import sys
import time
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph


class CountState(TypedDict):
    n: Annotated[int, operator.add]


class Capped(Exception):
    """The chain ran past its time cap."""


def chain_graph(n: int, saver: Any, starts: list[float], cap_at: float | None = None) -> Any:
    def body(state: CountState) -> dict[str, int]:
        now = time.perf_counter()
        if cap_at is not None and now > cap_at:
            raise Capped
        starts.append(now)
        return {"n": 1}

    g = StateGraph(CountState)
    names = [f"t{i:05d}" for i in range(n)]
    for name in names:
        g.add_node(name, body)
    for a, b in zip([START, *names], [*names, END], strict=True):
        g.add_edge(a, b)
    return g.compile(checkpointer=saver)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--sizes", default="36,1000")
    ap.add_argument("--cap-seconds", type=float)
    args = ap.parse_args()
    with PostgresSaver.from_conn_string(args.url) as saver:
        saver.setup()
        chain_graph(3, saver, []).invoke({"n": 0}, {"configurable": {"thread_id": "warm"}},
                                         durability="sync")
        for n in (int(x) for x in args.sizes.split(",")):
            starts: list[float] = []
            cap_at = None if args.cap_seconds is None else time.perf_counter() + args.cap_seconds
            graph = chain_graph(n, saver, starts, cap_at)
            config = {"configurable": {"thread_id": f"t{n}"}, "recursion_limit": n + 10}
            try:
                out = graph.invoke({"n": 0}, config, durability="sync")
                assert out["n"] == n == len(starts)
                capped = False
            except Capped:
                capped = True
            gaps = [b - a for a, b in zip(starts[2:], starts[3:], strict=False)]
            line: dict[str, Any] = {"nodes": n}
            if capped:
                line.update(reached=len(starts), seconds=starts[-1] - starts[0],
                            windows={f"{i}-{i + 1000}": round(statistics.median(
                                gaps[i:i + 1000]) * 1000, 2)
                                for i in range(0, len(gaps) - 999, 1000)})
                gaps = gaps[-200:]
            line["ms_per_node"] = statistics.median(gaps) * 1000
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
