"""LangGraph's PostgresSaver: bookkeeping per trivial node, the peer of bench/postgres.py.

Runs in .venv-peers only (LangGraph is never a keepstep dependency; this script imports the
standard library, langgraph and psycopg, never keepstep). A chain of N trivial nodes, one
superstep and one checkpoint each (as keepstep commits each unit), durability="sync" (each
checkpoint written before the next node starts, as a keepstep commit is); the figure is the
median time between consecutive node starts. Prints one JSON line per size:
{"nodes": N, "ms_per_node": x}.

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


def chain_graph(n: int, saver: Any, starts: list[float]) -> Any:
    def body(state: CountState) -> dict[str, int]:
        starts.append(time.perf_counter())
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
    args = ap.parse_args()
    with PostgresSaver.from_conn_string(args.url) as saver:
        saver.setup()
        chain_graph(3, saver, []).invoke({"n": 0}, {"configurable": {"thread_id": "warm"}},
                                         durability="sync")
        for n in (int(x) for x in args.sizes.split(",")):
            starts: list[float] = []
            graph = chain_graph(n, saver, starts)
            config = {"configurable": {"thread_id": f"t{n}"}, "recursion_limit": n + 10}
            out = graph.invoke({"n": 0}, config, durability="sync")
            assert out["n"] == n == len(starts)
            gaps = [b - a for a, b in zip(starts[2:], starts[3:], strict=False)]
            print(json.dumps({"nodes": n, "ms_per_node": statistics.median(gaps) * 1000}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
