"""What every fault case must show, read from stored facts, plus the named checks of a row.

Invariants (every case): the units executed more than once, orphans isolated (no current
record, manifest row or consumed hash from an uncommitted attempt, no ``.tmp`` promoted), no
commit by a stale executor, a unit committed at most once per invalidation, and the budget's
call counter equal to the call ledger. Named checks (``Case.checks``) are listed in
``named_check``.
"""

from __future__ import annotations

import stat
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keepstep.engine.api import Project
from keepstep.storage.hashing import file_sha256

from .child import EFFECT_ACTION
from .steps import RUN

if TYPE_CHECKING:
    from .harness import CaseRun


class CaseFailed(AssertionError):
    pass


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise CaseFailed(message)


def reexecuted(p: Project) -> set[str]:
    """Units executed more than once: model calls in more than one attempt, files staged by
    more than one attempt (of the attempts table: a planted folder is not an execution), or
    more than one unit commit."""
    store = p.store
    known = {a.attempt_id for a in store.attempts(RUN)}
    worked: dict[str, set[str]] = defaultdict(set)
    for c in store.calls(RUN):
        worked[c.unit].add(c.attempt_id)
    for unit, attempt_id, _d, files in store.artifacts.attempt_dirs(RUN):
        if files and attempt_id in known:
            worked[unit].add(attempt_id)
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    return {u for u, a in worked.items() if len(a) > 1} | {u for u, n in commits.items() if n > 1}


def orphan_attempts(p: Project) -> set[str]:
    store = p.store
    listed = {o.attempt_id for o in store.orphaned_attempts(RUN, full=True)}
    return listed | {a.attempt_id for a in store.attempts(RUN)
                     if a.status in ("orphaned", "fenced")}


def check_orphans_isolated(p: Project) -> None:
    store = p.store
    orphans = orphan_attempts(p)
    manifest = store.manifest(RUN)
    expect(not [e for e in manifest if e.attempt_id in orphans],
           "a manifest row points into an orphan attempt")
    expect(not [e for e in manifest if e.name.endswith(".tmp") or e.path.endswith(".tmp")],
           "a temporary file was promoted into the manifest")
    committed: dict[str, set[str]] = defaultdict(set)
    for e in manifest:
        committed[e.unit].add(e.sha256)
    for uid, rec in p.get_run(RUN).facts_records().items():
        expect(rec.attempt not in orphans, f"{uid}'s record names orphan {rec.attempt}")
        own = "/".join([RUN, *rec.attempt.split("/")]) + "/"
        for name, ref in rec.outputs.items():
            expect(ref.path.startswith(own), f"{uid}'s output {name} is outside {rec.attempt}")
        for dep, outs in rec.consumed.items():
            stray = set(outs.values()) - committed[dep]
            expect(not stray, f"{uid} consumed {dep} bytes no commit produced: {sorted(stray)}")


def check_stale_never_commits(p: Project) -> None:
    store = p.store
    attempts = {a.attempt_id: a for a in store.attempts(RUN)}
    seen: set[str] = set()
    for cp in store.list_checkpoints(RUN, kinds=["unit-success"]):
        att = attempts.get(cp.attempt or "")
        expect(att is not None, f"checkpoint {cp.version} names no attempt")
        assert att is not None
        expect(att.status == "committed", f"checkpoint {cp.version} commits {att.attempt_id}, "
               f"whose status is {att.status}")
        expect(cp.fencing_token == att.fencing_token,
               f"checkpoint {cp.version} carries token {cp.fencing_token}, {att.attempt_id} "
               f"was claimed with {att.fencing_token}")
        expect(att.attempt_id not in seen, f"{att.attempt_id} was committed twice")
        seen.add(att.attempt_id)


def check_commits_bounded(p: Project) -> None:
    store = p.store
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    invalidated: Counter[str] = Counter()
    for cp in store.list_checkpoints(RUN, kinds=["plan-change", "input-change", "repair"]):
        for key, value in cp.delta.items():
            if key.startswith("unit:") and value and value.get("state") == "invalidated":
                invalidated[key[5:]] += 1
    for unit, n in commits.items():
        expect(n <= 1 + invalidated[unit], f"{unit} was committed {n} times but invalidated "
               f"only {invalidated[unit]} time(s)")


