"""The run loop: decide, claim, execute, commit — until done, blocked or cancelled.

Concurrency (issue 15). The caller's thread is the scheduler; up to ``jobs`` units run at once,
each in a worker thread of a small per-project pool of daemon threads (litellm's completion is
synchronous and the store keeps one SQLite connection per thread, so threads, not asyncio).
Each unit in flight has its own claim, lease, heartbeat, fencing token and attempt folder,
exactly as a lone unit has.

Where the serialisation is: one re-entrant lock per run handle (the facts cache's ``lock``)
is held while the scheduler reads the facts and claims, and while a worker commits. So this
process's claims and commits never race each other: each commit is a compare-and-swap against
the head the cache holds — which this process's own commits keep current without a read — and
succeeds first time unless another executor process committed meanwhile. Then the cache reads
only the checkpoints since its version, the attempt's consumed dependencies and plan version are
checked against them, and the commit is made again on the moved head (the rebase); a changed
dependency fences the attempt (its output is an orphan, never promoted).

Scheduling is flat: the committed records live in memory (``RunHandle.facts_cache``), each
commit's own delta is applied to them, and a ready set (``core.decide.ReadySet``) is updated
from each changed unit's dependents; leases, statuses and the budget (sized by what is in
flight or blocked) are read per decision. Only when nothing is ready and nothing of ours is in
flight does the loop make the full ``decide`` (done, blocked, waiting). Units are picked in
``topo_order`` at ``jobs == 1`` (today's order, exactly) and critical-path first otherwise
(longest remaining chain of estimated calls, ties by ``topo_order``).

Budgets: every model call reserves its budget atomically in the database before it is made
(``Store.reserve_call``), so reserved + spent never passes a limit whatever the interleaving; a
unit blocked by the budget (or the provider's quota, or the key) stops new claims of model
units, and units in flight finish the call they are in.

Cancellation: ``cancel`` (Ctrl-C, SIGTERM, the TUI's quit) stops claiming and tells every unit
in flight to stop at its next safe point; a unit still inside a model call after
``cancel_grace_s`` is cancelled from here (its attempt marked ``cancelled``, its lease
released; the thread's late answer is an orphan). Then ``RunCancelled`` is raised. Any
exception inside a unit ends that attempt as failed with a classified, scrubbed message and
releases its lease; an exception in the scheduler stops the units in flight the same way before
it propagates. Nothing is ever left ``running`` with a live lease and no process.

Events passed to ``on_event`` (dicts with ``kind``; ``claimed`` and ``attempt`` come from the
scheduler's thread, ``progress`` from the unit's own thread):

- ``decision`` {decision, unit, reasons, head}: what the loop decided;
- ``claimed`` {unit, attempt, token, started (epoch seconds, the run's clock), in_flight}: a
  unit started; ``in_flight`` lists every unit this executor has running;
- ``progress`` {unit, attempt, step, started}: a unit reached a step (``extract A1 (1/4)``,
  ``model call 2``, ``staged``, ``verified``…);
- ``attempt`` {unit, attempt, outcome, detail, started, elapsed_s, in_flight}: it ended
  (committed, retry, failed, blocked, orphaned, cancelled);
- ``recovery.*``: from recovery, before the loop starts.
"""

from __future__ import annotations

import errno
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.decide import (
    RUN_WIDE_BLOCKS,
    Decision,
    DecisionKind,
    ReadySet,
    decide,
)
from keepstep.engine.core.plan import Plan, UnitKind
from keepstep.engine.core.presets import evidence_sources
from keepstep.engine.core.state import UnitRecord, UnitState, unit_key
from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    EffectRejected,
    KeepstepError,
    LeaseLost,
    ModelError,
    QuotaExhausted,
    ReplayMiss,
    RunCancelled,
    SideEffectError,
    UnitTimedOut,
)
from keepstep.engine.kinds import get_kind
from keepstep.engine.run.attempt import (
    AttemptContext,
    AttemptResult,
    Heartbeat,
    blocked_reason,
    build_record,
    input_fingerprints,
    record_diagnosis,
    verify_staged,
)
from keepstep.engine.run.gates import request_gates
from keepstep.storage import (
    CheckpointConflict,
    CommitOutcomeUnknown,
    EventIn,
    LeaseHeld,
    StaleFencingToken,
    StorageBusy,
    StorageError,
    crash_point,
)
from keepstep.storage.errors import mount_point
from keepstep.storage.hashing import canonical_json, file_sha256

if TYPE_CHECKING:
    from keepstep.engine.kinds.model_step import CheckedAnswer, StepCall
    from keepstep.engine.run.handle import RunHandle

