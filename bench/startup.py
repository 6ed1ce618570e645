"""Start-up of an offline run: spawn -> first unit claimed -> first model request, and the
process's peak RSS.

Each round copies the ME-042 sample pack (offline model, its default), warms its caches
with ``keepstep validate`` (sources converted once), spawns
``keepstep run --max-units N`` and reads from the state database when the first unit was
claimed (the first ``unit.claimed`` event) and when the first model call was reserved (the
call ledger), relative to the spawn; the peak RSS is the child's own (``os.wait4``).

Baseline, measured in the same run and interleaved round by round: a bare interpreter
(``python -c pass``) and ``python -c "import litellm"`` (with LITELLM_LOCAL_MODEL_COST_MAP,
as the gateway imports it) — what the offline default paid before its first request when
every model call went through litellm, and the RSS litellm brings. Goals: first request
<= 1.5 s after spawn on a quiet machine, peak RSS <= 200 MB.

    python bench/startup.py [--rounds 3] [--max-units 8]

Also ``--importtime``: the slowest imports of ``keepstep run`` (``python -X importtime``).

``--real-model``: the same pack calling ``openai/gpt-4o-mini`` through litellm, pointed at
tests/support/model_server.py (a local OpenAI-compatible server in this process; a dummy
key): spawn -> first claim, and spawn -> the first request the server receives (its own clock
at arrival) and the first answer settled in the call ledger. What the first request waits for
there is litellm's import (and the tokenizer), which the run starts in the background.

Keepstep's own modules: ``--bytecode`` compiles them first (as a user's install has them);
without it they are compiled in every process when PYTHONDONTWRITEBYTECODE is set (as on
the shared machines). The header says which.
Not a test: figures vary with load; compare the columns of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "sample_projects" / "market-entry"
REAL_MODEL = "openai/gpt-4o-mini"
# The server and the config helper are test support (tests/support); the bench runs from the
# repository.
sys.path.insert(0, str(ROOT))


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    out.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    out.pop("KEEPSTEP_CRASH_AT", None)
    return out


def spawn(args: list[str], cwd: Path) -> tuple[float, float, float, str]:
    """(epoch at spawn, wall seconds, peak RSS MB, stderr tail) of one child."""
    with tempfile.TemporaryFile("w+") as err:
        t_epoch, t0 = time.time(), time.perf_counter()
        proc = subprocess.Popen(args, cwd=cwd, env=env(), stdout=subprocess.DEVNULL,
                                stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 3):
            raise RuntimeError(f"{args} exited {code}: {err.read()[-1500:]}")
        return t_epoch, wall, usage.ru_maxrss / 1024, ""


def first_times(root: Path) -> tuple[float, float, float]:
    """(first unit.claimed event, first model request, first model answer) as epoch
    seconds."""
    db = sqlite3.connect(f"file:{root / '.keepstep' / 'state.db'}?mode=ro", uri=True)
    try:
        claim = db.execute("SELECT MIN(ts) FROM events WHERE kind = 'unit.claimed'").fetchone()[0]
        # The first request: its reservation in the call ledger, just before it is sent.
        request = db.execute("SELECT MIN(reserved_at) FROM model_calls").fetchone()[0]
        # The first answer: the call's end (settled_at), as the unit that waits for it sees.
        call = db.execute("SELECT MIN(settled_at) FROM model_calls").fetchone()[0]
    finally:
        db.close()
    return _epoch(claim), _epoch(request), _epoch(call)


def _epoch(value: object) -> float:
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def keepstep_round(work: Path, n: int, max_units: int) -> dict[str, float]:
    root = work / f"pack{n}"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    # A warm cache: `validate` converts the sources once (.keepstep/converted/), as any
    # earlier command on the project would have; the run then starts from a quiet disk.
    spawn([sys.executable, "-m", "keepstep.app.cli.main", "validate"], root)
    started, wall, rss, _ = spawn([sys.executable, "-m", "keepstep.app.cli.main", "run",
                                   "--max-units", str(max_units)], root)
    claim, request, call = first_times(root)
    shutil.rmtree(root, ignore_errors=True)
    return {"claim": claim - started, "request": request - started, "answer": call - started,
            "wall": wall, "rss": rss}


def real_model_round(work: Path, n: int, max_units: int) -> dict[str, float]:
    """One run of the pack against the local OpenAI-compatible server: the first request is
    timed at its arrival there."""
    from tests.support.model_server import running_server
    from tests.support.small_project import write_config

    root = work / f"real{n}"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    spawn([sys.executable, "-m", "keepstep.app.cli.main", "validate"], root)
    with running_server("clean") as server:
        write_config(root, default_model=REAL_MODEL, api_base=server.api_base)
        started, wall, rss, _ = spawn([sys.executable, "-m", "keepstep.app.cli.main", "run",
                                       "--max-units", str(max_units)], root)
        arrivals = [e["received_at"] for e in server.log]
    claim, _reserved, call = first_times(root)
    shutil.rmtree(root, ignore_errors=True)
    if not arrivals:
        raise RuntimeError(f"no request reached the model server in {max_units} units: "
                           "raise --max-units")
    return {"claim": claim - started, "request": min(arrivals) - started,
            "answer": call - started, "wall": wall, "rss": rss}


@contextmanager
def compiled_keepstep() -> Iterator[None]:
    """Inside: keepstep's modules byte-compiled beside their sources and children allowed to
    read them (PYTHONDONTWRITEBYTECODE unset), as a user's install has them. On the way out
    the __pycache__ folders made here are removed, so later processes on a machine that sets
    PYTHONDONTWRITEBYTECODE compile again, as they did before."""
    import compileall

    def caches() -> set[Path]:
        return {d for f in ("app", "engine", "storage") for d in (ROOT / f).rglob("__pycache__")}

    before = caches()
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        for folder in ("app", "engine", "storage"):
            compileall.compile_dir(str(ROOT / folder), quiet=1)
        yield
    finally:
        if saved is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = saved
        for d in caches() - before:
            shutil.rmtree(d, ignore_errors=True)


def bytecode_words() -> str:
    """How keepstep's modules reach the children now."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        if any((ROOT / "engine").rglob("__pycache__")):
            return "read from __pycache__ left by an earlier process"
        return "compiled in every process (PYTHONDONTWRITEBYTECODE is set)"
    return "compiled once, then read (as installed)"


