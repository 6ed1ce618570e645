"""The PostgreSQL store against the SQLite store (the baseline measured in the same run).

1. For each size, one run of N trivial units committed one after another through the Store
interface, as the engine does it: claim at the head (new attempt, lease, fencing token,
event), stage one small file, commit (CAS on the head, token check, delta, manifest row,
current pointer, lease released; on PostgreSQL also the file's blob). No model, no plan: the
store's own cost per unit. Printed: the median ms per unit on each store and the ratio PostgreSQL /
SQLite (the baseline measured in the same run). SQLite runs with its default
synchronous=FULL; the PostgreSQL server is a throwaway local cluster (fsync off: the figure
is keepstep's round trips and locking, not the disk) unless --url names one.

    .venv/bin/python bench/postgres.py [--sizes 36,1000] [--url postgresql://…]

With .venv-peers holding langgraph-checkpoint-postgres (see bench/peers_postgres.py), the
same sizes also run there against LangGraph's PostgresSaver on the same server: a chain of
trivial nodes, durability="sync", the median gap between node starts; the last column is
keepstep on PostgreSQL / PostgresSaver (the goal: ≤ 1.5×). LangGraph's node writes no file,
claims nothing and checks no token, so its figure is a floor rather than the same work. Its
cost per node grows with the chain (a 10,000-node chain ran 13 min here): from 10,000 nodes
on, the chain is stopped after --saver-cap seconds (300) and measured over the last 200
nodes it reached — a floor for nodes 9,800–10,000 (the line says where it stopped and the
median of every 1,000 nodes).

2. A trivial plan through the engine (bench/parallel.py's trivial kind: claim, stage one
   small file, verify, commit, decide; --jobs 1), every unit run, on SQLite and on
   PostgreSQL: the median time between consecutive unit commits and the whole run's wall;
   the last column is that PostgreSQL figure / PostgresSaver's at the same size (section 1).
3. ME-042 on PostgreSQL with 1, 2 and 4 workers (separate processes in separate project
   folders, as hosts; --jobs 1 each) against a local provider answering like the offline
   model after ``--latency`` (0.3 s) per call: the wall from the first claim to the last
   commit (the server's clock, in the run's events) against the best schedule of the same
   calls on that many slots (bench/parallel.py's slot bound). Goal: 4 workers ≤ 1.3×.

    .venv/bin/python bench/postgres.py [--sizes 36,1000,10000] [--plan-sizes 1000,10000]
                                       [--workers 1,2,4] [--latency 0.3] [--skip plan,pack]

Not a test: figures vary by machine (and by the load on it); watch the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keepstep.storage import CommitRequest, SQLiteStore  # noqa: E402
from keepstep.storage.postgres import PostgresStore  # noqa: E402

RUN = "BENCH"


def per_unit(store: object, n: int) -> float:
    """Seconds per unit for n claim + stage + commit cycles: the median cycle (the statistic
    the PostgresSaver figure uses, and robust to a loaded machine's stalls)."""
    import statistics

    s = store  # a Store
    s.create_run(RUN, {})  # type: ignore[attr-defined]
    version = 0
    cycles: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        unit = f"U{i:05d}"
        c = s.claim(RUN, "main", unit, expected_version=version,  # type: ignore[attr-defined]
                    owner="bench:1:x", lease_seconds=60)
        entry = s.artifacts.stage(RUN, c.attempt_id, "out.json",  # type: ignore[attr-defined]
                                  f'{{"unit": "{unit}"}}'.encode(),
                                  media_type="application/json", producer_version="bench",
                                  created_at="2026-01-01T00:00:00+00:00")
        version = s.commit(CommitRequest(  # type: ignore[attr-defined]
            run_id=RUN, branch_id="main", expected_version=version,
            delta={f"unit:{unit}": {"state": "succeeded", "attempt": c.attempt_id}},
            manifest=(entry,), unit=unit, attempt_id=c.attempt_id,
            fencing_token=c.fencing_token, current={unit: c.attempt_id}))
        cycles.append(time.perf_counter() - started)
    return statistics.median(cycles)


def peer(python: Path, url: str, n: int, cap: float | None) -> tuple[float, str] | None:
    """LangGraph PostgresSaver's ms per node for a chain of n and a note (None without
    .venv-peers). With ``cap`` (seconds) a chain still running then is stopped: the figure
    is over the last 200 nodes it reached (a floor: its cost per node grows with position)."""
    import json
    import subprocess

    if not python.exists():
        return None
    cmd = [str(python), str(Path(__file__).with_name("peers_postgres.py")), url,
           "--sizes", str(n)]
    if cap is not None:
        cmd += ["--cap-seconds", str(cap)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  (PostgresSaver failed: {proc.stderr.strip()[-300:]})", file=sys.stderr)
        return None
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    note = ""
    if "reached" in line:
        k = int(line["reached"])
        note = (f"  (PostgresSaver stopped at {line['seconds']:.0f} s, node {k:,} of {n:,}: "
                f"nodes {k - 200:,}–{k:,}; ms per node by 1,000 nodes: "
                f"{', '.join(str(v) for v in line['windows'].values())})")
    return float(line["ms_per_node"]), note


class Database:
    """A database of its own on the bench's server, dropped at the end."""

    def __init__(self, admin: str, name: str) -> None:
        import psycopg

        from tests.support.pg_fixtures import with_database

        self.admin, self.name = with_database(admin, "postgres"), name
        with psycopg.connect(self.admin, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        self.url = with_database(admin, name)

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as c:
            c.execute(f"DROP DATABASE {self.name} WITH (FORCE)")


def plan_run(tmp: Path, n: int, url: str | None) -> tuple[float, float]:
    """(median seconds between consecutive unit commits, wall of the whole run) for a plan
    of n trivial units run by the engine at --jobs 1 on SQLite (url None) or PostgreSQL."""
    import os
    import statistics

    from parallel import trivial_kind, wide_plan

    from keepstep.engine.api import open_project
    from keepstep.engine.kinds.context import REGISTRY

    root = tmp / f"plan-{n}-{'pg' if url else 'lite'}"
    wide_plan(root, n)
    spec = REGISTRY["notes"][0]
    REGISTRY["notes"] = (spec, trivial_kind)
    if url:
        os.environ["KEEPSTEP_STORE_URL"] = url
    else:
        os.environ.pop("KEEPSTEP_STORE_URL", None)
    stamps: list[float] = []

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "attempt":
            stamps.append(time.perf_counter())

    try:
        with open_project(root) as p:
            run = p.start_run(RUN)
            t0 = time.perf_counter()
            status = run.run(jobs=1, on_event=on_event)
            wall = time.perf_counter() - t0
            assert status.decision == "done", status.decision
    finally:
        os.environ.pop("KEEPSTEP_STORE_URL", None)
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:], strict=False)]
    return statistics.median(gaps), wall


