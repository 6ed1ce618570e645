"""The PostgreSQL store's pipelined write transactions: the round trips a claim and a commit
cost (two each), an error in a statement whose answer nobody waited for, and a connection
lost while the COMMIT was on its way (settled by the transaction's id, never guessed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from keepstep.storage import CommitRequest, StorageError
from keepstep.storage.errors import CommitOutcomeUnknown
from keepstep.storage.postgres import PostgresStore
from keepstep.storage.postgres.connection import ConnectionLost
from tests.store.contract import stage

pytestmark = pytest.mark.postgres
RUN = "R1"


class RoundTrips:
    """Counts the waits for the server's answers inside write transactions: each pipeline
    Sync and each answer fetched before the Sync (one round trip each)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        sync = psycopg.Pipeline.sync
        fetch = psycopg.Cursor._fetch_pipeline

        def counted_sync(pipe: Any) -> None:
            self.n += 1
            sync(pipe)

        def counted_fetch(cur: Any) -> None:
            if cur.pgresult is None and cur._conn._pipeline is not None:
                self.n += 1
            fetch(cur)

        exit_ = psycopg.Pipeline.__exit__

        def counted_exit(pipe: Any, *exc: Any) -> None:
            self.n += 1  # leaving pipeline mode: a Sync and every answer still due
            exit_(pipe, *exc)

        monkeypatch.setattr(psycopg.Pipeline, "sync", counted_sync)
        monkeypatch.setattr(psycopg.Cursor, "_fetch_pipeline", counted_fetch)
        monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)


def test_a_claim_and_a_commit_cost_two_round_trips_each(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = PostgresStore(tmp_path / ".keepstep", pg_url)
    try:
        s.create_run(RUN, {})
        s.get_head(RUN)  # this host has every file up to the head: the claim fetches nothing
        trips = RoundTrips(monkeypatch)
        c = s.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=30)
        # BEGIN + lock + the fencing token + the head read; the inserts with the COMMIT.
        assert trips.n == 2
        entry = stage(s, c.attempt_id, data=b"one file")
        trips.n = 0
        version = s.commit(CommitRequest(
            run_id=RUN, branch_id="main", expected_version=0,
            delta={"unit:U1": {"state": "succeeded"}}, manifest=(entry,), unit="U1",
            attempt_id=c.attempt_id, fencing_token=c.fencing_token, current={"U1": c.attempt_id}))
        # BEGIN + lock + the blob + the old state values + the head read; the rest and
        # the COMMIT.
        assert trips.n == 2
        assert version == 1 and s.get_head(RUN).version == 1
        assert s.leases(RUN) == [] and s.blob(entry.sha256) == b"one file"
        assert [a.status for a in s.attempts(RUN)] == ["committed"]
        c2 = s.claim(RUN, "main", "U2", expected_version=1, owner="a", lease_seconds=30)
        assert (c.fencing_token, c2.fencing_token) == (1, 2)  # each claim takes one token
    finally:
        s.close()


def test_an_error_in_a_statement_nobody_waited_for_writes_nothing(tmp_path: Path,
                                                                  pg_url: str) -> None:
    s = PostgresStore(tmp_path / ".keepstep", pg_url)
    try:
        s.create_run(RUN, {})
        with pytest.raises(StorageError) as err, s._write() as db:
            db.conn.execute("INSERT INTO events (run_id, branch_id, ts, kind, payload) "
                            "VALUES (?, 'main', 'now', 'x.one', '{}')", [RUN])
            db.conn.execute("INSERT INTO no_such_table VALUES (1)")  # answered at COMMIT
        assert not isinstance(err.value, CommitOutcomeUnknown)
        assert "no_such_table" in err.value.message
        assert s.events(RUN, kinds=["x.one"]) == []
        s.append_event(RUN, "x.two")  # the pool's connection is usable again
        assert [e.kind for e in s.events(RUN, kinds=["x.two"])] == ["x.two"]
    finally:
        s.close()


