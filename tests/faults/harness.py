"""The fault-suite driver: one function, ``run_case(case, ...)``, for every row of the table.

For a case it copies a prepared project (the small plan of faults/plan.toml over source
groups A-C of the ME-042 pack), runs executor processes with the case's injections (real
SIGKILLs and SIGSTOPs, forked by the zygote), acts between them like a person or a broken
disk would, resumes with fresh processes, then checks, from stored facts:

- the end state, and the units executed more than once (call ledger, attempt folders,
  checkpoints) against the expected set;
- that orphans never reach downstream (no current record, manifest row or consumed hash
  comes from an uncommitted attempt) and no ``.tmp`` file is ever promoted;
- that a stale executor never commits (every unit commit is its attempt's, with its token);
- that a unit is committed at most once per invalidation, and the budget's call counter
  equals the call ledger (never reset, never double counted);
- the case's own checks (webhook counts, an old approval not reused, …).

The actions between processes are in faults/actions.py, the checks in faults/checks.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from keepstep.engine.api import Project, open_project
from tests.support.fake_provider import MODEL, FakeProvider

from .actions import Actions, Snapshot
from .checks import (
    CaseFailed,
    check_budget_matches_ledger,
    check_commits_bounded,
    check_no_dup,
    check_orphans_isolated,
    check_stale_never_commits,
    expect,
    named_check,
    reexecuted,
)
from .steps import AUDIENCE, RUN, Case, Do, Pre, Worker
from .zygote import Zygote

HERE = Path(__file__).resolve().parent
PACK = HERE.parents[1] / "sample_projects" / "market-entry"
PLAN = HERE / "plan.toml"
GROUPS = ("A", "B", "C")
CONFIG: dict[str, Any] = {
    "name": "fault-suite",
    "default_model": "local/keepstep-offline",
    # The 48 cases count crash points and calls in plan order: one unit at a time (the
    # parallel cases are in tests/faults/test_parallel_faults.py).
    "max_parallel": 1,
    "budget": {"calls": 200, "tokens": 1_000_000, "cost": 5.0, "retries": 50,
               "recoveries": 50},
    "policy": {"lease_seconds": 30.0, "heartbeat_seconds": 10.0, "max_unit_retries": 2,
               "max_recoveries": 5, "recovery_cooldown_s": 5.0,
               "stall_no_commit_s": 1800.0, "stall_repeated_errors": 3},
}


# -- templates ---------------------------------------------------------------------------------
def write_config(root: Path, **sections: dict[str, Any]) -> None:
    path = root / "keepstep.toml"
    cfg = tomllib.loads(path.read_text())
    for key, value in sections.items():
        if isinstance(value, dict):
            cfg.setdefault(key, {}).update(value)
        else:
            cfg[key] = value
    path.write_text(tomli_w.dumps(cfg))


def make_fresh(dest: Path) -> Path:
    """The small project: plan.toml of this folder, groups A-C of the pack, no state."""
    dest.mkdir(parents=True)
    shutil.copy(PACK / "contract.md", dest / "contract.md")
    shutil.copytree(PACK / "templates", dest / "templates")
    shutil.copytree(PACK / "data", dest / "data")  # the pack's vocabulary its kinds read
    (dest / "sources").mkdir()
    sources = tomllib.loads((PACK / "sources.toml").read_text())
    sources["source"] = [s for s in sources["source"] if s["group"] in GROUPS]
    for s in sources["source"]:
        shutil.copy(PACK / s["path"], dest / s["path"])
    (dest / "sources.toml").write_text(tomli_w.dumps(sources))
    (dest / "keepstep.toml").write_text(tomli_w.dumps(CONFIG))
    shutil.copy(PLAN, dest / "plan.toml")
    return dest


class Templates:
    """Prepared projects, built once per session and copied per case."""

    def __init__(self, root: Path, zygote: Zygote) -> None:
        self.root = root
        self.zygote = zygote
        self.fresh = make_fresh(root / "fresh")
        self._cache: dict[str, Path] = {}
        self.done = self.prepared(Pre("done"), ())

    def prepared(self, pre: Pre, setup: tuple[Do, ...]) -> Path:
        key = f"{pre!r}|{setup!r}"
        if key not in self._cache:
            target = self.root / f"pre-{len(self._cache)}"
            shutil.copytree(self.fresh, target)
            for action in setup:
                apply_setup(target, action)
            units = None if pre.base == "done" else pre.max_units
            if pre.base == "done" or units:
                code, _out, err = run_worker(self.zygote, target, Worker(max_units=units),
                                             target.parent / f"{target.name}.log")
                expect(code == 0, f"preparing {pre}: worker exited {code}: {err[-2000:]}")
            if pre.base == "done" and pre.max_units:
                raise ValueError("a 'done' pre-state takes no max_units")
            self._cache[key] = target
        return self._cache[key]


def copy_project(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


# -- worker processes ----------------------------------------------------------------------------
def worker_argv(root: Path, w: Worker, *, marker: Path | None = None,
                webhook: str | None = None) -> list[str]:
    argv = [str(root), "--run", RUN]
    if w.approve is not None:
        argv += ["--approve", f"audience={w.approve}"]
    if w.stop_after:
        argv += ["--stop-after", w.stop_after]
    if w.max_units is not None:
        argv += ["--max-units", str(w.max_units)]
    if w.lease is not None:
        argv += ["--lease-seconds", str(w.lease)]
    if w.rules:
        argv += ["--call-rules", json.dumps([
            {"unit": r.unit, "do": r.do, "call": r.call, "seconds": r.seconds,
             "marker": str(marker) if marker else None} for r in w.rules])]
    if w.pause_at:
        argv += ["--pause-at", w.pause_at, "--marker", str(marker)]
    if w.disk_full:
        argv += ["--disk-full", w.disk_full]
    if webhook:
        argv += ["--webhook", webhook]
    return argv


def worker_env(zygote: Zygote, w: Worker) -> dict[str, str]:
    env = dict(zygote.env)
    if w.crash_at:
        env["KEEPSTEP_CRASH_AT"] = w.crash_at
    return env


def run_worker(zygote: Zygote, root: Path, w: Worker, log: Path) -> tuple[int, str, str]:
    pid = zygote.spawn(worker_argv(root, w), env=worker_env(zygote, w),
                       stdout=log.with_suffix(".out"), stderr=log.with_suffix(".err"))
    code = zygote.wait(pid)
    return code, log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()


@dataclass
class WorkerRun:
    n: int
    spec: Worker
    pid: int
    out: Path
    err: Path
    marker: Path | None
    code: int | None = None

    @property
    def stdout(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    @property
    def stderr(self) -> str:
        return self.err.read_text() if self.err.exists() else ""

    @property
    def status(self) -> dict[str, Any] | None:
        for line in reversed(self.stdout.splitlines()):
            if line.startswith('{"status"'):
                return json.loads(line)["status"]
        return None


# -- setup ------------------------------------------------------------------------
def _set_unit_field(root: Path, unit: str, key: str, value: Any) -> None:
    plan = tomllib.loads((root / "plan.toml").read_text())
    for u in plan["unit"]:
        if u["id"] == unit:
            u[key] = value
    (root / "plan.toml").write_text(tomli_w.dumps(plan))


def apply_setup(root: Path, action: Do) -> None:
    """Edits made before the run starts (budget limits only count at run creation)."""
    name, args = action.action, action.args
    if name == "budget":
        write_config(root, budget={args[0]: float(args[1])})
    elif name == "policy":
        write_config(root, policy={args[0]: args[1]})
    elif name == "unit_field":
        _set_unit_field(root, args[0], args[1], args[2])
    elif name == "gate_expires_days":
        plan = tomllib.loads((root / "plan.toml").read_text())
        plan["gate"][0]["expires_days"] = float(args[0])
        (root / "plan.toml").write_text(tomli_w.dumps(plan))
    else:
        raise ValueError(f"unknown setup action {action}")


# -- the driver --------------------------------------------------------------------------------
class CaseRun(Actions):
    def __init__(self, case: Case, workdir: Path, zygote: Zygote, templates: Templates) -> None:
        self.case = case
        self.workdir = workdir
        self.zygote = zygote
        self.provider: FakeProvider | None = None
        self.webhook: Any = None
        self.workers: list[WorkerRun] = []
        self.named: dict[str, WorkerRun] = {}
        self.snap = Snapshot()
        self.log: list[str] = []
        if case.provider is not None:
            if case.pre.max_units:
                raise ValueError(f"{case.id}: a provider case starts from a fresh project")
            # Every answer is what local/keepstep-offline would say, so the run can finish
            # once the scripted fault is gone.
            self.provider = FakeProvider(rules=case.provider, offline=True).start()
        base = templates.fresh if case.provider is not None else \
            templates.prepared(case.pre, case.setup)
        self.root = copy_project(base, workdir / "project")
        if case.provider is not None:
            for action in case.setup:
                apply_setup(self.root, action)
            write_config(self.root, default_model=MODEL, api_base=self.provider.api_base)
        if case.webhook:
            from tests.support.webhook_server import WebhookServer

            self.webhook = WebhookServer().start()

    def close(self) -> None:
        for w in self.workers:
            if w.code is None and self.zygote.poll(w.pid) is None:
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(w.pid, sig)
                    except ProcessLookupError:
                        pass
                try:
                    self.zygote.wait(w.pid, 10)
                except TimeoutError:
                    pass
        if self.provider is not None:
            self.provider.stop()
        if self.webhook is not None:
            self.webhook.stop()

    # -- facts --------------------------------------------------------------------------------
    @contextmanager
    def project(self) -> Iterator[Project]:
        p = open_project(self.root, executor_id="fault-suite-inspector")
        try:
            yield p
        finally:
            p.close()

    @property
    def last(self) -> WorkerRun:
        return self.workers[-1]

    # -- steps -----------------------------------------------------------------------------------
    def run(self) -> None:
        for step in self.case.steps:
            self.log.append(str(step))
            if isinstance(step, Worker):
                self.start(step)
            else:
                self.act(step)
        expect(not any(w.code is None for w in self.workers),
               f"{self.case.id}: a background worker was never joined")

    def start(self, w: Worker) -> WorkerRun:
        n = len(self.workers) + 1
        marker = self.workdir / f"w{n}.marker"
        out, err = self.workdir / f"w{n}.out", self.workdir / f"w{n}.err"
        url = self.webhook.url if self.webhook is not None else None
        pid = self.zygote.spawn(worker_argv(self.root, w, marker=marker, webhook=url),
                                env=worker_env(self.zygote, w), stdout=out, stderr=err)
        run = WorkerRun(n, w, pid, out, err, marker)
        self.workers.append(run)
        if w.name:
            self.named[w.name] = run
        else:
            self.finish(run)
        return run

    def finish(self, run: WorkerRun, timeout: float = 120.0) -> None:
        run.code = self.zygote.wait(run.pid, timeout)
        wanted = {"exit": 0, "killed": -signal.SIGKILL, "error": 2}[run.spec.expect]
        expect(run.code == wanted,
               f"{self.case.id}: worker {run.n} exited {run.code}, expected {run.spec.expect}"
               f"\n--- stderr ---\n{run.stderr[-3000:]}\n--- stdout ---\n{run.stdout[-1500:]}")

    def act(self, step: Do) -> None:
        name, args = step.action, step.args
        fn = getattr(self, f"do_{name}", None)
        if fn is None:
            raise ValueError(f"{self.case.id}: unknown action {name!r}")
        fn(*args)

    # -- observing -------------------------------------------------------------------------------
    def observed_state(self) -> str:
        last = self.last
        if last.code == 2:
            return "refused:schema" if "schema" in last.stderr else "refused"
        with self.project() as p:
            store = p.store
            rec_events = store.events(RUN, kind_prefix="recovery.", newest_first=True, limit=1)
            if rec_events and rec_events[0].kind in ("recovery.failed", "recovery.blocked"):
                return "refused:recovery"
            status = p.get_run(RUN).status()
            if status.decision == "done":
                return "done"
            statuses = store.unit_statuses(RUN)
            failed = sorted(u for u, s in statuses.items() if s.status == "failed")
            if failed:
                return "failed:" + ",".join(failed)
            kinds = sorted({s.details.get("kind") or ("effect" if s.details.get("effect")
                                                       else "other")
                            for s in statuses.values() if s.status == "blocked"})
            if kinds:
                return "blocked:" + ",".join(kinds)
            if status.pending_approvals:
                return "blocked:approval"
            return status.decision

    def refusal_text(self) -> str:
        last = self.last
        text = last.stderr
        if last.code != 2:
            with self.project() as p:
                evs = p.store.events(RUN, kind_prefix="recovery.", newest_first=True, limit=1)
                text += " ".join(str(e.payload.get("reason", "")) for e in evs)
            status = last.status or {}
            text += " ".join(status.get("reasons", []))
        return text


# -- the checks ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    state: str
    reexec: set[str]
    seconds: float


def run_case(case: Case, workdir: Path, zygote: Zygote, templates: Templates) -> Outcome:
    started = time.monotonic()
    cr = CaseRun(case, workdir, zygote, templates)
    try:
        cr.run()
        state = cr.observed_state()
        expect(state == case.expect, f"{case.id}: end state {state}, expected {case.expect}"
               f"\nsteps: {cr.log}\nlast worker stderr:\n{cr.last.stderr[-3000:]}")
        if case.message:
            text = cr.refusal_text()
            expect(case.message in text, f"{case.id}: the refusal does not say "
                   f"{case.message!r}: {text[-1500:]}")
        if case.expect == "refused:schema":
            for item in case.checks:
                named_check(cr, None, item)  # type: ignore[arg-type]
            return Outcome(state, set(), time.monotonic() - started)
        with cr.project() as p:
            if case.expect.startswith("refused"):
                status = cr.last.status or {}
                expect(status.get("decision") == "blocked",
                       f"{case.id}: the worker reported {status.get('decision')!r} although "
                       "recovery refused")
            got = reexecuted(p)
            expect(got == set(case.reexec), f"{case.id}: re-executed {sorted(got)}, expected "
                   f"{sorted(case.reexec)}")
            check_orphans_isolated(p)
            check_stale_never_commits(p)
            check_commits_bounded(p)
            check_budget_matches_ledger(p)
            chain = p.store.verify_chain(RUN)
            expect(chain.ok == case.chain_ok, f"{case.id}: chain ok={chain.ok}: "
                   f"{[pr.problem for pr in chain.problems]}")
            for item in case.no_dup:
                check_no_dup(cr, p, item)
            for item in case.checks:
                named_check(cr, p, item)
        return Outcome(state, got, time.monotonic() - started)
    finally:
        cr.close()


__all__ = ["AUDIENCE", "CaseFailed", "Outcome", "RUN", "Templates", "run_case"]
