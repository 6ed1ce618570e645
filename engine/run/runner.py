"""One unit's attempt, start to end: execute -> stage -> verify -> commit, or end.

``AttemptRunner.run_unit`` runs in a worker thread with a claim the scheduler made. It owns
the attempt's heartbeat (started here, stopped before the commit so a renewal never lands
after it). The attempt ends in exactly one of two writes: the unit-success commit
(``run.commit.UnitCommitter``), or one ``Store.end_attempt`` built from the ``Ending`` that
``run.ending.classify`` gives the error (plus the retry bound read from the store).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.plan import Plan, Unit, UnitKind
from keepstep.engine.core.state import UnitRecord
from keepstep.engine.kinds import get_kind
from keepstep.engine.run.attempt import (
    AttemptContext,
    AttemptResult,
    Heartbeat,
    build_record,
    input_fingerprints,
    record_diagnosis,
    verify_staged,
)
from keepstep.engine.run.budget import charge_retry
from keepstep.engine.run.commit import UnitCommitter
from keepstep.engine.run.effects import UNRESOLVED
from keepstep.engine.run.ending import (
    RETRYABLE_STATUSES,
    AttemptOutcome,
    Ending,
    EndingKind,
    blocked_status,
    classify,
    safe_message,
)
from keepstep.engine.run.facts_cache import plan_n_of, snapshot_of, templates_of
from keepstep.storage import (
    AttemptEnd,
    AttemptStatus,
    Claim,
    EventIn,
    UnitStatusChange,
    UnitStatusKind,
    crash_point,
)
from keepstep.storage.hashing import canonical_json, file_sha256

if TYPE_CHECKING:
    from keepstep.engine.kinds.model_step import CheckedAnswer, StepCall
    from keepstep.engine.run.runtime import Run

Emit = Callable[..., None]


def _same_failure_before(store: Any, run: Any, unit_id: str, tries: list[Any],
                         error_class: str, message: str,
                         diagnosis: dict[str, Any] | None) -> str | None:
    """The previous attempt (since the unit's last success) that failed its validators with
    the same message, the same problems and byte-identical rejected model answers, when this
    one did too — else None: deterministic on the same inputs, so a retry would fail the same
    way. Only validator failures count: a timeout or a provider error may pass next time."""
    if error_class != "invalid_output":
        return None
    before = [a for a in tries if a.error_class == error_class]
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

    return str(prev.attempt_id) if what(old) == what(diagnosis or {}) else None


@dataclass
class LoopSettings:
    """What a run loop is asked to do (one object instead of keyword arguments).

    ``jobs`` None: keepstep.toml's ``max_parallel``. ``replay``: request hash -> recorded
    answer (no model client is built). ``approve``: gate id -> option. ``max_units``: stop
    claiming after that many. ``stop_after``: stop once these units committed.
    ``left_out``: unit -> why this executor never claims it (it reads a source whose bytes
    here differ from the run's); other executors run it."""

    cancel: threading.Event | None = None
    on_event: Callable[[dict[str, Any]], None] | None = None
    approve: dict[str, str] = field(default_factory=dict)
    replay: dict[str, str] | None = None
    max_units: int | None = None
    stop_after: set[str] = field(default_factory=set)
    jobs: int | None = None
    left_out: dict[str, str] = field(default_factory=dict)
    # How long units in flight get to reach a safe point once the run is cancelled (Ctrl-C
    # must be honoured within 2 s, a model call can take a minute).
    cancel_grace_s: float = 1.2
    # How long the scheduler waits for another executor's commit before deciding again.
    poll_seconds: float = 0.2


class _Attempt(AttemptContext):
    """An attempt whose steps are reported as ``progress`` events."""

    on_step: Callable[[str], None] | None = None

    @property
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


class AttemptRunner:
    """Runs claimed units of one run (any number of threads at once)."""

    def __init__(self, run: Run, settings: LoopSettings, *, stop: threading.Event,
                 plan: Callable[[], Plan], committer: UnitCommitter, emit: Emit) -> None:
        self.run = run
        self.store = run.store
        self.settings = settings
        self.stop = stop
        self.plan = plan
        self.committer = committer
        self.emit = emit

    def run_unit(self, unit: Unit, claim: Claim, deps: dict[str, UnitRecord],
                 started: float, committed: Mapping[str, Any]) -> AttemptResult:
        """Run ``claim``'s attempt. ``committed``: the run's state keys (plan, inputs,
        versions) at the head the unit was claimed at — the facts cache's, so the attempt
        reads no state from the store."""
        run, store = self.run, self.store
        plan_info = committed.get("plan") or {}
        snapshot = snapshot_of(committed.get("inputs"))
        fingerprint_inputs = (snapshot, templates_of(plan_info),
                              dict(committed.get("versions") or {}))
        policy = run.project.files.config.policy
        lease_lost = threading.Event()
        replay = self.settings.replay
        ctx = _Attempt(
            store=store, run_id=run.run_id, branch_id=run.branch_id, plan=self.plan(),
            plan_n=plan_n_of(plan_info), unit=unit, claim=claim, files=run.project.files,
            snapshot=snapshot, records=deps,
            # A replay answers from the recorded calls: no model client is even built.
            gateway=run.gateway() if replay is None else None,
            model=run.model_for(unit), api_base=run.project.files.config.api_base,
            replay=replay, cancel=self.stop, lease_lost=lease_lost,
            deadline=started + unit.timeout_minutes * 60, clock=run.clock,
            decision_events=run.decision_events, adapters=run.project.effect_adapters,
        )
        ctx.on_step = lambda step: self.emit("progress", unit=unit.id, attempt=claim.attempt_id,
                                             step=step, started=started)
        heartbeat = Heartbeat(store, claim, interval=policy.heartbeat_seconds,
                              lease_seconds=policy.lease_seconds, progress=lambda: ctx.progress,
                              on_event=self.settings.on_event, lost=lease_lost)
        heartbeat.start()
        try:
            return self._execute(ctx, claim, unit, started, heartbeat, fingerprint_inputs)
        except BaseException as exc:
            ending = classify(exc, unit.id, run.project.root)
            if ending is None:
                raise  # not the unit's to end: the last line (release_after_error) does
            result = self.end(claim, unit, ending, started)
            if ending.kind == EndingKind.cancel:
                raise
            return result
        finally:
            heartbeat.stop()

    def _execute(self, ctx: AttemptContext, claim: Claim, unit: Unit, started: float,
                 heartbeat: Heartbeat,
                 fingerprint_inputs: tuple[InputSnapshot, dict[str, str], dict[str, str]],
                 ) -> AttemptResult:
        run, store = self.run, self.store
        _spec, fn = get_kind(unit.kind.value)
        outcome = fn(ctx)
        ctx.safe_point("staged")
        crash_point("unit.after_stage")
        crash_point(f"unit.after_stage:{unit.id}")
        problems = verify_staged(store, ctx.staged)
        if problems:
            return self.end(claim, unit, Ending(
                EndingKind.fail, AttemptStatus.failed,
                "staged files did not verify: " + "; ".join(problems), "integrity"), started)
        crash_point("unit.after_verify")
        if not outcome.passed and unit.kind != UnitKind.audit:
            failed = [v.name for v in outcome.validators if not v.passed]
            return self.end(claim, unit, Ending(
                EndingKind.fail, AttemptStatus.failed,
                "validators failed: " + ", ".join(failed), "invalid_output"), started,
                diagnosis=record_diagnosis(ctx, outcome))
        ctx.safe_point("verified")
        record = build_record(ctx, outcome, input_fingerprints(
            unit, run.project.files, *fingerprint_inputs))
        # The lease stops being renewed before the commit (the commit checks the token, not
        # the expiry): a renewal can then never land after the unit has committed.
        heartbeat.stop()
        version = self.committer.commit_unit(claim, record, ctx.staged, started)
        store.artifacts.seal(ctx.staged)
        return AttemptResult(unit.id, claim.attempt_id, AttemptOutcome.committed,
                             version=version)

    # -- the one ending ------------------------------------------------------------
    def end(self, claim: Claim, unit: Unit, ending: Ending, started: float, *,
            diagnosis: dict[str, Any] | None = None) -> AttemptResult:
        """Write ``ending`` in one ``end_attempt`` (the wall time it took included) and say
        what it was. A failure is retried within the unit's bounds and the retries budget;
        an unsettled external action blocks the unit on it."""
        usage = {"wall_time_s": max(0.0, self.run.clock() - started)}
        aid = claim.attempt_id
        if ending.kind == EndingKind.fence:
            self._end(claim, AttemptEnd(
                status=AttemptStatus.fenced, message=ending.message, usage=usage,
                events=(EventIn(kind="attempt.fenced", unit=unit.id, attempt_id=aid, payload={
                    "reason": "lease taken over; output left as an orphan"}),)))
            return AttemptResult(unit.id, aid, AttemptOutcome.orphaned,
                                 "lease lost; output is an orphan")
        if ending.kind == EndingKind.cancel:
            self._end(claim, AttemptEnd(
                status=AttemptStatus.cancelled, message="cancelled", usage=usage,
                events=(EventIn(kind="attempt.cancelled", unit=unit.id, attempt_id=aid),)))
            return AttemptResult(unit.id, aid, AttemptOutcome.cancelled, "cancelled")
        if ending.kind == EndingKind.block:
            self._end(claim, AttemptEnd(
                status=AttemptStatus.blocked, error_class=ending.error_class,
                message=ending.message, unit_status=ending.unit_status, usage=usage))
            return AttemptResult(unit.id, aid, AttemptOutcome.blocked, ending.message)
        if ending.kind == EndingKind.effect:
            return self._effect_unsettled(claim, unit, ending, usage)
        return self._fail(claim, unit, ending, usage, diagnosis)

    def _end(self, claim: Claim, end: AttemptEnd) -> bool:
        return self.store.end_attempt(claim, end)

    def _effect_unsettled(self, claim: Claim, unit: Unit, ending: Ending,
                          usage: dict[str, float]) -> AttemptResult:
        """An external action of the unit has no receipt: block the unit on that effect
        (recovery asks the adapter on resume and unblocks it; else a person decides) —
        never a retry. Without an open effect the unit fails: within the retry bounds when
        the adapter rejected the action (certainly not done), at once when it was misused."""
        run, store = self.run, self.store
        message = ending.message
        open_effects = store.effects(run.run_id, UNRESOLVED, unit=unit.id,
                                     branch_id=run.branch_id)
        if not open_effects:
            return self._fail(claim, unit, Ending(
                EndingKind.fail, AttemptStatus.failed, message, "effect",
                final=not ending.rejected), usage, None)
        row = open_effects[-1]
        current = store.unit_statuses(run.run_id, run.branch_id).get(unit.id)
        change = None
        if not (current and current.status == UnitStatusKind.blocked
                and current.details.get("effect") == row.idem_key):
            # The same details effects._block writes, so a settled effect unblocks the unit.
            change = UnitStatusChange(
                UnitStatusKind.blocked, f"external outcome unknown: {message}",
                {"kind": "effect", "effect": row.idem_key, "action": row.action,
                 "adapter": row.adapter})
        self._end(claim, AttemptEnd(status=AttemptStatus.blocked, error_class="effect",
                                    message=message[:500], unit_status=change, usage=usage))
        return AttemptResult(unit.id, claim.attempt_id, AttemptOutcome.blocked, message)

    def _fail(self, claim: Claim, unit: Unit, ending: Ending, usage: dict[str, float],
              diagnosis: dict[str, Any] | None) -> AttemptResult:
        """A failed attempt: retried within the bounds (and the retries budget), else the
        unit is marked failed. ``diagnosis`` (validator problems, rejected answers) goes with
        the attempt's event and the unit's status."""
        run, store = self.run, self.store
        aid = claim.attempt_id
        message, error_class = ending.message, ending.error_class or "error"
        policy = run.project.files.config.policy
        # The earlier tries since the unit's last success, on this branch, plus this one.
        tries = [a for a in store.attempts(run.run_id, unit.id)
                 if a.status in RETRYABLE_STATUSES and a.branch_id == run.branch_id
                 and a.attempt_id != aid]
        rec = self._record(unit.id)
        if rec is not None:
            last_ok = int(rec.attempt.rsplit("/a", 1)[1])
            tries = [a for a in tries if a.attempt_no > last_ok]
        this = [] if ending.status not in RETRYABLE_STATUSES else [(error_class, claim)]
        n_tries = len(tries) + len(this)
        same = sum(1 for a in tries if a.error_class == error_class) + len(this)
        events: list[EventIn] = []
        if same >= policy.stall_repeated_errors:
            events.append(EventIn(kind="alert.repeated_error", unit=unit.id,
                                  payload={"error_class": error_class, "count": same}))
        extra = {"diagnosis": diagnosis} if diagnosis else {}
        final = ending.final
        repeated = _same_failure_before(store, run, unit.id, tries, error_class, message,
                                        diagnosis)
        if repeated is not None and not final:
            # Deterministic on the same inputs: a retry would fail the same way.
            message = (f"{message} — the same failure as attempt {repeated} on the same "
                       f"inputs, so not retried: fix what it names, then "
                       f"`keepstep retry {unit.id}`")
            final = True
        end = AttemptEnd(status=ending.status, error_class=error_class, message=message[:500],
                         usage=usage)
        if final or n_tries > policy.max_unit_retries:
            if diagnosis:
                events.append(EventIn(kind="attempt.failed", unit=unit.id, attempt_id=aid,
                                      payload={"error_class": error_class,
                                               "message": message[:300], "will_retry": False,
                                               **extra}))
            self._end(claim, _with(end, UnitStatusChange(
                UnitStatusKind.failed, message,
                {"kind": error_class, "attempts": n_tries, **extra}), events))
            return AttemptResult(unit.id, aid, AttemptOutcome.failed, message)
        over = charge_retry(run, unit.id)
        if over is not None:
            # The retries budget is never passed: the unit waits for a budget decision.
            change = blocked_status(over)
            self._end(claim, _with(end, UnitStatusChange(
                UnitStatusKind.blocked, change.reason, {**change.details, **extra}), events))
            return AttemptResult(unit.id, aid, AttemptOutcome.blocked, change.reason)
        events.append(EventIn(kind="attempt.failed", unit=unit.id, attempt_id=aid,
                              payload={"error_class": error_class, "message": message[:300],
                                       "will_retry": True, **extra}))
        self._end(claim, _with(end, None, events))
        return AttemptResult(unit.id, aid, AttemptOutcome.retry, message)

    def _record(self, unit_id: str) -> UnitRecord | None:
        cache = self.committer.cache
        with cache.lock:
            cache.refresh()
            return cache.records.get(unit_id)

    # -- endings from outside the unit's thread -------------------------------------------
    def cancel_from_outside(self, claim: Claim) -> None:
        """The run stopped while the unit was inside a call: its attempt is cancelled (if it
        is still claimed) and its lease released; the thread's late answer is an orphan."""
        self._end(claim, AttemptEnd(
            status=AttemptStatus.cancelled, message="cancelled while a call was in flight",
            only_if=(AttemptStatus.claimed,),
            events=(EventIn(kind="attempt.cancelled", unit=claim.unit,
                            attempt_id=claim.attempt_id,
                            payload={"reason": "the run was stopped during a call"}),)))

    def release_after_error(self, claim: Claim, exc: BaseException, started: float) -> None:
        """The last line: an error the attempt could not even record (storage trouble, a
        bug in the loop). Best effort, so a unit is never left running with a live lease;
        when even this fails, the lease expires and recovery fences it."""
        try:
            self._end(claim, AttemptEnd(
                status=AttemptStatus.failed, error_class="internal",
                message=safe_message(exc)[:500], only_if=(AttemptStatus.claimed,),
                usage={"wall_time_s": max(0.0, self.run.clock() - started)}))
        except Exception:  # noqa: BLE001, S110 - the lease then expires; recovery fences it
            pass


def _with(end: AttemptEnd, status: UnitStatusChange | None,
          events: list[EventIn]) -> AttemptEnd:
    return AttemptEnd(status=end.status, error_class=end.error_class, message=end.message,
                      usage=end.usage, unit_status=status, events=tuple(events))


__all__ = ["AttemptRunner", "LoopSettings"]