def _xid(s: PostgresStore, *, commit: bool) -> str:
    """The id of a transaction that committed (or rolled back) an event."""
    with psycopg.connect(s.url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO events (run_id, branch_id, ts, kind, payload) "
                     "VALUES (%s, 'main', 'now', 'x.settle', '{}')", [RUN])
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        conn.execute("COMMIT" if commit else "ROLLBACK")
    assert row is not None
    return str(row[0])


def test_a_commit_whose_answer_was_lost_is_settled_by_its_transaction_id(
        tmp_path: Path, pg_url: str) -> None:
    s = PostgresStore(tmp_path / ".keepstep", pg_url)
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    try:
        s.create_run(RUN, {})
        s._settle_lost_commit(_xid(s, commit=True), lost)  # committed: returns
        with pytest.raises(ConnectionLost):  # rolled back: nothing written, may run again
            s._settle_lost_commit(_xid(s, commit=False), lost)
        with pytest.raises(CommitOutcomeUnknown):  # no id to ask about: never guessed
            s._settle_lost_commit(None, lost)
    finally:
        s.close()


def test_a_connection_killed_before_the_commit_writes_nothing_and_the_call_is_retried(
        tmp_path: Path, pg_url: str) -> None:
    """The server ends the session in the middle of a transaction: the operation fails
    with ConnectionLost (nothing written) inside, and a Store write retried on a new
    connection succeeds once."""
    s = PostgresStore(tmp_path / ".keepstep", pg_url)
    try:
        s.create_run(RUN, {})
        with pytest.raises(ConnectionLost), s._write() as db:
            db.conn.execute("INSERT INTO events (run_id, branch_id, ts, kind, payload) "
                            "VALUES (?, 'main', 'now', 'x.killed', '{}')", [RUN])
            pid = db.conn.raw.info.backend_pid
            with psycopg.connect(s.url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert s.events(RUN, kinds=["x.killed"]) == []
        seq = s.append_event(RUN, "x.after")
        assert [e.seq for e in s.events(RUN, kinds=["x.after"])] == [seq]
    finally:
        s.close()


def test_a_waiting_executor_is_woken_by_another_hosts_commit(tmp_path: Path,
                                                             pg_url: str) -> None:
    """wait_for_change hears another store's commit on the run at once (LISTEN/NOTIFY, sent
    in the commit's transaction), and not a commit on another run."""
    import threading
    import time

    listening = PostgresStore(tmp_path / "a" / ".keepstep", pg_url)
    other = PostgresStore(tmp_path / "b" / ".keepstep", pg_url)
    try:
        other.create_run(RUN, {})
        other.create_run("R2", {})
        assert listening.wait_for_change(RUN, 5.0) is True  # starts listening
        while listening.wait_for_change(RUN, 0.1):
            pass  # the runs' creation, heard or not: drained
        started = time.monotonic()
        assert listening.wait_for_change(RUN, 0.3) is False  # nothing happened
        assert 0.25 <= time.monotonic() - started < 2.0
        other.commit_checkpoint("R2", "main", 0, {"x": 1})
        assert listening.wait_for_change(RUN, 0.3) is False  # another run's commit
        timer = threading.Timer(0.3, lambda: other.commit_checkpoint(RUN, "main", 0, {"x": 1}))
        timer.start()
        started = time.monotonic()
        assert listening.wait_for_change(RUN, 10.0) is True
        assert time.monotonic() - started < 5.0
        timer.join()
        c = other.claim(RUN, "main", "U1", expected_version=1, owner="b", lease_seconds=30)
        assert listening.wait_for_change(RUN, 0.1) is False  # a claim makes nothing ready
        other.release_lease(RUN, "main", "U1", c.fencing_token)
        assert listening.wait_for_change(RUN, 5.0) is True  # a lease given back does
    finally:
        listening.close()
        other.close()
