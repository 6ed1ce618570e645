"""Units in flight at once: wall time against the critical path, and flat bookkeeping.

Three measurements, side by side in one run:

1. The ME-042 pack against a local OpenAI-compatible server (tests/support/fake_provider.py
   in a process of its own, as a real server is: answering like the offline model after a
   fixed ``--latency`` per call, TCP_NODELAY) at ``--jobs`` 1, 4 and 8, in one process
   (litellm imported once, before the first timing).
   Wall time of ``run.run()`` is printed against the critical path (the longest chain of
   calls in the DAG, from the call ledger, × latency) and against the sum of all calls.
2. Per-unit bookkeeping with a trivial no-model kind (claim, stage one small file, verify,
   commit, decide): plans of 36, 1,000 and 10,000 independent units, 90 % of them committed
   beforehand; the median time between consecutive unit commits at --jobs 1.
3. Resume: a fresh worker process's start → its first ``claimed`` event on the pack after
   ~1,000 and ~20,000 checkpoints of history (bench/recovery.py's synthetic history).

    python bench/parallel.py [--latency 0.3] [--sizes 36,1000,10000] [--short 1000]
                             [--long 20000] [--repeat 3] [--skip resume]
    python bench/parallel.py --dump-shape PATH   # the pack's DAG shape for bench/peers.py

Goals: wall ≤ 1.3 × critical path at --jobs 8; bookkeeping at 10,000 ≤ 1.5 × at 36;
resume long/short ≤ 1.2. Not a test: figures vary by machine; the ratios are what to watch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

PACK = REPO / "sample_projects" / "market-entry"
RUN = "ME-042"
APPROVE = {"audience": "product team"}


# -- 1. wall time against the critical path ---------------------------------------------------
def critical_path_calls(plan: Any, calls_per_unit: dict[str, int]) -> int:
    from keepstep.engine.core.decide import topo_order

    units = plan.unit_map()
    longest: dict[str, int] = {}
    for uid in topo_order(plan):
        longest[uid] = calls_per_unit.get(uid, 0) + max(
            (longest[d.unit] for d in units[uid].depends_on), default=0)
    return max(longest.values())


def slot_bound(plan: Any, calls_per_unit: dict[str, int], slots: int) -> int:
    """The wall time, in calls, of the DAG on ``slots`` slots with no overhead at all: list
    scheduling, longest remaining chain first (what the run loop does). With fewer slots
    than ready units this is above the critical path: ME-042 has 9 four-call extractions
    under its longest chain, so 8 slots cannot run them all at once."""
    import heapq

    from keepstep.engine.core.decide import topo_order

    units = plan.unit_map()
    children: dict[str, list[str]] = {u: [] for u in units}
    for uid, unit in units.items():
        for d in unit.depends_on:
            children[d.unit].append(uid)
    rest: dict[str, int] = {}
    for uid in reversed(topo_order(plan)):
        rest[uid] = calls_per_unit.get(uid, 0) + max((rest[c] for c in children[uid]),
                                                     default=0)
    done: set[str] = set()
    pending, running, now = set(units), [], 0
    while pending or running:
        ready = sorted((u for u in pending if all(d.unit in done for d in units[u].depends_on)),
                       key=lambda u: (-rest[u], u))
        for uid in ready[:max(0, slots - len(running))]:
            pending.discard(uid)
            heapq.heappush(running, (now + calls_per_unit.get(uid, 0), uid))
        now, uid = heapq.heappop(running)
        done.add(uid)
        while running and running[0][0] == now:
            done.add(heapq.heappop(running)[1])
    return now


def warm_up_models() -> None:
    """litellm's import, its lazily loaded completion path and the tokenizer: paid once per
    process, outside every timing (a run imports litellm in the background from its first
    claim on)."""
    from keepstep.engine.gateway.client import warm_up

    warm_up(["openai/fake-model"])


def run_pack(root: Path, provider: Any, jobs: int) -> tuple[Any, float, dict[str, int], Any]:
    """One timed run of a fresh copy of the pack at ``root`` against ``provider``: the
    status, the wall time of ``run.run()``, the calls per unit (call ledger), the plan."""
    from keepstep.engine.api import open_project

    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    cfg = tomllib.loads((root / "keepstep.toml").read_text())
    cfg.update(default_model="openai/fake-model", api_base=provider.api_base)
    (root / "keepstep.toml").write_text(tomli_w.dumps(cfg))
    provider.stats(reset=True)
    with open_project(root) as p:
        run = p.start_run(RUN)
        t0 = time.perf_counter()
        status = run.run(jobs=jobs, approve=APPROVE)
        wall = time.perf_counter() - t0
        calls: dict[str, int] = {}
        for c in run.calls():
            calls[c.unit] = calls.get(c.unit, 0) + 1
        return status, wall, calls, run.plan


def pack_wall(tmp: Path, latency: float, jobs_list: list[int], repeat: int = 1) -> list[str]:
    from tests.support.fake_provider import provider_process

    warm_up_models()
    lines = []
    with provider_process(latency=latency, offline=True) as provider:
        figures: dict[int, Any] = {}
        walls: dict[int, list[float]] = {}
        for jobs, n in ((j, n) for n in range(repeat) for j in jobs_list):
            status, wall, calls, plan = run_pack(tmp / f"pack-j{jobs}-{n}", provider, jobs)
            cp = critical_path_calls(plan, calls)
            bound = slot_bound(plan, calls, jobs)
            walls.setdefault(jobs, []).append(wall)
            figures[jobs] = (status.decision, sum(calls.values()), cp, bound,
                             max(provider.stats()["max_in_flight"],
                                 figures.get(jobs, (0,) * 5)[4]))
    for jobs, (decision, total, cp, bound, peak) in figures.items():
        crit, serial, best = cp * latency, total * latency, bound * latency
        wall = statistics.median(walls[jobs])
        runs = "" if repeat == 1 else " (median of " + ", ".join(
            f"{w:.2f}" for w in walls[jobs]) + ")"
        lines.append(f"  --jobs {jobs:<2} wall {wall:6.2f} s{runs}  ({decision}, {total} calls, "
                     f"peak {peak} in flight)  critical path {cp} calls = {crit:.2f} s → "
                     f"{wall / crit:.2f}×   best on {jobs} slots {bound} calls = {best:.2f} s → "
                     f"{wall / best:.2f}×   sum of calls {serial:.2f} s → {wall / serial:.2f}×")
    return lines


def dump_shape(tmp: Path, latency: float, path: Path) -> tuple[str, dict[str, Any]]:
    """Run the pack once at --jobs 4 and write its DAG shape for bench/peers.py: each unit's
    dependencies and model calls (from the call ledger), the latency per call, the critical
    path and the sum of calls (both in calls)."""
    import json

    from tests.support.fake_provider import provider_process

    warm_up_models()
    with provider_process(latency=latency, offline=True) as provider:
        status, _wall, calls, plan = run_pack(tmp / "pack-shape", provider, 4)
    units = {uid: {"deps": sorted({d.unit for d in unit.depends_on}),
                   "calls": calls.get(uid, 0)} for uid, unit in plan.unit_map().items()}
    shape = {"latency": latency, "units": units,
             "critical_path_calls": critical_path_calls(plan, calls),
             "total_calls": sum(calls.values())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(shape, indent=1, sort_keys=True) + "\n")
    return status.decision, shape


# -- 2. bookkeeping per unit ------------------------------------------------------------------
def trivial_kind(ctx: Any) -> Any:
    from keepstep.engine.kinds.context import KindOutcome, ValidatorResult

    ctx.write("out.json", b'{"ok": true}\n')
    return KindOutcome(validators=[ValidatorResult(name="structure", passed=True)])


def wide_plan(root: Path, n: int) -> None:
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    units = [{"id": f"T{i:05d}", "title": f"Trivial {i}", "phase": "bench", "kind": "notes",
              "outputs": ["out.json"], "required_final": True} for i in range(n)]
    (root / "plan.toml").write_text(tomli_w.dumps(
        {"plan": {"title": f"{n} trivial units", "deliverables": []}, "unit": units}))


def _fingerprints(units: list[Any]) -> list[str]:
    from keepstep.storage.hashing import canonical_json, sha256_hex

    return [sha256_hex(canonical_json(u.model_dump(mode="json"))) for u in units]


def bookkeeping(tmp: Path, n: int) -> tuple[float, int]:
    """Median seconds between consecutive unit commits, 90 % of the plan committed first."""
    from keepstep.engine.api import open_project
    from keepstep.engine.core.state import OutputRef, UnitRecord, UnitState, unit_key
    from keepstep.engine.kinds.context import REGISTRY
    from keepstep.engine.run.loop import RunLoop

    root = tmp / f"wide-{n}"
    wide_plan(root, n)
    done = int(n * 0.9) if n >= 300 else 0  # small plans: every unit is a sample
    spec = REGISTRY["notes"][0]
    REGISTRY["notes"] = (spec, trivial_kind)
    with open_project(root) as p:
        run = p.start_run(RUN)
        if done:
            # Committed records as the loop would write them (same unit fingerprint, a real
            # artifact), so recovery's audit keeps them current.
            import hashlib

            seed = run.store.artifacts.root / "seed.json"
            seed.write_bytes(b'{"ok": true}\n')
            ref = OutputRef(sha256=hashlib.sha256(seed.read_bytes()).hexdigest(),
                            path="seed.json")
            units = run.plan.units
            delta = {unit_key(u.id): UnitRecord(
                state=UnitState.succeeded, attempt=f"{u.id}/a0", outputs={"out.json": ref},
                unit_fp=run.plan.unit_fingerprint(u.id) if i == 0 else "",
                plan_n=1).model_dump(mode="json") for i, u in enumerate(units[:done])}
            fps = {u.id: fp for u, fp in zip(units[:done], _fingerprints(units[:done]),
                                               strict=True)}
            for u in units[:done]:
                delta[unit_key(u.id)]["unit_fp"] = fps[u.id]
            run.store.commit_checkpoint(RUN, "main", run.head().version, delta, kind="repair")
        run.recover()
        stamps: list[float] = []

        def on_event(e: dict[str, Any]) -> None:
            if e["kind"] == "attempt":
                stamps.append(time.perf_counter())

        todo = min(n - done, 200)
        RunLoop(run, on_event=on_event, jobs=1, max_units=todo).loop()
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:], strict=False)]
    return statistics.median(gaps), len(gaps)


# -- 3. resume: start → first claim -----------------------------------------------------------
def first_claim(root: Path) -> float:
    env = dict(os.environ)
    env.pop("KEEPSTEP_CRASH_AT", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "keepstep.engine.drills.worker", str(root),
                             "--run", RUN, "--jobs", "1", "--approve", "audience=product team"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith('{"kind": "claimed"'):
            elapsed = time.perf_counter() - t0
            break
    else:
        raise RuntimeError("the worker never claimed a unit")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return elapsed


def _compile_sources() -> None:
    """Byte-compile keepstep's own modules first, as any start after the first one has them.

    An editable install leaves them uncompiled, and with PYTHONDONTWRITEBYTECODE set (as on
    these machines) every process would compile ~90 modules again (about 0.1–0.3 s), which a
    user's second start never pays."""
    import compileall

    for folder in ("app", "engine", "storage"):
        compileall.compile_dir(str(REPO / folder), quiet=1)


