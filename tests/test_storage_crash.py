"""SIGKILL at any moment of claim → stage → commit leaves the old checkpoint or the whole new one.

One project directory is reused across every kill, so each check also runs against the
debris of all earlier crashes (orphans, fenced and half-written attempts, a hot WAL).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from keepstep.storage import SQLiteStore
from tests.faults.zygote import Zygote

RUN = "CRASH"
SEED = 4242
POINTS = (
    "claim.before", "claim.after",
    "commit.before_begin", "commit.inside_txn", "commit.before_commit", "commit.after_commit",
)
KILLS_PER_POINT = 5  # 6 points × 5 = 30 crash-point kills
TIMED_KILLS = 30
LOST_COMMIT = {"commit.before_begin", "commit.inside_txn", "commit.before_commit"}


@dataclass(frozen=True)
class Kill:
    point: str | None  # a named crash point, or None for a timed SIGKILL from the parent
    nth: int = 1  # crash on the nth time the point is reached (= the nth iteration)
    delay: float = 0.0  # for timed kills: seconds after the child said "ready"

    def __str__(self) -> str:
        return f"{self.point}@{self.nth}" if self.point else f"timed+{self.delay * 1000:.0f}ms"


def _schedule(rng: random.Random) -> list[Kill]:
    kills = [Kill(p, nth=rng.randint(1, 4)) for p in POINTS for _ in range(KILLS_PER_POINT)]
    kills += [Kill(None, delay=rng.uniform(0.0, 0.08)) for _ in range(TIMED_KILLS)]
    rng.shuffle(kills)
    return kills


def _far_future() -> float:
    """A clock for the checking store: every child lease looks expired, as after a takeover."""
    return time.time() + 3600


@pytest.fixture(scope="module")
def zygote():
    """A fork server preloaded with keepstep.storage (tests/faults/zygote.py ``--storage``):
    each child is a real process forked from it in milliseconds, instead of 60 interpreters
    started one after another. SIGKILL, KEEPSTEP_CRASH_AT and the exit status are the same."""
    z = Zygote(storage_only=True)
    yield z
    z.close()


_spawned = iter(range(1, 1_000_000))


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    # Only whole lines: the child flushes each line, a partial one is still being written.
    return [line.strip() for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _run_child(zygote: Zygote, root: Path, kill: Kill, *,
               max_iterations: int | None = None) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "KEEPSTEP_CRASH_AT"}
    if kill.point:
        env["KEEPSTEP_CRASH_AT"] = f"{kill.point}@{kill.nth}"
    args = [str(root), RUN, "0.05"]
    if max_iterations is not None:
        args.append(str(max_iterations))
    n = next(_spawned)
    out, err = root.parent / f"child-{n}.out", root.parent / f"child-{n}.err"
    pid = zygote.spawn(args, env=env, stdout=out, stderr=err, entry="crash_child")
    try:
        if kill.point is None and max_iterations is None:
            deadline = time.monotonic() + 30
            ready = False
            while not ready and time.monotonic() < deadline:
                ready = bool(_read_lines(out)) or zygote.poll(pid) is not None
                if not ready:
                    time.sleep(0.002)
            assert ready, "child never became ready"
            time.sleep(kill.delay)
            if zygote.poll(pid) is None:  # never signal a pid the zygote has reaped
                os.kill(pid, signal.SIGKILL)
        rc = zygote.wait(pid, timeout=30)
    finally:
        if zygote.poll(pid) is None:
            os.kill(pid, signal.SIGKILL)
            zygote.wait(pid, timeout=30)
    lines = _read_lines(out)
    stderr = err.read_text(encoding="utf-8") if err.exists() else ""
    assert not stderr.strip() or rc == 0, f"{kill}: child wrote to stderr:\n{stderr}"
    return rc, lines


@dataclass
class Seen:
    head: int
    attempts: int


def _check(root: Path, before: Seen, kill: Kill, rc: int, lines: list[str]) -> Seen:
    """The store after a kill: a verified chain, head old-or-new, lost work shown as orphans."""
    where = f"after {kill}: "
    assert rc == -signal.SIGKILL, where + f"child exit code {rc}, output {lines}"
    assert lines and lines[0].split() == ["ready", str(before.head)], where + str(lines)
    acked = [int(line.split()[1]) for line in lines if line.startswith("committed ")]
    claimed = [line.split()[1] for line in lines if line.startswith("claimed ")]
    staged = [line.split()[1] for line in lines if line.startswith("staged ")]
    acked_attempts = {line.split()[2] for line in lines if line.startswith("committed ")}
    unacked = [a for a in staged if a not in acked_attempts]
    last_ack = acked[-1] if acked else before.head
    assert acked == list(range(before.head + 1, last_ack + 1)), where + str(lines)

    store = SQLiteStore(root, clock=_far_future)
    try:
        head = store.get_head(RUN).version
        assert head in (last_ack, last_ack + 1), where + f"head {head}, last ack {last_ack}"
        chain = store.verify_chain(RUN)
        assert chain.ok and chain.checked == head + 1, where + str(chain.problems)
        assert store.verify_head(RUN).ok, where + str(store.verify_head(RUN).problems)

        # The materialised state is exactly the committed units, each with its artifact.
        state = store.read_state(RUN, prefix="unit/")
        manifest = store.manifest(RUN)
        committed = {e.attempt_id for e in manifest}
        assert sorted(state) == [f"unit/U{v:04d}" for v in range(1, head + 1)], where
        assert {v["attempt"] for v in state.values()} == committed, where
        assert {e.sha256 for e in manifest} == {v["sha256"] for v in state.values()}, where
        assert store.artifacts.verify(manifest) == [], where
        statuses = {a.attempt_id: a.status for a in store.attempts(RUN)}
        assert {a for a, s in statuses.items() if s == "committed"} == committed, where
        if head == last_ack + 1:  # committed but never acknowledged: it is the in-flight one
            assert store.get_checkpoint(RUN, head).attempt in unacked, where

        # Every attempt directory with files is committed or listed as an orphan.
        with_files = {a for _, a, _, files in store.artifacts.attempt_dirs(RUN) if files}
        orphans = {o.attempt_id for o in store.orphaned_attempts(RUN)}
        assert orphans == with_files - committed, where
        for attempt in unacked:
            assert (attempt in committed) != (attempt in orphans), where + attempt
        attempts = len(statuses)
        assert attempts - before.attempts in (len(claimed), len(claimed) + 1), where

        if kill.point is not None:  # a named point: exactly what happened is known
            n = kill.nth
            assert len(acked) == n - 1, where + str(lines)
            assert head == last_ack + (kill.point == "commit.after_commit"), where
            expected_attempts = before.attempts + n - (kill.point == "claim.before")
            assert attempts == expected_attempts, where
            if kill.point in LOST_COMMIT:
                (lost,) = unacked
                assert lost in orphans and lost not in committed, where
            if kill.point == "claim.after":
                newest = max(store.attempts(RUN), key=lambda a: a.fencing_token)
                assert newest.status == "claimed" and newest.attempt_id not in with_files, where
    finally:
        store.close()
    return Seen(head=head, attempts=attempts)


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_the_old_or_the_whole_new_checkpoint(
        tmp_path: Path, zygote: Zygote) -> None:
    """60 SIGKILLs (named crash points and random timings): chain verifies, head is old or new."""
    root = tmp_path / ".keepstep"
    setup = SQLiteStore(root)
    setup.create_run(RUN, {"plan": "plan-v1"})
    setup.close()
    seen = Seen(head=0, attempts=0)
    kills = _schedule(random.Random(SEED))
    assert len(kills) >= 50
    for kill in kills:
        rc, lines = _run_child(zygote, root, kill)
        seen = _check(root, seen, kill, rc, lines)
    assert seen.head > 0

    # Work goes on after all that debris: a clean child commits three more units.
    rc, lines = _run_child(zygote, root, Kill(None), max_iterations=3)
    assert rc == 0, lines
    store = SQLiteStore(root)
    try:
        assert store.get_head(RUN).version == seen.head + 3
        assert store.verify_chain(RUN).ok
    finally:
        store.close()