def check_budget_matches_ledger(p: Project) -> None:
    used = p.store.get_budget(RUN).used.get("calls", 0)
    # A reused answer (an earlier attempt's, verified) has a ledger row but is no call.
    calls = len([c for c in p.store.calls(RUN) if c.outcome != "reused"])
    expect(used == calls, f"the budget counts {used:g} calls, the call ledger holds {calls}")


def check_no_dup(cr: CaseRun, p: Project, item: str) -> None:
    store = p.store
    kind, _, what = item.partition(":")
    commits = Counter(cp.unit for cp in store.list_checkpoints(RUN, kinds=["unit-success"]))
    if kind == "commit":
        expect(commits[what] == 1, f"{what} was committed {commits[what]} times")
    elif kind == "commits":
        twice = sorted(u for u, n in commits.items() if n != 1)
        expect(not twice, f"units not committed exactly once: {twice}")
    elif kind == "calls":
        attempts = {c.attempt_id for c in store.calls(RUN, unit=what)}
        expect(len(attempts) == 1, f"{what}'s calls are spread over {sorted(attempts)}")
    elif kind == "webhook":
        server = cr.webhook
        keys = [e.idem_key for e in store.effects(RUN)]
        expect(bool(keys), "no side effect was recorded")
        for key in keys:
            expect(server.applied[key] == 1, f"webhook key {key} applied "
                   f"{server.applied[key]} times")
        expect(server.posts == len(keys), f"{server.posts} POSTs for {len(keys)} key(s)")
    else:
        raise ValueError(f"unknown no_dup item {item!r}")


