"""The run loop: decide, claim, execute, commit — until done, blocked or cancelled."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.decide import RUN_WIDE_BLOCKS, Decision, DecisionKind, decide
from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.state import UnitRecord, UnitState, unit_key
from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    KeepstepError,
    LeaseLost,
    ModelError,
    QuotaExhausted,
    RunCancelled,
    SideEffectError,
)
from keepstep.engine.kinds import get_kind
from keepstep.engine.run.attempt import (
    AttemptContext,
    AttemptResult,
    Heartbeat,
    ReplayMiss,
    UnitTimedOut,
    blocked_reason,
    build_record,
    input_fingerprints,
    record_diagnosis,
    verify_staged,
)
from keepstep.storage import (
    CheckpointConflict,
    CommitOutcomeUnknown,
    EventIn,
    LeaseHeld,
    StaleFencingToken,
    StorageBusy,
    crash_point,
)

if TYPE_CHECKING:
    from keepstep.engine.api import Run

RETRYABLE_OUTCOMES = ("failed", "timed_out")
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


class RunLoop:
    def __init__(
        self,
        run: Run,
        *,
        cancel: threading.Event | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        approve: dict[str, str] | None = None,
        replay: dict[str, str] | None = None,
        max_units: int | None = None,
        stop_after: set[str] | None = None,
    ) -> None:
        self.run = run
        self.stop_after = set(stop_after or ())
        self.poll_seconds = 0.2
        self.store = run.store
        self.cancel = cancel
        self.on_event = on_event
        self.approve = dict(approve or {})
        self.replay = replay
        self.max_units = max_units
        self.executed: list[AttemptResult] = []

    def emit(self, kind: str, **payload: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"kind": kind, **payload})
            except Exception:  # a display callback must never break the run
                pass

    # -- the loop --------------------------------------------------------------
    def loop(self) -> Decision:
        last_blocked: str | None = None
        while True:
            if self.cancel is not None and self.cancel.is_set():
                raise RunCancelled("cancelled before the next unit")
            facts = self.run.facts(approve=self.approve, ask=True)
            plan = self.run.plan
            d = decide(plan, facts)
            self.emit("decision", decision=d.kind.value, unit=d.unit, reasons=d.reasons,
                      head=facts.head_version)
            if d.kind == DecisionKind.claim:
                if self.max_units is not None and len(self.executed) >= self.max_units:
                    return d
                result = self.run_unit(d.unit, facts)
                if result is None:
                    continue
                self.executed.append(result)
                self.emit("attempt", unit=result.unit, attempt=result.attempt_id,
                          outcome=result.outcome, detail=result.detail)
                if result.outcome == "committed" and result.unit in self.stop_after:
                    return Decision(kind=DecisionKind.blocked,
                                    reasons=[f"stopped after {result.unit} as asked"])
                if result.outcome == "blocked":
                    st = self.store.unit_statuses(self.run.run_id, self.run.branch_id)
                    kind = st[result.unit].details.get("kind") if result.unit in st else None
                    if kind in RUN_WIDE_BLOCKS:
                        # decide() now holds every unit that calls a model; units that
                        # make no model call can still go on.
                        continue
                    return Decision(kind=DecisionKind.blocked,
                                    reasons=[f"{result.unit} blocked: {result.detail}"])
                if result.outcome == "orphaned":
                    return Decision(kind=DecisionKind.blocked,
                                    reasons=[f"{result.attempt_id}: {result.detail}"])
                continue
            if d.kind == DecisionKind.waiting:
                # Another executor holds the only ready work: wait for its commit (or its
                # lease to expire, which recovery's claim then fences) and decide again.
                waiter = self.cancel or threading.Event()
                waiter.wait(self.poll_seconds)
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

    # -- one unit ----------------------------------------------------------------
    def run_unit(self, unit_id: str, facts: Any) -> AttemptResult | None:
        run = self.run
        store = self.store
        plan = run.plan
        unit = plan.unit_map()[unit_id]
        policy = run.project.files.config.policy
        try:
            claim = store.claim(run.run_id, run.branch_id, unit_id,
                                expected_version=facts.head_version, owner=run.executor_id,
                                lease_seconds=policy.lease_seconds)
        except (CheckpointConflict, LeaseHeld):
            return None  # someone else moved; decide again from the new head
        self.emit("claimed", unit=unit_id, attempt=claim.attempt_id, token=claim.fencing_token)
        started = run.clock()
        lease_lost = threading.Event()
        ctx = AttemptContext(
            store=store, run_id=run.run_id, branch_id=run.branch_id, plan=plan,
            plan_n=run.plan_n, unit=unit, claim=claim, files=run.project.files,
            snapshot=run.snapshot, records=facts.records,
            # A replay answers from the recorded calls: no model client is even built.
            gateway=run.gateway() if self.replay is None else None,
            model=run.model_for(unit), api_base=run.project.files.config.api_base,
            replay=self.replay, cancel=self.cancel, lease_lost=lease_lost,
            deadline=started + unit.timeout_minutes * 60, clock=run.clock,
            decision_events=run.decision_events, adapters=run.project.effect_adapters,
        )
        hb = Heartbeat(store, claim, interval=policy.heartbeat_seconds,
                       lease_seconds=policy.lease_seconds, progress=lambda: ctx.progress,
                       on_event=self.on_event)
        # The heartbeat's "lost" flag and the context's are one and the same.
        hb.lost = lease_lost
        hb.start()
        try:
            return self._execute(ctx, claim, unit, facts)
        finally:
            hb.stop()
            store.add_usage(run.run_id, {"wall_time_s": max(0.0, run.clock() - started)},
                            branch_id=run.branch_id)

    def _execute(self, ctx: AttemptContext, claim: Any, unit: Any, facts: Any) -> AttemptResult:
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
            version = self._commit(ctx, claim, record)
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
            reason = (f"storage: the disk is full ({errno.errorcode[exc.errno]}) while "
                      f"{unit.id} was staging its output")
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
        except KeepstepError as exc:
            return self._fail(claim, unit, "failed", str(exc).splitlines()[0], "error", final=True)

    def _effect_unsettled(self, claim: Any, unit: Any, exc: SideEffectError) -> AttemptResult:
        """An external action of the unit has no receipt: block the unit on that effect
        (recovery asks the adapter on resume and unblocks it; else a person decides) —
        never a retry. Without an open effect the unit fails: within the retry bounds when
        the adapter rejected the action (certainly not done), at once when it was misused."""
        from keepstep.engine.run.effects import UNRESOLVED, EffectRejected

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
        rec = run.facts_records().get(unit.id)
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

        if not any(r.state == UnitState.invalidated for r in current.values()):
            return {}  # the common case: nothing to keep, no graph walk on the hot path
        plan = self.run.plan
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

    def _commit(self, ctx: AttemptContext, claim: Any, record: Any) -> int:
        """CAS commit; on a head move by another unit, re-check and rebase; read the head
        when the acknowledgement is lost."""
        run, store = self.run, self.store
        expected = claim.claimed_at_version
        # The records loaded when the unit was claimed are the head it committed against;
        # after a rebase they are re-read below.
        current = ctx.records
        for _ in range(20):
            kept = self._cutoff(claim.unit, record, current)
            delta = {unit_key(claim.unit): record.model_dump(mode="json"),
                     "budget": store.get_budget(run.run_id, run.branch_id).used,
                     **{unit_key(u): r.model_dump(mode="json") for u, r in kept.items()}}
            kept_events = [EventIn(kind="unit.kept_current", unit=u,
                                   payload={"note": r.cutoff_note}) for u, r in kept.items()]
            try:
                return store.commit_checkpoint(
                    run.run_id, run.branch_id, expected, delta, ctx.staged, claim.fencing_token,
                    kind="unit-success", unit=claim.unit, attempt_id=claim.attempt_id,
                    clear_unit_status=[claim.unit],
                    events=[EventIn(kind="unit.succeeded", unit=claim.unit,
                                    attempt_id=claim.attempt_id,
                                    payload={"outputs": {k: v.sha256[:12] for k, v in
                                                         record.outputs.items()}}),
                            *kept_events],
                )
            except CheckpointConflict:
                # Another unit committed meanwhile. Rebase only if what this attempt
                # consumed is still what the new head holds.
                head = store.get_head(run.run_id, run.branch_id)
                now_records = current = run.facts_records()
                for dep, outs in record.consumed.items():
                    cur = now_records.get(dep)
                    if cur is None or cur.state != UnitState.succeeded or \
                            {n: o.sha256 for n, o in cur.outputs.items()} != outs:
                        raise LeaseLost(f"{claim.unit}: dependency {dep} changed under the "
                                        "attempt") from None
                cur_plan = store.read_key(run.run_id, "plan", run.branch_id) or {}
                if cur_plan.get("n") != record.plan_n:
                    raise LeaseLost(f"{claim.unit}: the plan changed under the attempt") from None
                expected = head.version
            except (StorageBusy, CommitOutcomeUnknown):
                # The outcome is learnt from the database, never guessed as "failed".
                att = store.get_attempt(run.run_id, claim.attempt_id)
                if att is not None and att.status == "committed":
                    return store.get_head(run.run_id, run.branch_id).version
                raise
        raise LeaseLost(f"{claim.unit}: could not commit after repeated head moves")


__all__ = ["RunLoop"]
