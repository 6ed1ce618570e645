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

Project files are read and edited with the engine's own loaders; the database is only ever
touched directly to simulate damage (a broken hash, a foreign schema version).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import stat
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from keepstep.engine.project import Project, open_project
from keepstep.engine.project_files import load_contract, write_contract
from keepstep.storage import SCHEMA_VERSION
from keepstep.storage.hashing import file_sha256

from .child import EFFECT_ACTION
from .provider import MODEL, FaultProvider
from .steps import AUDIENCE, Case, Do, Pre, Worker
from .zygote import Zygote

HERE = Path(__file__).resolve().parent
PACK = HERE.parents[1] / "sample_projects" / "market-entry"
PLAN = HERE / "plan.toml"
RUN = "F1"
GROUPS = ("A", "B", "C")
CONFIG: dict[str, Any] = {
    "name": "fault-suite",
    "default_model": "local/keepstep-offline",
    "budget": {"calls": 200, "tokens": 1_000_000, "cost": 5.0, "retries": 50,
               "recoveries": 50},
    "policy": {"lease_seconds": 30.0, "heartbeat_seconds": 10.0, "max_unit_retries": 2,
               "max_recoveries": 5, "recovery_cooldown_s": 5.0,
               "stall_no_commit_s": 1800.0, "stall_repeated_errors": 3},
}


class CaseFailed(AssertionError):
    pass


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise CaseFailed(message)


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


# -- setup and injections ------------------------------------------------------------------------
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


def _writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


