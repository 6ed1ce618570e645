"""Faults on the team store: SIGKILLed workers on two hosts, a worker paused past its lease,
the database server restarted mid-run. Executors are real processes."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from keepstep.engine.api import open_project
from keepstep.storage.postgres import PostgresStore
from keepstep.storage.postgres.connection import WRITE_LOCK_KEY
from tests.postgres.test_team import two_hosts
from tests.support.engine_harness import (
    KILLED,
    RUN,
    WorkerProcess,
    finish,
    start_kill_in_call,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.postgres


def observer(tmp_path: Path, url: str) -> PostgresStore:
    return PostgresStore(tmp_path / "observer" / ".keepstep", url, sync=False)


def assert_each_unit_committed_once(store: PostgresStore) -> None:
    assert store.verify_chain(RUN).ok
    commits = Counter(c.unit for c in store.list_checkpoints(RUN) if c.kind == "unit-success")
    committed = Counter(a.unit for a in store.attempts(RUN) if a.status == "committed")
    assert commits == committed and set(commits.values()) == {1}, (commits, committed)


def kill_in_call(root: Path, k: int) -> WorkerProcess:
    """A worker that SIGKILLs itself inside its k-th provider call (so mid-unit)."""
    return start_kill_in_call(root, k)


def test_a_dozen_sigkills_on_two_hosts_commit_nothing_twice(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers on hosts A and B, both killed inside a model call, six rounds (12 kills),
    then both finish the run: no unit committed twice, and every unit done more than once
    was in flight in a killed worker."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    a, b = two_hosts(tmp_path)
    with open_project(a) as p:
        p.start_run(RUN)
    rng = random.Random(25)
    killed: set[int] = set()
    for _ in range(6):
        procs = [kill_in_call(root, rng.choice([1, 2])) for root in (a, b)]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode in (KILLED, 0), err[-2000:]
            if proc.returncode == KILLED:
                killed.add(proc.pid)
    assert len(killed) == 12
    for r in [finish(start_worker(root), timeout=300) for root in (a, b)]:
        assert r.returncode == 0, r.stderr[-2000:]
    store = observer(tmp_path, pg_url)
    try:
        assert_each_unit_committed_once(store)
        attempts = store.attempts(RUN)
        tries = Counter(x.unit for x in attempts)
        redone = {u for u, n in tries.items() if n > 1}
        in_flight = {x.unit for x in attempts if x.status != "committed"
                     and int(x.executor.split(":")[1]) in killed}
        assert redone <= in_flight, (redone, in_flight)
        assert in_flight, "the kills should have hit units in flight"
    finally:
        store.close()


def pause_outside_a_write(pid: int, url: str) -> None:
    """SIGSTOP ``pid`` while it holds no write transaction (one stopped inside a write
    would hold the writers' lock until it continues)."""
    with psycopg.connect(url, autocommit=True) as probe:
        for _ in range(200):
            os.kill(pid, signal.SIGSTOP)
            got = probe.execute("SELECT pg_try_advisory_lock(%s)", [WRITE_LOCK_KEY]).fetchone()
            if got and got[0]:
                probe.execute("SELECT pg_advisory_unlock(%s)", [WRITE_LOCK_KEY])
                return
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.003)
    raise AssertionError("the worker held the write lock at every try")


def test_a_worker_paused_past_its_lease_is_fenced_out(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host A's worker is stopped (a laptop lid closed) mid-unit; its lease expires by the
    server's clock, host B takes the unit over and commits; A, woken, cannot commit."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    a, b = two_hosts(tmp_path)
    with open_project(a) as p:
        p.start_run(RUN)
    # Forked from the zygote, the worker is fast: U03's first call is held for a second
    # (tests/faults/child.py's call rules) so that the pause lands inside U03.
    hold = json.dumps([{"unit": "U03", "call": 1, "do": "slow", "seconds": 1.0}])
    paused = start_worker(a, RUN, "--call-rules", hold, executor_id="hostA:1:p",
                          lease_seconds=0.5)
    store = observer(tmp_path, pg_url)
    try:
        wait_for(lambda: store.calls(RUN, unit="U03"), timeout=120, interval=0.005)
        pause_outside_a_write(paused.pid, pg_url)
        lease = wait_for(lambda: store.leases(RUN))[0]
        wait_for(lambda: store.now() > lease.expires_at + 0.2)
        with open_project(b, executor_id="hostB:2:t") as p:
            p.get_run(RUN).resume(stop_after={lease.unit})
        attempts = {x.attempt_id: x.status for x in store.attempts(RUN, unit=lease.unit)}
        assert attempts[lease.attempt_id] in ("fenced", "orphaned")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        result = finish(paused, timeout=300)
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        mine = [e for e in result.kinds("attempt") if e["unit"] == lease.unit]
        assert (lease.attempt_id, "orphaned") in [(e["attempt"], e["outcome"]) for e in mine]
        cps = [c.attempt for c in store.list_checkpoints(RUN) if c.unit == lease.unit]
        assert len(cps) == 1 and cps[0] != lease.attempt_id
        assert_each_unit_committed_once(store)
    finally:
        store.close()


def test_the_database_restarting_mid_run_loses_nothing(
        tmp_path: Path, pg_own_cluster: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers (two hosts) run while the server restarts: they reconnect and finish;
    each unit is committed once and the chain verifies."""
    url = pg_own_cluster.url  # type: ignore[attr-defined]
    monkeypatch.setenv("KEEPSTEP_STORE_URL", url)
    a, b = two_hosts(tmp_path)
    with open_project(a) as p:
        p.start_run(RUN)
    store = observer(tmp_path, url)
    workers = [start_worker(root) for root in (a, b)]
    try:
        wait_for(lambda: store.get_head(RUN).version >= 2, timeout=180, interval=0.05)
        pg_own_cluster.restart()  # type: ignore[attr-defined]
        results = [finish(w, timeout=300) for w in workers]
        for r in results:
            assert r.returncode == 0, r.stderr[-3000:]
        with open_project(a) as p:
            assert p.get_run(RUN).status().decision == "done"
        assert_each_unit_committed_once(store)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        store.close()
