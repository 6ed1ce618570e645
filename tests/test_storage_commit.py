"""The commit protocol: compare-and-swap races, fencing, leases, budgets, events, branches."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from keepstep.storage import (
    ArtifactEntry,
    BudgetLimitReached,
    CheckpointConflict,
    Claim,
    LeaseHeld,
    SQLiteStore,
    StaleFencingToken,
)

RUN = "R1"


class FakeClock:
    """A clock the test moves by hand (shared by every store of one test)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def run_store(store_root: Path, clock: FakeClock):
    s = SQLiteStore(store_root, clock=clock)
    s.create_run(RUN, {"plan": "plan-v1"}, limits={"model_calls": 2, "cost": 1.0})
    yield s
    s.close()


def _claim_and_stage(store: SQLiteStore, unit: str, *, version: int = 0,
                     lease_seconds: float = 30) -> tuple[Claim, ArtifactEntry]:
    claim = store.claim(RUN, "main", unit, expected_version=version, owner=f"exec-{unit}",
                        lease_seconds=lease_seconds)
    entry = store.artifacts.stage(RUN, claim.attempt_id, "out.json", f'"{unit}"'.encode(),
                                  media_type="application/json", producer_version="test",
                                  created_at="2024-01-01T00:00:00+00:00")
    return claim, entry


def _commit(store: SQLiteStore, claim: Claim, entry: ArtifactEntry, *, kind: str = "unit-success",
            branch: str = "main") -> int:
    head = claim.claimed_at_version
    return store.commit_checkpoint(
        RUN, branch, head, {f"unit/{claim.unit}": {"attempt": claim.attempt_id}}, [entry],
        claim.fencing_token, kind=kind, unit=claim.unit, attempt_id=claim.attempt_id,
    )


def _plain_commit(store: SQLiteStore, key: str, *, kind: str = "unit-success",
                  branch: str = "main") -> int:
    head = store.get_head(RUN, branch).version
    return store.commit_checkpoint(RUN, branch, head, {key: True}, kind=kind)


def _assert_one_winner(store: SQLiteStore, outcomes: dict[str, object],
                       staged: dict[str, tuple[Claim, ArtifactEntry]]) -> None:
    """Exactly one commit landed; the loser's files become an orphan once its lease is gone."""
    winners = [u for u, o in outcomes.items() if o == 1]
    losers = [u for u, o in outcomes.items() if o == "conflict"]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    (winner,), (loser,) = winners, losers
    head = store.get_head(RUN)
    assert head.version == 1
    cp = store.get_checkpoint(RUN, 1)
    assert (cp.unit, cp.attempt) == (winner, staged[winner][0].attempt_id)
    assert set(store.read_state(RUN, prefix="unit/")) == {f"unit/{winner}"}
    assert store.verify_chain(RUN).ok
    assert [e.attempt_id for e in store.manifest(RUN)] == [staged[winner][0].attempt_id]

    loser_claim = staged[loser][0]
    # While its lease is live the loser is in flight, not an orphan.
    assert store.orphaned_attempts(RUN) == []
    store.release_lease(RUN, "main", loser, loser_claim.fencing_token)
    orphans = store.orphaned_attempts(RUN)
    assert [(o.attempt_id, o.files) for o in orphans] == [(loser_claim.attempt_id, ["out.json"])]


