"""Large converted text kept on disk (``TextFile``) rather than as one string.

A conversion past ``spill.SPILL_CHARS`` writes its text to a file as it goes; the text reads
by window. These tests make every source "large" (a spill threshold of a few dozen
characters) and check that nothing a user sees changes: the same text, segments, locators,
table rows and citations; the cache takes the file over by renaming it and reads it back by
window; a cancelled conversion leaves no file behind; and a run's extract and verify units
give the same evidence without ever reading a large text whole.
"""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keepstep.engine.api import open_project
from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert import builder, convert, iter_table_rows, spill
from keepstep.engine.files.convert.cache import ConversionCache
from keepstep.engine.files.convert.quotes import find_occurrence, quote_at
from keepstep.engine.files.convert.spill import SpillWriter, TextFile
from keepstep.engine.kinds.common import quote_cited
from tests.support.hypothesis_profiles import examples
from tests.support.small_project import write_config
from tests.support.source_files import write_large_pdf_direct, write_large_pptx_direct
from tests.test_source_extraction import _project, _write_sources

ALPHABET = "ab \n|é€x-"


def _text_file(parts: list[str], folder: Path) -> tuple[TextFile, str]:
    writer = SpillWriter(folder)
    for part in parts:
        writer.write(part)
    full = "".join(parts)
    return writer.finish(len(full)), full


@settings(max_examples=examples(60), deadline=None)
@given(parts=st.lists(st.text(alphabet=ALPHABET, max_size=30), min_size=1, max_size=10),
       data=st.data())
def test_a_text_file_reads_like_the_string(tmp_path_factory: pytest.TempPathFactory,
                                           parts: list[str], data: st.DataObject) -> None:
    """Slices, find, count and both kinds of windows agree with the string, across block
    boundaries and with characters of several UTF-8 lengths."""
    text, full = _text_file(parts, tmp_path_factory.mktemp("tf"))
    assert len(text) == len(full) and text.read() == full
    for _ in range(20):
        a = data.draw(st.integers(0, len(full)))
        b = data.draw(st.integers(a, len(full)))
        assert text[a:b] == full[a:b]
        needle = data.draw(st.sampled_from(["\n", "ab", "a\nb", "é€", "x x", "|"]))
        assert text.find(needle, a, b) == full.find(needle, a, b)
        assert text.count("\n", a, b) == full.count("\n", a, b)
        lines = list(text.windows(a, b, lines=True))
        assert "".join(piece for _, piece in lines) == full[a:b]
        assert all(piece.endswith("\n") for _, piece in lines[:-1])
        for base, piece in text.windows(a, b, overlap=3):
            assert full[base:base + len(piece)] == piece


def test_find_sees_a_needle_across_a_block_shorter_than_it(tmp_path: Path) -> None:
    """"a\nb" over the blocks "aaa" | "\n" | "b": the middle block is shorter than the
    needle, so the characters kept from before it must include the previous block's."""
    text, full = _text_file(["aaa", "\n", "b"], tmp_path)
    assert text.find("a\nb") == full.find("a\nb") == 2
    assert text.find("aa\nb", 1) == full.find("aa\nb", 1) == 1


def test_a_spill_is_cut_to_its_last_newline_and_private(tmp_path: Path) -> None:
    writer = SpillWriter(tmp_path)
    for part in ["# T\n\n", "body é\n", "\n\n", "\n"]:
        writer.write(part)
    text = writer.finish(len("# T\n\nbody é\n"))
    assert text.read() == "# T\n\nbody é\n"
    assert text.path.stat().st_size == len("# T\n\nbody é\n".encode())
    assert oct(text.path.stat().st_mode & 0o777) == "0o600"
    path = text.path
    del text
    gc.collect()
    assert not path.exists()  # nobody took the file over: it goes with the object


