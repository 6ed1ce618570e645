"""Where a checkpoint commit is made: ``commit`` (any CommitRequest, with the compare-and-swap
retry) and ``UnitCommitter`` (a unit's success: rebase on a moved head, early cut-off).

The loop, recovery and takeover each only *build* a ``CommitRequest`` (a function of the head
they see); ``commit`` sends it to ``Store.commit`` and, on a moved head, builds it again from
the new head, a bounded number of times. A commit whose acknowledgement was lost is learnt
from the database (its attempt is ``committed``), never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from keepstep.engine.core.invalidation import cutoff, cutoff_note
from keepstep.engine.core.state import UnitRecord, UnitState, unit_key
from keepstep.engine.errors import LeaseLost
from keepstep.storage import (
    AttemptStatus,
    CheckpointConflict,
    Claim,
    CommitOutcomeUnknown,
    CommitRequest,
    EventIn,
    StorageBusy,
    Store,
)

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Plan
    from keepstep.engine.run.facts_cache import FactsCache
    from keepstep.engine.run.runtime import Run
    from keepstep.storage import ArtifactEntry

# How often a unit's commit is built again on a head another executor moved.
UNIT_COMMIT_TRIES = 20


def commit(store: Store, build: Callable[[], CommitRequest | None], *, tries: int,
           gave_up: Callable[[], BaseException],
           on_conflict: Callable[[], None] | None = None,
           on_learnt: Callable[[], None] | None = None) -> int | None:
    """Build a request and commit it; on CheckpointConflict (the head moved) call
    ``on_conflict`` and build again, at most ``tries`` times, then raise ``gave_up()``.
    ``build`` returning None means nothing is to be committed (None is returned).

    StorageBusy or CommitOutcomeUnknown on a request naming an attempt: the database says
    whether it landed (the head's version is returned, after ``on_learnt``, when the
    attempt is committed)."""
    for _ in range(tries):
        request = build()
        if request is None:
            return None
        try:
            return store.commit(request)
        except CheckpointConflict:
            if on_conflict is not None:
                on_conflict()
            continue
        except (StorageBusy, CommitOutcomeUnknown):
            if request.attempt_id is not None:
                att = store.get_attempt(request.run_id, request.attempt_id)
                if att is not None and att.status == AttemptStatus.committed:
                    if on_learnt is not None:
                        on_learnt()
                    return store.get_head(request.run_id, request.branch_id).version
            raise
    raise gave_up()


class UnitCommitter:
    """Commits units' successes of one run at the facts cache's head (under its lock), so
    this process's claims and commits never race; another executor's commit is caught up
    with and rebased on when what the attempt consumed is unchanged."""

    def __init__(self, run: Run, cache: FactsCache,
                 plan: Callable[[], Plan]) -> None:
        self.run = run
        self.store = run.store
        self.cache = cache
        self._plan = plan

    def commit_unit(self, claim: Claim, record: UnitRecord, staged: list[ArtifactEntry],
                    started: float) -> int:
        """The unit-success commit of ``claim``'s attempt; returns its version. LeaseLost
        when a dependency or the plan changed under the attempt (its output stays an
        orphan), or when the head kept moving."""
        run, store, cache = self.run, self.store, self.cache
        kept: dict[str, UnitRecord] = {}
        # The cache is at the head as far as this process knows (its own commits are
        # applied to it, the scheduler refreshed it before the claim): the commit is made
        # on its version without reading the head first. Another executor's commit makes
        # the compare-and-swap fail; only then is the head read (and the rebase checked).
        stale = cache.version is None

        def moved() -> None:
            nonlocal stale
            stale = True

        def build() -> CommitRequest:
            nonlocal kept
            expected = cache.refresh() if stale else cache.version
            assert expected is not None  # refreshed when it was None
            current = cache.records
            if expected != claim.claimed_at_version:
                self._check_rebase(claim, record)
            kept = self._cutoff(claim.unit, record, current)
            delta = {unit_key(claim.unit): record.model_dump(mode="json"),
                     **{unit_key(u): r.model_dump(mode="json") for u, r in kept.items()}}
            return CommitRequest(
                run_id=run.run_id, branch_id=run.branch_id, expected_version=expected,
                delta=delta, kind="unit-success", manifest=tuple(staged), unit=claim.unit,
                attempt_id=claim.attempt_id, fencing_token=claim.fencing_token,
                current={claim.unit: claim.attempt_id, **{u: r.attempt for u, r in kept.items()}},
                usage={"wall_time_s": max(0.0, run.clock() - started)},
                clear_unit_status=(claim.unit,), budget_key="budget",
                events=(EventIn(kind="unit.succeeded", unit=claim.unit,
                                attempt_id=claim.attempt_id,
                                payload={"outputs": {k: v.sha256[:12]
                                                     for k, v in record.outputs.items()}}),
                        *(EventIn(kind="unit.kept_current", unit=u,
                                  payload={"note": r.cutoff_note}) for u, r in kept.items())))

        learnt: list[bool] = []
        with cache.lock:
            version = commit(store, build, tries=UNIT_COMMIT_TRIES, gave_up=lambda: LeaseLost(
                f"{claim.unit}: could not commit after repeated head moves"),
                on_conflict=moved, on_learnt=lambda: learnt.append(True))
            assert version is not None  # build never declines
            if learnt:  # the acknowledgement was lost: read what landed
                cache.refresh()
            else:
                cache.apply(version, {claim.unit: record, **kept})
            return version

    def _check_rebase(self, claim: Claim, record: UnitRecord) -> None:
        """The head moved since the claim (our own units' commits, or another executor's):
        rebase only if what this attempt consumed is unchanged."""
        current = self.cache.records
        for dep, outs in record.consumed.items():
            cur = current.get(dep)
            if cur is None or cur.state != UnitState.succeeded or \
                    {n: o.sha256 for n, o in cur.outputs.items()} != outs:
                raise LeaseLost(f"{claim.unit}: dependency {dep} changed under the attempt")
        cur_plan = self.cache.keys.get("plan") or {}
        if cur_plan.get("n") != record.plan_n:
            raise LeaseLost(f"{claim.unit}: the plan changed under the attempt")

    def _cutoff(self, unit_id: str, record: UnitRecord,
                current: dict[str, UnitRecord]) -> dict[str, UnitRecord]:
        """Early cut-off: invalidated dependents that consumed byte-identical output stay
        current (transitively), each with a note saying so."""
        if not self.cache.invalidated:
            return {}  # the common case: nothing to keep, no graph walk on the hot path
        plan = self._plan()
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


__all__ = ["UNIT_COMMIT_TRIES", "UnitCommitter", "commit"]
