"""Drills: show, on a copy, that a run survives two kills at commit-protocol boundaries.

``drill(project_root, run_id, seed=...)`` copies the project (its files and ``.keepstep``;
the database through SQLite's online backup API, so a live project can be drilled) into a
temporary folder, picks two crash points of the commit protocol with the seed, and runs three
executor processes on the copy: one killed (SIGKILL) at the first point, one at the second,
and a third that recovers and runs to the end. Then it compares what the copy holds with what
must hold:

- the run is done and every unit of the plan is current;
- the units executed more than once are among the units in flight at the kills;
- no unit and no attempt was committed twice, and every commit is its attempt's own (no
  fenced or orphaned attempt, no stale fencing token);
- no current record or manifest row names an orphan attempt;
- the whole checkpoint chain verifies.

A run that is not finished is continued as it stands; a finished run is drilled as a fresh
run ``<run>-drill`` over the same files (there is nothing left in flight to interrupt). Gates
are answered with the contract's audience (or the gate's first option) — in the copy only.
The project's own files and runs are not changed. The copy is removed afterwards, unless the
drill failed or ``keep`` is set: then the report names it.

Workers are started by ``launch(args, crash_at) -> exit code``; the default runs
``python -m keepstep.engine.drills.worker`` as a subprocess (tests pass a faster launcher).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from keepstep.engine.errors import KeepstepError
from keepstep.engine.files.project import STATE_DIR

# The commit protocol's boundaries (DESIGN §5), in order. heartbeat.renew is left out: it is
# only reached when a unit outlasts a heartbeat interval, so a drill could not count on it.
COMMIT_PROTOCOL_POINTS = (
    "claim.before", "claim.after", "unit.before_call", "unit.after_call", "unit.after_stage",
    "unit.after_verify", "commit.before_begin", "commit.inside_txn", "commit.before_commit",
    "commit.after_commit",
)
MAX_OCCURRENCE = 3  # a point is hit at its 1st, 2nd or 3rd occurrence in the worker
WORKER_TIMEOUT_S = 1800.0
KILLED = -9  # a process's exit code after SIGKILL
IN_FLIGHT = ("claimed",)
NOT_COMMITTED = ("fenced", "orphaned")
DB_FILES = ("state.db", "state.db-wal", "state.db-shm")

Launch = Callable[[list[str], str | None], int]


class DrillKill(BaseModel):
    point: str  # "commit.inside_txn@2"
    exit_code: int
    killed: bool
    in_flight: list[str] = Field(default_factory=list)  # units whose attempt the kill cut


class DrillCheck(BaseModel):
    name: str
    passed: bool
    detail: str


class DrillFacts(BaseModel):
    """What the copy holds after the drill; ``judge`` turns it into checks (pure)."""

    units: list[str]
    current: list[str]
    decision: str
    current_before: list[str] = Field(default_factory=list)  # current when the drill began
    worked: dict[str, list[str]] = Field(default_factory=dict)  # unit -> drill attempts that
    # called a model or staged files
    commits: dict[str, list[str]] = Field(default_factory=dict)  # unit -> attempts committed
    # by the drill, one entry per unit commit
    attempt_status: dict[str, str] = Field(default_factory=dict)
    token_mismatch: list[str] = Field(default_factory=list)  # commits whose token is not
    # their attempt's
    orphans: list[str] = Field(default_factory=list)
    referenced: list[str] = Field(default_factory=list)  # attempts current records or
    # manifest rows name
    in_flight: list[str] = Field(default_factory=list)
    chain_ok: bool = True
    chain_problems: list[str] = Field(default_factory=list)
    checkpoints: int = 0

    def re_executed(self) -> list[str]:
        before = set(self.current_before)
        return sorted(u for u, atts in self.worked.items()
                      if len(set(atts)) > 1 or (atts and u in before))


class DrillReport(BaseModel):
    project: str
    run_id: str
    drill_run: str
    mode: str  # "resume": the run as it stood; "fresh": a new run over the same files
    seed: int
    kills: list[DrillKill] = Field(default_factory=list)
    final_exit: int = 0
    decision: str = ""
    re_executed: list[str] = Field(default_factory=list)
    checks: list[DrillCheck] = Field(default_factory=list)
    copy_kept: str | None = None
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def render(self) -> str:
        mode = (f"run {self.run_id} continued" if self.mode == "resume" else
                f"run {self.run_id} is finished: drilled a fresh run {self.drill_run} over "
                "the same files")
        lines = [f"keepstep drill — {mode}, seed {self.seed}, on a copy of {self.project}"]
        for n, k in enumerate(self.kills, start=1):
            what = ("killed (SIGKILL)" if k.killed else
                    f"not reached: the worker exited {k.exit_code}")
            flight = ", ".join(k.in_flight) or "nothing"
            lines.append(f"  kill {n} at {k.point}: {what}; in flight: {flight}")
        lines.append(f"  recovery worker exited {self.final_exit}: {self.decision or '?'}")
        lines.append(f"  re-executed: {', '.join(self.re_executed) or 'none'}")
        for c in self.checks:
            lines.append(f"  {'✓' if c.passed else '✗'} {c.name}: {c.detail}")
        if self.copy_kept:
            lines.append(f"  the copy is kept in {self.copy_kept}")
        lines.append(f"{'PASS' if self.passed else 'FAIL'} ({self.duration_s:.1f} s)")
        return "\n".join(lines)


def judge(facts: DrillFacts) -> list[DrillCheck]:
    """The drill's verdict from the collected facts (no I/O)."""
    checks: list[DrillCheck] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(DrillCheck(name=name, passed=bool(ok), detail=detail))

    missing = [u for u in facts.units if u not in set(facts.current)]
    check("every unit current", facts.decision == "done" and not missing,
          f"{len(facts.units) - len(missing)}/{len(facts.units)} current, run "
          f"{facts.decision}" + (f"; not current: {', '.join(missing)}" if missing else ""))
    again = facts.re_executed()
    outside = sorted(set(again) - set(facts.in_flight))
    check("re-executed units were in flight at a kill", not outside,
          f"{', '.join(again) or 'none'} ⊆ {', '.join(facts.in_flight) or 'nothing'}"
          + (f"; redone without being in flight: {', '.join(outside)}" if outside else ""))
    twice = sorted(u for u, atts in facts.commits.items() if len(atts) > 1)
    dup_attempts = sorted(a for a, n in Counter(a for atts in facts.commits.values()
                                                for a in atts).items() if n > 1)
    check("no duplicate commits", not twice and not dup_attempts,
          "each unit committed at most once" if not (twice or dup_attempts) else
          f"committed more than once: {', '.join(twice + dup_attempts)}")
    stale = sorted(a for atts in facts.commits.values() for a in atts
                   if facts.attempt_status.get(a) != "committed")
    check("no commit by a stale executor", not stale and not facts.token_mismatch,
          "every commit is its attempt's, with its fencing token" if not (
              stale or facts.token_mismatch) else
          f"commits by {', '.join(stale + facts.token_mismatch)}")
    leaked = sorted(set(facts.orphans) & set(facts.referenced))
    check("orphans never referenced", not leaked,
          f"{len(facts.orphans)} orphan attempt(s), none referenced" if not leaked else
          f"referenced orphans: {', '.join(leaked)}")
    check("checkpoint chain verifies", facts.chain_ok,
          f"{facts.checkpoints} checkpoint(s)" if facts.chain_ok else
          "; ".join(facts.chain_problems[:5]))
    return checks