@pytest.fixture
def tiny_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source converted through the Markdown builder spills (and in many blocks)."""
    monkeypatch.setattr(spill, "SPILL_CHARS", 40)
    monkeypatch.setattr(builder, "_CHUNK_CHARS", 16)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _write_sources(tmp_path_factory.mktemp("spill") / "sources")


def test_every_format_gives_the_same_text_locators_and_rows_on_disk(
        sources: dict[str, Path], tiny_spill: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "SPILL_CHARS", 10 ** 12)
    memory = {sid: convert(path) for sid, path in sources.items()}
    monkeypatch.setattr(spill, "SPILL_CHARS", 40)
    spilled = set()
    for sid, path in sources.items():
        conv, plain = convert(path), memory[sid]
        if isinstance(conv.text, TextFile):
            spilled.add(sid)
        assert conv.whole_text() == plain.text, sid
        assert conv.segments == plain.segments, sid
        assert [r.model_dump() for r in iter_table_rows(conv)] == \
            [r.model_dump() for r in iter_table_rows(plain)], sid
        for seg in plain.segments:
            assert conv.text_at(seg.locator) == plain.text_at(seg.locator), (sid, seg)
        # Each line's last words as a quote: found at the same place, cited at the same parts.
        for line in plain.text.splitlines():
            quote = " ".join(line.replace("|", " ").split()[-4:])
            if len(quote) < 4:
                continue
            assert find_occurrence(conv, quote) == find_occurrence(plain, quote), (sid, quote)
            for seg in plain.segments[:12]:
                assert quote_at(conv, seg.locator, quote) == quote_at(plain, seg.locator, quote)
                assert quote_cited(conv, quote, seg.locator) == \
                    quote_cited(plain, quote, seg.locator)
    assert {"P1", "W1", "X1", "K1", "H1"} <= spilled, spilled


def test_the_cache_takes_a_spill_over_and_reads_it_back_by_window(
        sources: dict[str, Path], tiny_spill: None, tmp_path: Path) -> None:
    folder = tmp_path / "converted"
    first = ConversionCache(folder).get_or_convert(sources["X1"])
    assert isinstance(first.text, TextFile)
    assert first.text.path.parent == folder and not first.text.owned()
    assert not list(folder.glob(".spill-*"))  # renamed into the entry, not copied
    assert oct(first.text.path.stat().st_mode & 0o777) == "0o600"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"

    again = ConversionCache(folder).get_or_convert(sources["X1"])  # a new process's cache
    assert isinstance(again.text, TextFile)  # read by window, not into one string
    assert again.text.path == first.text.path
    assert again.whole_text() == first.whole_text() and again.segments == first.segments

    # A damaged entry is converted again, not read.
    with open(first.text.path, "ab") as fh:
        fh.write(b"tampered")
    redone = ConversionCache(folder).get_or_convert(sources["X1"])
    assert redone.whole_text() == first.whole_text()
    assert redone.text.path.stat().st_size == first.text.offsets[-1]


class _CancelAfter(threading.Event):
    """Set once it has been asked ``n`` times (a Ctrl-C in the middle of a conversion)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


def test_a_cancelled_spilling_conversion_leaves_no_file(
        sources: dict[str, Path], tiny_spill: None, tmp_path: Path) -> None:
    folder = tmp_path / "converted"
    cache = ConversionCache(folder)
    with pytest.raises(RunCancelled):
        cache.get_or_convert(sources["W1"], cancel=_CancelAfter(8))
    gc.collect()
    assert folder.is_dir() and not list(folder.iterdir())


def _run_outputs(root: Path) -> dict[str, Any]:
    # A small window: each source is sent in several chunks, read from the file by window.
    write_config(root, max_tokens=40)
    with open_project(root) as p:
        status = p.start_run("R").run()
        assert status.decision == "done", status.reasons
        run = p.get_run("R")
        art = p.store.artifacts.root
        calls: dict[str, int] = {}
        for call in run.calls():
            calls[call.unit] = calls.get(call.unit, 0) + 1
        return {"calls": calls, **{uid: json.loads((art / ref.path).read_text())
                                   for uid, rec in run.facts_records().items()
                                   for ref in rec.outputs.values()}}


