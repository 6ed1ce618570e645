"""Fuzzing targets over every file a project or a colleague hands keepstep, and their
invariants: no unhandled exception (only keepstep's own errors, each naming the file), no
file read or written outside the project (or the bundle / restore target), bounded memory.

Shared by tests/test_fuzz_untrusted.py (a bounded number of cases, seconds) and
bench/untrusted.py ``--fuzz N`` (longer). Inputs are real files mutated: bytes flipped,
cut, repeated, spliced with hostile snippets (``../``, links, entities, huge numbers).
"""

from __future__ import annotations

import functools
import io
import resource
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import strategies as st

from keepstep.engine.errors import KeepstepError

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "sample_projects" / "market-entry"
SOURCES = PACK / "sources"
RSS_GROWTH_MB = 300  # the goal for any one hostile input

HOSTILE = [b"../", b"/etc/passwd", b"\x00", b"{{", b"}}", b"{% for %}", b"<!DOCTYPE x [",
           b"<!ENTITY a \"aaaa\">", b"&a;", b"9" * 400, b"\"\"\"", b"[[unit]]", b"+++",
           b"\xff\xfe", b"$(id)", b"'; rm -rf ~", b"1e999", b"-1", b"[plan]", b"= ",
           b"\n" * 3, b"\\u0000", b"\xc3\x28"]


