"""Stopping a run from outside, and errors inside a unit: never a unit left running.

Each test drives a real process (the worker or the ``keepstep`` CLI) against a local
OpenAI-compatible server whose answers take long, so the units are inside a model call when
the signal arrives — the case where a stop used to wait for the call, or not happen at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from keepstep.engine.api import open_project
from keepstep.storage import SQLiteStore
from tests.support.engine_harness import WorkerProcess, run_worker, start_worker, worker_env
from tests.support.fake_provider import FakeProvider, running_provider
from tests.support.small_project import make_small_project

RUN = "R"
KEEPSTEP = str(Path(sys.executable).with_name("keepstep"))


def _slow_project(tmp_path: Path, provider: FakeProvider) -> Path:
    return make_small_project(tmp_path / "small", default_model="openai/fake-model",
                              api_base=provider.api_base)


def _wait_in_calls(provider: FakeProvider, proc: subprocess.Popen | WorkerProcess,
                   n: int) -> None:
    deadline = time.monotonic() + 60
    while provider.in_flight < n:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the units never reached their model calls"
        time.sleep(0.02)


def _stop(proc: subprocess.Popen | WorkerProcess, sig: int) -> tuple[float, str, str]:
    started = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    return time.monotonic() - started, out, err


def _assert_released(root: Path) -> None:
    store = SQLiteStore(root / ".keepstep")
    try:
        assert store.leases(RUN) == []
        attempts = store.attempts(RUN)
        assert attempts and not [a for a in attempts if a.status == "claimed"]
    finally:
        store.close()


def _resume_to_done(root: Path, provider: FakeProvider) -> None:
    provider.latency = 0.0
    with open_project(root) as p:
        assert p.get_run(RUN).resume(jobs=2).decision == "done"


def test_worker_stops_within_two_seconds_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM is handled like SIGINT: with two units inside 30-second model calls the worker
    exits within 2 s (128 + 15), says how to continue, holds no lease, and a resume finishes."""
    sig = signal.SIGTERM
    with running_provider(latency=30.0, offline=True) as provider:
        root = _slow_project(tmp_path, provider)
        proc = start_worker(root, RUN, "--jobs", "2")
        _wait_in_calls(provider, proc, 2)
        elapsed, _out, err = _stop(proc, sig)
        assert elapsed < 2.0, err[-2000:]
        assert proc.returncode == 128 + sig
        assert f"keepstep resume {root} --run {RUN}" in err
        _assert_released(root)
        _resume_to_done(root, provider)


def test_cli_run_stops_within_two_seconds_on_ctrl_c(tmp_path: Path) -> None:
    """`keepstep run` under Ctrl-C (SIGINT; SIGTERM takes the same handler) during long model
    calls: it stops within 2 s with the cancelled exit code, names the resume command and
    releases every lease."""
    sig = signal.SIGINT
    with running_provider(latency=30.0, offline=True) as provider:
        root = _slow_project(tmp_path, provider)
        proc = subprocess.Popen([KEEPSTEP, "run", str(root), "--run", RUN, "--jobs", "2"],
                                env=worker_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        _wait_in_calls(provider, proc, 2)
        elapsed, out, err = _stop(proc, sig)
        assert elapsed < 2.0, err[-2000:]
        assert proc.returncode == 130
        assert "keepstep resume" in out + err
        _assert_released(root)


def test_non_utf8_source_is_refused_before_any_unit_runs(tmp_path: Path) -> None:
    """A source that is not UTF-8 text is refused when the run starts, before any unit is
    claimed: the worker exits with a message naming the file and what to do, no traceback,
    no run, no attempt, no lease. On a run that already exists (a source broken between two
    resumes) the same refusal leaves every unit as it was: nothing claimed, nothing running."""
    root = make_small_project(tmp_path / "small")
    victim = root / "sources" / "A2-household-demand.md"
    good = victim.read_bytes()
    victim.write_bytes(b"\x80\x81\x9c not text\n")
    proc = run_worker(root, RUN, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "A2-household-demand.md is not valid UTF-8 text" in proc.stderr
    assert "save it as UTF-8" in proc.stderr and "nothing was started" in proc.stderr
    store = SQLiteStore(root / ".keepstep")
    try:
        assert not store.run_exists(RUN)
    finally:
        store.close()

    victim.write_bytes(good)
    assert run_worker(root, RUN, "--max-units", "3", timeout=300).returncode == 0
    victim.write_bytes(b"\x80\x81\x9c not text\n")
    store = SQLiteStore(root / ".keepstep")
    try:
        attempts_before = [(a.attempt_id, a.status) for a in store.attempts(RUN)]
        head_before = store.get_head(RUN, "main").version
    finally:
        store.close()
    proc = run_worker(root, RUN, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "A2-household-demand.md is not valid UTF-8 text" in proc.stderr
    store = SQLiteStore(root / ".keepstep")
    try:
        assert [(a.attempt_id, a.status) for a in store.attempts(RUN)] == attempts_before
        assert store.get_head(RUN, "main").version == head_before
        assert store.leases(RUN) == []
        assert not [a for a in store.attempts(RUN) if a.status == "claimed"]
        assert not [u for u, st in store.unit_statuses(RUN).items() if st.status == "running"]
    finally:
        store.close()


def test_unexpected_error_in_a_kind_ends_the_attempt_and_keeps_other_units(
        tmp_path: Path) -> None:
    """A kind raising an unexpected exception (a bug) fails that attempt with a scrubbed
    message and no lease, while the units in flight beside it commit."""
    from keepstep.engine.kinds.context import REGISTRY
    from tests.support.dag_project import FakeGateway, dag_kind, make_dag_project

    deps = {"A": [], "B": [], "C": [], "D": ["A"]}
    root = make_dag_project(tmp_path / "p", deps)
    old = REGISTRY["notes"]

    def sometimes_broken(ctx: object) -> object:
        if ctx.unit.id == "B":  # type: ignore[attr-defined]
            raise RuntimeError("boom with api_key=sk-abcdefghijklmnopqrstuvwx inside")
        return dag_kind(ctx)

    REGISTRY["notes"] = (old[0], sometimes_broken)
    try:
        with open_project(root, gateway_factory=lambda ledger: FakeGateway(
                ledger, latency=0.1)) as p:
            run = p.start_run(RUN)
            status = run.run(jobs=3)
            att = run.store.get_attempt(RUN, "B/a1")
            assert att.status == "failed" and att.error_class == "internal"
            assert "RuntimeError" in att.message and "sk-abc" not in att.message
            assert run.store.leases(RUN) == []
            assert {"A", "C", "D"} <= set(run.facts_records())
            assert status.decision == "blocked"
    finally:
        REGISTRY["notes"] = old
    assert os.path.isdir(root)
