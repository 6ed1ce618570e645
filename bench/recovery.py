"""How long until keepstep knows the next action, and does that grow with the run's history?

For each plan size (the 36-unit ME-042 pack and a synthetic 10,000-unit plan) two runs are
built side by side: one with a short history (~1,000 checkpoints) and one with a long one
(~100,000 checkpoints; each history step is a real claim + staged file + fenced commit
through the Store API, so it also leaves an attempt row, an attempt folder and three events).
Then, interleaved so that machine load hits both alike:

- start → next action: wall time of a fresh process that opens the project and calls
  ``run.status()`` (what `keepstep status` does, minus the CLI);
- status in-process: ``run.status()`` alone, in a process that has the project open and has
  called it once already (median of 3 calls);
- the decision alone: ``run.facts()`` + ``decide(plan, facts)``, in that same process.

The in-process figures come from a fresh process per label and repeat, holding one project
as a real front end does: in one process holding both, whichever project was opened second
reads its 10,000 Plan/Unit objects ~1.4× slower (memory locality: the short history opened
twice shows it too), which says nothing about the history.

It prints the figures, the long/short ratio for each (goal: ≤ 1.2), a breakdown of the
status path's storage reads for the long history, and whether `keepstep status` imports
litellm or textual (``python -X importtime -m keepstep.app.cli.main status DIR --run ID --json``).

    python bench/recovery.py [--short 1000] [--long 100000] [--repeat 5] [--dir PATH]
                             [--plans 36,10000]

Not a test: figures vary by machine; the ratio is what to watch.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "sample_projects" / "market-entry"
RUN = "BENCH"
GOAL = 1.2
OPEN_AND_STATUS = (
    "import sys\n"
    "from keepstep.engine.api import open_project\n"
    "with open_project(sys.argv[1]) as p:\n"
    "    st = p.get_run(sys.argv[2]).status()\n"
    "print(st.decision, '|', st.next_action[:70], '|', "
    "'litellm' in sys.modules, 'textual' in sys.modules)\n"
)
IN_PROCESS = (
    "import json, statistics, sys, time\n"
    "from keepstep.engine.core.decide import decide\n"
    "from keepstep.engine.api import open_project\n"
    "with open_project(sys.argv[1]) as p:\n"
    "    run = p.get_run(sys.argv[2])\n"
    "    run.status()  # warm: plan parse, fingerprint, topological order, imports\n"
    "    status, decision = [], []\n"
    "    for _ in range(3):\n"
    "        t0 = time.perf_counter(); run.status(); status.append(time.perf_counter() - t0)\n"
    "        t0 = time.perf_counter(); decide(run.plan, run.facts())\n"
    "        decision.append(time.perf_counter() - t0)\n"
    "print(json.dumps({'status': statistics.median(status),\n"
    "                  'decide': statistics.median(decision)}))\n"
)


# -- projects -----------------------------------------------------------------------------------
def pack_project(dest: Path) -> Path:
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    return dest


def wide_project(dest: Path, n_units: int) -> Path:
    """The pack's sources and contract with a generated plan of ``n_units`` model-free units:
    unit i depends on i-1 and i//2 (a DAG with long chains and fan-out); the last is final."""
    pack_project(dest)
    units = []
    for i in range(1, n_units + 1):
        deps = sorted({f"W{j:05d}" for j in (i - 1, i // 2) if j >= 1})
        units.append({"id": f"W{i:05d}", "title": f"Synthetic unit {i}", "phase": "bench",
                      "kind": "intake", "outputs": ["evidence-schema.json"],
                      "depends_on": deps, "validators": ["structure"],
                      "params": {"step": "schema"}, "required_final": i == n_units})
    plan = {"plan": {"title": f"synthetic {n_units}-unit plan", "deliverables": []},
            "unit": units}
    (dest / "plan.toml").write_text(tomli_w.dumps(plan), encoding="utf-8")
    return dest


def synthesize_history(root: Path, steps: int, *, cycle: int,
                       say: Callable[[str], None]) -> dict[str, int]:
    """Start the run, then ``steps`` unit successes through the Store API (claim, stage one
    small file, fenced commit with a manifest row and an event). Units cycle over the first
    ``cycle`` units in plan order (never the last five, so the run is never done and the
    decision is a real claim): with the same ``cycle`` a short and a long history leave the
    same current state, and only the history differs."""
    from keepstep.engine.api import open_project
    from keepstep.engine.core.state import OutputRef, UnitRecord, UnitState, unit_key
    from keepstep.storage import EventIn, SQLiteStore

    with open_project(root) as project:
        project.start_run(RUN)
        units = [u.id for u in project.files.plan.units][:-5][:cycle]
    # Synthesis only: no fsyncs (the figures measured later read the same database).
    store = SQLiteStore(root / ".keepstep", synchronous="OFF", durable_files=False)
    head = store.get_head(RUN).version
    started = time.perf_counter()
    for i in range(steps):
        unit = units[i % len(units)]
        claim = store.claim(RUN, "main", unit, expected_version=head, owner="bench:1:history",
                            lease_seconds=600)
        entry = store.artifacts.stage(RUN, claim.attempt_id, "out.json", b'{"i": %d}\n' % i,
                                      media_type="application/json", producer_version="bench",
                                      created_at="2030-01-01T00:00:00Z")
        record = UnitRecord(state=UnitState.succeeded, attempt=claim.attempt_id,
                            outputs={"out.json": OutputRef(sha256=entry.sha256, path=entry.path)})
        head = store.commit_checkpoint(
            RUN, "main", head, {unit_key(unit): record.model_dump(mode="json")}, [entry],
            claim.fencing_token, kind="unit-success", unit=unit, attempt_id=claim.attempt_id,
            events=[EventIn(kind="unit.succeeded", unit=unit, attempt_id=claim.attempt_id)])
        if (i + 1) % 20000 == 0:
            say(f"    … {i + 1:,} steps ({time.perf_counter() - started:.0f} s)")
    counts = {"checkpoints": head,
              "events": len(store.events(RUN)) if steps <= 5000 else -1,
              "attempts": len(store.attempts(RUN))}
    if counts["events"] < 0:
        counts["events"] = store.events(RUN, newest_first=True, limit=1)[0].seq
    store.close()
    return counts


# -- measurements ---------------------------------------------------------------------------------
def time_process(root: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", OPEN_AND_STATUS, str(root), RUN],
                          capture_output=True, text=True, env=_env())
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return elapsed, proc.stdout.strip()


def time_in_process(root: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS, str(root), RUN],
                          capture_output=True, text=True, env=_env())
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.pop("KEEPSTEP_CRASH_AT", None)
    return env


def time_call(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def status_breakdown(run: Any) -> dict[str, float]:
    """Each storage read of the status path, timed alone (median of 3)."""
    from keepstep.engine.report.status import recovery_stop

    s, r, b = run.store, run.run_id, run.branch_id
    head = s.get_head(r, b).version
    reads: dict[str, Callable[[], Any]] = {
        "run.plan (recorded plan + takeover scope)": lambda: run.plan,
        "facts (head, state, leases, budget, statuses)": run.facts,
        "attempt_counts(run)  [status]": lambda: s.attempt_counts(r),
        "attempts(run)  [every row; not on the status path]": lambda: s.attempts(r),
        "orphaned_attempts(run)  [uncommitted attempts; status]": lambda: s.orphaned_attempts(r),
        "orphaned_attempts(run, full=True)  [walks attempt folders; recovery]":
            lambda: s.orphaned_attempts(r, full=True),
        "count_checkpoints": lambda: s.count_checkpoints(r, b),
        "get_checkpoint(head)  [status]": lambda: s.get_checkpoint(r, head, b),
        "list_checkpoints(limit=1)": lambda: s.list_checkpoints(r, b, limit=1),
        "events(alert.*, newest 20)": lambda: s.events(
            r, branch_id=b, kind_prefix="alert.", newest_first=True, limit=20),
        "newest recovery outcome (recovery_stop)": lambda: recovery_stop(run),
        "calls(run)": lambda: s.calls(r),
    }
    return {name: statistics.median(time_call(fn) for _ in range(3))
            for name, fn in reads.items()}


def importtime_check(root: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "keepstep.app.cli.main", "status", str(root),
         "--run", RUN, "--json"], capture_output=True, text=True, env=_env())
    if proc.returncode != 0:
        return f"`keepstep status` failed ({proc.returncode}): {proc.stderr.strip()[-400:]}"
    modules = {line.split("|")[-1].strip().split(".")[0]
               for line in proc.stderr.splitlines() if line.startswith("import time:")}
    total_us = sum(int(line.split("|")[1]) for line in proc.stderr.splitlines()
                   if line.startswith("import time:") and line.split("|")[1].strip().isdigit())
    return (f"`keepstep status --json` imports litellm: {'litellm' in modules}; textual: "
            f"{'textual' in modules}; {len(modules)} top-level packages, cumulative import "
            f"time {total_us / 1e6:.2f} s")


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=1_000)
    ap.add_argument("--long", type=int, default=100_000)
    ap.add_argument("--plans", default="36,10000",
                    help="plan sizes: 36 is the ME-042 pack, anything else is synthetic")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    sys.path.insert(0, str(ROOT))
    from keepstep.engine.api import open_project

    def say(text: str) -> None:
        print(text, flush=True)

    base = Path(tempfile.mkdtemp(prefix="keepstep-bench-", dir=args.dir))
    say(f"keepstep recovery/status bench in {base}; python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs; {args.repeat} repeats, interleaved short/long")
    worst = 0.0
    try:
        for size in (int(x) for x in args.plans.split(",")):
            say(f"\n== plan of {size} units ==")
            projects: dict[str, Path] = {}
            for label, steps in (("short", args.short), ("long", args.long)):
                root = base / f"p{size}-{label}"
                (pack_project(root) if size == 36 else wide_project(root, size))
                t0 = time.perf_counter()
                counts = synthesize_history(root, steps, cycle=min(size, args.short), say=say)
                say(f"  {label:5} history: {counts['checkpoints']:,} checkpoints, "
                    f"{counts['events']:,} events, {counts['attempts']:,} attempts "
                    f"(built in {time.perf_counter() - t0:.1f} s)")
                projects[label] = root
            figures: dict[str, dict[str, list[float]]] = {
                k: {"process": [], "status": [], "decide": []} for k in projects}
            shown: dict[str, str] = {}
            for _ in range(args.repeat):
                for label in ("short", "long"):
                    elapsed, out = time_process(projects[label])
                    figures[label]["process"].append(elapsed)
                    shown[label] = out
                    for key, secs in time_in_process(projects[label]).items():
                        figures[label][key].append(secs)
            say(f"  {'median of ' + str(args.repeat):24} {'short':>11} {'long':>11}   ratio")
            for key, name in (("process", "start → next action"),
                              ("status", "status, in-process"),
                              ("decide", "decision alone")):
                short = statistics.median(figures["short"][key])
                long_ = statistics.median(figures["long"][key])
                ratio = long_ / short
                worst = max(worst, ratio) if key != "status" else worst
                flag = "ok" if ratio <= GOAL else f"over the goal of {GOAL}"
                say(f"  {name:24} {fmt(short)} {fmt(long_)}   {ratio:5.2f}  {flag}")
            for label in ("short", "long"):
                say(f"  next action ({label}): {shown[label]}")
            say("  status path reads, long history (short in brackets):")
            opened = {k: open_project(v) for k, v in projects.items()}
            runs = {k: p.get_run(RUN) for k, p in opened.items()}
            for run in runs.values():  # warm: plan parse, topological order cache, imports
                run.status()
            b_long = status_breakdown(runs["long"])
            b_short = status_breakdown(runs["short"])
            for name, secs in sorted(b_long.items(), key=lambda kv: -kv[1]):
                say(f"    {fmt(secs)}  ({fmt(b_short[name]).strip()})  {name}")
            for p in opened.values():
                p.close()
            say("  " + importtime_check(projects["short"]))
        say(f"\nworst long/short ratio (start → next action, decision): {worst:.2f} "
            f"(goal ≤ {GOAL})")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