@st.composite
def mutated(draw: Callable, original: bytes) -> bytes:
    """``original`` with a few random edits (flip, delete, insert hostile, cut, repeat)."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "delete", "insert", "cut", "repeat"]))
        pos = draw(st.integers(0, max(0, len(data) - 1))) if data else 0
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.sampled_from(HOSTILE) | st.binary(max_size=16))
        elif kind == "cut":
            del data[pos:]
        elif kind == "repeat" and data:
            data[pos:pos] = bytes(data[pos:pos + 32]) * draw(st.integers(1, 20))
    return bytes(data)


def text_of(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def expect_keepstep_error(fn: Callable[[], object], names: str) -> None:
    """``fn()`` returns, or raises a KeepstepError whose message names ``names``."""
    try:
        fn()
    except KeepstepError as exc:
        assert names in str(exc), (names, str(exc))


# -- project files -------------------------------------------------------------------------
@functools.cache
def project_template() -> Path:
    """A small copy of the pack (few sources) the file fuzzers overwrite one file of."""
    from tests.support.small_project import make_small_project

    root = Path(tempfile.mkdtemp(prefix="keepstep-fuzz-")) / "p"
    return make_small_project(root, per_group=1)


def fresh_project() -> Path:
    root = Path(tempfile.mkdtemp(prefix="keepstep-fuzz-")) / "p"
    shutil.copytree(project_template(), root)
    return root


def fuzz_project_file(name: str, data: bytes) -> None:
    """Write ``data`` as the project's ``name`` and load/validate the project: only a
    KeepstepError naming the file (or the plan problems), nothing read outside it."""
    from keepstep.engine.files.project import load_config, load_contract, load_sources
    from keepstep.engine.run.validation import validate_project

    root = fresh_project()
    try:
        (root / name).write_bytes(data)
        loader = {"keepstep.toml": load_config, "contract.md": load_contract,
                  "sources.toml": load_sources}.get(name)
        if loader is not None:
            expect_keepstep_error(lambda: loader(root), name)
        expect_keepstep_error(lambda: validate_project(root, models=False), "")
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def fuzz_plan(data: bytes) -> None:
    from keepstep.engine.core.plan import parse_plan

    expect_keepstep_error(lambda: parse_plan(text_of(data), origin="plan.toml"), "plan.toml")


def fuzz_contract(data: bytes) -> None:
    from keepstep.engine.files.project import parse_contract

    expect_keepstep_error(lambda: parse_contract(text_of(data), origin="contract.md"),
                          "contract.md")


def fuzz_template(data: bytes) -> None:
    """Layout and placeholders never raise; rendering raises only template errors."""
    import jinja2

    from keepstep.engine.core.templates import layout, placeholders, syntax_error
    from keepstep.engine.files.sandbox import TemplateRefused
    from keepstep.engine.kinds.render import render_text

    text = text_of(data)
    layout(text)
    names = placeholders(text)
    if syntax_error(text):
        return
    try:
        render_text(text, {n: "v" for n in names})
    except (jinja2.TemplateError, TemplateRefused):
        pass
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError):
        pass  # a template's own arithmetic or filter misuse: a failed render, named by the kind


# -- converters --------------------------------------------------------------------------
SOURCE_FILES = {"pdf": "A1-market-overview.pdf", "docx": "D1-interview-ostmark.docx",
                "xlsx": "E1-brightwell-price-list.xlsx", "html": "C1-aquilon-product-page.html",
                "md": "A2-household-demand.md"}


@functools.cache
def source_bytes(fmt: str) -> bytes:
    if fmt == "pptx":
        return (SOURCES / "L3-pilot-proposal.pptx").read_bytes()
    if fmt == "csv":
        return b"tier,price,notes\nbasic,10,\"a, b\"\npro,20,x\n"
    return (SOURCES / SOURCE_FILES[fmt]).read_bytes()


def fuzz_convert(fmt: str, data: bytes, *, zipped: bool = False) -> None:
    """Convert a mutated ``fmt`` file: a result or a ConversionError naming the file."""
    from keepstep.engine.files.convert import ConversionError, convert

    folder = Path(tempfile.mkdtemp(prefix="keepstep-fuzz-src-"))
    path = folder / f"source.{fmt}"
    try:
        path.write_bytes(data)
        try:
            convert(path, max_bytes=8 * 1024 * 1024)
        except ConversionError as exc:
            assert str(path) in str(exc), str(exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mutated_zip_members(original: bytes) -> st.SearchStrategy[bytes]:
    """An OOXML package whose XML parts are mutated (the zip itself stays valid, so the
    parsers, not just the zip reader, see the damage)."""
    with zipfile.ZipFile(io.BytesIO(original)) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    xml = [n for n, _ in members if n.endswith(".xml")]

    @st.composite
    def build(draw: Callable) -> bytes:
        victim = draw(st.sampled_from(xml))
        new = draw(mutated(dict(members)[victim]))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members:
                zf.writestr(name, new if name == victim else data)
        return out.getvalue()
    return build()


# -- bundles and backups -------------------------------------------------------------------
@functools.cache
def bundle_and_backup() -> tuple[bytes, bytes, Path]:
    """A handover bundle zip and a backup zip of a small finished run (made once)."""
    from keepstep.engine import open_project
    from keepstep.engine.run.maintenance import backup_project
    from tests.support.engine_harness import RUN

    root = fresh_project()
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        run.run(max_units=4)
        bundle = run.handover(root.parent / "bundle.zip")
        backup_project(project, root.parent / "backup.zip")
    return bundle.read_bytes(), (root.parent / "backup.zip").read_bytes(), root


def fuzz_bundle(data: bytes) -> None:
    """verify_bundle never raises on any bytes; it never passes a mutated bundle unless
    the mutation left every listed byte as it was."""
    from keepstep.engine.report.handover import verify_bundle

    folder = Path(tempfile.mkdtemp(prefix="keepstep-fuzz-bundle-"))
    try:
        path = folder / "bundle.zip"
        path.write_bytes(data)
        verify_bundle(path).render()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def fuzz_backup(data: bytes) -> None:
    """restore raises only keepstep errors, and writes nothing outside the target folder."""
    from keepstep.storage import restore

    folder = Path(tempfile.mkdtemp(prefix="keepstep-fuzz-backup-"))
    try:
        path = folder / "backup.zip"
        path.write_bytes(data)
        dest = folder / "dest"
        dest.mkdir()
        before = {p for p in folder.rglob("*")}
        try:
            restore(path, dest)
        except KeepstepError:
            pass
        after = {p for p in folder.rglob("*")}
        outside = [p for p in after - before if dest not in p.parents and p != dest]
        assert not outside, outside
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["HOSTILE", "RSS_GROWTH_MB", "bundle_and_backup", "fuzz_backup", "fuzz_bundle",
           "fuzz_contract", "fuzz_convert", "fuzz_plan", "fuzz_project_file", "fuzz_template",
           "mutated", "mutated_zip_members", "peak_mb", "source_bytes"]
