"""What realistic model answers cost keepstep: the ME-042 pack against a local model server.

Two runs side by side, in one process, on fresh copies of the pack, with
``openai/gpt-4o-mini`` pointed at tests/support/model_server.py (a dummy key, real litellm
calls over loopback, usage priced by litellm):

- ``clean``: every answer well-formed — the minimum (each call once, with a valid answer);
- ``mixed``: realistic formatting — clean, fenced and prose answers in turn, 1 answer in 9
  invalid (no JSON, wrong keys, or cut off), one 429.

It prints, for each: calls paid (answers the server gave), revise rounds, rejected answers,
tokens, cost, and the ratio paid(mixed) / minimum (goal ≤ 1.15). Then the prompt tokens per
kind of request (extract, verify, synthesize, rank, check, render, support) of the pack run
offline (the default model), read from the call ledger and each call's recorded prompt name,
and of the clean run (the server's reported prompt tokens per INPUT task).

    python bench/real_model.py [--every 9] [--keep DIR]

Not a test: it prints figures and the ratio against the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The model server is a test helper (tests/support); the bench runs from the repo.
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")

from keepstep.engine.api import open_project  # noqa: E402
from keepstep.engine.gateway.call_ledger import parse_artifact_ref  # noqa: E402
from keepstep.engine.gateway.prompts import read_input_block  # noqa: E402
from tests.support.model_server import running_server  # noqa: E402
from tests.support.small_project import write_config  # noqa: E402

GOAL = 1.15
MODEL = "openai/gpt-4o-mini"
PACK = REPO / "sample_projects" / "market-entry"


def run_pack(workdir: Path, mode: str, every: int) -> dict[str, Any]:
    root = workdir / mode
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    with running_server(mode, every=every) as server:
        write_config(root, default_model=MODEL, api_base=server.api_base)
        started = time.perf_counter()
        with open_project(root) as project:
            status = project.start_run("ME-042").run(approve={"audience": "product team"})
            run = project.get_run("ME-042")
            calls = run.calls()
            budget = project.store.get_budget("ME-042").used
            revisions = sum(int(r.facts.get("revise_rounds", 0))
                            for r in run.facts_records().values())
        seconds = time.perf_counter() - started
        hows = Counter(e["how"] for e in server.log)
        by_task = server_tokens_by_task(server.log)
    outcomes = Counter(c.outcome for c in calls)
    return {
        "mode": mode, "decision": status.decision, "paid": len(server.answered()),
        "rows": len(calls), "rejected": outcomes["invalid_output"],
        "rate_limited": outcomes["rate_limited"], "reused": outcomes["reused"],
        "revise_rounds": revisions, "tokens": int(budget.get("tokens", 0)),
        "cost": float(budget.get("cost", 0.0)), "seconds": seconds, "hows": dict(hows),
        "by_task": by_task,
    }


def offline_tokens_by_kind(workdir: Path) -> tuple[dict[str, int], dict[str, int], str]:
    """The offline ME-042 run: prompt tokens and calls per request kind (the prompt each
    ledger row's recorded answer names), and the run's decision."""
    root = workdir / "offline"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    tokens: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    with open_project(root) as project:
        status = project.start_run("ME-042").run(approve={"audience": "product team"})
        artifacts = project.store.artifacts.root
        for c in project.get_run("ME-042").calls():
            ref = parse_artifact_ref(c.response_artifact)
            kind = json.loads((artifacts / ref[0]).read_text())["prompt"] if ref else "?"
            tokens[kind] += c.tokens_in
            calls[kind] += 1
    return dict(tokens), dict(calls), status.decision


def server_tokens_by_task(log: list[dict[str, Any]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for e in log:
        payload = read_input_block(e["messages"]) or {}
        out[str(payload.get("task", "?"))] += int(e.get("prompt_tokens") or 0)
    return dict(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=9, help="1 answer in N is invalid")
    parser.add_argument("--keep", type=Path, help="keep the two project copies here")
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-keepstep-dummy-0000")
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="keepstep-bench-real-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        clean = run_pack(workdir, "clean", args.every)
        mixed = run_pack(workdir, "mixed", args.every)
        offline, offline_calls, offline_decision = offline_tokens_by_kind(workdir)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"ME-042 pack, {MODEL} against the local model server (1 answer in {args.every} "
          "invalid in mixed mode)")
    header = (f"{'mode':<6} {'result':<8} {'paid':>5} {'rejected':>8} {'revise':>6} "
              f"{'429':>4} {'tokens':>8} {'cost $':>9} {'seconds':>8}")
    print(header)
    for r in (clean, mixed):
        print(f"{r['mode']:<6} {r['decision']:<8} {r['paid']:>5} {r['rejected']:>8} "
              f"{r['revise_rounds']:>6} {r['rate_limited']:>4} {r['tokens']:>8} "
              f"{r['cost']:>9.5f} {r['seconds']:>8.1f}")
    print(f"mixed answers written as: {mixed['hows']}")
    kinds = sorted(set(offline) | set(clean["by_task"]))
    print(f"prompt tokens per kind (offline run: {offline_decision}; clean run against the "
          "server):")
    print(f"{'kind':<11} {'offline':>9} {'calls':>6} {'clean':>9}")
    for k in kinds:
        print(f"{k:<11} {offline.get(k, 0):>9} {offline_calls.get(k, 0):>6} "
              f"{clean['by_task'].get(k, 0):>9}")
    print(f"{'total':<11} {sum(offline.values()):>9} {sum(offline_calls.values()):>6} "
          f"{sum(clean['by_task'].values()):>9}")
    ratio = mixed["paid"] / clean["paid"] if clean["paid"] else float("inf")
    verdict = "meets" if ratio <= GOAL and mixed["decision"] == "done" else "MISSES"
    print(f"calls paid / minimum = {mixed['paid']} / {clean['paid']} = {ratio:.3f} "
          f"({verdict} the goal of ≤ {GOAL}); tokens × {mixed['tokens'] / clean['tokens']:.3f}, "
          f"cost × {mixed['cost'] / clean['cost']:.3f}")
    return 0 if verdict == "meets" else 1


if __name__ == "__main__":
    sys.exit(main())
