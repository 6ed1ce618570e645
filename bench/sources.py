"""Source conversion: throughput (MB/s) per format and peak RSS, against reading the same
bytes as plain text, side by side in one run.

For each format a source of about ``--mb`` (50 MB by default) is generated in a temporary
folder — text only, no images, so it holds far more text than most real files of that size
(a 50 MB Word file of prose is ~260 M characters). PDF and PPTX files are written directly
(PDF syntax; slide XML cloned from a python-pptx deck): fpdf2 and python-pptx need many
minutes for 50 MB. pypdf reads text-only pages at well under 1 MB/s, so a 50 MB text PDF takes
minutes to convert (``--small-mb`` sets a smaller size for PDF and PPTX, e.g. for a quick look).
Each measurement runs in a fresh child process that reports its own peak RSS (``ru_maxrss``):

- convert: ``keepstep.engine.files.convert.convert(path)`` (the whole file, to Markdown; a
  text past ``spill.SPILL_CHARS`` goes to a file as it is made and comes back as a
  ``TextFile``, as in a run — its length is counted, it is not read back whole);
- plain read: the same file's bytes read and decoded as text (Latin-1, which never fails);
- baseline: the child with the converter imported and nothing read (the fixed cost).

It prints MB/s and peak RSS for both, the convert/plain ratios, and the goal check: peak RSS
under 300 MB for the 50 MB sources.

    python bench/sources.py [--mb 50] [--small-mb 5] [--formats txt,md,csv,...] [--dir PATH]

Not a test: figures vary by machine; the ratios and the RSS ceiling are what to watch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import source_files as sf  # noqa: E402

RSS_GOAL_MB = 300
FORMATS = ("txt", "md", "csv", "html", "docx", "xlsx", "pdf", "pptx")
SMALL = ("pdf", "pptx")

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
from keepstep.engine.files.convert import convert
import pypdf, openpyxl  # the fixed cost is the same in every mode
start = time.perf_counter()
chars = 0
if mode == "convert":
    chars = len(convert(path, max_bytes=1 << 40).text)
elif mode == "plain":
    with open(path, "rb") as fh:
        chars = len(fh.read().decode("latin-1"))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "chars": chars,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _scaled(make, path: Path, target: int, probe_units: int) -> Path:
    """Write ``probe_units`` units, measure bytes per unit, then write enough for ``target``."""
    make(path, probe_units)
    per_unit = max(path.stat().st_size / probe_units, 1)
    return make(path, max(int(target / per_unit), 1))


def generate(fmt: str, folder: Path, megabytes: float) -> Path:
    target = int(megabytes * 1024 * 1024)
    path = folder / f"big.{fmt}"
    if fmt == "txt":
        return sf.write_large_text(path, megabytes)
    if fmt == "md":
        return sf.write_large_text(path, megabytes, markdown=True)
    if fmt == "csv":
        return sf.write_large_csv(path, megabytes)
    if fmt == "html":
        return sf.write_large_html(path, megabytes)
    if fmt == "docx":
        return _scaled(sf.write_large_docx, path, target, 5000)
    if fmt == "xlsx":
        return _scaled(sf.write_large_xlsx, path, target, 20000)
    if fmt == "pdf":
        return sf.write_large_pdf_direct(path, megabytes)
    if fmt == "pptx":
        return sf.write_large_pptx_direct(path, megabytes)
    raise ValueError(fmt)


def measure(mode: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True,
                         text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} {path.name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def generate_apart(fmt: str, folder: Path, megabytes: float) -> Path:
    """``generate`` in a child process. A child's peak RSS (``ru_maxrss``) starts from its
    parent's RSS when it was forked: generating in this process (python-pptx holds a deck,
    openpyxl a workbook) raised every later measurement's floor from ~57 to ~131 MB."""
    out = subprocess.run([sys.executable, __file__, "--generate", fmt, str(folder),
                          str(megabytes)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"generating {fmt} failed:\n{out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--generate"]:
        print(generate(argv[1], Path(argv[2]), float(argv[3])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--small-mb", type=float, default=None,
                        help="size for PDF and PPTX (default: --mb)")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    formats = [f for f in args.formats.split(",") if f]
    folder = Path(tempfile.mkdtemp(prefix="keepstep-bench-sources-", dir=args.dir))
    try:
        print(f"python {sys.version.split()[0]}; files in {folder}")
        rows = []
        for fmt in formats:
            size_mb = args.small_mb if fmt in SMALL and args.small_mb else args.mb
            path = generate_apart(fmt, folder, size_mb)
            mb = path.stat().st_size / (1024 * 1024)
            base = measure("baseline", path)
            plain = measure("plain", path)
            conv = measure("convert", path)
            rows.append((fmt, mb, conv, plain, base))
            _print_row(fmt, mb, conv, plain, base)
            path.unlink()
        print()
        over = [(f, c["rss_mb"]) for f, mb, c, _, _ in rows
                if mb >= 45 and c["rss_mb"] >= RSS_GOAL_MB]
        big = [f for f, mb, *_ in rows if mb >= 45]
        if big:
            verdict = "MET" if not over else "NOT MET for " + ", ".join(
                f"{f} ({r:.0f} MB)" for f, r in over)
            print(f"goal: peak RSS < {RSS_GOAL_MB} MB for a ~50 MB source "
                  f"({', '.join(big)}): {verdict}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


_HEADER_DONE = False


def _print_row(fmt: str, mb: float, conv: dict, plain: dict, base: dict) -> None:
    global _HEADER_DONE
    if not _HEADER_DONE:
        print(f"{'format':6} {'size MB':>8} | {'convert s':>9} {'MB/s':>7} {'RSS MB':>7} | "
              f"{'plain s':>7} {'MB/s':>7} {'RSS MB':>7} | {'time x':>7} {'RSS x':>6} | "
              f"{'base RSS':>8} {'out chars':>10}")
        _HEADER_DONE = True
    conv_rate = mb / conv["seconds"] if conv["seconds"] else float("inf")
    plain_rate = mb / plain["seconds"] if plain["seconds"] else float("inf")
    time_x = conv["seconds"] / plain["seconds"] if plain["seconds"] else float("inf")
    rss_x = conv["rss_mb"] / plain["rss_mb"] if plain["rss_mb"] else float("inf")
    print(f"{fmt:6} {mb:8.1f} | {conv['seconds']:9.2f} {conv_rate:7.2f} {conv['rss_mb']:7.0f} | "
          f"{plain['seconds']:7.3f} {plain_rate:7.0f} {plain['rss_mb']:7.0f} | {time_x:7.0f} "
          f"{rss_x:6.2f} | {base['rss_mb']:8.0f} {conv['chars']:10d}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