def test_a_run_over_large_sources_never_reads_their_text_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Extract and verify give exactly the evidence they give with the text in memory, and
    neither reads a spilled text into one string (chunks and quotes are read by window)."""
    memory = _run_outputs(_project(tmp_path / "memory")[0])
    monkeypatch.setattr(spill, "SPILL_CHARS", 40)
    monkeypatch.setattr(builder, "_CHUNK_CHARS", 16)

    def refuse(self: TextFile) -> str:
        raise AssertionError(f"the whole of {self.path} was read")

    monkeypatch.setattr(TextFile, "read", refuse)
    root = _project(tmp_path / "disk")[0]
    assert _run_outputs(root) == memory
    # Several chunks per source (one call each), so chunks were cut from the file.
    assert sum(1 for uid, n in memory["calls"].items() if uid.startswith("E-") and n > 1) >= 5
    entries = list((root / ".keepstep" / "converted").glob("*.json"))
    assert sum(1 for e in entries if json.loads(e.read_text())["blocks"]) >= 5


@pytest.mark.parametrize("name,make,count", [
    ("big.pdf", write_large_pdf_direct, "pages"),
    ("big.pptx", write_large_pptx_direct, "slides"),
])
def test_the_benchmarks_direct_pdf_and_pptx_convert_alike_in_memory_and_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, make: Any,
        count: str) -> None:
    """bench/sources.py writes its 50 MB PDF and PPTX as PDF syntax and cloned slide XML:
    the readers open them page by page and slide by slide, and the spilled conversion is the
    in-memory one."""
    path = make(tmp_path / name, 0.2)
    memory = convert(path)
    assert (getattr(memory, count) or 0) > 50
    assert ("# Chapter 1" if count == "pages" else "## Slide 1: Region 1") in memory.text
    monkeypatch.setattr(spill, "SPILL_CHARS", 1000)
    monkeypatch.setattr(builder, "_CHUNK_CHARS", 256)
    disk = convert(path)
    assert isinstance(disk.text, TextFile)
    assert disk.whole_text() == memory.text and disk.segments == memory.segments


def test_what_a_killed_conversion_left_is_swept_when_nobody_writes_it(
        sources: dict[str, Path], tmp_path: Path) -> None:
    """A SIGKILL mid-conversion leaves its spill; the next conversion removes one untouched
    for 15 minutes and leaves one still being written (another executor's)."""
    import os
    import time

    folder = tmp_path / "converted"
    folder.mkdir()
    old, fresh = folder / ".spill-old.md", folder / ".spill-fresh.md"
    for path in (old, fresh):
        path.write_text("half a text")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    ConversionCache(folder).get_or_convert(sources["M1"])
    assert not old.exists() and fresh.exists()


def test_a_cache_folder_that_cannot_be_made_still_converts(
        sources: dict[str, Path], tiny_spill: None, tmp_path: Path) -> None:
    """The cache is an optimisation: when its folder cannot be made (here its parent is a
    file), a large text spills to the system's temporary folder and the conversion works."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    conv = ConversionCache(blocker / "converted").get_or_convert(sources["W1"])
    assert isinstance(conv.text, TextFile) and conv.text.owned()
    assert "Premium | NVK 7 | 4.1%" in conv.whole_text()


def test_verify_takes_the_paragraphs_around_a_quote_from_a_large_text(tmp_path: Path) -> None:
    """passage_near (a verify unit's passage for a quote in a large source): the paragraph
    holding the quote's first occurrence, the adjacent ones when the quote runs across them,
    the quote itself when the text lacks it; the same passage passage_for finds in memory."""
    from keepstep.engine.files.convert import from_markdown
    from keepstep.engine.kinds.verify import passage_for, passage_near

    markdown = ("# Study\n\nFirst paragraph, about meters.\n\nThe list price is NVK 1,150 "
                "per unit.\nIt falls in 2027.\n\nChurn is 6.2% for Basic.\n")
    text, _ = _text_file([markdown[i:i + 7] for i in range(0, len(markdown), 7)], tmp_path)
    conv = from_markdown(markdown).model_copy(update={"text": text})
    for quote in ("NVK 1,150 per unit. It falls", "Churn is 6.2%",
                  "about meters. The list price"):
        assert passage_near(conv, quote) == passage_for(quote, markdown), quote
    assert passage_near(conv, "The list price is NVK 1,150") == \
        "The list price is NVK 1,150 per unit.\nIt falls in 2027."
    assert passage_near(conv, "not in the text at all") == "not in the text at all"
