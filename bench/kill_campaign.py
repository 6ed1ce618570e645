"""Kill campaign: random external SIGKILLs of `keepstep run` / `keepstep resume` on copies of
the ME-042 sample pack, with every invariant checked after each kill and at the end of each run.

    python bench/kill_campaign.py [--kills 200] [--seed 7] [--min-delay 0.05] [--max-delay 1.5]

Not a test (it takes minutes): it prints the kills made, the violations found by type, and
the units redone against the units that were in flight when a kill landed. Checked:

- after every kill: the database opens, the checkpoint chain verifies, no budget counter went
  down, no unit has two committed successes;
- at the end of every run: all 36 units current and the run done, and the units executed more
  than once (their model calls span several attempts in the call ledger) are exactly units
  that were in flight when some kill landed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "sample_projects" / "market-entry"
RUN_ID = "ME-042"
APPROVE = "audience=product team"


def _copy_pack(target: Path) -> Path:
    shutil.copytree(PACK, target, ignore=shutil.ignore_patterns(".keepstep", "deliverables",
                                                                 "handover", "*.ipynb"))
    return target


def _command(project: Path, first: bool) -> list[str]:
    verb = "run" if first else "resume"
    return [sys.executable, "-m", "keepstep.app.cli", verb, str(project), "--run", RUN_ID,
            "--approve", APPROVE]


def _facts(project: Path) -> dict:
    """What the invariants need, read through the engine (never by hand-written SQL)."""
    from keepstep.engine import open_project

    with open_project(project) as p:
        if RUN_ID not in p.runs():
            return {"exists": False}
        run = p.get_run(RUN_ID)
        status = run.status()
        chain = run.verify()
        successes = Counter(cp.unit for cp in p.store.list_checkpoints(RUN_ID)
                            if cp.kind == "unit-success")
        in_flight = {a.unit for a in p.store.attempts(RUN_ID) if a.status == "claimed"}
        by_unit: dict[str, set[str]] = {}
        for call in run.calls():
            by_unit.setdefault(call.unit, set()).add(call.attempt_id)
        return {"exists": True, "decision": status.decision, "reasons": status.reasons,
                "current": status.counts["current"],
                "units": len(status.units), "chain_ok": chain.ok,
                "used": dict(status.budget["used"]), "successes": successes,
                "limits": dict(status.budget["limits"]),
                "in_flight": in_flight,
                "redone": {u for u, atts in by_unit.items() if len(atts) > 1}}


def campaign(kills_wanted: int, seed: int, min_delay: float, max_delay: float) -> int:
    rng = random.Random(seed)
    violations: Counter[str] = Counter()
    kills = runs = raises = 0
    redone_total: set[tuple[int, str]] = set()
    in_flight_total: set[tuple[int, str]] = set()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keepstep-kills-") as tmp:
        while kills < kills_wanted:
            runs += 1
            project = _copy_pack(Path(tmp) / f"run-{runs}")
            first, used_before, in_flight = True, {}, set()
            while True:
                proc = subprocess.Popen(_command(project, first), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, cwd=tmp)
                first = False
                try:
                    proc.wait(timeout=rng.uniform(min_delay, max_delay))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                try:
                    facts = _facts(project)
                except Exception as exc:  # the database must open after every kill
                    violations[f"database does not open: {type(exc).__name__}"] += 1
                    break
                if not facts["exists"]:
                    first = True  # killed before the run existed: `run` it again (not resume)
                    continue
                if not facts["chain_ok"]:
                    violations["chain does not verify"] += 1
                for counter, value in used_before.items():
                    if facts["used"].get(counter, 0) < value:
                        violations[f"budget counter {counter} went down"] += 1
                used_before = facts["used"]
                twice = [u for u, n in facts["successes"].items() if n > 1]
                if twice:
                    violations["a unit committed two successes"] += len(twice)
                in_flight |= facts["in_flight"]
                if proc.returncode == 0 and facts["decision"] == "done":
                    break
                reasons = " ".join(facts["reasons"])
                if proc.returncode != -signal.SIGKILL and "recoveries" in reasons:
                    # Many kills use up the recovery budget (a circuit breaker by design): do
                    # what a person would, record a raise, and go on.
                    raises += 1
                    limit = int(facts["used"].get("recoveries", 0)) + 10
                    subprocess.run([sys.executable, "-m", "keepstep.app.cli", "budget", "raise",
                                    str(project), "--run", RUN_ID, "--recoveries", str(limit),
                                    "--reason", "kill campaign"], check=True,
                                   capture_output=True, cwd=tmp)
                    continue
                if proc.returncode != -signal.SIGKILL and "budget limit reached" in reasons:
                    # Every call cut off by a kill is charged (the provider may have billed
                    # it), so hundreds of kills spend the calls and tokens budget: a person
                    # would raise it, and so does the campaign.
                    raises += 1
                    doubled = {c: str(2 * int(max(facts["used"].get(c, 0) or 0,
                                                  facts["limits"].get(c) or 0)))
                               for c in ("calls", "tokens")}
                    subprocess.run([sys.executable, "-m", "keepstep.app.cli", "budget", "raise",
                                    str(project), "--run", RUN_ID, "--calls", doubled["calls"],
                                    "--tokens", doubled["tokens"],
                                    "--reason", "kill campaign"], check=True,
                                   capture_output=True, cwd=tmp)
                    continue
                if proc.returncode != -signal.SIGKILL:
                    # It stopped by itself without being done: nothing to kill any more.
                    violations[f"run stopped {facts['decision']} (exit {proc.returncode}): "
                               f"{'; '.join(facts['reasons'])[:200]}"] += 1
                    break
            if facts.get("exists"):
                if facts["current"] != facts["units"]:
                    violations["run ended with units not current"] += 1
                stray = facts["redone"] - in_flight
                if stray:
                    violations["a unit not in flight was redone"] += len(stray)
                redone_total |= {(runs, u) for u in facts["redone"]}
                in_flight_total |= {(runs, u) for u in in_flight}
            print(f"run {runs}: {kills} kills so far, redone {sorted(facts.get('redone', []))}",
                  flush=True)
    elapsed = time.monotonic() - started
    print()
    print(f"kills: {kills} over {runs} runs in {elapsed:.0f} s (seed {seed}); "
          f"{raises} budget raise(s) (recoveries, calls/tokens) recorded on the way")
    print(f"violations: {sum(violations.values())}")
    for kind, n in sorted(violations.items()):
        print(f"  {kind}: {n}")
    print(f"units redone: {len(redone_total)}; units in flight at a kill: {len(in_flight_total)}; "
          f"redone ⊆ in flight: {redone_total <= in_flight_total}")
    return 1 if violations else 0


def main() -> int:
    if os.environ.get("KEEPSTEP_CAMPAIGN_TRACE"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["KEEPSTEP_CAMPAIGN_TRACE"]), exit=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--min-delay", type=float, default=0.3)
    parser.add_argument("--max-delay", type=float, default=6.0)
    args = parser.parse_args()
    return campaign(args.kills, args.seed, args.min_delay, args.max_delay)


if __name__ == "__main__":
    sys.exit(main())
