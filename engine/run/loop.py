"""The run loop's scheduler: decide, claim, hand the unit to a worker — until done, blocked or
cancelled. One unit's attempt (execute, verify, commit or end) is ``run.runner.AttemptRunner``;
where a commit is made is ``run.commit``; how an error ends an attempt is ``run.ending``.

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

Scheduling is flat: the committed records live in memory (``Run.facts_cache``), each
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

import queue
import threading
import time
from typing import Any

from keepstep.engine.core.decide import (
    RUN_WIDE_BLOCKS,
    Decision,
    DecisionKind,
    ReadySet,
    decide,
)
from keepstep.engine.core.plan import Plan, Unit, UnitKind
from keepstep.engine.core.presets import evidence_sources
from keepstep.engine.core.state import RunFacts, UnitRecord, UnitState
from keepstep.engine.errors import RunCancelled
from keepstep.engine.run.attempt import AttemptResult
from keepstep.engine.run.commit import UnitCommitter
from keepstep.engine.run.ending import AttemptOutcome
from keepstep.engine.run.gates import request_gates
from keepstep.engine.run.runner import AttemptRunner, LoopSettings
from keepstep.engine.run.runtime import Run
from keepstep.storage import CheckpointConflict, Claim, LeaseHeld

# How often the scheduler looks at the cancel flag and other executors' commits while it waits.
TICK_S = 0.05


class _InFlight:
    def __init__(self, unit: str, claim: Claim, started: float) -> None:
        self.unit = unit
        self.claim = claim
        self.started = started
        self.abandoned = False


class RunLoop:
    """The scheduler of one run: ``RunLoop(run, settings).loop()`` (or keyword arguments,
    each a field of LoopSettings)."""

    def __init__(self, run: Run, settings: LoopSettings | None = None,
                 **fields: Any) -> None:
        if settings is None:
            fields["approve"] = dict(fields.get("approve") or {})
            fields["stop_after"] = set(fields.get("stop_after") or ())
            settings = LoopSettings(**fields)
        elif fields:
            raise TypeError("give either a LoopSettings or its fields, not both")
        self.run = run
        self.settings = settings
        self.store = run.store
        self.cancel = settings.cancel
        self.on_event = settings.on_event
        self.stop_after = settings.stop_after
        self.max_units = settings.max_units
        # Units this executor never claims (their sources differ on this host): left to
        # the other executors of a shared run.
        self.left_out = dict(settings.left_out)
        self.jobs = max(1, int(settings.jobs if settings.jobs is not None
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
        self._index: tuple[Plan, dict[str, Unit]] | None = None
        committer = UnitCommitter(run, self.cache, self.plan)
        self.runner = AttemptRunner(run, settings, stop=self._stop, plan=self.plan,
                                    committer=committer, emit=self.emit)

    def plan(self) -> Plan:
        """The plan the ready set was built from (the run's plan before the first one)."""
        return self._plan or self.run.plan

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
                    facts.gates_open = request_gates(self.run, facts, approve=self.settings.approve)
                ready = ready_set.ready(facts, exclude=set(self._inflight) | set(self.left_out),
                                        limit=self.jobs)
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
            if d.kind == DecisionKind.claim and set(d.ready) <= set(self.left_out):
                # Only units left to other executors are ready: wait while another executor
                # is at work (its commits may make more ready here), else stop, saying so.
                if any(facts.effective_state(u.id) == UnitState.running for u in plan.units):
                    self._wait_for_others()
                    continue
                left = Decision(kind=DecisionKind.waiting, reasons=[
                    f"{u} is left to an executor whose copy matches: {self.left_out[u]}"
                    for u in d.ready])
                self.emit("decision", decision=left.kind.value, unit=None,
                          reasons=left.reasons, head=facts.head_version)
                return left
            if d.kind == DecisionKind.claim:
                # The ready set and decide() disagree: rebuild the set from the records.
                self._ready = None
                continue
            if d.kind == DecisionKind.waiting:
                # Another executor holds the only ready work: wait for its commit (or its
                # lease to expire, which recovery's claim then fences) and decide again.
                self._wait_for_others()
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

    def _wait_for_others(self) -> None:
        """Nothing of ours in flight, nothing ready here: wait for another executor's change
        (a server store wakes this at once; else this is a poll), at most ``poll_seconds``,
        looking at the cancel flag every tick."""
        deadline = time.monotonic() + self.settings.poll_seconds
        while not self._cancelled():
            left = deadline - time.monotonic()
            if left <= 0 or self.store.wait_for_change(self.run.run_id, min(TICK_S, left)):
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
            if result.outcome == AttemptOutcome.committed and result.unit in self.stop_after:
                final = Decision(kind=DecisionKind.blocked,
                                 reasons=[f"stopped after {result.unit} as asked"])
            elif result.outcome == AttemptOutcome.blocked:
                st = self.store.unit_statuses(self.run.run_id, self.run.branch_id)
                kind = st[result.unit].details.get("kind") if result.unit in st else None
                if kind not in RUN_WIDE_BLOCKS:
                    # (A budget, quota or key block holds every unit that calls a model —
                    # the ready set leaves them out — but units that make no call go on.)
                    final = Decision(kind=DecisionKind.blocked,
                                     reasons=[f"{result.unit} blocked: {result.detail}"])
            elif result.outcome == AttemptOutcome.orphaned:
                final = Decision(kind=DecisionKind.blocked,
                                 reasons=[f"{result.attempt_id}: {result.detail}"])

    def _wind_down(self) -> int:
        """After ``_stop``: give units in flight ``cancel_grace_s`` to reach a safe point, then
        cancel the rest from here (attempt ``cancelled``, lease released by its token).
        Returns how many were cancelled from here."""
        deadline = time.monotonic() + self.settings.cancel_grace_s
        while self._inflight and time.monotonic() < deadline:
            try:
                job, _result, _error = self._done.get(timeout=TICK_S)
            except queue.Empty:
                continue
            if self._inflight.get(job.unit) is job:
                del self._inflight[job.unit]
        for job in list(self._inflight.values()):
            job.abandoned = True
            try:
                self.runner.cancel_from_outside(job.claim)
            except Exception:  # noqa: BLE001, S110 - the lease then expires; recovery fences it
                pass
        abandoned = len(self._inflight)
        self._inflight.clear()
        return abandoned

    def _claim(self, unit_id: str, facts: RunFacts, plan: Plan,
               ) -> tuple[Unit, Claim, dict[str, UnitRecord], dict[str, Any]] | None:
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
        # The run's state keys at the claimed head (plan, inputs, versions): the attempt
        # reads them from here, not from the store (a commit replaces a key's value, never
        # changes it in place, so this shallow copy stays as it was at the claim).
        return unit, claim, deps, dict(self.cache.keys)

    def _unit_index(self, plan: Plan) -> dict[str, Unit]:
        index = self._index
        if index is None or index[0] is not plan:
            index = self._index = (plan, plan.unit_map())
        return index[1]

    def _launch(self, unit: Unit, claim: Claim, deps: dict[str, UnitRecord],
                committed: dict[str, Any]) -> None:
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
                result = self.runner.run_unit(unit, claim, deps, started, committed)
            except RunCancelled:
                result = AttemptResult(unit.id, claim.attempt_id, AttemptOutcome.cancelled,
                                       "cancelled")
            except BaseException as exc:  # noqa: BLE001 - reported to the scheduler
                error = exc
                self.runner.release_after_error(claim, exc, started)
            self._done.put((job, result, error))

        self.run.project.worker_pool.submit(work)


__all__ = ["LoopSettings", "RunLoop"]
