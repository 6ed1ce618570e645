"""The runtime: ``Project`` (a project folder and its state database) and ``Run`` (one run
and branch of it), each defined once here.

``Project`` holds the injected clock, executor id and model-gateway factory, the loaded
project files, the store and the worker pool that runs unit attempts; it starts and opens
runs. ``Run`` is one run (and branch): the recorded plan and inputs, the committed facts
(``FactsCache``), the ledgers, the resume tokens issued to it, and the actions — run,
resume, retry, approve, … — with the views a person reads, each with a typed result. Every
run/ and report/ module is given one of these two; ``engine.api`` re-exports them with
``open_project``.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.estimates import UnitCost, estimate_costs
from keepstep.engine.core.explain import Preview, UnitExplanation, explain_unit, preview
from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.plan import MODEL_KINDS, Plan, Unit, parse_plan
from keepstep.engine.core.state import (
    BudgetFact,
    LeaseFact,
    RunFacts,
    StatusFact,
    UnitRecord,
    UnitState,
)
from keepstep.engine.errors import ApprovalError, KeepstepError, PlanValidationError
from keepstep.engine.files.convert import converter_versions
from keepstep.engine.files.project import STATE_DIR, ProjectFiles, load_project_files
from keepstep.engine.files.sources import require_readable_sources
from keepstep.engine.gateway.call_ledger import StoreCallLedger
from keepstep.engine.gateway.keys import OFFLINE_PROVIDER
from keepstep.engine.report.status import RunStatus, run_status
from keepstep.engine.report.views import (
    CompensationPreview,
    Deliverable,
    EffectRow,
    OutputInfo,
    current_deliverables,
    effect_rows,
    unit_outputs,
)
from keepstep.engine.run.adapters import EffectAdapter, adapters_from_config
from keepstep.engine.run.approvals import approval_applies
from keepstep.engine.run.baseline import (
    PRODUCER_VERSION,
    PROMPT_VERSION,
    Detected,
    create_run,
    detect,
    prose_writers,
)
from keepstep.engine.run.budget import raise_budget
from keepstep.engine.run.effects import SettleResult, compensate, compensation_key, settle_effect
from keepstep.engine.run.facts_cache import FactsCache, plan_n_of, snapshot_of, templates_of
from keepstep.engine.run.folder_checks import file_problems
from keepstep.engine.run.gates import (
    PendingApproval,
    bound_object,
    issue_resume_token,
    open_gates,
    pending_approvals,
    record_choice,
    revoke_choice,
)
from keepstep.engine.run.pool import WorkerPool
from keepstep.engine.run.recovery import RecoveryReport, recover
from keepstep.storage import (
    ApprovalRecord,
    Budget,
    ChainReport,
    Event,
    EventIn,
    Head,
    ModelCall,
    SQLiteStore,
    StorageError,
)
from keepstep.storage.selection import StoreChoice, choose_store, open_store

if TYPE_CHECKING:
    from keepstep.engine.gateway.client import ModelGateway
    from keepstep.engine.report.deliverables import DeliverablesExport, Output
    from keepstep.engine.report.progress import NotebookProgress, ProgressTracker

# Decision events: what the narrative, change notes and replay read back.
DECISION_KINDS = (
    "decision.plan_change", "decision.input_change", "decision.budget_raise",
    "decision.takeover", "approval.decided", "approval.revoked", "decision.repair",
    "recovery.done", "decision.recovery_reset",
)
GatewayFactory = Callable[[StoreCallLedger], Any]
Progress = Callable[[dict[str, Any]], None]


def store_password(choice: StoreChoice) -> str | None:
    """The OS keyring's PostgreSQL password (``keepstep keys set postgres``), unless libpq
    has its own (PGPASSWORD, a .pgpass file) or the store needs none."""
    if choice.url is None or os.environ.get("PGPASSWORD"):
        return None
    if Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass").is_file():
        return None
    # Lazy: the keyring is read only for a PostgreSQL store without a password of its own.
    from keepstep.engine.gateway.keys import get_api_key

    return get_api_key("postgres")


def default_executor_id() -> str:
    """``host:pid:random`` — unique per process, readable in a lease row."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"