def test_two_threads_racing_for_one_version_exactly_one_wins(
    run_store: SQLiteStore, store_root: Path, clock: FakeClock
) -> None:
    """Two stores in two threads commit on the same head: one wins, one gets CheckpointConflict."""
    stores = {u: SQLiteStore(store_root, clock=clock) for u in ("UA", "UB")}
    staged = {u: _claim_and_stage(s, u) for u, s in stores.items()}
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def race(unit: str) -> None:
        store = stores[unit]
        barrier.wait()
        try:
            outcomes[unit] = _commit(store, *staged[unit])
        except CheckpointConflict:
            outcomes[unit] = "conflict"
        finally:
            store.close()

    threads = [threading.Thread(target=race, args=(u,)) for u in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    _assert_one_winner(run_store, outcomes, staged)


_RACER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from keepstep.storage import CheckpointConflict, SQLiteStore

    root, run, unit, attempt_id, token = sys.argv[1:6]
    store = SQLiteStore(Path(root))
    entry = store.artifacts.stage(run, attempt_id, "out.json", b'"x"',
                                  media_type="application/json", producer_version="test",
                                  created_at="2024-01-01T00:00:00+00:00")
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        outcome = store.commit_checkpoint(run, "main", 0, {"unit/" + unit: {"attempt": attempt_id}},
                                          [entry], int(token), unit=unit, attempt_id=attempt_id)
    except CheckpointConflict:
        outcome = "conflict"
    print(json.dumps(outcome), flush=True)
    """
)


def test_two_processes_racing_for_one_version_exactly_one_wins(
    run_store: SQLiteStore, store_root: Path
) -> None:
    """Two OS processes commit on the same head: one wins, one gets CheckpointConflict."""
    claims = {u: run_store.claim(RUN, "main", u, expected_version=0, owner=f"proc-{u}",
                                 lease_seconds=3600) for u in ("UA", "UB")}
    procs = {
        u: subprocess.Popen(
            [sys.executable, "-c", _RACER, str(store_root), RUN, u, c.attempt_id,
             str(c.fencing_token)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for u, c in claims.items()
    }
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        for p in procs.values():  # release both as close together as possible
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = {u: json.loads(p.stdout.readline()) for u, p in procs.items()}
        for p in procs.values():
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    staged = {u: (claims[u], None) for u in claims}
    _assert_one_winner(run_store, outcomes, staged)  # type: ignore[arg-type]


def test_stale_fencing_token_is_refused_after_a_takeover(
    run_store: SQLiteStore, store_root: Path, clock: FakeClock
) -> None:
    """After a lease expires and another executor claims, the old token cannot commit or renew."""
    first, entry = _claim_and_stage(run_store, "U1", lease_seconds=5)
    clock.t += 10
    other = SQLiteStore(store_root, clock=clock)
    try:
        second, second_entry = _claim_and_stage(other, "U1")
        assert second.fencing_token > first.fencing_token
        assert second.attempt_id == "U1/a2"
        with pytest.raises(StaleFencingToken):
            _commit(run_store, first, entry)
        with pytest.raises(StaleFencingToken):
            run_store.renew_lease(RUN, "main", "U1", fencing_token=first.fencing_token,
                                  lease_seconds=5)
        assert run_store.get_head(RUN).version == 0
        assert run_store.get_attempt(RUN, first.attempt_id).status == "fenced"
        assert [e.attempt_id for e in run_store.events(RUN, kinds=["lease.fenced"])] == ["U1/a1"]
        # The new holder commits normally; the fenced attempt's files are an orphan.
        assert _commit(other, second, second_entry) == 1
        assert [o.attempt_id for o in run_store.orphaned_attempts(RUN)] == ["U1/a1"]
    finally:
        other.close()


def test_claiming_a_unit_under_a_live_lease_raises_lease_held(
    run_store: SQLiteStore, clock: FakeClock
) -> None:
    """A live lease blocks a second claim, and the refused claim records nothing."""
    first = run_store.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=30)
    token = run_store.current_token()
    clock.t += 29
    with pytest.raises(LeaseHeld):
        run_store.claim(RUN, "main", "U1", expected_version=0, owner="b", lease_seconds=30)
    assert run_store.current_token() == token
    assert [a.attempt_id for a in run_store.attempts(RUN, "U1")] == [first.attempt_id]
    assert [le.owner for le in run_store.leases(RUN)] == ["a"]


def test_renewing_a_lease_extends_it_and_keeps_others_out(
    run_store: SQLiteStore, clock: FakeClock
) -> None:
    """renew_lease pushes the expiry forward from now, so the lease survives its first term."""
    c = run_store.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=10)
    clock.t += 8
    expires = run_store.renew_lease(RUN, "main", "U1", fencing_token=c.fencing_token,
                                    lease_seconds=10, progress="step 2")
    assert expires == clock.t + 10
    clock.t += 8
    with pytest.raises(LeaseHeld):
        run_store.claim(RUN, "main", "U1", expected_version=0, owner="b", lease_seconds=10)
    assert run_store.leases(RUN)[0].progress == "step 2"


def test_reserve_call_over_the_limit_raises_with_figures_and_records_nothing(
    run_store: SQLiteStore,
) -> None:
    """A conditional budget increment past a limit raises BudgetLimitReached and writes nothing."""
    def reserve(cost: float, **kw) -> str:
        return run_store.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1",
                                      round=1, model="offline/m", request_hash="h",
                                      budget_delta={"model_calls": 1, "cost": cost}, **kw)

    reserve(0.25)
    reserve(0.5)
    before = run_store.get_budget(RUN)
    assert before.used == {"model_calls": 2, "cost": 0.75}
    with pytest.raises(BudgetLimitReached) as info:
        reserve(0.5)
    assert info.value.figures == {
        "model_calls": {"used": 2, "requested": 1, "limit": 2},
        "cost": {"used": 0.75, "requested": 0.5, "limit": 1.0},
    }
    assert "model_calls 2/2" in str(info.value)
    assert run_store.get_budget(RUN) == before
    assert len(run_store.calls(RUN)) == 2
    # Without enforcement the same call is recorded (used for settling real spend).
    reserve(0.5, enforce=False)
    assert run_store.get_budget(RUN).used == {"model_calls": 3, "cost": 1.25}


def test_settle_call_records_figures_and_adds_usage(run_store: SQLiteStore) -> None:
    """settle_call fills in the ledger row and adds the real spend to the used counters."""
    call = run_store.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1", round=1,
                                  model="offline/m", request_hash="h",
                                  budget_delta={"model_calls": 1})
    run_store.settle_call(call, tokens_in=10, tokens_out=5, cost=0.25, latency_ms=3,
                          outcome="ok", budget_delta={"tokens": 15, "cost": 0.25})
    (row,) = run_store.calls(RUN)
    assert (row.status, row.tokens_in, row.tokens_out, row.outcome) == ("settled", 10, 5, "ok")
    assert run_store.get_budget(RUN).used == {"model_calls": 1, "tokens": 15, "cost": 0.25}


def test_events_are_append_only_but_payloads_may_be_stripped(
    run_store: SQLiteStore, store_root: Path
) -> None:
    """DELETE and UPDATE of events abort; only stripping a payload to '{}' is allowed."""
    seq = run_store.append_event(RUN, "note", unit="U1", payload={"text": "hello"})
    raw = sqlite3.connect(store_root / "state.db")
    try:
        for sql in (
            "DELETE FROM events WHERE seq = ?",
            "UPDATE events SET kind = 'other' WHERE seq = ?",
            "UPDATE events SET payload = '{\"text\":\"bye\"}' WHERE seq = ?",
            "UPDATE events SET payload = '{}', unit = 'U2' WHERE seq = ?",
            "UPDATE events SET payload = '{}', attempt_id = 'U1/a9' WHERE seq = ?",
            "UPDATE events SET payload = '{}', branch_id = 'b' WHERE seq = ?",
            "UPDATE events SET payload = '{}', ts = '1999' WHERE seq = ?",
        ):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                raw.execute(sql, [seq])
    finally:
        raw.close()
    (event,) = run_store.events(RUN, kinds=["note"])
    assert (event.unit, event.payload) == ("U1", {"text": "hello"})
    assert run_store.strip_event_payloads(RUN, before_ts="9999") >= 1
    (event,) = run_store.events(RUN, kinds=["note"])
    assert (event.seq, event.kind, event.unit, event.payload) == (seq, "note", "U1", {})


def test_a_conflicting_commit_writes_nothing(run_store: SQLiteStore) -> None:
    """A commit on a stale head raises CheckpointConflict and leaves state, chain and events."""
    _plain_commit(run_store, "a")
    events_before = len(run_store.events(RUN))
    with pytest.raises(CheckpointConflict):
        run_store.commit_checkpoint(RUN, "main", 0, {"b": True})
    assert run_store.get_head(RUN).version == 1
    assert "b" not in run_store.read_state(RUN)
    assert len(run_store.events(RUN)) == events_before
    assert run_store.verify_chain(RUN).ok


def test_count_checkpoints_counts_commits_by_kind_along_the_lineage(
    run_store: SQLiteStore,
) -> None:
    """count_checkpoints excludes genesis, groups by kind and follows a branch's ancestry."""
    assert run_store.count_checkpoints(RUN) == {}
    _plain_commit(run_store, "u1")
    _plain_commit(run_store, "plan", kind="plan-change")
    _plain_commit(run_store, "u2")
    _plain_commit(run_store, "u3")
    assert run_store.count_checkpoints(RUN) == {"unit-success": 3, "plan-change": 1}
    run_store.fork_branch(RUN, "main", 2, "b")
    assert run_store.count_checkpoints(RUN, "b") == {"unit-success": 1, "plan-change": 1}
    _plain_commit(run_store, "u4", branch="b")
    assert run_store.count_checkpoints(RUN, "b") == {"unit-success": 2, "plan-change": 1}
    assert run_store.count_checkpoints(RUN) == {"unit-success": 3, "plan-change": 1}


def test_fork_branch_verifies_and_keeps_the_budget_used(run_store: SQLiteStore) -> None:
    """A fork starts from the parent's state at that version, verifies, and inherits budget used."""
    _plain_commit(run_store, "u1")
    _plain_commit(run_store, "u2")
    state_at_2 = run_store.read_state(RUN)
    run_store.add_usage(RUN, {"model_calls": 1, "tokens": 100})
    _plain_commit(run_store, "u3")
    head = run_store.fork_branch(RUN, "main", 2, "alt")
    assert head.version == 2
    assert head.hash == run_store.get_checkpoint(RUN, 2).hash
    assert run_store.read_state(RUN, "alt") == state_at_2
    assert run_store.get_budget(RUN, "alt").used == {"model_calls": 1, "tokens": 100}
    assert run_store.verify_chain(RUN, "alt").ok
    assert run_store.verify_head(RUN, "alt").ok
    _plain_commit(run_store, "alt-only", branch="alt")
    assert run_store.get_head(RUN, "alt").version == 3
    assert "alt-only" not in run_store.read_state(RUN)
    assert "u3" not in run_store.read_state(RUN, "alt")
    report = run_store.verify_chain(RUN, "alt")
    assert report.ok and report.checked == 4
    assert run_store.verify_chain(RUN).ok
    # Budgets then move independently.
    run_store.add_usage(RUN, {"tokens": 1}, branch_id="alt")
    assert run_store.get_budget(RUN).used["tokens"] == 100


def test_claim_and_commit_each_take_exactly_one_transaction(run_store: SQLiteStore) -> None:
    """claim and commit_checkpoint each run one BEGIN IMMEDIATE … COMMIT, nothing more."""
    statements: list[str] = []
    conn = run_store.db.conn
    conn.set_trace_callback(statements.append)
    try:
        claim, entry = _claim_and_stage(run_store, "U1")
        claimed = list(statements)
        statements.clear()
        _commit(run_store, claim, entry)
    finally:
        conn.set_trace_callback(None)
    for trace in (claimed, statements):
        assert [s for s in trace if s.split()[0] in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
                                                      "RELEASE")] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert run_store.verify_chain(RUN).ok