RETRYABLE_OUTCOMES = ("failed", "timed_out")
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# How long units in flight get to reach a safe point once the run is cancelled (Ctrl-C must be
# honoured within 2 s, a model call can take a minute).
CANCEL_GRACE_S = 1.2
# How often the scheduler looks at the cancel flag and other executors' commits while it waits.
TICK_S = 0.05


def _same_failure_before(store: Any, run: Any, unit_id: str, tries: list[Any], aid: str,
                         error_class: str, message: str,
                         diagnosis: dict[str, Any] | None) -> str | None:
    """The previous attempt (since the unit's last success) that failed its validators with
    the same message, the same problems and byte-identical rejected model answers, when this
    one did too — else None: deterministic on the same inputs, so a retry would fail the same
    way. Only validator failures count: a timeout or a provider error may pass next time."""
    if error_class != "invalid_output":
        return None
    before = [a for a in tries if a.attempt_id != aid and a.error_class == error_class]
    if not before:
        return None
    prev = max(before, key=lambda a: a.attempt_no)
    if (prev.message or "") != message[:500]:
        return None
    said = [e for e in store.events(run.run_id, branch_id=run.branch_id,
                                    kinds=["attempt.failed"], unit=unit_id)
            if e.attempt_id == prev.attempt_id]
    old = (said[-1].payload.get("diagnosis") if said else None) or {}

    def what(d: dict[str, Any]) -> str:  # the failure itself, not where its files lie
        answers = []
        for path in d.get("answers") or []:
            try:  # what the model said, byte for byte: a different answer may pass next time
                answers.append(file_sha256(str(store.artifacts.root / str(path))))
            except OSError:
                answers.append(f"unreadable:{path}")
        return canonical_json({**{k: d.get(k) for k in ("validators", "problems")},
                               "answers": answers})

    return prev.attempt_id if what(old) == what(diagnosis or {}) else None


class WorkerPool:
    """Daemon threads that run unit attempts, created on demand and reused (each keeps its
    SQLite connection). A thread stuck in a provider call never blocks the process's exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_PoolThread] = []
        self._all: list[_PoolThread] = []

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _PoolThread(self, len(self._all) + 1)
                self._all.append(worker)
                worker.start()
        worker.inbox.put(fn)

    def _back(self, worker: _PoolThread) -> None:
        with self._lock:
            self._idle.append(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = self._all, [], []
        for w in workers:
            w.inbox.put(None)


class _PoolThread(threading.Thread):
    def __init__(self, pool: WorkerPool, n: int) -> None:
        super().__init__(daemon=True, name=f"keepstep-unit-{n}")
        self.pool = pool
        self.inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            fn = self.inbox.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: BLE001, S110 - the job reports its own outcome
                pass
            self.pool._back(self)


def worker_pool(run: RunHandle) -> WorkerPool:
    """The project's pool (closed with the project)."""
    project = run.project
    pool: WorkerPool | None = getattr(project, "_worker_pool", None)
    if pool is None:
        pool = project._worker_pool = WorkerPool()
    return pool


class _Attempt(AttemptContext):
    """An attempt whose steps are reported as ``progress`` events."""

    on_step: Callable[[str], None] | None = None

    @property  # type: ignore[override]
    def progress(self) -> str:
        return self._step

    @progress.setter
    def progress(self, value: str) -> None:
        self._step = value
        report = self.on_step
        if report is not None:
            report(value)

    def call_model(self, call: StepCall, *, check: Any) -> CheckedAnswer:
        self.progress = f"model call {self._call_seq + 1}"
        return super().call_model(call, check=check)


class _InFlight:
    def __init__(self, unit: str, claim: Any, started: float) -> None:
        self.unit = unit
        self.claim = claim
        self.started = started
        self.abandoned = False