def baseline_round(work: Path) -> dict[str, float]:
    _, bare, bare_rss, _ = spawn([sys.executable, "-c", "pass"], work)
    _, lite, lite_rss, _ = spawn([sys.executable, "-c", "import litellm"], work)
    return {"bare": bare, "bare_rss": bare_rss, "litellm": lite, "litellm_rss": lite_rss}


def importtime(work: Path) -> None:
    root = work / "importtime"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "keepstep.app.cli.main",
                           "run", "--max-units", "8"], cwd=root, env=env(),
                          capture_output=True, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.split("|")[1].strip().isdigit():
            _self, cum, name = (p.strip() for p in line.split("|"))
            if name.count(".") == 0 or name.startswith("keepstep"):
                rows.append((int(cum), name.strip()))
    print("slowest top-level imports of `keepstep run` (cumulative):")
    for cum, name in sorted(rows, reverse=True)[:15]:
        print(f"   {cum / 1e6:6.3f} s  {name}")
    print(f"   litellm imported: {any(n == 'litellm' for _, n in rows)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-units", type=int, default=8)
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--real-model", action="store_true",
                    help=f"{REAL_MODEL} through litellm against a local server")
    ap.add_argument("--bytecode", action="store_true",
                    help="compile keepstep's modules first (as installed)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="keepstep-startup-"))
    if args.real_model:
        os.environ.setdefault("OPENAI_API_KEY", "sk-bench-keepstep-dummy-0000")
    with compiled_keepstep() if args.bytecode else nullcontext():
        return measure(args, work)


def measure(args: argparse.Namespace, work: Path) -> int:
    try:
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"keepstep's modules {bytecode_words()}")
        runs, base = [], []
        one_round = real_model_round if args.real_model else keepstep_round
        for n in range(args.rounds):
            base.append(baseline_round(work))
            runs.append(one_round(work, n, args.max_units))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        bmed = {k: statistics.median(r[k] for r in base) for k in base[0]}
        model = f"{REAL_MODEL}, local server" if args.real_model else "offline"
        where = ("its arrival at the server" if args.real_model
                 else "reserved in the call ledger")
        print(f"keepstep run --max-units {args.max_units} ({model}), median of {args.rounds}:")
        print(f"   spawn -> first claim    {med['claim']:6.2f} s")
        print(f"   spawn -> first request  {med['request']:6.2f} s   ({where}; goal <= 1.5 s "
              "on a quiet machine)")
        print(f"   spawn -> first answer   {med['answer']:6.2f} s")
        print(f"   whole process           {med['wall']:6.2f} s   peak RSS {med['rss']:.0f} MB "
              "(goal <= 200 MB)")
        print("baseline, same rounds:")
        print(f"   python -c pass          {bmed['bare']:6.2f} s   peak RSS "
              f"{bmed['bare_rss']:.0f} MB")
        print(f"   python -c 'import litellm' {bmed['litellm']:6.2f} s   peak RSS "
              f"{bmed['litellm_rss']:.0f} MB   (what the first request waited for before)")
        print(f"ratios: first request / litellm import {med['request'] / bmed['litellm']:.2f}; "
              f"peak RSS / litellm alone {med['rss'] / bmed['litellm_rss']:.2f}")
        if args.importtime:
            importtime(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
