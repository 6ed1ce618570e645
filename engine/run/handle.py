"""The read side of a project and of one run: what every run/ and report/ module is given.

``Workspace`` is a project folder with its state database and the injected clock, executor
id and model-gateway factory. ``RunHandle`` is one run (and branch) of it: the recorded plan
and inputs, the loaded facts, the ledgers. Neither changes a state: the actions live in
``engine.api`` (``Project`` / ``Run`` extend these two) and in the run/ modules they call.
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
from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.plan import MODEL_KINDS, Plan, Unit, parse_plan
from keepstep.engine.core.state import (
    UNIT_PREFIX,
    BudgetFact,
    LeaseFact,
    RunFacts,
    StatusFact,
    UnitRecord,
    UnitState,
    records_from_state,
)
from keepstep.engine.errors import PlanValidationError
from keepstep.engine.files.convert import converter_versions
from keepstep.engine.files.project import STATE_DIR, ProjectFiles, load_project_files
from keepstep.engine.gateway.call_ledger import StoreCallLedger
from keepstep.engine.run.baseline import (
    PRODUCER_VERSION,
    PROMPT_VERSION,
    create_run,
    prose_writers,
)
from keepstep.engine.run.gates import open_gates
from keepstep.engine.run.pool import WorkerPool
from keepstep.storage import Event, Head, ModelCall, SQLiteStore
from keepstep.storage.selection import StoreChoice, choose_store, open_store

if TYPE_CHECKING:
    from keepstep.engine.gateway.client import ModelGateway
    from keepstep.engine.run.adapters import EffectAdapter

# Decision events: what the narrative, change notes and replay read back.
DECISION_KINDS = (
    "decision.plan_change", "decision.input_change", "decision.budget_raise",
    "decision.takeover", "approval.decided", "approval.revoked", "decision.repair",
    "recovery.done", "decision.recovery_reset",
)
GatewayFactory = Callable[[StoreCallLedger], Any]


class FactsCache:
    """One run's committed facts in memory, kept at the branch head from commit deltas.

    ``refresh()`` reads the head (one query); when it moved, only the checkpoints since the
    cached version are read and their deltas applied (another executor's commits), so a
    refresh costs what changed, not the size of the run. A commit made through this process
    is applied with ``apply`` (no read at all). A gap, a head behind the cache, a hash that
    does not chain or a very long delta list loads everything again (``generation`` then
    moves, so views built on the cache know to rebuild).

    Callers hold ``lock`` while reading ``records``; ``changes`` lists (unit, record or None)
    as applied, for the one consumer that drains it (the run loop's ready set).
    """

    MAX_DELTAS = 2000

    def __init__(self, store: SQLiteStore, run_id: str, branch_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        self.lock = threading.RLock()
        self.version: int | None = None
        self.hash: str | None = None
        self.records: dict[str, UnitRecord] = {}
        self.keys: dict[str, Any] = {}  # plan, inputs, versions, budget (as committed)
        self.invalidated: set[str] = set()
        self.generation = 0
        self.changes: list[tuple[str, UnitRecord | None]] = []

    def refresh(self) -> int:
        """Bring the cache to the branch head; returns the head version."""
        with self.lock:
            head = self.store.get_head(self.run_id, self.branch_id)
            if self.version == head.version and self.hash in (None, head.hash):
                self.hash = head.hash
                return head.version
            if (self.version is None or head.version <= self.version
                    or head.version - self.version > self.MAX_DELTAS):
                return self._reload()
            cps = self.store.list_checkpoints(self.run_id, self.branch_id,
                                              since_version=self.version + 1)
            chained = bool(cps) and cps[0].version == self.version + 1 and \
                cps[-1].version == head.version and cps[-1].hash == head.hash and \
                (self.hash is None or cps[0].parent_hash == self.hash)
            if not chained:
                return self._reload()
            for cp in cps:
                self._apply_delta(cp.delta)
            self.version, self.hash = head.version, head.hash
            return head.version

    def _reload(self) -> int:
        self._load_all()
        assert self.version is not None  # _load_all set it
        return self.version

    def _load_all(self) -> None:
        head = self.store.get_head(self.run_id, self.branch_id)
        state = self.store.read_state(self.run_id, self.branch_id)
        self.records = records_from_state(state)
        self.keys = {k: v for k, v in state.items() if not k.startswith(UNIT_PREFIX)}
        self.invalidated = {u for u, r in self.records.items()
                            if r.state == UnitState.invalidated}
        self.version, self.hash = head.version, head.hash
        self.generation += 1
        self.changes.clear()

    def _set(self, unit_id: str, record: UnitRecord | None) -> None:
        if record is None:
            self.records.pop(unit_id, None)
        else:
            self.records[unit_id] = record
        if record is not None and record.state == UnitState.invalidated:
            self.invalidated.add(unit_id)
        else:
            self.invalidated.discard(unit_id)
        self.changes.append((unit_id, record))
        if len(self.changes) > 50_000:  # nobody drains (a read-only handle): views rebuild
            self.changes.clear()
            self.generation += 1

    def _apply_delta(self, delta: Mapping[str, Any]) -> None:
        for key, value in delta.items():
            if key.startswith(UNIT_PREFIX):
                self._set(key[len(UNIT_PREFIX):],
                          None if value is None else UnitRecord.model_validate(value))
            elif value is None:
                self.keys.pop(key, None)
            else:
                if key == "plan" and value != self.keys.get("plan"):
                    self.generation += 1  # a plan change: views on the plan rebuild
                self.keys[key] = value

    def apply(self, version: int, records: Mapping[str, UnitRecord],
              keys: Mapping[str, Any] | None = None) -> None:
        """Apply this process's own commit of ``version`` (its records already parsed). A
        cache that is not at ``version - 1`` is left for ``refresh`` to catch up."""
        with self.lock:
            if self.version != version - 1:
                return
            for uid, rec in records.items():
                self._set(uid, rec)
            for key, value in (keys or {}).items():
                self.keys[key] = value
            self.version, self.hash = version, None  # the hash is learnt at the next refresh

    def drain(self) -> list[tuple[str, UnitRecord | None]]:
        with self.lock:
            out, self.changes = self.changes, []
            return out


def store_password(choice: StoreChoice) -> str | None:
    """The OS keyring's PostgreSQL password (``keepstep keys set postgres``), unless libpq
    has its own (PGPASSWORD, a .pgpass file) or the store needs none."""
    if choice.url is None or os.environ.get("PGPASSWORD"):
        return None
    if Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass").is_file():
        return None
    from keepstep.engine.gateway.keys import get_api_key

    return get_api_key("postgres")


def default_executor_id() -> str:
    """``host:pid:random`` — unique per process, readable in a lease row."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Workspace:
    """A project folder and its state database (the read side; ``engine.api.Project``
    adds the actions)."""

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
            # Lazy: validation loads every kind and the model checks; a read-only command
            # (status, explain) that opens the project never needs them (start-up).
            from keepstep.engine.run.validation import file_problems

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
        # Lazy: only a project with [adapters] tables or a deliver unit builds adapters.
        from keepstep.engine.run.adapters import adapters_from_config

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

    def run_handle(self, run_id: str, branch_id: str = "main") -> RunHandle:
        """A handle on a run known to exist (``engine.api.Project`` returns its ``Run``)."""
        return RunHandle(self, run_id, branch_id)

    def start_run(self, run_id: str, *, branch_id: str = "main") -> RunHandle:
        """Create a run at plan-v1 / in-v1 from the project files as they are now."""

        create_run(self, run_id, branch_id=branch_id)
        return self.run_handle(run_id, branch_id)


class RunHandle:
    """One run (and branch) of a workspace, read side: facts, plan, inputs, ledgers."""

    def __init__(self, project: Workspace, run_id: str, branch_id: str = "main") -> None:
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
        return int(self.plan_info.get("n", 1))

    @property
    def plan(self) -> Plan:
        """The plan the run works to: the recorded plan with a takeover's narrowed scope
        applied (dropped units are not required final; see ``run.takeover.scoped_plan``)."""
        # Lazy: takeover imports the committer, which imports this module's types.
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
        info = self.store.read_key(self.run_id, "inputs", self.branch_id) or {}
        return InputSnapshot(sources=info.get("sources", {}), groups=info.get("groups", {}))

    @property
    def templates(self) -> dict[str, str]:
        """template name -> sha256 as recorded, plus ``data:<name>`` -> sha256 of the pack
        data files (what a unit's input fingerprint records)."""
        info = self.plan_info
        return {**info.get("templates", {}),
                **{f"data:{k}": v for k, v in (info.get("data") or {}).items()}}

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
        approval's options, a takeover and the TUI show (``engine.core.explain.estimate_costs``
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
        with cache.lock:
            version = cache.refresh()
            records = dict(cache.records) if copy else cache.records
            plan_info = cache.keys.get("plan") or {}
            inputs_info = cache.keys.get("inputs") or {}
        leases = {lease.unit: LeaseFact.model_validate(lease)
                  for lease in self.store.leases(self.run_id, self.branch_id)}
        statuses = {u: StatusFact.model_validate(st) for u, st in
                    self.store.unit_statuses(self.run_id, self.branch_id).items()}
        budget = BudgetFact.model_validate(self.store.get_budget(self.run_id, self.branch_id))
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
                                         api_base_for=getattr(self.project.files.config,
                                                              "api_base_for", None))
                if self.project.gateway_factory is not None:
                    self._gateway = self.project.gateway_factory(ledger)
                else:
                    from keepstep.engine.gateway.client import ModelGateway
                    from keepstep.engine.gateway.limits import ProviderLimits

                    config = self.project.files.config
                    self._gateway = ModelGateway(ledger=ledger, limits=ProviderLimits(
                        config.providers), outage_limit_s=config.provider_outage_minutes * 60)
            return self._gateway

    def preload_model_client(self) -> threading.Thread | None:
        """Import the model client (litellm: seconds) in a background thread while recovery
        and the first claims run — only when the run has model units left to do and no
        injected gateway. Returns the thread, or None when there is nothing to preload."""

        if self.project.gateway_factory is not None:
            return None
        plan = self.project.files.plan
        model_units = {u.id for u in plan.units if u.kind in MODEL_KINDS}
        if not model_units:
            return None
        records = self.facts_records()
        if all(u in records and records[u].state == UnitState.succeeded for u in model_units):
            return None

        config = self.project.files.config
        models = sorted({config.model_for(u.id, u.kind.value) for u in plan.units
                         if u.id in model_units})

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


__all__ = ["DECISION_KINDS", "FactsCache", "RunHandle", "Workspace", "default_executor_id"]
