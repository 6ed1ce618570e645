"""The ME-042 story: the three interruptions, for real, on a copy of the pack.

1. U07 is killed (SIGKILL, a separate executor process) after staging, before commit.
2. The call budget runs out before U21's model call; a recorded decision raises it.
3. After U30 the contract's audience changes; the plan change invalidates exactly
   U27–U30, the gate asks again, and the run finishes under the new plan.

``run_story`` prints each decision and why, and returns the end-state checks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, Field

from keepstep.engine.api import Project, Run, open_project
from keepstep.engine.files.project import load_contract, write_contract

RUN_ID = "ME-042"
NEW_AUDIENCE = "investment committee"
OLD_AUDIENCE = "product team"


class Check(BaseModel):
    name: str
    passed: bool
    detail: str


class StoryResult(BaseModel):
    project: str
    checks: list[Check] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def calls_before(project: Project, unit_id: str) -> int:
    """Model calls the units before ``unit_id`` (in scheduling order) will make offline."""
    from keepstep.engine.core.decide import topo_order

    plan = project.files.plan
    units = plan.unit_map()
    approved = project.files.approved_sources()
    total = 0
    for uid in topo_order(plan):
        if uid == unit_id:
            break
        u = units[uid]
        if u.kind.value == "extract":
            groups = set(u.input_refs("group"))
            total += sum(1 for s in approved.values() if s.group in groups)
        elif u.kind.value in ("verify", "synthesize"):
            total += 1
        elif u.kind.value == "rank":
            total += 2 * (u.max_rounds or 1)
    return total


def _worker(project_dir: Path, *args: str,
            crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("KEEPSTEP_CRASH_AT", None)
    if crash_at:
        env["KEEPSTEP_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "keepstep.engine.drills.worker", str(project_dir), "--run", RUN_ID,
         *args],
        env=env, capture_output=True, text=True, timeout=600,
    )


def run_story(pack: Path, workdir: Path, *, say: Callable[[str], None] = print) -> StoryResult:
    if workdir.exists():
        shutil.rmtree(workdir)
    shutil.copytree(pack, workdir, ignore=shutil.ignore_patterns(".keepstep"))
    with open_project(workdir) as probe:
        limit = calls_before(probe, "U21") + calls_before(probe, "U08") - calls_before(probe, "U07")
    cfg_path = workdir / "keepstep.toml"
    import tomllib

    cfg = tomllib.loads(cfg_path.read_text())
    cfg.setdefault("budget", {})["calls"] = limit
    cfg_path.write_text(tomli_w.dumps(cfg))
    say(f"ME-042 story in {workdir} (offline heuristic model; call budget set to {limit}: "
        "exactly what U01–U20 need, counting U07 twice)")

    say("\n[1] run; the executor process is killed (SIGKILL) after U07 stages its output and "
        "before it commits")
    # Steps 1-3 run one unit at a time (--jobs 1 / jobs=1): the kill must find U07 alone in
    # flight, the exact call budget must run out at U21, and nothing past U30 may run under
    # the old plan. Steps 4-5 run at the project's max_parallel.
    proc = _worker(workdir, "--jobs", "1", "--approve", f"audience={OLD_AUDIENCE}",
                   crash_at="unit.after_stage:U07")
    killed = proc.returncode == -signal.SIGKILL
    say(f"    executor exit: {'killed by SIGKILL' if killed else proc.returncode}")

    project = open_project(workdir)
    run = project.get_run(RUN_ID)
    say("\n[2] resume with a new executor: recovery audits, fences the dead lease, quarantines "
        "the orphan; the run continues until the budget stops it")
    st = run.run(approve={"audience": OLD_AUDIENCE}, on_event=_printer(say), jobs=1)
    say(f"    stopped: {st.decision} — {'; '.join(st.reasons)}")
    say(f"    next action: {st.next_action}")

    say("\n[3] a recorded budget decision raises the call limit; resume")
    run.raise_budget(calls=200, reason="ME-042: client approved more model calls",
                     who="consultant")
    st = run.run(approve={"audience": OLD_AUDIENCE}, stop_after={"U30"}, on_event=_printer(say),
                 jobs=1)
    say(f"    paused after U30 as the story asks (head {st.head_version})")

    say(f"\n[4] the contract's audience changes to {NEW_AUDIENCE!r}; preview before deciding")
    contract = load_contract(workdir)
    contract.fields["audience"] = NEW_AUDIENCE
    write_contract(workdir, contract)
    preview = run.preview()
    say("    " + preview.summary)
    for uid, exps in sorted(preview.invalidated.items()):
        for e in exps:
            say(f"      {uid}: {e.render()}")
    st = run.run(on_event=_printer(say))
    say(f"    the plan change is committed ({st.plan_version}); the old approval no longer "
        f"applies: {st.next_action}")

    say(f"\n[5] approve the gate for {NEW_AUDIENCE!r} and resume to the end")
    st = run.run(approve={"audience": NEW_AUDIENCE}, on_event=_printer(say))
    say(f"    {st.decision}: {'; '.join(st.reasons)}")
    result = StoryResult(project=str(workdir), checks=end_state_checks(run))
    say("\nEnd state:")
    for c in result.checks:
        say(f"  {'✓' if c.passed else '✗'} {c.name}: {c.detail}")
    project.close()
    return result


def _printer(say: Callable[[str], None]) -> Callable[[dict[str, Any]], None]:
    def on_event(e: dict[str, Any]) -> None:
        kind = e.get("kind", "")
        if kind == "attempt" and e.get("outcome") != "committed":
            say(f"    {e['attempt']}: {e['outcome']} — {e.get('detail', '')}")
        elif kind.startswith("recovery.") and kind != "recovery.started":
            detail = {k: v for k, v in e.items() if k != "kind" and v not in ([], "", None, 0)}
            say(f"    {kind}: {detail}")

    return on_event


def end_state_checks(run: Run) -> list[Check]:
    """The assertions of ME-042 'What the end state must show', from stored facts."""
    st = run.status()
    store = run.store
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name=name, passed=bool(ok), detail=detail))

    kinds = st.commits_by_kind
    check("41 checkpoint commits", st.checkpoint_commits == 41,
          f"{st.checkpoint_commits} ({kinds})")
    records = run.facts_records()
    current = sorted(u for u, r in records.items() if r.state.value == "succeeded")
    check("36 current unit successes", len(current) == 36 and kinds.get("unit-success") == 40,
          f"{len(current)} current; {kinds.get('unit-success', 0)} unit-success commits")
    invalidated_then = _superseded(run)
    check("4 invalidated successes (U27–U30 under the old plan)",
          invalidated_then == ["U27", "U28", "U29", "U30"], ", ".join(invalidated_then))
    check("1 plan change", kinds.get("plan-change") == 1, str(kinds.get("plan-change", 0)))
    orphans = [o.attempt_id for o in store.orphaned_attempts(run.run_id)]
    check("1 orphan (U07/a1)", orphans == ["U07/a1"], ", ".join(orphans) or "none")
    referenced = any(
        "U07/a1" in str(r.model_dump()) for r in records.values()
    )
    check("the orphan is never referenced downstream", not referenced,
          "no current record names U07/a1" if not referenced else "U07/a1 is referenced")
    by_unit: dict[str, set[str]] = {}
    for c in store.calls(run.run_id):
        by_unit.setdefault(c.unit, set()).add(c.attempt_id)
    again = sorted(u for u, atts in by_unit.items() if len(atts) > 1)
    check("exactly U07, U27–U30 executed more than once (call ledger)",
          again == ["U07", "U27", "U28", "U29", "U30"], ", ".join(again))
    u21 = store.attempts(run.run_id, "U21")
    first_calls = [c for c in store.calls(run.run_id, unit="U21") if c.attempt_id == "U21/a1"]
    check("U21's first attempt made no model call",
          bool(u21) and u21[0].status == "blocked" and not first_calls,
          f"U21/a1 {u21[0].status if u21 else 'missing'}, {len(first_calls)} calls")
    f01 = records.get("U35")
    check("F01 passed", f01 is not None and f01.validators_passed and
          f01.state.value == "succeeded", "audit validators passed" if f01 else "no F01")
    problems = store.artifacts.verify(store.manifest(run.run_id))
    deliverables = [n for r in records.values() for n in r.outputs
                    if n in run.plan.plan.deliverables]
    check("5 deliverables present with hashes matching the manifest",
          len(set(deliverables)) == 5 and not problems,
          f"{sorted(set(deliverables))}; {len(problems)} hash problems")
    check("run is done", st.decision == "done", st.decision)
    return checks


def _superseded(run: Run) -> list[str]:
    """Units that had a success which a later plan change invalidated."""
    out = set()
    for cp in run.store.list_checkpoints(run.run_id, kinds=["plan-change", "input-change"]):
        for key, value in cp.delta.items():
            if key.startswith("unit:") and value and value.get("state") == "invalidated":
                out.add(key[5:])
    return sorted(out)
