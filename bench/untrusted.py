"""Hostile files: time to refusal and peak RSS for each bomb and malformed-file class, against
an idle child measured in the same run (goal: every refusal <= 5 s and <= 300 MB peak).

Each case runs in a fresh child process that reports its own wall time and peak RSS
(``ru_maxrss``); the baseline child imports the same modules and does nothing, so
"over baseline" is what the hostile input itself cost. Cases:

- zip bombs as XLSX, DOCX and PPTX (really unpacking to ``--bomb-mb``, default 400 MB, and a
  1.5 GB one declared in the zip directory), billion laughs in each;
- a handover bundle with an unlisted 3.9 GB member (declared) and with a real unlisted
  ``--bomb-mb`` member, a listed member declaring another size; a backup with an unlisted
  member; a template reaching for Python, a template multiplying a string by 10^10;
- malformed files: truncated PDF, DOCX with a damaged part, a non-UTF-8 plan.toml.

``--fuzz N`` also runs every fuzz target of tests/support/fuzz_targets.py with N cases and
prints cases tried and failures found.

    python bench/untrusted.py [--bomb-mb 400] [--fuzz 200] [--dir PATH]

Not a test: figures vary by machine; the goal check is what to watch.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOAL_S, GOAL_MB = 5.0, 300.0
HUGE = 1_500 * 1024 * 1024
HUGER = 3_900 * 1024 * 1024


# -- the child: one case, timed ---------------------------------------------------------------
def _child(case: str, path: str) -> None:
    import keepstep.engine.files.convert  # noqa: F401 - the baseline imports the same
    import keepstep.engine.report.handover  # noqa: F401
    import keepstep.storage  # noqa: F401

    started = time.perf_counter()
    outcome = "returned"
    try:
        _run_case(case, Path(path))
    except Exception as exc:  # noqa: BLE001 - the outcome is what the bench reports
        outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:110]}"
    seconds = time.perf_counter() - started
    rss = _peak_rss_mb()
    print(json.dumps({"seconds": seconds, "rss_mb": rss, "outcome": outcome}))


def _peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM belongs to the memory of this program only (on Linux,
    ru_maxrss of a child started by fork+exec carries the parent's peak over)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run_case(case: str, path: Path) -> None:
    if case == "idle":
        return
    if case == "convert":
        from keepstep.engine.files.convert import convert

        convert(path)
    elif case == "verify-bundle":
        from keepstep.engine.report.handover import verify_bundle

        report = verify_bundle(path)
        if not report.ok:
            raise ValueError(report.render().replace("\n", " | "))
    elif case == "restore":
        from keepstep.storage import restore

        dest = Path(tempfile.mkdtemp(prefix="keepstep-bench-restore-"))
        try:
            report = restore(path, dest)
            if report.unlisted:
                raise ValueError(report.message)
        finally:
            shutil.rmtree(dest, ignore_errors=True)
    elif case == "template":
        from keepstep.engine.kinds.render import render_text

        render_text(path.read_text(), {})
    elif case == "plan":
        from keepstep.engine.core.plan import load_plan

        load_plan(path)
    else:
        raise SystemExit(f"unknown case {case}")


def measure(case: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", case, str(path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        return {"seconds": float("nan"), "rss_mb": float("nan"),
                "outcome": f"child failed: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- building the hostile files -------------------------------------------------------------
def build(folder: Path, bomb_mb: int) -> list[tuple[str, str, Path]]:
    from tests.support import bombs
    from tests.support import fuzz_targets as ft

    cases: list[tuple[str, str, Path]] = []
    for fmt in ("xlsx", "docx", "pptx"):
        cases.append((f"{fmt} zip bomb ({bomb_mb} MB real)", "convert",
                      bombs.zip_bomb(folder / f"bomb.{fmt}", fmt, bomb_mb)))
        declared = bombs.small_office(folder / f"declared.{fmt}", fmt)
        part = {"xlsx": "xl/worksheets/sheet1.xml", "docx": "word/document.xml",
                "pptx": "ppt/slides/slide1.xml"}[fmt]
        cases.append((f"{fmt} zip bomb (1.5 GB declared)", "convert",
                      bombs.declare_size(declared, part, HUGE)))
        cases.append((f"{fmt} billion laughs", "convert",
                      bombs.billion_laughs(folder / f"laughs.{fmt}", fmt)))
    bundle_bytes, backup_bytes, _root = ft.bundle_and_backup()
    unlisted = folder / "bundle-unlisted-declared.zip"
    unlisted.write_bytes(bundle_bytes)
    with zipfile.ZipFile(unlisted, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("deliverables/extra.bin", b"\0" * 4096)
    cases.append(("bundle: unlisted member, 3.9 GB declared", "verify-bundle",
                  bombs.declare_size(unlisted, "deliverables/extra.bin", HUGER)))
    real = folder / "bundle-unlisted-real.zip"
    real.write_bytes(bundle_bytes)
    with zipfile.ZipFile(real, "a", zipfile.ZIP_DEFLATED) as zf, \
            zf.open("deliverables/extra.bin", "w", force_zip64=True) as fh:
        block = b"\0" * (1024 * 1024)
        for _ in range(bomb_mb):
            fh.write(block)
    cases.append((f"bundle: unlisted member, {bomb_mb} MB real", "verify-bundle", real))
    listed = folder / "bundle-listed-declared.zip"
    listed.write_bytes(bundle_bytes)
    cases.append(("bundle: listed member declaring 3.9 GB", "verify-bundle",
                  bombs.declare_size(listed, "narrative.md", HUGER)))
    backup = folder / "backup-unlisted.zip"
    backup.write_bytes(backup_bytes)
    with zipfile.ZipFile(backup, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("artifacts/extra.bin", b"\0" * 4096)
    cases.append(("backup: unlisted member, 3.9 GB declared", "restore",
                  bombs.declare_size(backup, "artifacts/extra.bin", HUGER)))
    truncated = folder / "truncated-backup.zip"
    truncated.write_bytes(backup_bytes[: len(backup_bytes) // 2])
    cases.append(("backup: truncated zip", "restore", truncated))
    escape = folder / "escape.md"
    escape.write_text("{{ cycler.__init__.__globals__.os.popen('id').read() }}")
    cases.append(("template reaching for Python", "template", escape))
    repeat = folder / "repeat.md"
    repeat.write_text("{{ 'x' * 10000000000 }}")
    cases.append(("template 'x' * 10^10", "template", repeat))
    pdf = folder / "truncated.pdf"
    pdf.write_bytes(ft.source_bytes("pdf")[:900])
    cases.append(("truncated PDF", "convert", pdf))
    damaged = folder / "damaged.docx"
    src = bombs.small_office(folder / "src.docx", "docx")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(damaged, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data[: len(data) // 2] if info.filename == "word/document.xml"
                          else data)
    cases.append(("DOCX with a cut part", "convert", damaged))
    plan = folder / "plan.toml"
    plan.write_bytes(b"\xff\xfe[plan]\x00t\x00")
    cases.append(("non-UTF-8 plan.toml", "plan", plan))
    return cases


# -- fuzzing, longer ----------------------------------------------------------------------------
def fuzz(n: int) -> None:
    from tests.support import fuzz_targets as ft

    targets = []
    for name in ("plan.toml", "sources.toml", "contract.md", "keepstep.toml"):
        real = (ft.project_template() / name).read_bytes()
        targets.append((f"project file {name}", ft.mutated(real),
                        lambda d, name=name: ft.fuzz_project_file(name, d)))
    targets.append(("template", ft.mutated(
        (ft.PACK / "templates" / "report.md").read_bytes()), ft.fuzz_template))
    for fmt in ("pdf", "docx", "xlsx", "pptx", "html", "csv", "md"):
        targets.append((f"convert {fmt}", ft.mutated(ft.source_bytes(fmt)),
                        lambda d, fmt=fmt: ft.fuzz_convert(fmt, d)))
    for fmt in ("docx", "xlsx", "pptx"):
        targets.append((f"convert {fmt} (parts)", ft.mutated_zip_members(ft.source_bytes(fmt)),
                        lambda d, fmt=fmt: ft.fuzz_convert(fmt, d)))
    bundle, backup, _ = ft.bundle_and_backup()
    targets.append(("verify-bundle", ft.mutated(bundle), ft.fuzz_bundle))
    targets.append(("restore", ft.mutated(backup), ft.fuzz_backup))
    print(f"\nfuzzing: {n} cases per target (hypothesis, mutated real files)")
    print(f"{'target':32} {'cases':>6} {'failures':>9} {'seconds':>8} {'peak RSS':>9}")
    for name, strategy, target in targets:
        tried = [0]
        failures: list[str] = []
        start = time.perf_counter()

        _campaign(strategy, target, tried, failures, n)()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name:32} {tried[0]:>6} {len(failures):>9} "
              f"{time.perf_counter() - start:>8.1f} {rss:>7.0f} MB")
        for failure in sorted(set(failures))[:5]:
            print(f"    found: {failure}")


def _campaign(strategy, target, tried: list[int], failures: list[str], n: int):  # noqa: ANN001, ANN202
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=strategy)
    def run(data: bytes) -> None:
        tried[0] += 1
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - reported, the campaign goes on
            failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--bomb-mb", type=int, default=400)
    parser.add_argument("--fuzz", type=int, default=0, help="cases per fuzz target")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    folder = args.dir or Path(tempfile.mkdtemp(prefix="keepstep-bench-untrusted-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"building hostile files in {folder} …", flush=True)
    cases = build(folder, args.bomb_mb)
    base = measure("idle", folder)
    print(f"baseline child (imports only): {base['rss_mb']:.0f} MB peak RSS\n")
    print(f"{'case':44} {'size':>9} {'refused in':>10} {'peak RSS':>9} {'over base':>9}  goal  "
          "outcome")
    ok_all = True
    for name, case, path in cases:
        m = measure(case, path)
        over = m["rss_mb"] - base["rss_mb"]
        ok = m["seconds"] <= GOAL_S and m["rss_mb"] <= GOAL_MB and m["outcome"] != "returned"
        ok_all &= ok
        size = path.stat().st_size
        print(f"{name:44} {size / 1024:>7.0f} KB {m['seconds']:>8.2f} s {m['rss_mb']:>6.0f} MB "
              f"{over:>+7.0f} MB  {'ok' if ok else 'MISS'}  {m['outcome'][:100]}", flush=True)
    print(f"\ngoal (every refusal <= {GOAL_S:g} s and <= {GOAL_MB:g} MB peak): "
          f"{'met' if ok_all else 'NOT met'}")
    if args.fuzz:
        fuzz(args.fuzz)
    if args.dir is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
