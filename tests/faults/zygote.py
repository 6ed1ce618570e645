"""A preloaded fork server: worker processes for the fault suite in a fraction of a second.

Importing litellm costs seconds per process, and the fault suite starts well over a hundred
executor processes. The zygote imports litellm and the engine once, stays single-threaded,
and forks one child per worker run. Each child is a real, separate process with its own pid
(so its own executor id): SIGKILL, SIGSTOP, ``KEEPSTEP_CRASH_AT`` and RLIMIT_FSIZE hit it
exactly as they hit ``python -m keepstep.engine.drills.worker``, and recovery sees a dead pid.

Protocol, one JSON object per line:

    parent -> zygote  {"id": n, "argv": [...], "env": {...}, "stdout": path, "stderr": path}
    zygote -> parent  {"ready": true}                    once, after the preload
    zygote -> parent  {"id": n, "pid": pid}              after each fork
    zygote -> parent  {"pid": pid, "code": c}            when a child ends (c < 0: signal)

A child runs ``tests.faults.child.main(argv)`` (the real worker plus test hooks), the worker
killed inside its k-th provider call (``entry="kill_in_call"``, tests/support/engine_harness.py),
or — started with ``--storage``, which preloads only keepstep.storage —
tests/support/crash_child.py for tests/test_storage_crash.py. Run this file as a script;
``Zygote`` below is the parent's side, ``shared()`` the one zygote of a test process (the fault
suite and the engine tests' workers, tests/support/engine_harness.py, fork from it).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_API = "http://127.0.0.1:9/v1"  # the discard port: nothing listens, refused at once


# -- the zygote process -----------------------------------------------------------------------
def _warm_up() -> None:
    """One offline call and one refused OpenAI-style call through the real gateway, so that
    every module litellm imports lazily on a first call gets imported."""
    from keepstep.engine.errors import ModelError
    from keepstep.engine.gateway.client import CallContext, ModelGateway, ModelRequest, RetryPolicy

    class _Ledger:
        def reserve(self, ctx: Any, **_: Any) -> str:
            return "warm-up"

        def settle(self, call_id: str, **_: Any) -> None:
            pass

    gateway = ModelGateway(ledger=_Ledger(), policy=RetryPolicy(max_attempts=1))
    ctx = CallContext(run_id="warm", unit="U0", attempt="U0/a1")
    payload = json.dumps({"task": "check", "evidence_ids_known": [], "claims": []})
    gateway.complete(ctx, ModelRequest(model="local/keepstep-offline", expect_json=True,
                                       messages=[{"role": "user", "content": payload}]))
    with contextlib.suppress(ModelError):
        gateway.complete(ctx, ModelRequest(model="openai/fake-model", api_base=UNREACHABLE_API,
                                           messages=[{"role": "user", "content": payload}]))


def _warm_up_run() -> None:
    """A whole offline run (through its approval gate) of the fault suite's small project in a
    scratch folder: the modules a worker imports only when it runs (source conversion with
    pypdf and PIL, networkx for takeovers, the kinds, renderers, the delivery adapters) get
    imported here once instead of in every forked worker."""
    import tempfile

    from tests.faults.child import main as child_main
    from tests.faults.harness import make_fresh
    from tests.faults.steps import AUDIENCE, RUN

    with tempfile.TemporaryDirectory(prefix="keepstep-zygote-") as scratch:
        root = make_fresh(Path(scratch) / "project")
        child_main([str(root), "--run", RUN, "--approve", f"audience={AUDIENCE}"])


def _preload_storage() -> None:
    """The light preload (``--storage``): only what tests/support/crash_child.py imports."""
    import keepstep.storage  # noqa: F401
    import tests.support.crash_child  # noqa: F401


def _preload() -> None:
    if "--storage" in sys.argv[1:]:
        _preload_storage()
        return
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # noqa: F401

    import keepstep.engine.api  # noqa: F401
    import keepstep.engine.drills.worker  # noqa: F401
    import keepstep.engine.kinds  # noqa: F401
    import keepstep.engine.run.effects  # noqa: F401
    import keepstep.engine.run.loop  # noqa: F401
    import keepstep.engine.run.recovery  # noqa: F401
    from keepstep.engine.gateway import client as gateway
    gateway._litellm()
    import tests.faults.child  # noqa: F401
    import tests.support.engine_harness  # noqa: F401  (the kill_in_call entry)

    # litellm starts a logging thread on its first call, and a run starts unit and heartbeat
    # threads; a process must not fork with other threads running. So the first call and a
    # whole run are made in a throwaway child that reports which modules it imported; this
    # process then imports those, and stays single-threaded.
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the throwaway child
        os.close(read_fd)
        # The run prints its events: never onto the protocol pipe (stdout) to the parent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        before = set(sys.modules)
        with contextlib.suppress(Exception):
            _warm_up()
        with contextlib.suppress(BaseException):
            _warm_up_run()
        data = json.dumps(sorted(set(sys.modules) - before)).encode()
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        names = json.loads(fh.read() or b"[]")
    os.waitpid(pid, 0)
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"the zygote must stay single-threaded: {threading.enumerate()}")


def _child(request: dict[str, Any], control_fds: list[int]) -> int:
    for fd in control_fds:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    # New stream objects: never reuse the zygote's (their buffers and locks are its own).
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if request.get("entry") == "crash_child":  # tests/test_storage_crash.py's child
        from tests.support import crash_child

        sys.argv = [str(Path(crash_child.__file__)), *request["argv"]]
        return int(crash_child.main() or 0)
    if request.get("entry") == "kill_in_call":  # killed inside its k-th provider call
        from tests.support import engine_harness

        return int(engine_harness.kill_in_call_main(list(request["argv"])) or 0)
    from tests.faults import child

    return int(child.main(list(request["argv"])) or 0)


def _emit(obj: dict[str, Any]) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def serve() -> None:
    _preload()
    # Everything preloaded goes to the permanent generation: a child's garbage collections
    # then never touch (and so never copy) the zygote's pages.
    gc.freeze()
    _emit({"ready": True})
    buf = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.02)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:  # pragma: no cover - runs in the child
                    code = 1
                    try:
                        code = _child(request, [])
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None
                                                                           else 1)
                    except BaseException:  # noqa: BLE001 - report, then exit like a process
                        traceback.print_exc()
                    finally:
                        with contextlib.suppress(Exception):
                            sys.stdout.flush()
                            sys.stderr.flush()
                        os._exit(code)
                _emit({"id": request["id"], "pid": pid})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _emit({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


# -- the parent's side --------------------------------------------------------------------------
def _base_env(environ: Any) -> dict[str, str]:
    base = dict(environ)
    base.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    base.pop("KEEPSTEP_CRASH_AT", None)
    return base


class Zygote:
    """Starts the zygote and talks to it. Not thread-safe: one harness drives it."""

    def __init__(self, *, env: dict[str, str] | None = None, storage_only: bool = False
                 ) -> None:
        """``storage_only``: preload keepstep.storage alone, for children that run
        tests/support/crash_child.py (``spawn(..., entry="crash_child")``)."""
        base = _base_env(os.environ if env is None else env)
        # A shared zygote outlives the test that started it: with no env given, each launch
        # takes the environment of the test launching it (a postgres test's
        # KEEPSTEP_STORE_URL must not reach a later SQLite fault case, nor the reverse).
        self._follow_environ = env is None
        self._env = base
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.zygote", *(["--storage"] if storage_only
                                                             else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=base, cwd=str(REPO),
        )
        self._buf = b""
        self._next_id = 0
        self._spawned: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        first = self._read_line(120.0)
        if not first or not first.get("ready"):
            raise RuntimeError(f"the fault-suite zygote did not start: {first!r}")

    def _read_line(self, timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError("the fault-suite zygote exited")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _pump(self, timeout: float) -> bool:
        msg = self._read_line(timeout)
        if msg is None:
            return False
        if "code" in msg:
            self.exits[msg["pid"]] = msg["code"]
        elif "id" in msg:
            self._spawned[msg["id"]] = msg["pid"]
            # A new child with a pid an earlier child had (pids wrap): that exit is not its own.
            self.exits.pop(msg["pid"], None)
        return True

    @property
    def env(self) -> dict[str, str]:
        """The environment a worker is launched with (a fresh copy each time)."""
        return _base_env(os.environ) if self._follow_environ else dict(self._env)

    def spawn(self, argv: list[str], *, env: dict[str, str], stdout: Path, stderr: Path,
              cwd: Path | None = None, entry: str | None = None) -> int:
        """Fork a child running ``tests.faults.child.main(argv)`` (or, with ``entry=
        "crash_child"``, tests/support/crash_child.py with ``argv``; with ``entry=
        "kill_in_call"``, tests/support/engine_harness.py's worker killed in a provider call);
        returns its pid."""
        assert self.proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        request = {"id": rid, "argv": argv, "env": env, "stdout": str(stdout),
                   "stderr": str(stderr), "cwd": str(cwd) if cwd else None, "entry": entry}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        while rid not in self._spawned:
            if not self._pump(30.0):
                raise RuntimeError("the fault-suite zygote did not fork")
        return self._spawned.pop(rid)

    def poll(self, pid: int) -> int | None:
        while self._pump(0.0):
            pass
        return self.exits.get(pid)

    def wait(self, pid: int, timeout: float = 120.0) -> int:
        """The child's exit code (negative: killed by that signal)."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"worker {pid} still running after {timeout:g} s")
            self._pump(min(left, 1.0))
        return self.exits[pid]

    def launcher(self, workdir: Path):
        """A ``launch(args, crash_at) -> exit code`` for ``keepstep.engine.drills.drill``: the
        worker's own arguments, run by a forked child instead of a new interpreter."""
        counter = iter(range(1, 1_000_000))

        def launch(args: list[str], crash_at: str | None) -> int:
            n = next(counter)
            env = self.env
            if crash_at:
                env["KEEPSTEP_CRASH_AT"] = crash_at
            pid = self.spawn(list(args), env=env, stdout=workdir / f"drill-worker-{n}.out",
                             stderr=workdir / f"drill-worker-{n}.err")
            return self.wait(pid, 300.0)

        return launch

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_shared: Zygote | None = None


def shared() -> Zygote:
    """The zygote of this test process, started on first use and closed at exit (or by the
    session fixture in tests/conftest.py): one preload serves every worker the process forks."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = Zygote()
        atexit.register(_shared.close)
    return _shared


def close_shared() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


if __name__ == "__main__":
    serve()
