"""RunStatus: the dashboard's facts and views, recomputed from stored facts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.decide import Decision, DecisionKind, decide, ready_units
from keepstep.engine.core.plan_graph import gc_paused
from keepstep.engine.core.state import counts
from keepstep.engine.core.timefmt import parse_iso
from keepstep.engine.report.next_action import Need, needs
from keepstep.engine.run.gates import PendingApproval, pending_approvals
from keepstep.storage import NotFound

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run
    from keepstep.storage import Checkpoint

VIEW_VERSION = "status-view-1"
# Attempts that ended as an ordinary failure: their uncommitted files are its diagnosis.
ENDED_BY_FAILURE = ("failed", "timed_out", "blocked", "cancelled")


class UnitView(BaseModel):
    state: str
    attempts: int
    current_attempt: str | None
    reason: str | None = None
    # A failed unit's validator problems and rejected answers (see UnitExplanation).
    problems: list[dict[str, Any]] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)
    title: str = ""
    phase: str = ""
    kind: str = ""
    # A unit blocked by the budget: the refusal's figures, counter -> used, limit, requested.
    budget: dict[str, dict[str, float]] = Field(default_factory=dict)


class InFlightUnit(BaseModel):
    """A unit some executor is working on now: its lease, the step it last reported (the
    lease's progress string, renewed with every heartbeat) and when its attempt started."""

    unit: str
    title: str = ""
    attempt: str
    owner: str
    step: str | None = None
    started_at: str | None = None  # ISO, from the attempt row
    started_ts: float | None = None
    expires_at: float
    expired: bool = False


class RunStatus(BaseModel):
    run_id: str
    branch: str
    plan_version: str
    input_version: str
    head_version: int
    checkpoint_commits: int
    commits_by_kind: dict[str, int]
    units: dict[str, UnitView]
    counts: dict[str, int]
    budget: dict[str, dict[str, float]]
    leases: list[dict[str, Any]]
    in_flight: list[InFlightUnit] = Field(default_factory=list)
    pending_approvals: list[PendingApproval]
    external_unknown: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    next_action: str
    needs: list[Need] = Field(default_factory=list)
    decision: str
    reasons: list[str] = Field(default_factory=list)
    last_commit_at: str | None = None
    progress_pct: float = 0.0
    models: list[str] = Field(default_factory=list)
    # Every executor holding a lease on this run (any host): host, lease count, and its
    # last heartbeat (the newest lease renewal), newest first.
    executors: list[dict[str, Any]] = Field(default_factory=list)
    view_version: str = VIEW_VERSION

    def _repr_html_(self) -> str:  # Jupyter
        from keepstep.engine.report.display import status_html

        return status_html(self)


# Every read below costs what it returns, not what the run has been through: events by kind
# come off an index, attempt and commit counts off counters, orphans from the attempts that
# never committed, the last commit from the head.


def executors_of(leases: Any, now: float) -> list[dict[str, Any]]:
    """Executors by their leases: an executor id is ``host:pid:random``; its heartbeat is
    its newest lease renewal (the store's clock: on a server, the server's)."""
    by: dict[str, dict[str, Any]] = {}
    for lease in leases:
        e = by.setdefault(lease.owner, {"executor": lease.owner,
                                        "host": lease.owner.split(":", 1)[0], "leases": 0,
                                        "live": 0, "heartbeat_at": 0.0})
        e["leases"] += 1
        e["live"] += int(lease.expires_at > now)
        e["heartbeat_at"] = max(e["heartbeat_at"], lease.renewed_at)
    for e in by.values():
        e["heartbeat_age_s"] = round(max(0.0, now - e["heartbeat_at"]), 1)
    return sorted(by.values(), key=lambda e: -e["heartbeat_at"])


def _alerts(run: Run, facts: Any, last_commit_ts: float | None,
            decision_kind: str) -> list[dict]:
    policy = run.project.files.config.policy
    out: list[dict[str, Any]] = []
    if decision_kind != DecisionKind.done and last_commit_ts is not None and \
            facts.now - last_commit_ts > policy.stall_no_commit_s:
        out.append({"kind": "no_commit", "message": f"no new commit for "
                    f"{int(facts.now - last_commit_ts)} s"})
    for lease in facts.leases.values():
        if lease.renewed_at - lease.progress_at > policy.stall_no_commit_s / 2:
            out.append({"kind": "lease_without_progress", "unit": lease.unit,
                        "message": f"{lease.unit}'s lease is renewed but its progress has not "
                        f"moved for {int(lease.renewed_at - lease.progress_at)} s"})
    for ev in run.store.events(run.run_id, branch_id=run.branch_id, kind_prefix="alert.",
                               newest_first=True, limit=20):
        alert = {"kind": ev.kind.removeprefix("alert."), "unit": ev.unit, **ev.payload,
                 "ts": ev.ts}
        if not alert.get("message"):
            alert["message"] = _alert_message(alert)
        out.append(alert)
    if decision_kind == DecisionKind.blocked:
        out.append({"kind": "nothing_ready", "message": "nothing is ready but the run is not done"})
    return out


def _alert_message(alert: dict[str, Any]) -> str:
    """A sentence for an alert event recorded without one."""
    if alert["kind"] == "repeated_error":
        return (f"{alert.get('unit') or 'a unit'} failed {alert.get('count', 'several')} times "
                f"with {alert.get('error_class') or 'the same error'}")
    details = ", ".join(f"{k} {v}" for k, v in alert.items()
                        if k not in ("kind", "unit", "ts") and v not in (None, "", [], {}))
    return details or alert["kind"].replace("_", " ")


def recovery_stop(run: Run) -> str | None:
    """Why the newest recovery stopped (failed, blocked, breaker open), unless a later one
    finished or a person reset it: a run whose recovery stopped must not read "resume"."""
    evs = run.store.events(run.run_id, branch_id=run.branch_id, kinds=[
        "recovery.done", "recovery.failed", "recovery.blocked", "decision.recovery_reset"],
        newest_first=True, limit=1)
    if not evs or evs[0].kind in ("recovery.done", "decision.recovery_reset"):
        return None
    return str(evs[0].payload.get("reason") or "recovery stopped")


def run_status(run: Run) -> RunStatus:
    """The run's status, built with garbage collection paused: a view per unit of the plan
    (10,000 at once) would otherwise set off full collections, each scanning every object of
    the loaded plan (``plan_graph.gc_paused``)."""
    with gc_paused():
        return _run_status(run)


def _run_status(run: Run) -> RunStatus:
    from keepstep.engine.report.next_action import next_action

    store = run.store
    facts = run.facts()
    plan = run.plan
    head = store.get_head(run.run_id, run.branch_id)
    ready = ready_units(plan, facts)
    decision = decide(plan, facts, ready=ready)
    stopped = recovery_stop(run)
    if stopped is not None:
        decision = Decision(kind=DecisionKind.blocked, ready=decision.ready,
                            reasons=[f"recovery stopped: {stopped}", *decision.reasons])
    attempts = store.attempt_counts(run.run_id)
    units = {}
    for u in plan.units:
        rec = facts.records.get(u.id)
        st = facts.statuses.get(u.id)
        lease = facts.leases.get(u.id)
        units[u.id] = UnitView(
            state=facts.effective_state(u.id).value,
            attempts=attempts.get(u.id, 0),
            current_attempt=lease.attempt_id if lease else (rec.attempt if rec else None),
            reason=st.reason if st else None,
            problems=list((st.details.get("diagnosis") or {}).get("problems", [])) if st else [],
            answers=list((st.details.get("diagnosis") or {}).get("answers", [])) if st else [],
            title=u.title, phase=u.phase, kind=u.kind.value,
            budget=dict(st.details.get("figures") or {})
            if st and st.details.get("kind") == "budget" else {},
        )
    c = counts(facts, plan, ready)
    # An attempt that ended as an ordinary failure (validators, a timeout) keeps its files
    # as the failure's diagnosis: not an orphan. Orphans are what an interruption left.
    orphans = [o for o in store.orphaned_attempts(run.run_id)
               if (a := store.get_attempt(run.run_id, o.attempt_id)) is None
               or a.status not in ENDED_BY_FAILURE]
    c["orphans"] = len(orphans)
    by_kind = store.count_checkpoints(run.run_id, run.branch_id)
    # Successes later invalidated (or replaced by a newer success): each success is one
    # unit-success commit, and each unit holds at most one current record.
    c["superseded"] = max(0, by_kind.get("unit-success", 0) - c["current"])
    titles = {u.id: u.title for u in plan.units}
    in_flight = []
    for lease in facts.leases.values():
        attempt = store.get_attempt(run.run_id, lease.attempt_id)
        started = attempt.started_at if attempt is not None else None
        in_flight.append(InFlightUnit(
            unit=lease.unit, title=titles.get(lease.unit, ""), attempt=lease.attempt_id,
            owner=lease.owner, step=lease.progress, started_at=started,
            started_ts=parse_iso(started) if started else None, expires_at=lease.expires_at,
            expired=lease.expires_at <= facts.now))
    last: Checkpoint | None
    try:
        last = store.get_checkpoint(run.run_id, head.version, run.branch_id)
    except NotFound:  # a damaged chain: the newest row there is (recovery reports the rest)
        newest = store.list_checkpoints(run.run_id, run.branch_id, limit=1)
        last = newest[0] if newest else None
    last_ts = parse_iso(last.created_at) if last else None
    budget = facts.budget
    effects = [e for e in store.effects(run.run_id) if e.status in ("intent", "unknown")]
    status = RunStatus(
        run_id=run.run_id, branch=run.branch_id,
        plan_version=facts.plan_info.get("label", "plan-v1"),
        input_version=facts.inputs_info.get("label", "in-v1"),
        head_version=head.version, checkpoint_commits=sum(by_kind.values()),
        commits_by_kind=by_kind, units=units, counts=c,
        budget={"used": dict(budget.used), "limits": dict(budget.limits),
                "left": budget.left()},
        leases=[{"unit": lease.unit, "attempt": lease.attempt_id, "owner": lease.owner,
                 "token": lease.fencing_token, "expires_at": lease.expires_at,
                 "expired": lease.expires_at <= facts.now} for lease in facts.leases.values()],
        in_flight=in_flight,
        pending_approvals=pending_approvals(run, facts),
        external_unknown=[e.model_dump(mode="json") for e in effects],
        alerts=_alerts(run, facts, last_ts, decision.kind.value),
        next_action="", decision=decision.kind.value, reasons=decision.reasons,
        last_commit_at=last.created_at if last else None,
        progress_pct=round(100.0 * c["current"] / max(1, len(plan.units)), 1),
        models=sorted({run.model_for(u) for u in plan.units}) or [
            run.project.files.config.default_model],
    )
    status.executors = executors_of(facts.leases.values(), facts.now)
    status.needs = needs(status, recovery_stopped=stopped, budget_limits=dict(budget.limits))
    status.next_action = next_action(status, decision)
    if stopped is not None:
        status.alerts.insert(0, {"kind": "recovery_stopped", "message": stopped})
        status.next_action = (f"recovery stopped: {stopped}; look at the events, then "
                              f"{status.needs[0].command}")
    return status


__all__ = ["InFlightUnit", "RunStatus", "UnitView", "run_status"]
