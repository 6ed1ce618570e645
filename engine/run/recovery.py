"""Recovery: audit first, then reconcile, then apply detected changes (DESIGN §6).

Its own states (``RecoveryState``: started, auditing, reconciling, deciding, done,
blocked) and its own event kinds (``recovery.*``), so "a unit failed" and
"the recovery failed" are never confused. Running it twice is harmless: every
step is idempotent and the change commit is a compare-and-swap on the head.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.changes import artifact_lost
from keepstep.engine.core.invalidation import invalidate, released_by_change
from keepstep.engine.core.state import UnitState, unit_key
from keepstep.engine.core.timefmt import iso_utc, parse_iso
from keepstep.engine.errors import KeepstepError, PlanValidationError, RecoveryError
from keepstep.engine.run.baseline import detect, inputs_state, plan_state
from keepstep.engine.run.commit import commit
from keepstep.engine.run.effects import reconcile, settle_waiting
from keepstep.storage import (
    SCHEMA_VERSION,
    AttemptStatus,
    BudgetLimitReached,
    CommitRequest,
    EventIn,
    StorageError,
)
from keepstep.storage.hashing import file_sha256

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run


class RecoveryState(StrEnum):
    started = "started"
    auditing = "auditing"
    reconciling = "reconciling"
    deciding = "deciding"
    done = "done"
    blocked = "blocked"


class RecoveryReport(BaseModel):
    state: RecoveryState = RecoveryState.started
    blocked: bool = False
    reason: str = ""
    fenced: list[str] = Field(default_factory=list)
    orphans: list[str] = Field(default_factory=list)
    artifact_problems: list[str] = Field(default_factory=list)
    changes: list[str] = Field(default_factory=list)
    invalidated: list[str] = Field(default_factory=list)
    commits: list[int] = Field(default_factory=list)
    effects: list[str] = Field(default_factory=list)
    duration_s: float = 0.0
    did_work: bool = False


def _owner_dead(owner: str) -> bool:
    """True only when the owner is a process on this host that no longer exists."""
    parts = owner.split(":")
    if len(parts) < 2 or parts[0] != socket.gethostname():
        return False
    try:
        pid = int(parts[1])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie (killed, not yet reaped by its parent) is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


# An attempt that ended with no outcome recorded (its executor died or was fenced).
_ENDED_UNSEEN = (AttemptStatus.claimed, AttemptStatus.fenced)
_IN_FLIGHT = (AttemptStatus.claimed,)
# How often recovery starts its change commit again when another front end moved the head
# meanwhile; past that it stops (a person looks) instead of looping.
MAX_CHANGE_RESTARTS = 5


def _sealed(directory: str) -> bool:
    files = [f for f in Path(directory).rglob("*") if f.is_file()]
    return bool(files) and not any(f.stat().st_mode & 0o222 for f in files)


class Recovery:
    def __init__(self, run: Run, on_event: Callable[[dict[str, Any]], None] | None = None,
                 *, foreign_sources: frozenset[str] = frozenset()):
        """``foreign_sources``: approved sources whose bytes on this host differ from what
        the shared run recorded (a worker on another machine, ``engine.run.team``): this
        host's copy is not the team's input change, so their differences are not applied."""
        self.run = run
        self.store = run.store
        self.on_event = on_event
        self.foreign = {f"source:{s}" for s in foreign_sources}
        self.report = RecoveryReport()
        self.started = time.monotonic()

    def _event(self, kind: str, **payload: Any) -> None:
        self.store.append_event(self.run.run_id, f"recovery.{kind}",
                                branch_id=self.run.branch_id, payload=payload)
        if self.on_event is not None:
            try:
                self.on_event({"kind": f"recovery.{kind}", **payload})
            except Exception:
                pass

    def _block(self, reason: str, *, failed: bool = True) -> RecoveryReport:
        self.report.state = RecoveryState.blocked
        self.report.blocked = True
        self.report.reason = reason
        self._event("failed" if failed else "blocked", reason=reason)
        return self.report

    # -- circuit breaker -------------------------------------------------------
    def _breaker_open(self) -> str | None:
        policy = self.run.project.files.config.policy
        evs = self.store.events(self.run.run_id, branch_id=self.run.branch_id,
                                kinds=["recovery.failed", "recovery.done",
                                       "decision.recovery_reset"],
                                newest_first=True, limit=policy.max_recoveries + 1)
        failures = []
        for e in evs:
            if e.kind != "recovery.failed":
                break
            failures.append(e)
        if len(failures) >= policy.max_recoveries:
            return (f"recovery failed {len(failures)} times in a row (limit "
                    f"{policy.max_recoveries}): the circuit breaker is open — a person must "
                    "look (`keepstep verify`), then `keepstep recovery reset`")
        if failures:
            wait = policy.recovery_cooldown_s - (self.run.clock() - parse_iso(failures[0].ts))
            if wait > 0:
                return f"recovery is cooling down after a failure; try again in {wait:.0f} s"
        return None

    # -- the machine -----------------------------------------------------------
    def execute(self) -> RecoveryReport:
        opened = self._breaker_open()
        if opened:
            self.report.state = RecoveryState.blocked
            self.report.blocked = True
            self.report.reason = opened
            self._event("blocked", reason=opened)
            return self.report
        self._event("started", executor=self.run.executor_id)
        # A resume reads the state from the database, never from a cache of an earlier loop.
        self.run.drop_facts()
        try:
            self.report.state = RecoveryState.auditing
            if not self._audit():
                return self.report
            self.report.state = RecoveryState.reconciling
            self._reconcile()
            self.report.state = RecoveryState.deciding
            self._apply_changes()
        except PlanValidationError as exc:
            return self._block(f"the project files do not validate: {exc}")
        except StorageError:
            raise  # as before the shared error base: storage trouble is not a recovery block
        except KeepstepError as exc:
            return self._block(str(exc).splitlines()[0])
        if self.report.did_work:
            try:
                self.store.add_usage(self.run.run_id, {"recoveries": 1},
                                     branch_id=self.run.branch_id, enforce=True)
            except BudgetLimitReached as exc:
                return self._block(f"recovery attempts over their limit ({exc.args[0]}); "
                                   "raise it with `keepstep budget raise --recoveries N`",
                                   failed=False)
        self.report.state = RecoveryState.done
        self.report.duration_s = round(time.monotonic() - self.started, 3)
        self._event("done", **self._metrics())
        return self.report

    def _metrics(self) -> dict[str, Any]:
        r = self.report
        records = self.run.facts_records()
        current = [u for u, rec in records.items() if rec.state == UnitState.succeeded]
        saved = 0
        if r.did_work:
            by_attempt: dict[str, int] = {}
            for c in self.store.calls(self.run.run_id):
                by_attempt[c.attempt_id] = by_attempt.get(c.attempt_id, 0) + c.tokens_in + \
                    c.tokens_out
            saved = sum(by_attempt.get(records[u].attempt, 0) for u in current)
        return {"duration_s": r.duration_s, "fenced": r.fenced, "orphans": r.orphans,
                "invalidated": r.invalidated, "reused": len(current), "changes": r.changes,
                "artifact_problems": r.artifact_problems, "tokens_saved": saved,
                "did_work": r.did_work}

    def _audit(self) -> bool:
        run = self.run
        # Every checkpoint committed since the last verified one (all of them the first
        # time): O(new commits) per resume. `keepstep verify` re-checks the whole chain.
        chain = self.store.verify_since_last(run.run_id, run.branch_id)
        if not chain.ok:
            problems = "; ".join(f"checkpoint {p.version}: {p.problem}" for p in chain.problems)
            self._block(f"the checkpoint chain does not verify ({problems}) — this needs a "
                        "person: run `keepstep verify` to see where it breaks, then restore "
                        "from a backup (`keepstep restore`)")
            return False
        head = self.store.get_head(run.run_id, run.branch_id)
        cp = self.store.get_checkpoint(run.run_id, head.version, run.branch_id)

        if cp.schema_version > SCHEMA_VERSION:
            self._block(f"checkpoint {cp.version} was written by a newer keepstep (schema "
                        f"{cp.schema_version} > {SCHEMA_VERSION}) — upgrade keepstep")
            return False
        # Current artifacts must still be what was committed.
        lost: list[tuple[str, str]] = []
        root = self.store.artifacts.root
        for uid, rec in sorted(run.facts_records().items()):
            if rec.state != UnitState.succeeded:
                continue
            for _name, ref in sorted(rec.outputs.items()):
                p = root / ref.path
                if not p.is_file():
                    lost.append((uid, f"{ref.path} is missing"))
                elif file_sha256(str(p)) != ref.sha256:
                    lost.append((uid, f"{ref.path} changed (sha256 differs from the manifest)"))
            # The attempt's recorded model responses are read back by retries and replays:
            # an altered one is as untrustworthy as an altered output (a removed one — gc
            # strips old responses — only means it cannot be replayed).
            for entry in self.store.manifest(run.run_id, attempt_id=rec.attempt):
                if not entry.name.startswith("calls/"):
                    continue
                p = root / entry.path
                if p.is_file() and file_sha256(str(p)) != entry.sha256:
                    lost.append((uid, f"{entry.path} changed (a recorded model response no "
                                      "longer matches its manifest hash)"))
        self._lost = lost
        self.report.artifact_problems = [f"{u}: {w}" for u, w in lost]
        self._event("audited", head=cp.version, artifact_problems=self.report.artifact_problems)
        return True

    def _reconcile(self) -> None:
        run, store = self.run, self.store
        for lease in store.fence_expired_leases(run.run_id, run.branch_id):
            self.report.fenced.append(lease.attempt_id)
        for lease in store.leases(run.run_id, run.branch_id):
            if _owner_dead(lease.owner) and store.fence_lease(
                    run.run_id, run.branch_id, lease.unit, lease.fencing_token,
                    reason="owner process is gone"):
                self.report.fenced.append(lease.attempt_id)
        for orphan in store.orphaned_attempts(run.run_id):
            # The scan read the attempt rows and the leases before listing the folders, so
            # re-read the attempt: it may have committed, or been claimed, meanwhile.
            att = store.get_attempt(run.run_id, orphan.attempt_id)
            status = att.status if att is not None else None
            settled = (AttemptStatus.orphaned, AttemptStatus.committed)
            if status in settled or (status in _IN_FLIGHT and any(
                    le.attempt_id == orphan.attempt_id and le.expires_at > store.now()
                    for le in store.leases(run.run_id))):
                continue
            if status in _ENDED_UNSEEN:
                if not store.set_attempt_status(
                        run.run_id, orphan.attempt_id, AttemptStatus.orphaned,
                        only_if=_ENDED_UNSEEN,
                        message="files staged but never committed; quarantined"):
                    continue
            elif _sealed(orphan.directory):
                # A failed/timed-out/blocked attempt keeps its status (retry bounds count
                # it); being read-only says it was quarantined already.
                continue
            store.artifacts.seal_dir(orphan.directory)
            self.report.orphans.append(orphan.attempt_id)
            self._event("orphan", attempt=orphan.attempt_id, files=orphan.files,
                        action="quarantined (read-only, never promoted)")
        self.report.effects = reconcile_effects(run)
        if self.report.fenced or self.report.orphans or self.report.effects:
            self.report.did_work = True

    def _apply_changes(self) -> None:
        version = commit(
            self.store, self._changes_commit, tries=MAX_CHANGE_RESTARTS,
            # Another front end committed meanwhile: start again from the newest head.
            on_conflict=lambda: self._event("restarted", reason="the head moved during recovery"),
            gave_up=lambda: RecoveryError(
                f"the head kept moving while recovery committed the detected changes "
                f"({MAX_CHANGE_RESTARTS} tries)",
                hint="another keepstep process is committing to this run; let it finish, "
                "then `keepstep resume`"))
        if version is not None:
            self.report.commits.append(version)

    def _changes_commit(self) -> CommitRequest | None:
        """The commit of the detected changes at the current head (None: no change)."""
        run, store = self.run, self.store
        found = detect(run)
        files, snapshot, templates = found.files, found.snapshot, found.templates
        old_plan_info = run.plan_info
        old_inputs = store.read_key(run.run_id, "inputs", run.branch_id) or {}
        changes = [c for c in found.changes if c.origin not in self.foreign]
        changes += self._artifact_changes()
        if not changes:
            return None
        self.report.did_work = True
        self.report.invalidated = []
        self.report.changes = [f"{c.kind}: {c.detail}" for c in changes]
        records = run.facts_records()
        result = invalidate(files.plan, changes, records,
                            high_risk_rules=files.config.high_risk_rules,
                            source_groups=found.source_groups)
        delta: dict[str, Any] = {}
        current: dict[str, str | None] = {}
        for uid, explanations in sorted(result.affected.items()):
            rec = records.get(uid)
            if rec is None or rec.state != UnitState.succeeded:
                continue
            rec = rec.model_copy(update={"state": UnitState.invalidated,
                                         "explanations": explanations})
            delta[unit_key(uid)] = rec.model_dump(mode="json")
            current[uid] = None
            self.report.invalidated.append(uid)
        for uid in records:
            if uid not in files.plan.unit_map():
                delta[unit_key(uid)] = None  # a removed unit leaves the current state
                current[uid] = None
        plan_level = any(c.needs == "plan" for c in changes)
        input_level = any(c.needs == "inputs" for c in changes)
        head = store.get_head(run.run_id, run.branch_id)
        event_payload = {
            "changes": [c.model_dump(mode="json") for c in changes],
            "invalidated": {u: [e.render() for e in result.affected[u]]
                            for u in self.report.invalidated},
            "reused": sorted(result.reused),
        }
        if input_level and (not old_inputs or old_inputs.get("hash") != snapshot.hash()):
            n = int(old_inputs.get("n", 1)) + 1
            delta["inputs"] = inputs_state(n, snapshot)
            event_payload["inputs"] = f"in-v{n}"
        kind = "input-change"
        if plan_level:
            n = int(old_plan_info.get("n", 1)) + 1
            blob = (files.root / "plan.toml").read_bytes()
            attempt = f"_plan/v{n}"
            target = store.artifacts.attempt_dir(run.run_id, attempt) / "plan.toml"
            if not target.exists():
                store.artifacts.stage(run.run_id, attempt, "plan.toml", blob,
                                      media_type="application/toml",
                                      producer_version="keepstep",
                                      created_at=iso_utc(run.clock()))
            delta["plan"] = plan_state(n, files, f"{run.run_id}/_plan/v{n}/plan.toml", templates)
            delta["versions"] = run.project.versions()
            event_payload["plan"] = f"plan-v{n}"
            store.artifacts.prepare_units(run.run_id, [u.id for u in files.plan.units])
            kind = "plan-change"
        elif not input_level:
            kind = "repair"  # only lost or changed artifacts: same plan, same inputs
        # A unit that failed on the old inputs runs again on the new ones (the same rule the
        # preview states its "then run …" by).
        released = released_by_change(result, store.unit_statuses(run.run_id, run.branch_id))
        if released:
            event_payload["released"] = released
        return CommitRequest(
            run_id=run.run_id, branch_id=run.branch_id, expected_version=head.version,
            delta=delta, kind=kind, current=current, clear_unit_status=tuple(released),
            budget_key="budget",  # the budget as of the commit, read in its transaction
            events=(EventIn(kind=f"decision.{kind.replace('-', '_')}", payload=event_payload),))

    def _artifact_changes(self) -> list[Any]:

        return [artifact_lost(uid, what) for uid, what in getattr(self, "_lost", [])]


def reconcile_effects(run: Run) -> list[str]:
    """Ask the adapters about intents without receipts (see ``engine.run.effects``)."""
    results = reconcile(run.store, run.project.effect_adapters, run.run_id)
    settled = settle_waiting(run.store, run.project.effect_adapters, run.run_id)
    return [f"{r.key}: {r.outcome}" for r in results if r.outcome != "waiting"] + [
        f"{r.key}: settled as {r.outcome} by lookup" for r in settled if r.by == "lookup"]


def recover(run: Run,
            on_event: Callable[[dict[str, Any]], None] | None = None, *,
            foreign_sources: frozenset[str] = frozenset()) -> RecoveryReport:
    return Recovery(run, on_event, foreign_sources=foreign_sources).execute()


__all__ = ["Recovery", "RecoveryReport", "RecoveryState", "recover"]
