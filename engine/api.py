"""The engine's public face: open_project(path) -> Project -> Run.

The CLI, the TUI and notebooks all use these objects; none of them reach into
SQL. Time, executor ids and the model gateway are injectable for tests.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keepstep.engine.core.plan import Plan, Unit, parse_plan
from keepstep.engine.core.state import RunFacts, UnitRecord, records_from_state
from keepstep.engine.errors import KeepstepError, ProjectError
from keepstep.engine.files.project import (
    STATE_DIR,
    InputSnapshot,
    ProjectFiles,
    load_project_files,
    snapshot_sources,
)
from keepstep.engine.gateway.call_ledger import StoreCallLedger
from keepstep.engine.run.attempt import PRODUCER_VERSION
from keepstep.storage import ArtifactImmutable, EventIn, SQLiteStore, StorageError
from keepstep.storage.hashing import file_sha256

PROMPT_VERSION = "prompts-1"
DECISION_KINDS = (
    "decision.plan_change", "decision.input_change", "decision.budget_raise",
    "decision.takeover", "approval.decided", "approval.revoked", "decision.repair",
    "recovery.done", "decision.recovery_reset",
)


def default_executor_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def template_hashes(root: Path) -> dict[str, str]:
    tdir = root / "templates"
    if not tdir.is_dir():
        return {}
    return {p.stem: file_sha256(str(p)) for p in sorted(tdir.glob("*.md"))}


class Project:
    """A project folder and its state database."""

    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        executor_id: str | None = None,
        gateway_factory: Callable[[StoreCallLedger], Any] | None = None,
        synchronous: str = "FULL",
        policy: dict[str, Any] | None = None,
        validate: bool = True,
    ) -> None:
        self.root = Path(root).resolve()
        self.clock = clock
        self.executor_id = executor_id or default_executor_id()
        self.gateway_factory = gateway_factory
        # Per-process policy settings (e.g. the worker's --lease-seconds) that must survive
        # reload(): recovery re-reads the files, which would otherwise drop them.
        self.policy_overrides = dict(policy or {})
        # Per loaded ProjectFiles (reload() makes a new one, so both refresh): the files'
        # plan fingerprint, and recorded plan snapshots parsed for Run.recorded_plan. A 10,000-
        # unit plan costs ~0.3 s to fingerprint; Run.plan is read many times per decision.
        self._files_fingerprint: tuple[ProjectFiles, Plan, str] | None = None
        self._recorded_plans: dict[tuple[str, str | None, int], Plan] = {}
        # validate=False opens a project whose plan does not validate yet (listing or approving
        # sources); reload() — which every run, resume and preview goes through — validates.
        self.files: ProjectFiles = self._load_files(validate=validate)
        self.store = SQLiteStore(self.root / STATE_DIR, clock=clock, synchronous=synchronous)

    def _load_files(self, *, validate: bool = True) -> ProjectFiles:
        files = load_project_files(self.root, validate=validate)
        for key, value in self.policy_overrides.items():
            setattr(files.config.policy, key, value)
        return files

    def reload(self) -> ProjectFiles:
        """Re-read the project files (after an edit); validation errors raise."""
        self.files = self._load_files()
        return self.files

    def files_plan_fingerprint(self) -> str:
        """``self.files.plan.fingerprint()``, computed once per load of the files."""
        files = self.files
        cached = self._files_fingerprint
        if cached is None or cached[0] is not files or cached[1] is not files.plan:
            cached = self._files_fingerprint = (files, files.plan, files.plan.fingerprint())
        return cached[2]

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Project:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def effect_adapters(self) -> dict[str, Any]:
        """The side-effect adapters of keepstep.toml's ``[adapters.NAME]`` tables, by name.

        Built once per load of the files (a reload rebuilds them); recovery reconciles
        through these, and ``deliver`` units act through them. Assigning a mapping (a test
        harness, an embedding app) replaces them, reloads included.
        """
        from keepstep.engine.run.effects import adapters_from_config

        assigned: dict[str, Any] | None = getattr(self, "_assigned_adapters", None)
        if assigned is not None:
            return assigned
        files = self.files
        cached: tuple[ProjectFiles, dict[str, Any]] | None = getattr(self, "_adapters", None)
        if cached is None or cached[0] is not files:
            cached = (files, adapters_from_config(
                files.config.adapters, project_root=self.root,
                artifact_root=self.store.artifacts.root))
            self._adapters = cached
        return cached[1]

    @effect_adapters.setter
    def effect_adapters(self, adapters: dict[str, Any]) -> None:
        self._assigned_adapters = dict(adapters)

    # -- runs ----------------------------------------------------------------
    def runs(self) -> list[str]:
        return self.store.runs()

    def versions(self) -> dict[str, str]:
        from keepstep.engine.gateway.prompts import prompt_hashes

        cfg = self.files.config
        return {"code": PRODUCER_VERSION, "model": cfg.default_model, "prompt": PROMPT_VERSION,
                "tool": "kinds-1", "policy": cfg.versions.get("policy", "policy-1"),
                **{k: v for k, v in cfg.versions.items() if k != "policy"},
                # "prompt:<name>": sha256 — an edited prompt is a typed change (core.changes)
                **prompt_hashes(self.root)}

    def start_run(self, run_id: str, *, branch_id: str = "main") -> Run:
        """Create a run at plan-v1 / in-v1 from the project files as they are now."""
        snapshot = snapshot_sources(self.root, self.files.sources)
        plan_blob = (self.root / "plan.toml").read_bytes()
        if not (self.store.artifacts.attempt_dir(run_id, "_plan/v1") / "plan.toml").exists():
            try:
                self.store.artifacts.stage(
                    run_id, "_plan/v1", "plan.toml", plan_blob, media_type="application/toml",
                    producer_version=PRODUCER_VERSION, created_at=_iso(self.clock()))
            except (ArtifactImmutable, FileNotFoundError):
                pass  # another front end is starting this run and staged the same file
        plan_path = f"{run_id}/_plan/v1/plan.toml"
        initial = {
            "plan": plan_state(1, self.files, plan_path, template_hashes(self.root)),
            "inputs": inputs_state(1, snapshot),
            "versions": self.versions(),
            "budget": {},
        }
        self.store.create_run(
            run_id, initial, branch_id=branch_id,
            meta={"project": self.files.config.name, "created_by": self.executor_id},
            limits=self.files.config.budget.as_limits(),
            events=[EventIn(kind="decision.start", payload={
                "plan": "plan-v1", "inputs": "in-v1", "audience": self.files.contract.audience})],
        )
        self.store.artifacts.prepare_units(run_id, [u.id for u in self.files.plan.units])
        return Run(self, run_id, branch_id)

    def get_run(self, run_id: str, branch_id: str = "main") -> Run:
        if not self.store.run_exists(run_id):
            known = ", ".join(self.runs()) or "none yet"
            raise KeepstepError(f"no run {run_id!r} in {self.root}",
                                hint=f"start it with `keepstep run {self.root} --run {run_id}` "
                                f"(runs: {known})")
        self.store.get_head(run_id, branch_id)
        return Run(self, run_id, branch_id)

    def open_or_start(self, run_id: str, branch_id: str = "main") -> Run:
        if self.store.run_exists(run_id):
            return self.get_run(run_id, branch_id)
        try:
            return self.start_run(run_id, branch_id=branch_id)
        except StorageError:
            if not self.store.run_exists(run_id):
                raise
            return self.get_run(run_id, branch_id)  # another front end started it first

    def restart(self, run_id: str, new_run_id: str) -> Run:
        """A new business task: a new run id from the current files; the old run is kept."""
        self.get_run(run_id)
        new = self.start_run(new_run_id)
        self.store.append_event(run_id, "decision.restart", payload={"new_run": new_run_id})
        return new


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def plan_state(n: int, files: ProjectFiles, snapshot_path: str,
               templates: dict[str, str]) -> dict[str, Any]:
    return {
        "n": n, "label": f"plan-v{n}", "fingerprint": files.plan.fingerprint(),
        "contract_hash": files.contract.hash(), "contract_fields": files.contract.field_hashes(),
        "audience": files.contract.audience, "snapshot_path": snapshot_path,
        "templates": templates,
    }


def inputs_state(n: int, snapshot: InputSnapshot) -> dict[str, Any]:
    return {"n": n, "label": f"in-v{n}", "hash": snapshot.hash(), "sources": snapshot.sources,
            "groups": snapshot.groups}


class Run:
    """One run (and branch) of a project."""

    def __init__(self, project: Project, run_id: str, branch_id: str = "main") -> None:
        self.project = project
        self.store = project.store
        self.run_id = run_id
        self.branch_id = branch_id
        self._gateway: Any = None
        self._gateway_lock = threading.Lock()

    # -- facts ---------------------------------------------------------------
    @property
    def clock(self) -> Callable[[], float]:
        return self.project.clock

    @property
    def executor_id(self) -> str:
        return self.project.executor_id

    @property
    def plan_info(self) -> dict[str, Any]:
        return self.store.read_key(self.run_id, "plan", self.branch_id) or {}

    @property
    def plan_n(self) -> int:
        return int(self.plan_info.get("n", 1))

    @property
    def plan(self) -> Plan:
        """The plan the run works to: the recorded plan with a takeover's narrowed scope
        applied (dropped units are not required final; see engine.takeover.scoped_plan)."""
        from keepstep.engine.run.takeover import scoped_plan

        return scoped_plan(self, self.recorded_plan)

    @property
    def recorded_plan(self) -> Plan:
        """The plan the run is at (the stored snapshot), not the file being edited."""
        info = self.plan_info
        files = self.project.files
        recorded = info.get("fingerprint")
        path = self.store.artifacts.root / info.get("snapshot_path", "")
        if recorded == self.project.files_plan_fingerprint() or not path.is_file():
            return files.plan
        # A snapshot is written once and never changed, so its parse is kept (shared like
        # files.plan: callers copy a plan before editing it).
        cache = self.project._recorded_plans
        key = (str(path), recorded, id(files))
        plan = cache.get(key)
        if plan is None:
            plan = parse_plan(path.read_text(encoding="utf-8"), origin=str(path))
            if len(cache) >= 8:
                cache.clear()
            cache[key] = plan
        return plan

    @property
    def snapshot(self) -> InputSnapshot:
        info = self.store.read_key(self.run_id, "inputs", self.branch_id) or {}
        return InputSnapshot(sources=info.get("sources", {}), groups=info.get("groups", {}))

    @property
    def templates(self) -> dict[str, str]:
        return dict(self.plan_info.get("templates", {}))

    @property
    def versions(self) -> dict[str, str]:
        return self.store.read_key(self.run_id, "versions", self.branch_id) or {}

    def facts_records(self) -> dict[str, UnitRecord]:
        return records_from_state(self.store.read_state(self.run_id, self.branch_id, "unit:"))

    def facts(self, *, approve: dict[str, str] | None = None, ask: bool = False) -> RunFacts:
        from keepstep.engine.run.gates import gates_open

        head = self.store.get_head(self.run_id, self.branch_id)
        now = self.clock()
        leases = {lease.unit: lease for lease in self.store.leases(self.run_id, self.branch_id)}
        facts = RunFacts(
            run_id=self.run_id, branch_id=self.branch_id, head_version=head.version,
            plan_info=self.plan_info,
            inputs_info=self.store.read_key(self.run_id, "inputs", self.branch_id) or {},
            records=self.facts_records(),
            statuses=self.store.unit_statuses(self.run_id, self.branch_id),
            leases=leases, budget=self.store.get_budget(self.run_id, self.branch_id), now=now,
        )
        facts.gates_open = gates_open(self, facts, approve=approve, ask=ask)
        return facts

    def last_commit_seq(self) -> int:
        """Sequence number of the newest checkpoint.committed event (0 if none)."""
        cps = self.store.events(self.run_id, branch_id=self.branch_id,
                                kinds=["checkpoint.committed"], newest_first=True, limit=1)
        return cps[0].seq if cps else 0

    def decision_events(self) -> list:
        return self.store.events(self.run_id, kinds=list(DECISION_KINDS))

    # -- models ----------------------------------------------------------------
    def model_for(self, unit: Unit) -> str:
        return self.project.files.config.model_for(unit.id, unit.kind.value)

    def gateway(self) -> Any:
        with self._gateway_lock:
            if self._gateway is None:
                ledger = StoreCallLedger(self.store, self.run_id, self.branch_id)
                if self.project.gateway_factory is not None:
                    self._gateway = self.project.gateway_factory(ledger)
                else:
                    from keepstep.engine.gateway.client import ModelGateway

                    self._gateway = ModelGateway(ledger=ledger)
            return self._gateway

    # -- actions ---------------------------------------------------------------
    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        approve: dict[str, str] | None = None,
        max_units: int | None = None,
        stop_after: set[str] | None = None,
        recover: bool = True,
    ) -> Any:
        """Recover (audit, reconcile, apply detected changes), then run units until done,
        blocked or cancelled. Returns the RunStatus."""
        from keepstep.engine.report.status import run_status
        from keepstep.engine.run.loop import RunLoop
        from keepstep.engine.run.recovery import recover as do_recover

        if recover:
            report = do_recover(self, on_event=on_event)
            if report.blocked:
                return run_status(self)
        RunLoop(self, cancel=cancel, on_event=on_event, approve=approve,
                max_units=max_units, stop_after=stop_after).loop()
        return run_status(self)

    def resume(self, **kwargs: Any) -> Any:
        """Continue after a restart or interruption: the same as run(), recovery first."""
        return self.run(**kwargs)

    def retry(self, unit_id: str, *, who: str = "user", **kwargs: Any) -> Any:
        """Same unit, new attempt: clears a failed/blocked status (a recorded decision)."""
        if unit_id not in self.plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label')}")
        st = self.store.unit_statuses(self.run_id, self.branch_id).get(unit_id)
        if st is not None and st.details.get("kind") == "budget":
            raise KeepstepError(f"{unit_id} is blocked by the budget",
                                hint="raise the limit with `keepstep budget raise` first")
        self.store.clear_unit_status(self.run_id, self.branch_id, unit_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=self.branch_id,
                                unit=unit_id, payload={"action": "retry", "who": who})
        return self.run(**kwargs)

    def raise_budget(self, *, reason: str, who: str = "user", **limits: float) -> Any:
        """Record a budget decision raising limits; units blocked by the budget are released."""
        from keepstep.engine.run.budget import raise_budget

        return raise_budget(self, reason=reason, who=who, limits=limits)

    def reset_recovery(self, *, reason: str, who: str = "user") -> None:
        """Close recovery's circuit breaker after a person looked (a recorded decision);
        the next resume runs recovery again from the start."""
        if not reason.strip():
            raise KeepstepError("a recovery reset needs a reason", hint="pass --reason '...'")
        self.store.append_event(self.run_id, "decision.recovery_reset", branch_id=self.branch_id,
                                payload={"who": who, "reason": reason})

    def branch(self, at_version: int, branch_id: str) -> Run:
        self.store.fork_branch(self.run_id, self.branch_id, at_version, branch_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=branch_id,
                                payload={"action": "branch", "from": self.branch_id,
                                         "at_version": at_version})
        return Run(self.project, self.run_id, branch_id)

    def replay(self, new_run_id: str | None = None, **kwargs: Any) -> Run:
        """Re-execute this run into a new run from the recorded responses: no model calls."""
        from keepstep.engine.run.replay import replay_run

        return replay_run(self, new_run_id or f"{self.run_id}-replay", **kwargs)

    def preview(self) -> Any:
        """What the changes detected now would invalidate and reuse, with the estimated
        re-do cost — nothing is committed."""
        from keepstep.engine.core.explain import preview
        from keepstep.engine.run.recovery import detect

        found = detect(self)
        return preview(found.files.plan, found.changes, self.facts_records(), self.calls(),
                       high_risk_rules=found.files.config.high_risk_rules,
                       source_groups=found.source_groups)

    def explain(self, unit_id: str) -> Any:
        """Why a unit is current, invalidated, blocked or pending — from stored facts."""
        from keepstep.engine.core.explain import explain_unit

        plan = self.plan
        if unit_id not in plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label', 'the plan')}",
                                hint="units: " + ", ".join(u.id for u in plan.units))
        facts = self.facts()
        facts.attempts_count = {}
        for a in self.store.attempts(self.run_id):
            facts.attempts_count[a.unit] = facts.attempts_count.get(a.unit, 0) + 1
        return explain_unit(plan, facts, unit_id, calls=self.calls())

    def status(self) -> Any:
        from keepstep.engine.report.status import run_status

        return run_status(self)

    def next_action(self) -> str:
        return self.status().next_action

    def head(self) -> Any:
        return self.store.get_head(self.run_id, self.branch_id)

    def calls(self) -> list:
        return self.store.calls(self.run_id)

    def events(self, **kwargs: Any) -> list:
        return self.store.events(self.run_id, **kwargs)


def open_project(path: str | Path, *, validate: bool = True, **kwargs: Any) -> Project:
    """Open a project folder and its state database. Its files are validated unless
    ``validate=False`` (the plan may then be invalid; running still validates)."""
    root = Path(path)
    if not (root / "keepstep.toml").is_file():
        raise ProjectError(f"{root} is not a keepstep project (no keepstep.toml)",
                           hint="create one with `keepstep init DIR`")
    return Project(root, validate=validate, **kwargs)


__all__ = ["Project", "Run", "open_project"]
