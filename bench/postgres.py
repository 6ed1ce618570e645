"""Bookkeeping per trivial unit: the PostgreSQL store against the SQLite store, same run.

For each size, one run of N trivial units committed one after another through the Store
interface, as the engine does it: claim at the head (new attempt, lease, fencing token,
event), stage one small file, commit (CAS on the head, token check, delta, manifest row,
current pointer, lease released; on PostgreSQL also the file's blob). No model, no plan: the
store's own cost per unit. Printed: ms per unit on each store and the ratio PostgreSQL /
SQLite (the baseline measured in the same run). SQLite runs with its default
synchronous=FULL; the PostgreSQL server is a throwaway local cluster (fsync off: the figure
is keepstep's round trips and locking, not the disk) unless --url names one.

    .venv/bin/python bench/postgres.py [--sizes 36,1000] [--url postgresql://…]

With .venv-peers holding langgraph-checkpoint-postgres (see bench/peers_postgres.py), the
same sizes also run there against LangGraph's PostgresSaver on the same server: a chain of
trivial nodes, durability="sync", the median gap between node starts; the last column is
keepstep on PostgreSQL / PostgresSaver (the goal: ≤ 1.5×). LangGraph's node writes no file,
claims nothing and checks no token, so its figure is a floor rather than the same work.

Not a test: figures vary by machine (and by the load on it); watch the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keepstep.storage import CommitRequest, SQLiteStore  # noqa: E402
from keepstep.storage.postgres import PostgresStore  # noqa: E402

RUN = "BENCH"


def per_unit(store: object, n: int) -> float:
    """Seconds per unit for n claim + stage + commit cycles."""
    s = store  # a Store
    s.create_run(RUN, {})  # type: ignore[attr-defined]
    version = 0
    started = time.perf_counter()
    for i in range(n):
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
    return (time.perf_counter() - started) / n


def peer(python: Path, url: str, n: int) -> float | None:
    """LangGraph PostgresSaver's ms per node for a chain of n (None without .venv-peers)."""
    import json
    import subprocess

    if not python.exists():
        return None
    proc = subprocess.run([str(python), str(Path(__file__).with_name("peers_postgres.py")),
                           url, "--sizes", str(n)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  (PostgresSaver failed: {proc.stderr.strip()[-300:]})", file=sys.stderr)
        return None
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["ms_per_node"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="36,1000")
    ap.add_argument("--url", help="a server to use (a database is created and dropped per "
                    "size); default: a throwaway local cluster")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
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
    print("bookkeeping per trivial unit (claim + stage + commit), ms/unit")
    print(f"{'units':>7} {'SQLite':>9} {'PostgreSQL':>11} {'PG/SQLite':>10} "
          f"{'PostgresSaver':>14} {'PG/Saver':>9}")
    try:
        for n in sizes:
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
                saver = peer(peers, with_database(admin, f"{name}_lg"), n)
                with psycopg.connect(with_database(admin, "postgres"), autocommit=True) as c:
                    c.execute(f"DROP DATABASE {name}_lg WITH (FORCE)")
            tail = (f" {saver:>14.2f} {t_pg * 1000 / saver:>8.2f}x" if saver
                    else f" {'(no .venv-peers)':>14}")
            print(f"{n:>7} {t_lite * 1000:>9.2f} {t_pg * 1000:>11.2f} {t_pg / t_lite:>9.2f}x"
                  + tail, flush=True)
    finally:
        if cluster is not None:
            cluster.stop("immediate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