class Project:
    """A project folder and its state database: the injected clock, executor id and
    model-gateway factory, the loaded project files, the worker pool; start or open its
    runs."""


    def __init__(
        self,
        root: Path,
        *,
        clock: Callable[[], float] = time.time,
        executor_id: str | None = None,
        gateway_factory: GatewayFactory | None = None,
        synchronous: str = "FULL",
        policy: Mapping[str, Any] | None = None,
        validate: bool = True,
        read_only: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        self.clock = clock
        self.executor_id = executor_id or default_executor_id()
        self.gateway_factory = gateway_factory
        # Per-process policy settings (e.g. the worker's --lease-seconds) that must survive
        # reload(): recovery re-reads the files, which would otherwise drop them.
        self.policy_overrides = dict(policy or {})
        # Per loaded ProjectFiles (reload() makes a new one, so both refresh): the plan's
        # fingerprint (~0.3 s on 10,000 units, read many times per decision) and parsed
        # recorded plan snapshots.
        self._files_fingerprint: tuple[ProjectFiles, Plan, str] | None = None
        self._recorded_plans: dict[tuple[str, str | None, int], Plan] = {}
        self._adapters: tuple[ProjectFiles, dict[str, EffectAdapter]] | None = None
        self._assigned_adapters: dict[str, EffectAdapter] | None = None
        # The run loop's unit threads, made at the first claim, closed with the project.
        self._worker_pool: WorkerPool | None = None
        # validate=False opens a project whose plan does not validate yet (listing or
        # approving sources); reload() — which every run, resume and preview goes through —
        # validates.
        self.files: ProjectFiles = self._load_files(validate=validate)
        # read_only: for commands that only look (status, explain, verify, …): the database
        # is opened read-only, nothing is created or migrated, and a write raises
        # StoragePermissionDenied — so a read-only .keepstep can still be inspected.
        self.read_only = read_only
        # The store keepstep.toml's [store] url (or KEEPSTEP_STORE_URL) names; none: SQLite.
        self.store_choice = choose_store(self.files.config.store.url)
        # Typed as the SQLite store the engine was written against: the PostgreSQL store has
        # the same capability classes (storage/postgres), the contract suite holds both.
        self.store: SQLiteStore = open_store(self.root / STATE_DIR, self.store_choice,
                                             clock=None if clock is time.time else clock,
                                             synchronous=synchronous, read_only=read_only,
                                             password=store_password(self.store_choice))

    def _files_signature(self) -> tuple[Any, ...]:
        out: list[tuple[Any, ...]] = []
        for name in ("keepstep.toml", "contract.md", "sources.toml", "plan.toml"):
            try:
                st = (self.root / name).stat()
                out.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((name, None))
        return tuple(out)

    def reload_if_changed(self) -> ProjectFiles:
        """``reload()`` unless the files were loaded validated and have not changed on disk
        since (same inode, size and modification time of the four project files)."""
        if self._files_validated and self._files_signature() == self._loaded_signature:
            return self.files
        return self.reload()

    def _load_files(self, *, validate: bool = True) -> ProjectFiles:
        signature = self._files_signature()
        files = load_project_files(self.root, validate=validate)
        if validate:
            # Checked before anything runs: a plan that cannot run spends no model call.
            problems = file_problems(files)
            if problems:
                raise PlanValidationError([p.line() for p in problems], problems=problems)
        self._loaded_signature, self._files_validated = signature, validate
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
            cached = self._files_fingerprint = (files, files.plan, files.plan_fingerprint())
        return cached[2]

    @property
    def worker_pool(self) -> WorkerPool:
        """The threads that run unit attempts (made on first use, closed with the project)."""
        if self._worker_pool is None:
            self._worker_pool = WorkerPool()
        return self._worker_pool

    def close(self) -> None:
        pool, self._worker_pool = self._worker_pool, None
        if pool is not None:
            pool.close()
        self.store.close()

    @property
    def effect_adapters(self) -> dict[str, EffectAdapter]:
        """The side-effect adapters of keepstep.toml's ``[adapters.NAME]`` tables, by name.

        Built once per load of the files (a reload rebuilds them); recovery reconciles
        through these, and ``deliver`` units act through them. Assigning a mapping (a test
        harness, an embedding app) replaces them, reloads included.
        """
        if self._assigned_adapters is not None:
            return self._assigned_adapters
        files = self.files
        if self._adapters is None or self._adapters[0] is not files:
            self._adapters = (files, adapters_from_config(
                files.config.adapters, project_root=self.root,
                artifact_root=self.store.artifacts.root))
        return self._adapters[1]

    @effect_adapters.setter
    def effect_adapters(self, adapters: Mapping[str, EffectAdapter]) -> None:
        self._assigned_adapters = dict(adapters)

    def runs(self) -> list[str]:
        """Run ids in this project's database, oldest first."""
        return self.store.runs()

    def versions(self) -> dict[str, str]:
        """The code, model, prompt, tool and policy versions a checkpoint records."""
        # Lazy (start-up): the prompt files are read only when versions are recorded.
        from keepstep.engine.gateway.prompts import prompt_hashes

        cfg = self.files.config
        return {"code": PRODUCER_VERSION, "model": cfg.default_model, "prompt": PROMPT_VERSION,
                "tool": "kinds-1", "policy": cfg.versions.get("policy", "policy-1"),
                **{k: v for k, v in cfg.versions.items() if k != "policy"},
                # "prompt:<name>": sha256 — an edited prompt is a typed change (core.changes)
                **prompt_hashes(self.root),
                # "converter:<format>": its version — an upgrade is a typed `tool` change
                **{f"converter:{fmt}": v for fmt, v in converter_versions().items()}}


    def __enter__(self) -> Project:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_handle(self, run_id: str, branch_id: str = "main") -> Run:
        return Run(self, run_id, branch_id)

    def default_run_id(self) -> str:
        """The run a face shows when none is named: keepstep.toml's ``default_run``, else
        the newest run, else ``R1`` (the id a first ``keepstep run`` then starts)."""
        configured = self.files.config.default_run
        if configured:
            return configured
        runs = self.runs()
        return runs[-1] if runs else "R1"

    def start_run(self, run_id: str, *, branch_id: str = "main") -> Run:
        """Create a run at plan-v1 / in-v1 from the project files as they are now.

        An approved source that cannot be read raises SourceError (naming it and what to
        do) before anything is written: no run starts on it."""
        require_readable_sources(self.reload_if_changed())
        create_run(self, run_id, branch_id=branch_id)
        return self.run_handle(run_id, branch_id)

    def get_run(self, run_id: str, branch_id: str = "main") -> Run:
        """An existing run; a KeepstepError naming the known runs when there is none."""
        if not self.store.run_exists(run_id):
            known = ", ".join(self.runs()) or "none yet"
            raise KeepstepError(f"no run {run_id!r} in {self.root}",
                                hint=f"start it with `keepstep run {self.root} --run {run_id}` "
                                f"(runs: {known})")
        self.store.get_head(run_id, branch_id)
        return Run(self, run_id, branch_id)

    def open_or_start(self, run_id: str, branch_id: str = "main") -> Run:
        """The run if it exists, else a new one (safe when two front ends start it at once)."""
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


def _source_progress(on_event: Progress | None) -> Any:
    """The run-start source check's progress as ``sources.convert`` events."""
    if on_event is None:
        return None

    def report(source_id: str, fmt: str) -> None:
        try:
            on_event({"kind": "sources.convert", "source": source_id, "format": fmt})
        except Exception:  # noqa: BLE001 - a display callback must never break the run
            pass

    return report


class Run:
    """One run (and branch) of a project: the recorded plan and inputs, the loaded facts,
    the ledgers; its actions (run, resume, retry, approve, …) and the views of it."""


    def __init__(self, project: Project, run_id: str, branch_id: str = "main") -> None:
        self.project = project
        self.store = project.store
        self.run_id = run_id
        self.branch_id = branch_id
        self._gateway: ModelGateway | None = None
        self._gateway_lock = threading.Lock()
        self._facts: FactsCache | None = None
        # gate id -> the resume token issued to this object's run loop (or
        # issue_resume_token), in memory only: the database keeps its sha256, so a face shows
        # it once from here.
        self.resume_tokens: dict[str, str] = {}

    def facts_cache(self) -> FactsCache:
        """The in-memory committed facts of this run (refresh it before reading)."""
        if self._facts is None:
            self._facts = FactsCache(self.store, self.run_id, self.branch_id)
        return self._facts

    def drop_facts(self) -> None:
        """Forget the cached facts: the next read loads the whole state (recovery calls this,
        so a resume never trusts memory over the database)."""
        self._facts = None

    @property
    def clock(self) -> Callable[[], float]:
        return self.project.clock

    @property
    def executor_id(self) -> str:
        return self.project.executor_id

    @property
    def plan_info(self) -> dict[str, Any]:
        """The ``plan`` state key: version, fingerprint, contract hashes, templates."""
        return self.store.read_key(self.run_id, "plan", self.branch_id) or {}

    @property
    def plan_n(self) -> int:
        return plan_n_of(self.plan_info)

    @property
    def plan(self) -> Plan:
        """The plan the run works to: the recorded plan with a takeover's narrowed scope
        applied (dropped units are not required final; see ``run.takeover.scoped_plan``)."""
        # Lazy (start-up): takeover imports networkx, some 300 modules that opening a
        # project does not otherwise load.
        from keepstep.engine.run.takeover import scoped_plan

        return scoped_plan(self, self.recorded_plan)

    @property
    def recorded_plan(self) -> Plan:
        """The plan the run is at (the stored snapshot), not the file being edited.
        Shared with other readers: copy it before editing."""
        info = self.plan_info
        files = self.project.files
        recorded = info.get("fingerprint")
        path = self.store.artifacts.root / info.get("snapshot_path", "")
        if recorded == self.project.files_plan_fingerprint() or not path.is_file():
            return files.plan
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
        """The input snapshot the run is at (source ids and sha256, never text)."""
        return snapshot_of(self.store.read_key(self.run_id, "inputs", self.branch_id))

    @property
    def templates(self) -> dict[str, str]:
        """template name -> sha256 as recorded, plus ``data:<name>`` -> sha256 of the pack
        data files (what a unit's input fingerprint records)."""
        return templates_of(self.plan_info)

    @property
    def versions(self) -> dict[str, str]:
        return self.store.read_key(self.run_id, "versions", self.branch_id) or {}

    def facts_records(self) -> dict[str, UnitRecord]:
        """unit id -> its committed record (succeeded or invalidated) at the head (a copy:
        the caller may change the mapping; the records themselves are shared, copy one
        before editing it)."""
        cache = self.facts_cache()
        with cache.lock:
            cache.refresh()
            return dict(cache.records)

    def estimate(self, unit_ids: list[str], plan: Plan | None = None,
                 records: Mapping[str, UnitRecord] | None = None) -> list[UnitCost]:
        """Per unit, what running it is expected to cost: the one estimate a preview, an
        approval's options, a takeover and the TUI show (``engine.core.estimates``
        with the project's approved sources and the render units whose model writes prose)."""
        files = self.project.files
        plan = plan or self.plan
        groups = {sid: s.group or "" for sid, s in files.approved_sources().items()}
        return estimate_costs(plan, unit_ids, self.facts_records() if records is None else records,
                              self.calls(), source_groups=groups,
                              writers=prose_writers(files, plan))

    def facts(self) -> RunFacts:
        """Everything ``decide`` needs, read in one go. A plain read: it writes nothing
        (gate requests are written by the run loop, ``run.gates.request_gates``)."""

        facts = self.live_facts(copy=True)
        facts.gates_open = open_gates(self, facts)
        return facts

    def live_facts(self, *, copy: bool = False) -> RunFacts:
        """``facts()`` without the gates, from the facts cache: committed records as cached
        (refreshed from the deltas since the cached head), runtime overlays (leases,
        statuses, budget) read now — their size follows what is in flight or blocked, not
        the plan. ``copy=False`` shares the cache's record map: only for a caller that holds
        ``facts_cache().lock`` while it reads (the run loop)."""
        cache = self.facts_cache()
        # Head, leases, statuses and budget in one read (one round trip on a server); the
        # cache reads more only when the head moved (another executor's commits).
        overlay = self.store.run_overlay(self.run_id, self.branch_id)
        with cache.lock:
            version = cache.refresh(overlay.head)
            records = dict(cache.records) if copy else cache.records
            plan_info = cache.keys.get("plan") or {}
            inputs_info = cache.keys.get("inputs") or {}
        leases = {lease.unit: LeaseFact.model_validate(lease) for lease in overlay.leases}
        statuses = {u: StatusFact.model_validate(st) for u, st in overlay.statuses.items()}
        budget = BudgetFact.model_validate(overlay.budget)
        # model_construct: the records are parsed already; validating 10,000 of them again
        # per decision is what made scheduling grow with the plan.
        return RunFacts.model_construct(
            run_id=self.run_id, branch_id=self.branch_id, head_version=version,
            plan_info=plan_info, inputs_info=inputs_info, records=records,
            statuses=statuses, leases=leases, budget=budget,
            now=self.clock(), gates_open={}, attempts_count={},
        )

    def last_commit_seq(self) -> int:
        """Sequence number of the newest checkpoint.committed event (0 if none)."""
        cps = self.store.events(self.run_id, branch_id=self.branch_id,
                                kinds=["checkpoint.committed"], newest_first=True, limit=1)
        return cps[0].seq if cps else 0

    def decision_events(self) -> list[Event]:
        """The run's decision events (plan changes, approvals, budget raises…), oldest first."""
        return self.store.events(self.run_id, kinds=list(DECISION_KINDS))

    def model_for(self, unit: Unit) -> str:
        """The model a unit calls: its kind's model from keepstep.toml, else the default."""
        return self.project.files.config.model_for(unit.id, unit.kind.value)

    def gateway(self) -> ModelGateway:
        """The run's model gateway (built once; the injected factory's when given)."""
        with self._gateway_lock:
            if self._gateway is None:
                ledger = StoreCallLedger(self.store, self.run_id, self.branch_id,
                                         api_base_for=self.project.files.config.api_base_for)
                if self.project.gateway_factory is not None:
                    self._gateway = self.project.gateway_factory(ledger)
                else:
                    # Lazy: the model client is loaded only where a run calls a model (a
                    # status, or a run with an injected gateway, never does).
                    from keepstep.engine.gateway.client import ModelGateway
                    from keepstep.engine.gateway.limits import ProviderLimits

                    config = self.project.files.config
                    self._gateway = ModelGateway(ledger=ledger, limits=ProviderLimits(
                        config.providers), outage_limit_s=config.provider_outage_minutes * 60)
            return self._gateway

    def preload_model_client(self) -> threading.Thread | None:
        """Import the model client (litellm and the tokenizers: seconds) in a background
        thread while the sources are checked, recovery runs and the first units are claimed —
        only when model units are left to do, one of them calls a model other than the
        offline heuristic (which needs neither), and no gateway is injected. Returns the
        thread, or None when there is nothing to preload."""

        if self.project.gateway_factory is not None:
            return None
        plan = self.project.files.plan
        model_units = {u.id for u in plan.units if u.kind in MODEL_KINDS}
        if not model_units:
            return None
        config = self.project.files.config
        models = sorted({config.model_for(u.id, u.kind.value) for u in plan.units
                         if u.id in model_units})
        if all(m.split("/", 1)[0] == OFFLINE_PROVIDER for m in models):
            return None
        records = self.facts_records()
        if all(u in records and records[u].state == UnitState.succeeded for u in model_units):
            return None

        def load() -> None:
            # Lazy on purpose: this is the background import of litellm (start-up).
            from keepstep.engine.gateway import client

            try:
                client.warm_up(models)
            except Exception:  # noqa: BLE001, S110 - the first real call reports it
                pass

        thread = threading.Thread(target=load, daemon=True, name="keepstep-model-client")
        thread.start()
        return thread

    def head(self) -> Head:
        return self.store.get_head(self.run_id, self.branch_id)

    def calls(self) -> list[ModelCall]:
        """The run's call ledger, oldest first (every branch)."""
        return self.store.calls(self.run_id)

    def events(self, **filters: Any) -> list[Event]:
        """The run's events (``Store.events`` filters: kinds, branch_id, limit, …)."""
        return self.store.events(self.run_id, **filters)



    # -- actions ---------------------------------------------------------------
    def run(
        self,
        *,
        cancel: threading.Event | None = None,
        on_event: Progress | None = None,
        approve: dict[str, str] | None = None,
        max_units: int | None = None,
        stop_after: set[str] | None = None,
        recover: bool = True,
        jobs: int | None = None,
        left_out: dict[str, str] | None = None,
        foreign_sources: frozenset[str] = frozenset(),
    ) -> RunStatus:
        """Recover (audit, reconcile, apply detected changes), then run units until done,
        blocked or cancelled (``RunCancelled`` is raised after the units in flight stopped at
        their next safe point). ``approve`` answers gates (``{"<gate id>": "<option>"}``).
        ``jobs``: units in flight at once (default keepstep.toml's ``max_parallel``; 1 runs
        one unit at a time, in plan order). An approved source that cannot be read (no text,
        over ``max_source_mb``, unsupported or undecodable) raises SourceError before
        anything is claimed.

        ``left_out`` (unit -> why) and ``foreign_sources``: a worker whose copies of some
        approved sources differ from the shared run's (``source_mismatches``) claims none of
        those units and records none of those differences as an input change; the units
        are left to the executors whose copies match."""
        # Lazy: the loop loads the kinds and the attempt machinery (and imports this
        # module), which a command that only looks never needs.
        from keepstep.engine.run.loop import RunLoop

        # litellm's import (seconds) starts now, in the background, when the run will call a
        # real model: the first request then waits only for what is left of it, not for the
        # source check, recovery and the first claim as well. (It competes with them for
        # the GIL, delaying the first claim a little; an offline run starts no thread.)
        self.preload_model_client()
        # Every approved source must convert to text before any unit is claimed: a file that
        # cannot be read is refused here, naming it, never mid-run (conversions are cached,
        # so this converts only what no earlier check or run did).
        require_readable_sources(self.project.reload_if_changed(), cancel=cancel,
                                 progress=_source_progress(on_event))
        if recover:
            report = self.recover(on_event=on_event, foreign_sources=foreign_sources)
            if report.blocked:
                return self.status()
        RunLoop(self, cancel=cancel, on_event=on_event, approve=approve, max_units=max_units,
                stop_after=stop_after, jobs=jobs, left_out=dict(left_out or {})).loop()
        return self.status()

    def resume(self, **kwargs: Any) -> RunStatus:
        """Continue after a restart or interruption: the same as ``run()``, recovery first."""
        return self.run(**kwargs)

    def recover(self, *, on_event: Progress | None = None,
                foreign_sources: frozenset[str] = frozenset()) -> RecoveryReport:
        """Recovery alone (audit, reconcile leases and effects, apply detected changes;
        differences in ``foreign_sources`` are this host's, not applied — see ``run``)."""
        return recover(self, on_event=on_event, foreign_sources=foreign_sources)

    def retry(self, unit_id: str, *, who: str = "user", **kwargs: Any) -> RunStatus:
        """Same unit, new attempt: clears a failed/blocked status (a recorded decision),
        then runs; a current unit whose final validator failed is rerun. A unit blocked by
        the budget needs ``raise_budget`` first."""
        if unit_id not in self.plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label')}")
        st = self.store.unit_statuses(self.run_id, self.branch_id).get(unit_id)
        if st is not None and st.details.get("kind") == "budget":
            raise KeepstepError(f"{unit_id} is blocked by the budget",
                                hint="raise the limit with `keepstep budget raise` first")
        if self.final_check_failed(unit_id):
            # Current, but its final validator did not pass (e.g. the audit's check was fixed
            # since): clearing a status would leave nothing to run, so the unit is rerun —
            # invalidated with what uses its content, a recorded decision — and tried again.
            # Lazy (start-up): takeover imports networkx, as in recorded_plan's scope.
            from keepstep.engine.run.takeover import rerun_unit

            rerun_unit(self, unit_id, who=who,
                       note="retry of a current unit whose final validator did not pass")
            return self.run(**kwargs)
        self.store.clear_unit_status(self.run_id, self.branch_id, unit_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=self.branch_id,
                                unit=unit_id, payload={"action": "retry", "who": who})
        return self.run(**kwargs)

    def final_check_failed(self, unit_id: str) -> bool:
        """Whether ``unit_id`` is current but its final validator did not pass (a retry
        reruns such a unit)."""
        rec = self.facts_records().get(unit_id)
        return (rec is not None and rec.state == UnitState.succeeded
                and not rec.validators_passed)

    def is_current_and_passed(self, unit_id: str) -> bool:
        """Whether ``unit_id`` is current and its validators passed (a retry of it makes no
        new attempt: nothing failed)."""
        rec = self.facts_records().get(unit_id)
        return rec is not None and rec.state == UnitState.succeeded and rec.validators_passed

    def raise_budget(self, *, reason: str, who: str = "user",
                     **limits: float | None) -> Budget:
        """Record a budget decision raising limits; units blocked by the budget are released.
        Raises BudgetDecisionError (nothing recorded) for a bad counter, value or reason."""
        return raise_budget(self, reason=reason, who=who, limits=limits)

    def reset_recovery(self, *, reason: str, who: str = "user") -> None:
        """Close recovery's circuit breaker after a person looked (a recorded decision);
        the next resume runs recovery again from the start."""
        if not reason.strip():
            raise KeepstepError("a recovery reset needs a reason", hint="pass --reason '...'")
        self.store.append_event(self.run_id, "decision.recovery_reset", branch_id=self.branch_id,
                                payload={"who": who, "reason": reason})

    def branch(self, at_version: int, branch_id: str) -> Run:
        """Fork this run at a checkpoint version under its own branch id and head."""
        self.store.fork_branch(self.run_id, self.branch_id, at_version, branch_id)
        self.store.append_event(self.run_id, "decision.takeover", branch_id=branch_id,
                                payload={"action": "branch", "from": self.branch_id,
                                         "at_version": at_version})
        return Run(self.project, self.run_id, branch_id)

    def replay(self, new_run_id: str | None = None, **kwargs: Any) -> Run:
        """Re-execute this run into a new run from the recorded responses: no model calls."""
        # Lazy: replay runs the loop (see run()).
        from keepstep.engine.run.replay import replay_run

        new = replay_run(self, new_run_id or f"{self.run_id}-replay", **kwargs)
        return Run(self.project, new.run_id, new.branch_id)

    # -- approvals -------------------------------------------------------------
    def pending_approvals(self) -> list[PendingApproval]:
        """Open approval requests, each option's reuse/redo/cost recomputed now."""
        return pending_approvals(self)

    def approve(self, gate_id: str, choice: str, *, who: str,
                token: str | None = None) -> ApprovalRecord:
        """Record a person's answer to a gate. ApprovalError (nothing recorded) for an
        unknown gate or option, an answer contradicting contract.md, or a refused token."""
        return record_choice(self, self._gate(gate_id), choice, who=who, token=token)

    def issue_resume_token(self, gate_id: str) -> str:
        """A new resume token for the gate's open request (the old token stops working):
        someone who has only the token can answer the gate once, with
        ``keepstep approve --token``. Returned once; stored only as its sha256."""
        return issue_resume_token(self, self._gate(gate_id))

    def revoke(self, gate_id: str, *, who: str, reason: str) -> ApprovalRecord:
        """Revoke a gate's decision; the gate asks again when the run next reaches it."""
        return revoke_choice(self, self._gate(gate_id), who=who, reason=reason)

    def _gate(self, gate_id: str) -> Any:
        gate = next((g for g in self.plan.gates if g.id == gate_id), None)
        if gate is None:
            known = ", ".join(g.id for g in self.plan.gates) or "none"
            raise ApprovalError(f"no gate {gate_id!r} in {self.plan_info.get('label')}",
                                hint=f"gates: {known}")
        return gate

    # -- what a person reads -------------------------------------------------------
    def status(self) -> RunStatus:
        """The dashboard's facts and views, recomputed from stored facts."""
        return run_status(self)

    def next_action(self) -> str:
        return self.status().next_action

    def preview(self) -> Preview:
        """What the changes detected now would invalidate and reuse, with the estimated
        re-do cost — nothing is committed."""
        found = detect(self)
        return self._preview_found(found, found.files.plan)

    def _preview_found(self, found: Detected, plan: Plan) -> Preview:
        """The preview of what ``detect`` found, under ``plan``."""
        return preview(plan, found.changes, self.facts_records(), self.calls(),
                       high_risk_rules=found.files.config.high_risk_rules,
                       source_groups=found.source_groups,
                       writers=prose_writers(found.files, plan),
                       statuses=self.store.unit_statuses(self.run_id, self.branch_id))

    def explain(self, unit_id: str) -> UnitExplanation:
        """Why a unit is current, invalidated, blocked or pending — from stored facts: this
        branch's attempts, the call ledger and the gate's decisions."""
        plan = self.plan
        if unit_id not in plan.unit_map():
            raise KeepstepError(f"no unit {unit_id} in {self.plan_info.get('label', 'the plan')}",
                                hint="units: " + ", ".join(u.id for u in plan.units))
        facts = self.facts()
        counts: dict[str, int] = {}
        for attempt in self.store.attempts(self.run_id):
            if attempt.branch_id == self.branch_id:
                counts[attempt.unit] = counts.get(attempt.unit, 0) + 1
        facts.attempts_count = counts
        rows = []
        for gate in plan.gates:
            current = bound_object(self, gate, facts)
            for rec in self.store.approvals(self.run_id, branch_id=self.branch_id,
                                            gate_id=gate.id):
                if rec.status not in ("decided", "revoked"):
                    continue
                applies, _why = approval_applies(rec, current_bound_object=current,
                                                 now=facts.now)
                rows.append({"gate": gate.id, "unit": gate.unit, "choice": rec.choice,
                             "applies": applies})
        return explain_unit(plan, facts, unit_id, calls=self.calls(), approvals=rows)

    def verify(self) -> ChainReport:
        """Verify every checkpoint link and state hash of this branch, oldest first."""
        return self.store.verify_chain(self.run_id, self.branch_id)

    def deliverables(self) -> list[Deliverable]:
        """The committed outputs of the current document units, in plan order."""
        return current_deliverables(self)

    def output(self, unit_id: str, name: str) -> Output:
        """One committed output of a unit (``.data`` bytes, ``.text``), its sha256 checked;
        KeepstepError naming the unit's outputs when there is no such one."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.deliverables import unit_output

        return unit_output(self, unit_id, name)

    def outputs(self, unit_id: str) -> list[OutputInfo]:
        """What a unit's committed record holds: each output's name, sha256, size and
        whether the file still matches (read by explain; nothing is loaded)."""
        return unit_outputs(self, unit_id)

    def export_deliverables(self, out: str | Path | None = None) -> DeliverablesExport:
        """Copy the current deliverables and their manifest (sha256 of each) to ``out``,
        default ``deliverables/<run>/`` in the project."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.deliverables import export_deliverables

        return export_deliverables(self, out)

    def effects(self) -> list[EffectRow]:
        """The side-effect ledger of this branch, oldest first."""
        return effect_rows(self)

    def _effect(self, key: str) -> Any:
        row = self.store.get_effect(key)
        if row is None or row.run_id != self.run_id:
            known = ", ".join(e.key for e in self.effects()) or "none"
            raise KeepstepError(f"no external action with key {key!r} in run {self.run_id}",
                                hint=f"keys: {known}")
        return row

    def settle_effect(self, key: str, *, sent: bool | None = None, who: str, reason: str = "",
                      reference: str | None = None) -> SettleResult:
        """Settle an external action whose outcome is unknown: the adapter is asked by key
        first; when it cannot tell, ``sent`` records the person's decision (True: it
        happened, ``reference`` its remote id; False: it did not — the next resume sends it
        again with the same key). ``sent=None`` only looks it up. A decision event either
        way; the unit it blocked is released."""
        row = self._effect(key)
        return settle_effect(self.store, self.project.effect_adapters.get(row.adapter), key,
                             sent=sent, who=who, reason=reason, remote_id=reference)

    def compensation_preview(self, key: str) -> CompensationPreview:
        """What compensating a committed external action would undo, and the ledger entry
        it would write (nothing is changed)."""
        row = self._effect(key)
        adapter = self.project.effect_adapters.get(row.adapter)
        problems = []
        if row.compensates is not None:
            problems.append(f"{key} is itself an undo")
        elif row.status != "committed":
            problems.append(f"{key} is {row.status}; only a committed action can be undone")
        if adapter is None:
            problems.append(f"no adapter named {row.adapter!r} is configured")
        elif getattr(adapter, "compensate", None) is None:
            problems.append(f"adapter {row.adapter!r} cannot undo; undo it by hand")
        return CompensationPreview(
            key=key, unit=row.unit, action=row.action, adapter=row.adapter, status=row.status,
            remote_id=row.remote_id, undo_key=compensation_key(key),
            undo_action=f"compensate:{row.action}", problems=problems,
            records=f"a ledger entry {compensation_key(key)} (intent, then receipt) and the "
            f"original moved to compensated; a decision.effect event")

    def compensate_effect(self, key: str, *, who: str, reason: str) -> EffectRow:
        """Undo a committed external action through its own ledger entry (a recorded
        decision). KeepstepError, nothing done, when the preview names a problem."""
        preview = self.compensation_preview(key)
        if preview.problems:
            raise KeepstepError(f"cannot compensate {key}: " + "; ".join(preview.problems))
        if not reason.strip():
            raise KeepstepError("a compensation needs a reason", hint="pass --reason '...'")
        row = self._effect(key)
        adapter = self.project.effect_adapters[row.adapter]
        self.store.append_event(self.run_id, "decision.effect", branch_id=row.branch_id,
                                unit=row.unit, payload=EventIn(kind="decision.effect", payload={
                                    "key": key, "decision": "compensate", "who": who,
                                    "reason": reason}).payload)
        compensate(self.store, adapter, row, who=who, reason=reason)
        return next(e for e in self.effects() if e.key == key)

    def preview_sources(self, approved: dict[str, bool]) -> Preview:
        """What approving or revoking sources (``{"A3": False}``) would invalidate and
        reuse, before sources.toml is written — nothing is changed."""
        return self._preview_candidate(approved=approved)

    def preview_plan(self, plan: Plan) -> Preview:
        """What saving ``plan`` as plan.toml would invalidate and reuse, before the file is
        written — nothing is changed."""
        return self._preview_candidate(plan=plan)

    def _preview_candidate(self, *, approved: dict[str, bool] | None = None,
                           plan: Plan | None = None) -> Preview:
        files = self.project.reload()
        approved = approved or {}
        sources = files.sources.model_copy(deep=True)
        for entry in sources.sources:
            if entry.id in approved:
                entry.approved = approved[entry.id]
        unknown = sorted(set(approved) - {e.id for e in sources.sources})
        if unknown:
            raise KeepstepError(f"no source {', '.join(unknown)} in sources.toml")
        found = detect(self, sources=sources, plan=plan)
        return self._preview_found(found, found.files.plan if plan is None else plan)

    def progress(self, **kwargs: Any) -> ProgressTracker:
        """A live-progress tracker to pass as ``on_event`` (see ``report.progress``)."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.progress import ProgressTracker

        return ProgressTracker(self, **kwargs)

    def live_progress(self, **kwargs: Any) -> NotebookProgress:
        """``run.run(on_event=run.live_progress())``: a display refreshed in place in
        Jupyter while the run works (plain lines elsewhere)."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.progress import NotebookProgress

        return NotebookProgress(self, **kwargs)

    def dag_svg(self) -> str:
        """The DAG coloured by unit state, as an SVG document."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.dag_svg import run_dag_svg

        return run_dag_svg(self)

    def handover(self, out: str | Path, *, sources: str = "excerpts") -> Path:
        """Export the handover bundle (a folder, or a .zip when ``out`` ends so).
        ``sources``: "excerpts" (the default, as `keepstep handover`'s: each cited statement
        under its evidence id and locator, linked from index.html), "files" (the approved
        source files too) or "none"."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.handover import export_handover

        return export_handover(self, out, sources=sources)

    def narrative(self) -> str:
        """The handover narrative, generated from stored state only."""
        # Lazy (start-up): loaded when asked for; a status never needs it.
        from keepstep.engine.report.narrative import narrative

        return narrative(self)


__all__ = ["DECISION_KINDS", "GatewayFactory", "Project", "Run", "default_executor_id",
           "store_password"]