# -- running -----------------------------------------------------------------------------------
def subprocess_launcher(log_dir: Path) -> Launch:
    """Start ``python -m keepstep.engine.drills.worker`` per worker; output goes to log_dir."""
    counter = itertools.count(1)

    def launch(args: list[str], crash_at: str | None) -> int:
        env = dict(os.environ)
        env.pop("KEEPSTEP_CRASH_AT", None)
        if crash_at:
            env["KEEPSTEP_CRASH_AT"] = crash_at
        with open(log_dir / f"worker-{next(counter)}.log", "wb") as log:
            proc = subprocess.run([sys.executable, "-m", "keepstep.engine.drills.worker", *args],
                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=WORKER_TIMEOUT_S, check=False)
        return proc.returncode

    return launch


def copy_project(root: Path, dest: Path) -> Path:
    """The project folder with its state; the database through the online backup API."""
    from keepstep.storage import SQLiteStore

    shutil.copytree(root, dest, ignore=lambda d, names: [
        n for n in names if Path(d) == root / STATE_DIR and (n in DB_FILES or
                                                              n.endswith(".bak"))])
    state = root / STATE_DIR
    if (state / "state.db").is_file():
        (dest / STATE_DIR).mkdir(exist_ok=True)
        src = SQLiteStore(state)
        try:
            src.backup_to(dest / STATE_DIR / "state.db")
        finally:
            src.close()
    return dest


def gate_answers(project_root: Path) -> dict[str, str]:
    from keepstep.engine.files.project import load_project_files

    files = load_project_files(project_root)
    audience = files.contract.audience
    return {g.id: audience if audience in g.options else (g.options[0] if g.options else
                                                          "approve")
            for g in files.plan.gates}