def test_commit_hashes_match_the_reference_encoding_for_awkward_values(
    run_store: SQLiteStore,
) -> None:
    """Deltas with unicode, quotes, nesting, floats and deletions still verify (the commit
    encodes each value once; verification re-encodes from scratch)."""
    deltas = [
        {"unit:U1": {"b": [1, 2.5, "é\"x"], "a": None}, "ü": "line\nbreak", "z": 1e300},
        {"unit:U1": None, 'k"ey': {"fencing_token": ',"fencing_token":'}, "n": -0.0},
    ]
    for v, delta in enumerate(deltas):
        run_store.commit_checkpoint(RUN, "main", v, delta, unit="U1", attempt_id='a"1')
    assert run_store.verify_chain(RUN).ok and run_store.verify_head(RUN).ok
    assert run_store.get_checkpoint(RUN, 2).delta == deltas[1]


def test_the_orphan_scan_reads_attempt_rows_and_walks_no_attempt_folder(
    run_store: SQLiteStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without full=True the scan lists the uncommitted attempts' folders and one name list
    per unit folder — it never walks committed attempt folders, however many there are."""
    for version in range(5):
        claim, entry = _claim_and_stage(run_store, f"U{version}", version=version)
        _commit(run_store, claim, entry)
    loser, _ = _claim_and_stage(run_store, "U9", version=5, lease_seconds=5)
    clock.t += 10
    listed: list[str] = []
    real = run_store.artifacts.attempt_files

    def files_of(run_id: str, attempt_id: str):
        listed.append(attempt_id)
        return real(run_id, attempt_id)

    def no_walk(*_a, **_k):
        raise AssertionError("the default orphan scan walked the attempt folders")

    monkeypatch.setattr(run_store.artifacts, "attempt_files", files_of)
    monkeypatch.setattr(run_store.artifacts, "attempt_folders", no_walk)
    monkeypatch.setattr(run_store.artifacts, "attempt_dirs", no_walk)
    assert [o.attempt_id for o in run_store.orphaned_attempts(RUN)] == [loser.attempt_id]
    assert listed == [loser.attempt_id]


def test_a_commit_with_usage_needs_no_separate_usage_transaction(
    run_store: SQLiteStore,
) -> None:
    """usage= lands with the checkpoint: one write transaction for commit and usage."""
    claim, entry = _claim_and_stage(run_store, "U1")
    begins: list[str] = []
    run_store.db.conn.set_trace_callback(
        lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
    try:
        run_store.commit_checkpoint(RUN, "main", 0, {"unit/U1": 1}, [entry], claim.fencing_token,
                                    unit="U1", attempt_id=claim.attempt_id,
                                    usage={"wall_time_s": 2.0})
    finally:
        run_store.db.conn.set_trace_callback(None)
    assert begins == ["BEGIN IMMEDIATE"]
    assert run_store.get_budget(RUN).used == {"wall_time_s": 2.0}


def test_claiming_settling_a_call_and_renewing_a_lease_do_not_sync_on_their_own(
    run_store: SQLiteStore,
) -> None:
    """claim, settle_call and renew_lease commit with synchronous=NORMAL (synced by the next
    durable commit); a reservation and the unit's commit stay fully synced."""
    seen: list[str] = []
    conn = run_store.db.conn
    conn.set_trace_callback(seen.append)
    try:
        claim = run_store.claim(RUN, "main", "U1", expected_version=0, owner="o",
                                lease_seconds=30)
        call = run_store.reserve_call(RUN, branch_id="main", unit="U1",
                                      attempt_id=claim.attempt_id, round=1, model="m",
                                      request_hash="h", budget_delta={"model_calls": 1})
        before_settle = len(seen)
        run_store.settle_call(call, tokens_in=1, tokens_out=1, cost=0.0, latency_ms=1,
                              outcome="ok")
        run_store.renew_lease(RUN, "main", "U1", fencing_token=claim.fencing_token,
                              lease_seconds=30)
    finally:
        conn.set_trace_callback(None)
    relaxed = [s for s in seen if s.startswith("PRAGMA synchronous")]
    # The claim (changed deliberately: it was synced on its own), the settlement, the renewal.
    assert relaxed == ["PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"] * 3
    reservation = seen[:before_settle]
    last_pragma = max(i for i, s in enumerate(reservation) if s.startswith("PRAGMA synchronous"))
    assert reservation[last_pragma] == "PRAGMA synchronous = FULL"
    assert "COMMIT" in reservation[last_pragma:]  # the reservation commits fully synced
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    assert run_store.calls(RUN)[0].status == "settled"