def resume_ratio(tmp: Path, short: int, long: int, repeat: int) -> list[str]:
    from recovery import pack_project, synthesize_history

    _compile_sources()
    roots = {}
    for label, steps in (("short", short), ("long", long)):
        root = pack_project(tmp / f"history-{label}")
        counts = synthesize_history(root, steps, cycle=30, say=lambda s: None)
        roots[label] = (root, counts)
    times: dict[str, list[float]] = {"short": [], "long": []}
    for _ in range(repeat):
        for label in ("short", "long"):
            times[label].append(first_claim(roots[label][0]))
    lines = []
    for label in ("short", "long"):
        counts = roots[label][1]
        lines.append(f"  {label:5} history ({counts['checkpoints']:,} checkpoints, "
                     f"{counts['attempts']:,} attempts): start → first claim median "
                     f"{statistics.median(times[label]):.3f} s  (runs: "
                     + ", ".join(f"{t:.3f}" for t in times[label]) + ")")
    ratio = statistics.median(times["long"]) / statistics.median(times["short"])
    lines.append(f"  ratio long/short {ratio:.2f}× (goal ≤ 1.2×)")
    slowest = max(statistics.median(times["short"]), statistics.median(times["long"]))
    lines.append(f"  slower median {slowest:.3f} s (goal < 1 s for the sample pack): "
                 + ("met" if slowest < 1.0 else "NOT met"))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.3)
    ap.add_argument("--jobs", default="1,4,8,16")
    ap.add_argument("--sizes", default="36,1000,10000")
    ap.add_argument("--short", type=int, default=1000)
    ap.add_argument("--long", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", action="append", default=[], choices=["wall", "book", "resume"])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--dump-shape", metavar="PATH", default=None,
                    help="run the pack once at --jobs 4, write its DAG shape (deps and calls "
                         "per unit) as JSON to PATH for bench/peers.py, and exit")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="keepstep-parallel-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        if args.dump_shape:
            decision, shape = dump_shape(tmp, args.latency, Path(args.dump_shape))
            print(f"shape of {RUN} ({decision}): {len(shape['units'])} units, "
                  f"{shape['total_calls']} calls, critical path "
                  f"{shape['critical_path_calls']} calls → {args.dump_shape}")
            return 0
        print(f"keepstep parallel bench — {os.cpu_count()} cores, load "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        if "wall" not in args.skip:
            print(f"\n1. ME-042 pack, {args.latency:g} s per call (local server)")
            for line in pack_wall(tmp, args.latency, [int(j) for j in args.jobs.split(",")],
                                  args.repeat):
                print(line)
        if "book" not in args.skip:
            print("\n2. bookkeeping per trivial unit (--jobs 1, 90 % committed beforehand)")
            base = None
            for n in (int(s) for s in args.sizes.split(",")):
                per, samples = bookkeeping(tmp, n)
                base = base or per
                print(f"  {n:>6} units: {per * 1e3:7.2f} ms per unit (median of {samples}) "
                      f"→ {per / base:.2f}× the first size")
        if "resume" not in args.skip:
            print(f"\n3. resume on the pack: {args.short:,} vs {args.long:,} history steps")
            for line in resume_ratio(tmp, args.short, args.long, args.repeat):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