def drill(project_root: str | Path, run_id: str, *, seed: int, workdir: str | Path | None = None,
          launch: Launch | None = None, keep: bool = False) -> DrillReport:
    """Kill a copy of the run twice at seeded commit-protocol boundaries, recover it with a
    third executor, and check the end state (see the module docstring). Raises KeepstepError
    when the project has no such run."""
    from keepstep.engine.api import open_project

    started = time.monotonic()
    root = Path(project_root).resolve()
    with open_project(root) as source:
        if not source.store.run_exists(run_id):
            known = ", ".join(source.runs()) or "none yet"
            raise KeepstepError(f"no run {run_id!r} in {root}", hint=f"runs: {known}")
        finished = source.get_run(run_id).status().decision == "done"
    base = Path(tempfile.mkdtemp(prefix="keepstep-drill-", dir=workdir))
    copy = copy_project(root, base / root.name)
    launch = launch or subprocess_launcher(base)
    drill_run = f"{run_id}-drill" if finished else run_id
    report = DrillReport(project=str(root), run_id=run_id, drill_run=drill_run,
                         mode="fresh" if finished else "resume", seed=seed)
    rng = random.Random(seed)
    points = [f"{p}@{rng.randint(1, MAX_OCCURRENCE)}"
              for p in rng.sample(COMMIT_PROTOCOL_POINTS, 2)]
    args = [str(copy), "--run", drill_run]
    for gate, answer in gate_answers(copy).items():
        args += ["--approve", f"{gate}={answer}"]

    before = _attempts_and_current(copy, drill_run)
    seen = set(before[0])
    for point in points:
        code = launch(args, point)
        flight = _in_flight(copy, drill_run, seen)
        seen |= set(_attempts_and_current(copy, drill_run)[0])
        report.kills.append(DrillKill(point=point, exit_code=code, killed=code == KILLED,
                                      in_flight=flight))
    report.final_exit = launch(args, None)
    facts = _collect(copy, drill_run, before, sorted({u for k in report.kills
                                                      for u in k.in_flight}))
    report.decision = facts.decision
    report.re_executed = facts.re_executed()
    report.checks = judge(facts)
    if report.final_exit != 0:
        report.checks.append(DrillCheck(name="recovery worker", passed=False,
                                        detail=f"exited {report.final_exit}"))
    report.duration_s = round(time.monotonic() - started, 2)
    if keep or not report.passed:
        report.copy_kept = str(copy)
    else:
        shutil.rmtree(base, ignore_errors=True)
    return report


def _attempts_and_current(copy: Path, run_id: str) -> tuple[list[str], list[str]]:
    from keepstep.engine.api import open_project

    with open_project(copy) as p:
        if not p.store.run_exists(run_id):
            return [], []
        attempts = [a.attempt_id for a in p.store.attempts(run_id)]
        current = [u for u, r in p.get_run(run_id).facts_records().items()
                   if r.state.value == "succeeded"]
        return attempts, current


def _in_flight(copy: Path, run_id: str, seen: set[str]) -> list[str]:
    """Units whose attempt the last kill cut: claimed or staged, and new since the last look
    (the previous killed worker's attempts are fenced by the next worker's recovery)."""
    from keepstep.engine.api import open_project

    with open_project(copy) as p:
        if not p.store.run_exists(run_id):
            return []
        return sorted({a.unit for a in p.store.attempts(run_id)
                       if a.status in IN_FLIGHT and a.attempt_id not in seen})


def _collect(copy: Path, run_id: str, before: tuple[list[str], list[str]],
             in_flight: list[str]) -> DrillFacts:
    from keepstep.engine.api import open_project

    known_before = set(before[0])
    with open_project(copy) as p:
        store = p.store
        run = p.get_run(run_id)
        records = run.facts_records()
        attempts = {a.attempt_id: a for a in store.attempts(run_id)}
        worked: dict[str, set[str]] = defaultdict(set)
        for c in store.calls(run_id):
            if c.attempt_id not in known_before:
                worked[c.unit].add(c.attempt_id)
        for unit, attempt_id, _dir, files in store.artifacts.attempt_dirs(run_id):
            if files and attempt_id in attempts and attempt_id not in known_before:
                worked[unit].add(attempt_id)
        commits: dict[str, list[str]] = defaultdict(list)
        mismatch = []
        for cp in store.list_checkpoints(run_id, kinds=["unit-success"]):
            if cp.attempt in known_before or not cp.unit or not cp.attempt:
                continue
            commits[cp.unit].append(cp.attempt)
            att = attempts.get(cp.attempt)
            if att is None or att.fencing_token != cp.fencing_token:
                mismatch.append(cp.attempt)
        orphans = {o.attempt_id for o in store.orphaned_attempts(run_id)} | {
            a for a, att in attempts.items() if att.status in NOT_COMMITTED}
        referenced = {r.attempt for r in records.values()} | {
            e.attempt_id for e in store.manifest(run_id)}
        chain = store.verify_chain(run_id)
        return DrillFacts(
            units=[u.id for u in run.plan.units],
            current=sorted(u for u, r in records.items() if r.state.value == "succeeded"),
            decision=run.status().decision, current_before=before[1],
            worked={u: sorted(a) for u, a in worked.items()},
            commits=dict(commits), attempt_status={a: att.status for a, att in attempts.items()},
            token_mismatch=mismatch, orphans=sorted(orphans), referenced=sorted(referenced),
            in_flight=in_flight, chain_ok=chain.ok, checkpoints=chain.checked,
            chain_problems=[f"v{pr.version}: {pr.problem}" for pr in chain.problems],
        )


__all__ = ["COMMIT_PROTOCOL_POINTS", "DrillCheck", "DrillFacts", "DrillKill", "DrillReport",
           "copy_project", "drill", "judge", "subprocess_launcher"]