# A worker process for section 3 (keepstep.engine.drills.worker), made ready before the
# timing starts as bench/parallel.py's in-process run is: litellm imported and this host's
# sources converted (both paid once per process or host, not per unit); then it waits for
# the bench's go so that every worker starts together.
WORKER = """
import sys, time
from pathlib import Path
go, root = Path(sys.argv[1]), Path(sys.argv[2])
from keepstep.engine.api import open_project
from keepstep.engine.drills.worker import main
from keepstep.engine.files.sources import require_readable_sources
from keepstep.engine.gateway.client import warm_up
warm_up(["openai/fake-model"])
with open_project(root) as p:
    require_readable_sources(p.files)
Path(f"{go}.{root.parent.name}").touch()
while not go.exists():
    time.sleep(0.01)
sys.exit(main(sys.argv[2:]))
"""


def pack_workers(tmp: Path, admin: str, workers: int, provider: object,
                 latency: float) -> tuple[float, int, int, str]:
    """ME-042 with ``workers`` worker processes in separate folders on one PostgreSQL run:
    (wall from the first claim to the last commit, model calls, best schedule on that many
    slots in calls)."""
    import datetime as dt
    import os
    import shutil
    import subprocess
    import tomllib

    import tomli_w
    from parallel import PACK, slot_bound

    from keepstep.engine.api import open_project

    def at(ts: str) -> float:
        return dt.datetime.fromisoformat(ts).timestamp()

    with Database(admin, f"bench_me042_w{workers}_{int(time.time())}") as url:
        roots = []
        for w in range(workers):
            root = tmp / f"me042-w{workers}" / f"host{w}" / "me042"
            shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
            cfg = tomllib.loads((root / "keepstep.toml").read_text())
            cfg.update(default_model="openai/fake-model",
                       api_base=provider.api_base)  # type: ignore[attr-defined]
            (root / "keepstep.toml").write_text(tomli_w.dumps(cfg))
            roots.append(root)
        env = dict(os.environ, KEEPSTEP_STORE_URL=url)
        env.pop("KEEPSTEP_CRASH_AT", None)
        os.environ["KEEPSTEP_STORE_URL"] = url
        try:
            with open_project(roots[0]) as p:
                p.start_run(RUN)
            go = tmp / f"me042-w{workers}" / "go"
            procs = [subprocess.Popen(
                [sys.executable, "-c", WORKER, str(go), str(root), "--run", RUN,
                 "--approve", "audience=product team", "--jobs", "1",
                 "--executor-id", f"host{w}:{w}:bench"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for w, root in enumerate(roots)]
            while not all(Path(f"{go}.{root.parent.name}").exists() for root in roots):
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a worker exited before the start: "
                                       + "".join(p.stderr.read() for p in procs  # type: ignore
                                                 if p.poll() is not None)[-800:])
                time.sleep(0.05)
            go.touch()
            for proc in procs:
                _out, err = proc.communicate(timeout=1800)
                if proc.returncode != 0:
                    raise RuntimeError(f"a worker exited {proc.returncode}: {err[-800:]}")
            with open_project(roots[0]) as p:
                run = p.get_run(RUN)
                assert run.status().decision == "done"
                claims = [at(e.ts) for e in run.store.events(RUN, kinds=["unit.claimed"])]
                commits = [at(e.ts) for e in run.store.events(
                    RUN, kinds=["checkpoint.committed"]) if e.unit]
                calls: dict[str, int] = {}
                for c in run.calls():
                    calls[c.unit] = calls.get(c.unit, 0) + 1
                best = slot_bound(run.plan, calls, workers)
                where = time_spent(run, calls, latency)
        finally:
            os.environ.pop("KEEPSTEP_STORE_URL", None)
    return max(commits) - min(claims), sum(calls.values()), best, where


def time_spent(run: Any, calls: dict[str, int], latency: float) -> str:
    """Where the workers' time went, from the attempts (server clock): inside units beyond
    their calls' latency, and idle while a unit was ready and unclaimed (a worker that
    had not yet noticed the commit that made it ready: polling, then deciding)."""
    import datetime as dt

    def at(ts: str) -> float:
        return dt.datetime.fromisoformat(ts).timestamp()

    attempts = [a for a in run.store.attempts(run.run_id) if a.ended_at]
    done = {a.unit: a for a in attempts if a.status == "committed"}
    start = min(at(a.started_at) for a in attempts)
    units = run.plan.unit_map()
    waiting = []  # [ready, claimed) of every unit
    for uid, a in done.items():
        deps = [done[d.unit] for d in units[uid].depends_on if d.unit in done]
        ready = max((at(d.ended_at) for d in deps if d.ended_at), default=start)
        waiting.append((ready, at(a.started_at)))
    overhead = sum(at(a.ended_at) - at(a.started_at) for a in attempts) \
        - sum(calls.values()) * latency
    idle_ready = 0.0
    by_worker: dict[str, list[Any]] = {}
    for a in attempts:
        by_worker.setdefault(a.executor, []).append(a)
    for mine in by_worker.values():
        mine.sort(key=lambda a: at(a.started_at))
        for prev, nxt in zip(mine, mine[1:], strict=False):
            lo, hi = at(prev.ended_at), at(nxt.started_at)
            # The part of this gap when some unit was ready and unclaimed.
            spans = sorted((max(lo, r), min(hi, c)) for r, c in waiting if r < hi and c > lo)
            end = lo
            for a0, b0 in spans:
                a0 = max(a0, end)
                if b0 > a0:
                    idle_ready += b0 - a0
                    end = b0
    return (f"inside units beyond the calls' latency: {overhead:.1f} s over "
            f"{len(attempts)} attempts ({overhead / len(attempts) * 1000:.0f} ms each); "
            f"workers idle while a unit was ready: {idle_ready:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="36,1000,10000")
    ap.add_argument("--plan-sizes", default="1000,10000")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--latency", type=float, default=0.3)
    ap.add_argument("--skip", default="", help="sections to leave out: store, plan, pack")
    ap.add_argument("--saver-cap", type=float, default=300.0,
                    help="seconds a PostgresSaver chain of 10,000 or more may run before it is "
                         "stopped and measured over the last 200 nodes it reached")
    ap.add_argument("--url", help="a server to use (a database is created and dropped per "
                    "size); default: a throwaway local cluster")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    skip = set(args.skip.split(","))
    cluster = None
    if args.url is None:
        from tests.support.pg_cluster import start_temporary

        cluster = start_temporary()
        admin = cluster.url
    else:
        admin = args.url
    import psycopg

    from tests.support.pg_fixtures import with_database

    peers = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"
    savers: dict[int, float] = {}  # units -> PostgresSaver's ms per node (section 1)
    if "store" not in skip:
        print("1. bookkeeping per trivial unit (claim + stage + commit), ms/unit")
        print(f"{'units':>7} {'SQLite':>9} {'PostgreSQL':>11} {'PG/SQLite':>10} "
              f"{'PostgresSaver':>14} {'PG/Saver':>9}")
    try:
        for n in sizes if "store" not in skip else []:
            with tempfile.TemporaryDirectory() as tmp:
                lite = SQLiteStore(Path(tmp) / "lite" / ".keepstep")
                try:
                    t_lite = per_unit(lite, n)
                finally:
                    lite.close()
                name = f"bench_{n}_{int(time.time())}"
                with psycopg.connect(with_database(admin, "postgres"), autocommit=True) as c:
                    c.execute(f"CREATE DATABASE {name}")
                pg = PostgresStore(Path(tmp) / "pg" / ".keepstep", with_database(admin, name))
                try:
                    t_pg = per_unit(pg, n)
                finally:
                    pg.close()
                with psycopg.connect(with_database(admin, "postgres"), autocommit=True) as c:
                    c.execute(f"DROP DATABASE {name} WITH (FORCE)")
                    c.execute(f"CREATE DATABASE {name}_lg")  # its own: both have checkpoints
                # keepstep's figures first: LangGraph's long chains take long (its own cost
                # per node grows with the chain).
                print(f"{n:>7} {t_lite * 1000:>9.2f} {t_pg * 1000:>11.2f} "
                      f"{t_pg / t_lite:>9.2f}x", end="", flush=True)
                found = peer(peers, with_database(admin, f"{name}_lg"), n,
                             args.saver_cap if n >= 10_000 else None)
                with psycopg.connect(with_database(admin, "postgres"), autocommit=True) as c:
                    c.execute(f"DROP DATABASE {name}_lg WITH (FORCE)")
            if found:
                saver, note = found
                savers[n] = saver
                print(f" {saver:>14.2f} {t_pg * 1000 / saver:>8.2f}x{note}", flush=True)
            else:
                print(f" {'(no .venv-peers)':>14}", flush=True)
        if "plan" not in skip:
            print("\n2. a plan of trivial units through the engine (--jobs 1): median ms between "
                  "unit commits; wall of the whole run")
            print(f"{'units':>7} {'SQLite ms':>10} {'PG ms':>8} {'PG/SQLite':>10} "
                  f"{'SQLite wall':>12} {'PG wall':>9} {'PG/Saver':>9}")
            for n in [int(x) for x in args.plan_sizes.split(",") if x]:
                with tempfile.TemporaryDirectory() as tmp:
                    lite, lite_wall = plan_run(Path(tmp), n, None)
                    with Database(admin, f"bench_plan_{n}_{int(time.time())}") as url:
                        pg, pg_wall = plan_run(Path(tmp), n, url)
                ratio = f"{pg * 1000 / savers[n]:>8.2f}x" if n in savers else f"{'-':>9}"
                print(f"{n:>7} {lite * 1000:>10.2f} {pg * 1000:>8.2f} {pg / lite:>9.2f}x "
                      f"{lite_wall:>11.1f}s {pg_wall:>8.1f}s {ratio}", flush=True)
        if "pack" not in skip:
            from parallel import warm_up_models

            from tests.support.fake_provider import provider_process

            print(f"\n3. ME-042 on PostgreSQL, workers in separate folders (--jobs 1 each), "
                  f"{args.latency} s per call: first claim → last commit against the best "
                  "schedule on that many slots")
            warm_up_models()
            with provider_process(latency=args.latency, offline=True) as provider, \
                    tempfile.TemporaryDirectory() as tmp:
                for w in [int(x) for x in args.workers.split(",") if x]:
                    wall, total, best, where = pack_workers(Path(tmp), admin, w, provider,
                                                            args.latency)
                    bound = best * args.latency
                    print(f"  {w} worker(s): wall {wall:6.2f} s ({total} calls)  best on {w} "
                          f"slot(s) {best} calls = {bound:.2f} s → {wall / bound:.2f}×\n"
                          f"               {where}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop("immediate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