@contextmanager
def raw_db(root: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection, the way damage or a foreign keepstep would touch the file."""
    conn = sqlite3.connect(root / ".keepstep" / "state.db", isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


@dataclass
class Snapshot:
    calls: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    head: int = 0
    used: dict[str, float] = field(default_factory=dict)
    posts: int = 0
    db_sha: str = ""


# -- the driver --------------------------------------------------------------------------------
class CaseRun:
    def __init__(self, case: Case, workdir: Path, zygote: Zygote, templates: Templates) -> None:
        self.case = case
        self.workdir = workdir
        self.zygote = zygote
        self.provider: FaultProvider | None = None
        self.webhook: Any = None
        self.workers: list[WorkerRun] = []
        self.named: dict[str, WorkerRun] = {}
        self.snap = Snapshot()
        self.log: list[str] = []
        if case.provider is not None:
            if case.pre.max_units:
                raise ValueError(f"{case.id}: a provider case starts from a fresh project")
            self.provider = FaultProvider(case.provider).start()
        base = templates.fresh if case.provider is not None else \
            templates.prepared(case.pre, case.setup)
        self.root = copy_project(base, workdir / "project")
        if case.provider is not None:
            for action in case.setup:
                apply_setup(self.root, action)
            write_config(self.root, default_model=MODEL, api_base=self.provider.api_base)
        if case.webhook:
            from webhook_server import WebhookServer

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

    def _wait_marker(self, run: WorkerRun, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not (run.marker and run.marker.exists()):
            expect(self.zygote.poll(run.pid) is None,
                   f"{self.case.id}: worker {run.n} ended before reaching its hook:\n"
                   f"{run.stderr[-2000:]}")
            expect(time.monotonic() < deadline, f"{self.case.id}: no marker from worker {run.n}")
            time.sleep(0.01)

    def _wait_stopped(self, run: WorkerRun) -> None:
        self._wait_marker(run)
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{run.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            expect(time.monotonic() < deadline, f"worker {run.n} did not stop")
            time.sleep(0.01)

    def snapshot(self) -> Snapshot:
        with self.project() as p:
            store = p.store
            attempts = Counter(a.unit for a in store.attempts(RUN))
            snap = Snapshot(calls=len(store.calls(RUN)), attempts=dict(attempts),
                            head=store.get_head(RUN).version,
                            used=dict(store.get_budget(RUN).used))
        snap.posts = self.webhook.posts if self.webhook is not None else 0
        return snap

    def act(self, step: Do) -> None:
        name, args = step.action, step.args
        fn = getattr(self, f"do_{name}", None)
        if fn is None:
            raise ValueError(f"{self.case.id}: unknown action {name!r}")
        fn(*args)

    # background workers
    def do_kill_when_marked(self, worker: str) -> None:
        run = self.named[worker]
        self._wait_marker(run)
        os.kill(run.pid, signal.SIGKILL)
        self.finish(run)

    def do_wait_stopped(self, worker: str) -> None:
        self._wait_stopped(self.named[worker])

    def do_wake(self, worker: str) -> None:
        os.kill(self.named[worker].pid, signal.SIGCONT)

    def do_join(self, worker: str) -> None:
        self.finish(self.named[worker])

    def do_wait_lease_expiry(self) -> None:
        with self.project() as p:
            leases = p.store.leases(RUN)
        expect(bool(leases), f"{self.case.id}: no lease to wait for")
        time.sleep(max(0.0, max(le.expires_at for le in leases) - time.time()) + 0.1)

    def do_sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # artifacts and files
    def _output(self, unit: str, name: str) -> Path:
        with self.project() as p:
            rec = p.run(RUN).facts_records()[unit]
            return p.store.artifacts.root / rec.outputs[name].path

    def do_delete_artifact(self, unit: str, name: str) -> None:
        self._output(unit, name).unlink()

    def do_flip_byte(self, unit: str, name: str) -> None:
        path = self._output(unit, name)
        _writable(path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x20
        path.write_bytes(bytes(data))

    def do_plant_orphan(self, unit: str, attempt: str) -> None:
        d = self.root / ".keepstep" / "artifacts" / RUN / unit / attempt
        d.mkdir(parents=True)
        (d / "evidence.json").write_text('{"evidence": [], "planted": "stray attempt folder"}\n')

    def do_plant_partial(self, unit: str) -> None:
        """A torn write: truncated temporary files in the unit's uncommitted attempt."""
        with self.project() as p:
            attempt = [a for a in p.store.attempts(RUN, unit) if a.status != "committed"][-1]
            d = p.store.artifacts.attempt_dir(RUN, attempt.attempt_id)
        (d / "calls").mkdir(parents=True, exist_ok=True)
        (d / "evidence.json.tmp").write_bytes(b'{"evidence": [{"id": "C1-e1", "quo')
        (d / "calls" / "r1-002.json.tmp").write_bytes(b'{"content": "{\\"evid')

    def do_edit_source(self, sid: str) -> None:
        path = next((self.root / "sources").glob(f"{sid}-*.md"))
        path.write_text(path.read_text() + "\nA 2025 survey found that 41 percent of "
                        "households would pay 3 euros a month for leak alerts.\n")

    def do_revoke_source(self, sid: str) -> None:
        data = tomllib.loads((self.root / "sources.toml").read_text())
        for s in data["source"]:
            if s["id"] == sid:
                s["approved"] = False
        (self.root / "sources.toml").write_text(tomli_w.dumps(data))

    def do_add_source(self, sid: str, group: str) -> None:
        rel = f"sources/{sid}-tender-results.md"
        (self.root / rel).write_text(
            "# Tender results 2025\n\nIn 2025 utilities awarded 7 meter tenders worth 48 "
            "million euros in total.\n\nThe largest tender covered 120000 connections.\n")
        data = tomllib.loads((self.root / "sources.toml").read_text())
        data["source"].append({"id": sid, "path": rel, "group": group, "approved": True,
                               "title": "Tender results 2025", "kind": "market report"})
        (self.root / "sources.toml").write_text(tomli_w.dumps(data))

    def do_set_contract(self, key: str, value: str) -> None:
        contract = load_contract(self.root)
        contract.fields[key] = value
        write_contract(self.root, contract)

    def do_edit_template(self, name: str) -> None:
        path = self.root / "templates" / f"{name}.md"
        path.write_text(path.read_text() + "\nTypo fixed: 'recieved' now reads 'received'.\n")

    def do_record_output_change(self, unit: str, edge: str) -> None:
        """A person records that ``unit``'s committed output changed in one aspect (content:
        its claims; presentation: only its format). The engine computes this kind of change
        (``unit_output_changed`` + ``invalidate``) but has no command that records one, so
        the harness commits it as recovery commits a repair: invalidated records, one
        checkpoint, a ``decision.repair`` event."""
        from keepstep.engine.changes import unit_output_changed
        from keepstep.engine.invalidation import invalidate
        from keepstep.engine.plan import EdgeType
        from keepstep.engine.state import UnitState, unit_key
        from keepstep.storage import EventIn

        with self.project() as p:
            run = p.run(RUN)
            change = unit_output_changed(unit, EdgeType(edge), f"{unit}'s output changed "
                                         f"({edge})")
            records = run.facts_records()
            result = invalidate(run.plan, [change], records)
            delta: dict[str, Any] = {}
            for uid, exps in result.affected.items():
                rec = records[uid].model_copy(update={"state": UnitState.invalidated,
                                                      "explanations": exps})
                delta[unit_key(uid)] = rec.model_dump(mode="json")
            delta["budget"] = p.store.get_budget(RUN).used
            p.store.commit_checkpoint(
                RUN, "main", p.store.get_head(RUN).version, delta, kind="repair",
                events=[EventIn(kind="decision.repair", payload={
                    "changes": [change.model_dump(mode="json")],
                    "invalidated": sorted(result.affected), "who": "fault suite"})])

    # the database
    def do_break_parent_hash(self) -> None:
        with raw_db(self.root) as conn:
            head = conn.execute("SELECT head_version FROM branches WHERE run_id = ?",
                                [RUN]).fetchone()[0]
            conn.execute("UPDATE checkpoints SET parent_hash = ? WHERE run_id = ? AND "
                         "version = ?", ["0" * 64, RUN, head])

    def do_stamp_newer_schema(self) -> None:
        with raw_db(self.root) as conn:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        self.snap.db_sha = file_sha256(str(self.root / ".keepstep" / "state.db"))

    def do_downgrade_schema(self) -> None:
        """What a keepstep of schema 1 left behind: no approvals, no side-effect ledger."""
        with raw_db(self.root) as conn:
            conn.execute("DROP TABLE approvals")
            conn.execute("DROP TABLE side_effects")
            conn.execute("DELETE FROM _sqlite_migrations WHERE name = "
                         "'m002_approvals_effects'")
            conn.execute("PRAGMA user_version = 1")

    # what a person does
    def do_retry(self, unit: str) -> None:
        with self.project() as p:
            p.run(RUN).retry(unit, who="fault suite", max_units=0)

    def do_raise_budget(self, counter: str, value: float) -> None:
        with self.project() as p:
            p.run(RUN).raise_budget(reason="the client approved more work", who="fault suite",
                                    **{counter: value})

    def do_refused_raise(self, counter: str, value: float, reason: str, fragment: str) -> None:
        from keepstep.engine.errors import BudgetDecisionError

        before = self.snapshot()
        with self.project() as p:
            try:
                p.run(RUN).raise_budget(reason=reason, who="fault suite", **{counter: value})
            except BudgetDecisionError as exc:
                expect(fragment in str(exc), f"refusal says {exc!s}, not {fragment!r}")
            else:
                raise CaseFailed(f"raising {counter} to {value} with reason {reason!r} was "
                                 "accepted")
            limits = p.store.get_budget(RUN).limits
        expect(self.snapshot().used == before.used, "a refused raise changed the counters")
        expect(limits.get(counter) != value, "a refused raise changed the limit")

    def do_revoke_approval(self) -> None:
        from keepstep.engine.approvals_flow import revoke_choice

        with self.project() as p:
            run = p.run(RUN)
            revoke_choice(run, run.plan.gates[0], who="fault suite",
                          reason="the client wants to confirm the audience again")

    def do_webhook_down(self) -> None:
        self.webhook.stop()

    def do_webhook_up(self) -> None:
        self.webhook.start()

    def do_decide_effect(self, decision: str) -> None:
        from keepstep.engine.effects import WebhookAdapter, decide_unknown

        with self.project() as p:
            (row,) = p.store.effects(RUN, ("intent", "unknown"))
            decide_unknown(p.store, WebhookAdapter(self.webhook.url, timeout=2.0),
                           row.idem_key, decision=decision, who="fault suite")

    # intermediate assertions
    def do_snapshot(self) -> None:
        self.snap = self.snapshot()

    def do_expect(self, state: str) -> None:
        got = self.observed_state()
        expect(got == state, f"{self.case.id} after {self.last.n} worker(s): state {got}, "
               f"expected {state}")

    def do_expect_no_new_calls(self) -> None:
        now = self.snapshot()
        expect(now.calls == self.snap.calls, f"{now.calls - self.snap.calls} model call(s) "
               "were made while the run was blocked")
        expect(now.posts == self.snap.posts, "the webhook was called while the outcome was "
               "unknown")

    def do_expect_not_run(self, unit: str) -> None:
        now = self.snapshot()
        expect(now.attempts.get(unit, 0) == self.snap.attempts.get(unit, 0),
               f"{unit} was attempted although its gate had no applying approval")

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
            status = p.run(RUN).status()
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
def reexecuted(p: Project) -> set[str]:
    """Units executed more than once: model calls in more than one attempt, files staged by
    more than one attempt (of the attempts table: a planted folder is not an execution), or
    more than one unit commit."""
    store = p.store
    known = {a.attempt_id for a in store.attempts(RUN)}
    worked: dict[str, set[str]] = defaultdict(set)
    for c in store.calls(RUN):
        worked[c.unit].add(c.attempt_id)
    for unit, attempt_id, _d, files in store.artifacts.attempt_dirs(RUN):
        if files and attempt_id in known:
            worked[unit].add(attempt_id)
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    return {u for u, a in worked.items() if len(a) > 1} | {u for u, n in commits.items() if n > 1}


def orphan_attempts(p: Project) -> set[str]:
    store = p.store
    listed = {o.attempt_id for o in store.orphaned_attempts(RUN)}
    return listed | {a.attempt_id for a in store.attempts(RUN)
                     if a.status in ("orphaned", "fenced")}


def check_orphans_isolated(p: Project) -> None:
    store = p.store
    orphans = orphan_attempts(p)
    manifest = store.manifest(RUN)
    expect(not [e for e in manifest if e.attempt_id in orphans],
           "a manifest row points into an orphan attempt")
    expect(not [e for e in manifest if e.name.endswith(".tmp") or e.path.endswith(".tmp")],
           "a temporary file was promoted into the manifest")
    committed: dict[str, set[str]] = defaultdict(set)
    for e in manifest:
        committed[e.unit].add(e.sha256)
    for uid, rec in p.run(RUN).facts_records().items():
        expect(rec.attempt not in orphans, f"{uid}'s record names orphan {rec.attempt}")
        own = "/".join([RUN, *rec.attempt.split("/")]) + "/"
        for name, ref in rec.outputs.items():
            expect(ref.path.startswith(own), f"{uid}'s output {name} is outside {rec.attempt}")
        for dep, outs in rec.consumed.items():
            stray = set(outs.values()) - committed[dep]
            expect(not stray, f"{uid} consumed {dep} bytes no commit produced: {sorted(stray)}")


def check_stale_never_commits(p: Project) -> None:
    store = p.store
    attempts = {a.attempt_id: a for a in store.attempts(RUN)}
    seen: set[str] = set()
    for cp in store.list_checkpoints(RUN, kinds=["unit-success"]):
        att = attempts.get(cp.attempt or "")
        expect(att is not None, f"checkpoint {cp.version} names no attempt")
        assert att is not None
        expect(att.status == "committed", f"checkpoint {cp.version} commits {att.attempt_id}, "
               f"whose status is {att.status}")
        expect(cp.fencing_token == att.fencing_token,
               f"checkpoint {cp.version} carries token {cp.fencing_token}, {att.attempt_id} "
               f"was claimed with {att.fencing_token}")
        expect(att.attempt_id not in seen, f"{att.attempt_id} was committed twice")
        seen.add(att.attempt_id)


def check_commits_bounded(p: Project) -> None:
    store = p.store
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    invalidated: Counter[str] = Counter()
    for cp in store.list_checkpoints(RUN, kinds=["plan-change", "input-change", "repair"]):
        for key, value in cp.delta.items():
            if key.startswith("unit:") and value and value.get("state") == "invalidated":
                invalidated[key[5:]] += 1
    for unit, n in commits.items():
        expect(n <= 1 + invalidated[unit], f"{unit} was committed {n} times but invalidated "
               f"only {invalidated[unit]} time(s)")


def check_budget_matches_ledger(p: Project) -> None:
    used = p.store.get_budget(RUN).used.get("calls", 0)
    calls = len(p.store.calls(RUN))
    expect(used == calls, f"the budget counts {used:g} calls, the call ledger holds {calls}")


def check_no_dup(cr: CaseRun, p: Project, item: str) -> None:
    store = p.store
    kind, _, what = item.partition(":")
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    if kind == "commit":
        expect(commits[what] == 1, f"{what} was committed {commits[what]} times")
    elif kind == "commits":
        twice = sorted(u for u, n in commits.items() if n != 1)
        expect(not twice, f"units not committed exactly once: {twice}")
    elif kind == "calls":
        attempts = {c.attempt_id for c in store.calls(RUN, unit=what)}
        expect(len(attempts) == 1, f"{what}'s calls are spread over {sorted(attempts)}")
    elif kind == "webhook":
        server = cr.webhook
        keys = [e.idem_key for e in store.effects(RUN)]
        expect(bool(keys), "no side effect was recorded")
        for key in keys:
            expect(server.applied[key] == 1, f"webhook key {key} applied "
                   f"{server.applied[key]} times")
        expect(server.posts == len(keys), f"{server.posts} POSTs for {len(keys)} key(s)")
    else:
        raise ValueError(f"unknown no_dup item {item!r}")


def _check(cr: CaseRun, p: Project | None, name: str) -> None:
    store: Any = p.store if p is not None else None
    head, _, arg = name.partition(":")
    if head == "stale_refused":
        att = store.get_attempt(RUN, arg)
        expect(att is not None and att.status != "committed",
               f"{arg} is {att.status if att else 'missing'}")
        expect(not [cp for cp in store.list_checkpoints(RUN) if cp.attempt == arg],
               f"{arg} reached a checkpoint")
        fenced = store.events(RUN, kinds=["attempt.fenced", "lease.fenced"])
        expect(any(e.attempt_id == arg for e in fenced), f"no fencing event for {arg}")
    elif head == "orphan":
        listed = {o.attempt_id: o for o in store.orphaned_attempts(RUN)}
        expect(arg in listed, f"{arg} is not listed as an orphan ({sorted(listed)})")
        d = Path(listed[arg].directory)
        writable = [f for f in d.rglob("*") if f.is_file() and f.stat().st_mode & stat.S_IWUSR]
        expect(not writable, f"{arg} is not quarantined: {writable}")
    elif head == "partial_quarantined":
        d = store.artifacts.attempt_dir(RUN, arg)
        tmps = list(d.rglob("*.tmp"))
        expect(bool(tmps), f"no partial file left in {arg}")
        expect(arg in orphan_attempts(p), f"{arg} holding a partial file is not an orphan")
    elif head == "reserved_call":
        rows = [c for c in store.calls(RUN) if c.attempt_id == arg]
        expect(any(c.status == "reserved" for c in rows),
               f"{arg}'s interrupted call is not kept as reserved: {[c.status for c in rows]}")
    elif head == "same_attempt_retry":
        unit, _, outcome = arg.partition("/")
        rows = store.calls(RUN, unit=unit)
        expect(len({c.attempt_id for c in rows}) == 1, f"{unit} took more than one attempt")
        expect(any(c.outcome == outcome for c in rows), f"no {outcome} row for {unit}: "
               f"{[c.outcome for c in rows]}")
    elif head == "retry_after_honoured":
        rows = store.calls(RUN, unit=arg)
        i = next(i for i, c in enumerate(rows) if c.outcome == "rate_limited")
        from datetime import datetime

        gap = (datetime.fromisoformat(rows[i + 1].reserved_at)
               - datetime.fromisoformat(rows[i].settled_at)).total_seconds()
        expect(gap >= 0.95, f"retried {gap:.2f} s after a 429 with Retry-After: 1")
    elif head == "provider_charges_in_ledger":
        answered = sum(cr.provider.answered.values())
        rows = [c for c in store.calls(RUN) if c.tokens_in > 0]
        expect(answered == len(rows), f"the provider answered {answered} calls, the ledger "
               f"records {len(rows)} with usage")
    elif head == "downstream_not_run":
        from keepstep.engine.invalidation import downstream_of

        below = downstream_of(p.run(RUN).plan, [arg])
        ran = sorted(u for u in below if store.attempts(RUN, u))
        expect(not ran, f"units downstream of failed {arg} ran: {ran}")
    elif head == "repair_committed":
        expect(bool(store.list_checkpoints(RUN, kinds=["repair"])), "no repair checkpoint")
    elif head == "db_untouched":
        now = file_sha256(str(cr.root / ".keepstep" / "state.db"))
        expect(now == cr.snap.db_sha, "the newer database was modified")
    elif head == "backup_kept":
        baks = list((cr.root / ".keepstep").glob("state.db.v1-*.bak"))
        expect(len(baks) == 1, f"expected one backup of the schema-1 database, found {baks}")
    elif head == "approval":
        rows = store.approvals(RUN, gate_id="audience")
        statuses = [r.status for r in rows]
        expect(arg in statuses, f"no {arg} approval row: {statuses}")
        current = p.run(RUN).plan_n
        decided = [r for r in rows if r.status == "decided"]
        expect(bool(decided) and decided[-1].bound_object.get("plan_n") == current,
               "the decision that let U27 run is not bound to the current plan")
        u27 = p.run(RUN).facts_records()["U27"]
        last = max((r for r in rows if r.decided_at), key=lambda r: r.decided_at)
        expect(last.status in ("decided", "expired"), f"U27 ran under {last.status} approval")
        expect(u27.plan_n == current, "U27's record is not from the current plan")
    elif head == "webhook_keys":
        keys = {e.idem_key for e in store.effects(RUN)}
        expect(len(keys) == int(arg), f"{len(keys)} idempotency keys, expected {arg}")
        plans = sorted(e.plan_n for e in store.effects(RUN))
        expect(plans == list(range(1, int(arg) + 1)), f"keys for plan versions {plans}")
        expect(all(e.action == EFFECT_ACTION and e.status == "committed"
                   for e in store.effects(RUN)), "an effect is not committed")
    elif head == "budget_kept":
        used = store.get_budget(RUN).used
        expect(used.get("calls", 0) >= cr.snap.used.get("calls", 0),
               "the call counter went down after the resume")
        lost = [c for c in store.calls(RUN) if c.attempt_id == arg]
        expect(bool(lost) and all(c.status == "settled" and c.tokens_in > 0 for c in lost),
               f"the killed attempt's charged calls are not in the ledger: {lost}")
    elif head == "budget_decision":
        evs = store.events(RUN, kinds=["decision.budget_raise"])
        expect(len(evs) == 1, f"{len(evs)} budget decisions recorded, expected 1")
        payload = evs[0].payload
        expect(payload.get("who") and payload.get("reason") and payload["new"].get("calls"),
               f"the budget decision lacks who/reason/figures: {payload}")
    elif head == "breaker":
        failed = store.events(RUN, kinds=["recovery.failed"])
        expect(len(failed) == int(arg), f"{len(failed)} failed recoveries, expected {arg}")
    elif head == "executors":
        attempts = {a.attempt_id: a for a in store.attempts(RUN)}
        who = {attempts[cp.attempt].executor
               for cp in store.list_checkpoints(RUN, kinds=["unit-success"])}
        expect(len(who) >= int(arg), f"units were committed by {len(who)} executor(s)")
    elif head == "no_commit_since_snapshot":
        expect(store.get_head(RUN).version == cr.snap.head, "a checkpoint was committed")
    else:
        raise ValueError(f"unknown check {name!r}")


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
                _check(cr, None, item)  # type: ignore[arg-type]
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
                _check(cr, p, item)
        return Outcome(state, got, time.monotonic() - started)
    finally:
        cr.close()


__all__ = ["AUDIENCE", "CaseFailed", "Outcome", "RUN", "Templates", "run_case"]