class RunLoop:
    def __init__(
        self,
        run: RunHandle,
        *,
        cancel: threading.Event | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        approve: dict[str, str] | None = None,
        replay: dict[str, str] | None = None,
        max_units: int | None = None,
        stop_after: set[str] | None = None,
        jobs: int | None = None,
    ) -> None:
        self.run = run
        self.stop_after = set(stop_after or ())
        self.poll_seconds = 0.2
        self.cancel_grace_s = CANCEL_GRACE_S
        self.store = run.store
        self.cancel = cancel
        self.on_event = on_event
        self.approve = dict(approve or {})
        self.replay = replay
        self.max_units = max_units
        self.jobs = max(1, int(jobs if jobs is not None
                               else run.project.files.config.max_parallel))
        self.executed: list[AttemptResult] = []
        self.cache = run.facts_cache()
        # Units in flight stop at their next safe point once this is set (cancel, or the
        # scheduler failing).
        self._stop = threading.Event()
        self._done: queue.SimpleQueue[tuple[_InFlight, AttemptResult | None,
                                            BaseException | None]] = queue.SimpleQueue()
        self._inflight: dict[str, _InFlight] = {}
        self._launched = 0
        self._plan: Plan | None = None
        self._ready: ReadySet | None = None
        self._generation = -1

    def emit(self, kind: str, **payload: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"kind": kind, **payload})
            except Exception:  # a display callback must never break the run
                pass

    # -- the loop --------------------------------------------------------------
    def loop(self) -> Decision:
        try:
            return self._schedule()
        finally:
            if self._inflight:
                self._stop.set()
                self._wind_down()

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _sync_ready(self) -> ReadySet:
        """The ready set at the cache's head: rebuilt after a full reload or a plan change,
        else updated from the changed units only. Called with the cache lock held."""
        cache = self.cache
        if self._ready is None or self._generation != cache.generation:
            cache.drain()
            self._plan = self.run.plan
            weights = None if self.jobs == 1 else self._weights(self._plan)
            self._ready = ReadySet(self._plan, cache.records,
                                   order="plan" if self.jobs == 1 else "critical",
                                   weights=weights)
            self._generation = cache.generation
        else:
            for uid, rec in cache.drain():
                self._ready.update(uid, rec)
        return self._ready

    def _weights(self, plan: Plan) -> dict[str, float]:
        """Calls per extract unit = its approved sources (one call each)."""
        try:
            approved = self.run.project.files.approved_sources()
        except Exception:  # noqa: BLE001 - ordering only: fall back to the kind's estimate
            return {}
        out: dict[str, float] = {}
        for u in plan.units:
            if u.kind == UnitKind.extract:
                wanted, groups = set(u.input_refs("source")), set(u.input_refs("group"))
                out[u.id] = float(max(1, sum(1 for sid, s in approved.items()
                                             if sid in wanted or (s.group and s.group in groups))))
        return out

    def _schedule(self) -> Decision:
        last_blocked: str | None = None
        final: Decision | None = None  # set when the loop stops claiming (blocked, stop_after)
        while True:
            final = self._collect(final)
            if self._cancelled():
                self._stop.set()
                abandoned = self._wind_down()
                exc = RunCancelled("cancelled: units in flight stopped at their next safe point")
                # Threads still inside a provider call (their attempts are cancelled already):
                # a front end about to exit may leave without waiting for them.
                exc.abandoned_calls = abandoned  # type: ignore[attr-defined]
                raise exc
            if final is not None:
                if not self._inflight:
                    return final
                self._wait()
                continue
            if len(self._inflight) >= self.jobs:
                self._wait()
                continue
            claimed = None
            with self.cache.lock:
                facts = self.run.live_facts()
                ready_set = self._sync_ready()
                plan = self._plan
                assert plan is not None
                if plan.gates:
                    # Reaching a gate writes its approval request (and an --approve answer): an
                    # explicit step of the loop, never a side effect of reading the facts.
                    facts.gates_open = request_gates(self.run, facts, approve=self.approve)
                ready = ready_set.ready(facts, exclude=set(self._inflight), limit=self.jobs)
                if ready:
                    uid = ready[0]
                    d = Decision(kind=DecisionKind.claim, unit=uid, ready=ready)
                    if self.max_units is not None and self._launched >= self.max_units:
                        if not self._inflight:
                            self.emit("decision", decision=d.kind.value, unit=d.unit,
                                      reasons=d.reasons, head=facts.head_version)
                            return d
                    else:
                        self.emit("decision", decision=d.kind.value, unit=d.unit,
                                  reasons=d.reasons, head=facts.head_version)
                        claimed = self._claim(uid, facts, plan)
                        if claimed is None:
                            continue  # someone else moved; decide again from the new head
                full = None if ready or self._inflight else decide(plan, facts)
            if claimed is not None:
                self._launch(*claimed)
                continue
            if full is None:
                self._wait()
                continue
            d = full
            self.emit("decision", decision=d.kind.value, unit=d.unit, reasons=d.reasons,
                      head=facts.head_version)
            if d.kind == DecisionKind.claim:
                # The ready set and decide() disagree: rebuild the set from the records.
                self._ready = None
                continue
            if d.kind == DecisionKind.waiting:
                # Another executor holds the only ready work: wait for its commit (or its
                # lease to expire, which recovery's claim then fences) and decide again.
                self._wait(self.poll_seconds)
                continue
            if d.kind == DecisionKind.done:
                if not self.store.events(self.run.run_id, branch_id=self.run.branch_id,
                                         kinds=["run.done"], after_seq=self.run.last_commit_seq()):
                    self.store.append_event(self.run.run_id, "run.done",
                                            branch_id=self.run.branch_id,
                                            payload={"head": facts.head_version})
                return d
            if d.reason != last_blocked:
                self.store.append_event(self.run.run_id, f"run.{d.kind.value}",
                                        branch_id=self.run.branch_id,
                                        payload={"reasons": d.reasons})
            return d

    def _wait(self, timeout: float | None = None) -> None:
        """Wait for a unit of ours to end (or ``timeout``), waking every tick to look at the
        cancel flag."""
        waited = 0.0
        limit = TICK_S if timeout is None else timeout
        while True:
            try:
                item = self._done.get(timeout=min(TICK_S, max(0.0, limit - waited)) or TICK_S)
            except queue.Empty:
                waited += TICK_S
                if self._cancelled() or waited >= limit or (timeout is None and
                                                            not self._inflight):
                    return
                if timeout is None:
                    limit += TICK_S  # with no timeout: until a unit ends or a cancel
                continue
            self._done.put(item)  # _collect handles it, in order
            return

    def _collect(self, final: Decision | None) -> Decision | None:
        """Handle every unit that ended: events, and whether the loop stops claiming."""
        while True:
            try:
                job, result, error = self._done.get_nowait()
            except queue.Empty:
                return final
            if self._inflight.get(job.unit) is job:
                del self._inflight[job.unit]
            if job.abandoned:
                continue  # cancelled from here already (see _wind_down)
            if error is not None:
                raise error
            if result is None:
                continue
            self.executed.append(result)
            self.emit("attempt", unit=result.unit, attempt=result.attempt_id,
                      outcome=result.outcome, detail=result.detail, started=job.started,
                      elapsed_s=round(max(0.0, self.run.clock() - job.started), 3),
                      in_flight=sorted(self._inflight))
            if final is not None:
                continue
            if result.outcome == "committed" and result.unit in self.stop_after:
                final = Decision(kind=DecisionKind.blocked,
                                 reasons=[f"stopped after {result.unit} as asked"])
            elif result.outcome == "blocked":
                st = self.store.unit_statuses(self.run.run_id, self.run.branch_id)
                kind = st[result.unit].details.get("kind") if result.unit in st else None
                if kind not in RUN_WIDE_BLOCKS:
                    # (A budget, quota or key block holds every unit that calls a model —
                    # the ready set leaves them out — but units that make no call go on.)
                    final = Decision(kind=DecisionKind.blocked,
                                     reasons=[f"{result.unit} blocked: {result.detail}"])
            elif result.outcome == "orphaned":
                final = Decision(kind=DecisionKind.blocked,
                                 reasons=[f"{result.attempt_id}: {result.detail}"])

    def _wind_down(self) -> int:
        """After ``_stop``: give units in flight ``cancel_grace_s`` to reach a safe point, then
        cancel the rest from here (attempt ``cancelled``, lease released by its token).
        Returns how many were cancelled from here."""
        import time

        deadline = time.monotonic() + self.cancel_grace_s
        while self._inflight and time.monotonic() < deadline:
            try:
                job, _result, _error = self._done.get(timeout=TICK_S)
            except queue.Empty:
                continue
            if self._inflight.get(job.unit) is job:
                del self._inflight[job.unit]
        run, store = self.run, self.store
        for job in list(self._inflight.values()):
            job.abandoned = True
            claim = job.claim
            try:
                store.set_attempt_status(run.run_id, claim.attempt_id, "cancelled",
                                         message="cancelled while a call was in flight",
                                         only_if=("claimed",))
                store.release_lease(run.run_id, run.branch_id, claim.unit, claim.fencing_token)
                store.append_event(run.run_id, "attempt.cancelled", branch_id=run.branch_id,
                                   unit=claim.unit, attempt_id=claim.attempt_id,
                                   payload={"reason": "the run was stopped during a call"})
            except Exception:  # noqa: BLE001, S110 - the lease then expires; recovery fences it
                pass
        abandoned = len(self._inflight)
        self._inflight.clear()
        return abandoned

    # -- one unit ----------------------------------------------------------------
    def _claim(self, unit_id: str, facts: Any, plan: Plan) -> tuple[Any, ...] | None:
        run = self.run
        policy = run.project.files.config.policy
        try:
            claim = self.store.claim(run.run_id, run.branch_id, unit_id,
                                     expected_version=facts.head_version, owner=run.executor_id,
                                     lease_seconds=policy.lease_seconds)
        except (CheckpointConflict, LeaseHeld):
            return None
        unit = next(u for u in plan.units if u.id == unit_id) if len(plan.units) < 64 \
            else self._unit_index(plan)[unit_id]
        # The dependencies as they were at the claim: what the attempt reads and consumes.
        deps = {d.unit: facts.records[d.unit] for d in unit.depends_on if d.unit in facts.records}
        if unit.kind == UnitKind.verify:
            # A verify unit reads the evidence it reaches through other units (a cross-check
            # over two verify units): those extract units' records too.
            deps.update({u.id: facts.records[u.id]
                         for u in evidence_sources(unit, plan.unit_map())
                         if u.id in facts.records and u.id not in deps})
        return unit, claim, deps

    def _unit_index(self, plan: Plan) -> dict[str, Any]:
        index = getattr(self, "_index", None)
        if index is None or index[0] is not plan:
            index = self._index = (plan, plan.unit_map())
        return index[1]

    def _launch(self, unit: Any, claim: Any, deps: dict[str, UnitRecord]) -> None:
        started = self.run.clock()
        job = _InFlight(unit.id, claim, started)
        self._inflight[unit.id] = job
        self._launched += 1
        self.emit("claimed", unit=unit.id, attempt=claim.attempt_id, token=claim.fencing_token,
                  started=started, in_flight=sorted(self._inflight))

        def work() -> None:
            result: AttemptResult | None = None
            error: BaseException | None = None
            try:
                result = self.run_unit(unit, claim, deps, started)
            except RunCancelled:
                result = AttemptResult(unit.id, claim.attempt_id, "cancelled", "cancelled")
            except BaseException as exc:  # noqa: BLE001 - reported to the scheduler
                error = exc
                self._release_after_error(claim, exc)
            self._done.put((job, result, error))

        worker_pool(self.run).submit(work)

    def _release_after_error(self, claim: Any, exc: BaseException) -> None:
        """The last line: an error the attempt could not even record. Best effort, each step
        on its own, so a unit is never left running with a live lease."""
        run, store = self.run, self.store
        for step in (
            lambda: store.set_attempt_status(run.run_id, claim.attempt_id, "failed",
                                             error_class="internal",
                                             message=_safe_message(exc)[:500],
                                             only_if=("claimed",)),
            lambda: store.release_lease(run.run_id, run.branch_id, claim.unit,
                                        claim.fencing_token),
        ):
            try:
                step()
            except Exception:  # noqa: BLE001, S110 - the lease then expires; recovery fences
                pass

    def run_unit(self, unit: Any, claim: Any, deps: dict[str, UnitRecord],
                 started: float) -> AttemptResult:
        run = self.run
        store = self.store
        plan = self._plan or run.plan
        policy = run.project.files.config.policy
        lease_lost = threading.Event()
        ctx = _Attempt(
            store=store, run_id=run.run_id, branch_id=run.branch_id, plan=plan,
            plan_n=run.plan_n, unit=unit, claim=claim, files=run.project.files,
            snapshot=run.snapshot, records=deps,
            # A replay answers from the recorded calls: no model client is even built.
            gateway=run.gateway() if self.replay is None else None,
            model=run.model_for(unit), api_base=run.project.files.config.api_base,
            replay=self.replay, cancel=self._stop, lease_lost=lease_lost,
            deadline=started + unit.timeout_minutes * 60, clock=run.clock,
            decision_events=run.decision_events, adapters=run.project.effect_adapters,
        )
        ctx.on_step = lambda step: self.emit("progress", unit=unit.id, attempt=claim.attempt_id,
                                             step=step, started=started)
        hb = Heartbeat(store, claim, interval=policy.heartbeat_seconds,
                       lease_seconds=policy.lease_seconds, progress=lambda: ctx.progress,
                       on_event=self.on_event)
        # The heartbeat's "lost" flag and the context's are one and the same.
        hb.lost = lease_lost
        ctx.heartbeat = hb  # type: ignore[attr-defined]
        hb.start()
        result: AttemptResult | None = None
        try:
            result = self._execute(ctx, claim, unit, started)
            return result
        finally:
            hb.stop()
            if result is None or result.outcome != "committed":  # a commit carries its own
                try:
                    store.add_usage(run.run_id, {"wall_time_s": max(0.0, run.clock() - started)},
                                    branch_id=run.branch_id)
                except Exception:  # noqa: BLE001, S110 - a usage counter never fails a unit
                    pass

    def _execute(self, ctx: AttemptContext, claim: Any, unit: Any,
                 started: float) -> AttemptResult:
        run, store = self.run, self.store
        aid = claim.attempt_id
        try:
            _spec, fn = get_kind(unit.kind.value)
            outcome = fn(ctx)
            ctx.safe_point("staged")
            crash_point("unit.after_stage")
            crash_point(f"unit.after_stage:{unit.id}")
            problems = verify_staged(store, ctx.staged)
            if problems:
                return self._fail(claim, unit, "failed", "staged files did not verify: "
                                  + "; ".join(problems), "integrity")
            crash_point("unit.after_verify")
            if not outcome.passed and unit.kind != UnitKind.audit:
                failed = [v.name for v in outcome.validators if not v.passed]
                return self._fail(claim, unit, "failed", "validators failed: "
                                  + ", ".join(failed), "invalid_output",
                                  diagnosis=record_diagnosis(ctx, outcome))
            ctx.safe_point("verified")
            record = build_record(ctx, outcome, input_fingerprints(
                unit, run.project.files, run.snapshot, run.templates, run.versions))
            # The lease stops being renewed before the commit (the commit checks the token, not
            # the expiry): a renewal can then never land after the unit has committed.
            heartbeat = getattr(ctx, "heartbeat", None)
            if heartbeat is not None:
                heartbeat.stop()
            version = self._commit(ctx, claim, record, started)
            store.artifacts.seal(ctx.staged)
            return AttemptResult(unit.id, aid, "committed", version=version)
        except (BudgetExhausted, QuotaExhausted, AuthError) as exc:
            status, reason, details = blocked_reason(exc)
            store.set_attempt_status(run.run_id, aid, "blocked", error_class=details["kind"],
                                     message=reason)
            store.release_lease(run.run_id, run.branch_id, unit.id, claim.fencing_token)
            store.set_unit_status(run.run_id, run.branch_id, unit.id, status, reason, details,
                                  attempt_id=aid)
            return AttemptResult(unit.id, aid, "blocked", reason)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            # A full disk is not the unit's fault and a retry cannot help until a person
            # frees space: block it (the partial file stays an orphan, never promoted).
            where = exc.filename or run.project.root
            reason = (f"storage: the disk is full ({errno.errorcode[exc.errno]}) while "
                      f"{unit.id} was staging its output — free space on "
                      f"{mount_point(where)}, then run `keepstep retry {unit.id}`; work "
                      "already committed is kept")
            store.set_attempt_status(run.run_id, aid, "blocked", error_class="storage",
                                     message=reason)
            store.release_lease(run.run_id, run.branch_id, unit.id, claim.fencing_token)
            store.set_unit_status(run.run_id, run.branch_id, unit.id, "blocked", reason,
                                  {"kind": "storage"}, attempt_id=aid)
            return AttemptResult(unit.id, aid, "blocked", reason)
        except UnitTimedOut as exc:
            return self._fail(claim, unit, "timed_out", str(exc).splitlines()[0], "timeout")
        except (LeaseLost, StaleFencingToken) as exc:
            store.set_attempt_status(run.run_id, aid, "fenced", message=str(exc).splitlines()[0])
            store.append_event(run.run_id, "attempt.fenced", branch_id=run.branch_id,
                               unit=unit.id, attempt_id=aid,
                               payload={"reason": "lease taken over; output left as an orphan"})
            return AttemptResult(unit.id, aid, "orphaned", "lease lost; output is an orphan")
        except RunCancelled:
            store.set_attempt_status(run.run_id, aid, "cancelled", message="cancelled")
            store.release_lease(run.run_id, run.branch_id, unit.id, claim.fencing_token)
            store.append_event(run.run_id, "attempt.cancelled", branch_id=run.branch_id,
                               unit=unit.id, attempt_id=aid)
            raise
        except ReplayMiss as exc:
            return self._fail(claim, unit, "failed", str(exc).splitlines()[0], "replay", final=True)
        except SideEffectError as exc:
            return self._effect_unsettled(claim, unit, exc)
        except ModelError as exc:
            return self._fail(claim, unit, "failed", f"{exc.error_class}: "
                              f"{str(exc).splitlines()[0]}", exc.error_class,
                              final=not exc.retryable)
        except StorageError:
            raise  # storage trouble is not the unit's fault (StorageError is a KeepstepError)
        except KeepstepError as exc:
            return self._fail(claim, unit, "failed", str(exc).splitlines()[0], "error", final=True)
        except Exception as exc:  # noqa: BLE001 - any other error ends the attempt, classified
            # Input the kind could not read (binary or non-UTF-8 text) will not read better
            # next time; neither will a bug. Both end the unit with a message, never a crash.
            error_class = "input" if isinstance(exc, UnicodeError) else "internal"
            return self._fail(claim, unit, "failed", _safe_message(exc, unit.id), error_class,
                              final=True)

    def _effect_unsettled(self, claim: Any, unit: Any, exc: SideEffectError) -> AttemptResult:
        """An external action of the unit has no receipt: block the unit on that effect
        (recovery asks the adapter on resume and unblocks it; else a person decides) —
        never a retry. Without an open effect the unit fails: within the retry bounds when
        the adapter rejected the action (certainly not done), at once when it was misused."""
        from keepstep.engine.run.effects import UNRESOLVED

        run, store = self.run, self.store
        aid = claim.attempt_id
        message = str(exc).splitlines()[0]
        open_effects = store.effects(run.run_id, UNRESOLVED, unit=unit.id,
                                     branch_id=run.branch_id)
        if not open_effects:
            return self._fail(claim, unit, "failed", message, "effect",
                              final=not isinstance(exc, EffectRejected))
        row = open_effects[-1]
        store.set_attempt_status(run.run_id, aid, "blocked", error_class="effect",
                                 message=message[:500])
        store.release_lease(run.run_id, run.branch_id, unit.id, claim.fencing_token)
        current = store.unit_statuses(run.run_id, run.branch_id).get(unit.id)
        if not (current and current.status == "blocked"
                and current.details.get("effect") == row.idem_key):
            # The same details effects._block writes, so a settled effect unblocks the unit.
            store.set_unit_status(
                run.run_id, run.branch_id, unit.id, "blocked",
                f"external outcome unknown: {message}",
                {"kind": "effect", "effect": row.idem_key, "action": row.action,
                 "adapter": row.adapter}, attempt_id=aid)
        return AttemptResult(unit.id, aid, "blocked", message)

    def _fail(self, claim: Any, unit: Any, attempt_status: str, message: str, error_class: str,
              *, final: bool = False, diagnosis: dict[str, Any] | None = None) -> AttemptResult:
        """Record a failed attempt; retry within bounds (and the retries budget), then mark
        the unit failed. ``diagnosis`` (validator problems, rejected answers) goes with the
        attempt's event and the unit's status."""
        from keepstep.engine.run.budget import charge_retry
        run, store = self.run, self.store
        aid = claim.attempt_id
        store.set_attempt_status(run.run_id, aid, attempt_status, error_class=error_class,
                                 message=message[:500])
        store.release_lease(run.run_id, run.branch_id, unit.id, claim.fencing_token)
        tries = [a for a in store.attempts(run.run_id, unit.id)
                 if a.status in RETRYABLE_OUTCOMES and a.branch_id == run.branch_id]
        rec = self._record(unit.id)
        if rec is not None:
            last_ok = rec.attempt
            tries = [a for a in tries if a.attempt_no > int(last_ok.rsplit("/a", 1)[1])]
        limit = run.project.files.config.policy.max_unit_retries
        same_errors = [a for a in tries if a.error_class == error_class]
        if len(same_errors) >= run.project.files.config.policy.stall_repeated_errors:
            store.append_event(run.run_id, "alert.repeated_error", branch_id=run.branch_id,
                               unit=unit.id, payload={"error_class": error_class,
                                                      "count": len(same_errors)})
        extra = {"diagnosis": diagnosis} if diagnosis else {}
        same = _same_failure_before(store, run, unit.id, tries, aid, error_class, message,
                                    diagnosis)
        if same is not None and not final:
            # Deterministic on the same inputs: a retry would fail the same way (issue 21).
            message = (f"{message} — the same failure as attempt {same} on the same inputs, "
                       f"so not retried: fix what it names, then `keepstep retry {unit.id}`")
            final = True
        if final or len(tries) > limit:
            store.set_unit_status(run.run_id, run.branch_id, unit.id, "failed", message,
                                  {"kind": error_class, "attempts": len(tries), **extra},
                                  attempt_id=aid)
            if diagnosis:
                store.append_event(run.run_id, "attempt.failed", branch_id=run.branch_id,
                                   unit=unit.id, attempt_id=aid, payload={
                                       "error_class": error_class, "message": message[:300],
                                       "will_retry": False, **extra})
            return AttemptResult(unit.id, aid, "failed", message)
        over = charge_retry(run, unit.id)
        if over is not None:
            # The retries budget is never passed: the unit waits for a budget decision.
            _status, reason, details = blocked_reason(over)
            store.set_unit_status(run.run_id, run.branch_id, unit.id, "blocked", reason,
                                  {**details, **extra}, attempt_id=aid)
            return AttemptResult(unit.id, aid, "blocked", reason)
        store.append_event(run.run_id, "attempt.failed", branch_id=run.branch_id, unit=unit.id,
                           attempt_id=aid, payload={"error_class": error_class,
                                                    "message": message[:300], "will_retry": True,
                                                    **extra})
        return AttemptResult(unit.id, aid, "retry", message)

    def _cutoff(self, unit_id: str, record: UnitRecord,
                current: dict[str, UnitRecord]) -> dict[str, UnitRecord]:
        """Early cut-off: invalidated dependents that consumed byte-identical output stay
        current (transitively), each with a note saying so."""
        from keepstep.engine.core.invalidation import cutoff, cutoff_note

        if not self.cache.invalidated:
            return {}  # the common case: nothing to keep, no graph walk on the hot path
        plan = self._plan or self.run.plan
        records = dict(current)
        records[unit_id] = record
        kept: dict[str, UnitRecord] = {}
        frontier = [unit_id]
        while frontier:
            uid = frontier.pop()
            outs = {n: o.sha256 for n, o in records[uid].outputs.items()}
            for dep in cutoff(plan, uid, outs, records):
                rec = records[dep]
                if rec.state != UnitState.invalidated:
                    continue
                rec = rec.model_copy(update={"state": UnitState.succeeded,
                                             "cutoff_note": cutoff_note(uid)})
                records[dep] = kept[dep] = rec
                frontier.append(dep)
        return kept

    def _record(self, unit_id: str) -> UnitRecord | None:
        with self.cache.lock:
            self.cache.refresh()
            return self.cache.records.get(unit_id)

    def _commit(self, ctx: AttemptContext, claim: Any, record: Any, started: float) -> int:
        """CAS commit at the cached head, under the run's lock; on a head moved by another
        executor, catch the cache up, re-check what the attempt consumed and rebase; read the
        head when the acknowledgement is lost."""
        run, store, cache = self.run, self.store, self.cache
        with cache.lock:
            for _ in range(20):
                expected = cache.refresh()
                current = cache.records
                if expected != claim.claimed_at_version:
                    # The head moved since the claim (our own units' commits, or another
                    # executor's): rebase only if what this attempt consumed is unchanged.
                    for dep, outs in record.consumed.items():
                        cur = current.get(dep)
                        if cur is None or cur.state != UnitState.succeeded or \
                                {n: o.sha256 for n, o in cur.outputs.items()} != outs:
                            raise LeaseLost(f"{claim.unit}: dependency {dep} changed under the "
                                            "attempt")
                    cur_plan = cache.keys.get("plan") or {}
                    if cur_plan.get("n") != record.plan_n:
                        raise LeaseLost(f"{claim.unit}: the plan changed under the attempt")
                kept = self._cutoff(claim.unit, record, current)
                used = store.get_budget(run.run_id, run.branch_id).used
                delta = {unit_key(claim.unit): record.model_dump(mode="json"),
                         "budget": used,
                         **{unit_key(u): r.model_dump(mode="json") for u, r in kept.items()}}
                kept_events = [EventIn(kind="unit.kept_current", unit=u,
                                       payload={"note": r.cutoff_note}) for u, r in kept.items()]
                try:
                    version = store.commit_checkpoint(
                        run.run_id, run.branch_id, expected, delta, ctx.staged,
                        claim.fencing_token, kind="unit-success", unit=claim.unit,
                        attempt_id=claim.attempt_id, clear_unit_status=[claim.unit],
                        current={claim.unit: claim.attempt_id,
                                 **{u: r.attempt for u, r in kept.items()}},
                        usage={"wall_time_s": max(0.0, run.clock() - started)},
                        events=[EventIn(kind="unit.succeeded", unit=claim.unit,
                                        attempt_id=claim.attempt_id,
                                        payload={"outputs": {k: v.sha256[:12] for k, v in
                                                             record.outputs.items()}}),
                                *kept_events],
                    )
                except CheckpointConflict:
                    continue  # another executor committed meanwhile: catch up and rebase
                except (StorageBusy, CommitOutcomeUnknown):
                    # The outcome is learnt from the database, never guessed as "failed".
                    att = store.get_attempt(run.run_id, claim.attempt_id)
                    if att is not None and att.status == "committed":
                        cache.refresh()
                        return store.get_head(run.run_id, run.branch_id).version
                    raise
                cache.apply(version, {claim.unit: record, **kept}, {"budget": used})
                return version
        raise LeaseLost(f"{claim.unit}: could not commit after repeated head moves")


def _safe_message(exc: BaseException, unit_id: str | None = None) -> str:
    """A short, scrubbed message for an unexpected error: its class and first line, with
    anything key-shaped redacted; never a traceback, never a provider body."""
    from keepstep.engine.gateway.redaction import redact

    first = (str(exc).strip().splitlines() or [""])[0][:200]
    where = f"{unit_id}: " if unit_id else ""
    text = f"{where}unexpected {type(exc).__name__}" + (f": {first}" if first else "")
    if isinstance(exc, UnicodeError):
        text += " (an input is not UTF-8 text)"
    return redact(text)


__all__ = ["RunLoop"]