def named_check(cr: CaseRun, p: Project | None, name: str) -> None:
    """One of a case's ``checks``: ``name`` or ``name:arg``."""
    store: Any = p.store if p is not None else None
    head, _, arg = name.partition(":")
    if head == "stale_refused":
        att = store.get_attempt(RUN, arg)
        expect(att is not None and att.status != "committed",
               f"{arg} is {att.status if att else 'missing'}")
        expect(not [cp for cp in store.list_checkpoints(RUN) if cp.attempt == arg],
               f"{arg} reached a checkpoint")
        fenced = store.events(RUN, kinds=["attempt.fenced", "lease.fenced"])
        expect(any(e.attempt_id == arg for e in fenced), f"no fencing event for {arg}")
    elif head == "orphan":
        listed = {o.attempt_id: o for o in store.orphaned_attempts(RUN, full=True)}
        expect(arg in listed, f"{arg} is not listed as an orphan ({sorted(listed)})")
        d = Path(listed[arg].directory)
        writable = [f for f in d.rglob("*") if f.is_file() and f.stat().st_mode & stat.S_IWUSR]
        expect(not writable, f"{arg} is not quarantined: {writable}")
    elif head == "partial_quarantined":
        d = store.artifacts.attempt_dir(RUN, arg)
        tmps = list(d.rglob("*.tmp"))
        expect(bool(tmps), f"no partial file left in {arg}")
        expect(arg in orphan_attempts(p), f"{arg} holding a partial file is not an orphan")
    elif head == "disk_full_advice":
        # The person is told what to do: free space on the disk, then retry the unit.
        att = store.get_attempt(RUN, arg)
        message = (att.message or "") if att is not None else ""
        unit = arg.partition("/")[0]
        expect("free space on /" in message and f"keepstep retry {unit}" in message,
               f"{arg}'s disk-full message gives no advice: {message!r}")
    elif head == "reserved_call":
        rows = [c for c in store.calls(RUN) if c.attempt_id == arg]
        expect(any(c.status == "reserved" for c in rows),
               f"{arg}'s interrupted call is not kept as reserved: {[c.status for c in rows]}")
    elif head == "same_attempt_retry":
        unit, _, outcome = arg.partition("/")
        rows = store.calls(RUN, unit=unit)
        expect(len({c.attempt_id for c in rows}) == 1, f"{unit} took more than one attempt")
        expect(any(c.outcome == outcome for c in rows), f"no {outcome} row for {unit}: "
               f"{[c.outcome for c in rows]}")
    elif head == "retry_after_honoured":
        rows = store.calls(RUN, unit=arg)
        i = next(i for i, c in enumerate(rows) if c.outcome == "rate_limited")
        gap = (datetime.fromisoformat(rows[i + 1].reserved_at)
               - datetime.fromisoformat(rows[i].settled_at)).total_seconds()
        expect(gap >= 0.95, f"retried {gap:.2f} s after a 429 with Retry-After: 1")
    elif head == "provider_charges_in_ledger":
        answered = sum(cr.provider.answered.values())
        rows = [c for c in store.calls(RUN) if c.tokens_in > 0]
        expect(answered == len(rows), f"the provider answered {answered} calls, the ledger "
               f"records {len(rows)} with usage")
    elif head == "downstream_not_run":
        from keepstep.engine.core.invalidation import downstream_of

        below = downstream_of(p.get_run(RUN).plan, [arg])
        ran = sorted(u for u in below if store.attempts(RUN, u))
        expect(not ran, f"units downstream of failed {arg} ran: {ran}")
    elif head == "repair_committed":
        expect(bool(store.list_checkpoints(RUN, kinds=["repair"])), "no repair checkpoint")
    elif head == "db_untouched":
        now = file_sha256(str(cr.root / ".keepstep" / "state.db"))
        expect(now == cr.snap.db_sha, "the newer database was modified")
    elif head == "backup_kept":
        baks = list((cr.root / ".keepstep").glob("state.db.v1-*.bak"))
        expect(len(baks) == 1, f"expected one backup of the schema-1 database, found {baks}")
    elif head == "approval":
        rows = store.approvals(RUN, gate_id="audience")
        statuses = [r.status for r in rows]
        expect(arg in statuses, f"no {arg} approval row: {statuses}")
        current = p.get_run(RUN).plan_n
        decided = [r for r in rows if r.status == "decided"]
        expect(bool(decided) and decided[-1].bound_object.get("plan_n") == current,
               "the decision that let U27 run is not bound to the current plan")
        u27 = p.get_run(RUN).facts_records()["U27"]
        last = max((r for r in rows if r.decided_at), key=lambda r: r.decided_at)
        expect(last.status in ("decided", "expired"), f"U27 ran under {last.status} approval")
        expect(u27.plan_n == current, "U27's record is not from the current plan")
    elif head == "webhook_keys":
        keys = {e.idem_key for e in store.effects(RUN)}
        expect(len(keys) == int(arg), f"{len(keys)} idempotency keys, expected {arg}")
        plans = sorted(e.plan_n for e in store.effects(RUN))
        expect(plans == list(range(1, int(arg) + 1)), f"keys for plan versions {plans}")
        expect(all(e.action == EFFECT_ACTION and e.status == "committed"
                   for e in store.effects(RUN)), "an effect is not committed")
    elif head == "budget_kept":
        used = store.get_budget(RUN).used
        expect(used.get("calls", 0) >= cr.snap.used.get("calls", 0),
               "the call counter went down after the resume")
        lost = [c for c in store.calls(RUN) if c.attempt_id == arg]
        expect(bool(lost) and all(c.status == "settled" and c.tokens_in > 0 for c in lost),
               f"the killed attempt's charged calls are not in the ledger: {lost}")
    elif head == "budget_decision":
        evs = store.events(RUN, kinds=["decision.budget_raise"])
        expect(len(evs) == 1, f"{len(evs)} budget decisions recorded, expected 1")
        payload = evs[0].payload
        expect(payload.get("who") and payload.get("reason") and payload["new"].get("calls"),
               f"the budget decision lacks who/reason/figures: {payload}")
    elif head == "breaker":
        failed = store.events(RUN, kinds=["recovery.failed"])
        expect(len(failed) == int(arg), f"{len(failed)} failed recoveries, expected {arg}")
    elif head == "executors":
        attempts = {a.attempt_id: a for a in store.attempts(RUN)}
        who = {attempts[cp.attempt].executor
               for cp in store.list_checkpoints(RUN, kinds=["unit-success"])}
        expect(len(who) >= int(arg), f"units were committed by {len(who)} executor(s)")
    elif head == "no_commit_since_snapshot":
        expect(store.get_head(RUN).version == cr.snap.head, "a checkpoint was committed")
    else:
        raise ValueError(f"unknown check {name!r}")

