"""Cancellation during the conversion of a large source stops at the next safe point."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert import convert
from tests.support.source_files import (
    write_large_csv,
    write_large_docx,
    write_large_html,
    write_large_pdf,
    write_large_pptx_direct,
    write_large_text,
    write_large_xlsx,
)


class CountingEvent(threading.Event):
    """A cancel event that counts the converter's checks, so the test can set it from
    another thread once the conversion is known to be under way."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.started = threading.Event()

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks >= 2:
            self.started.set()
        return super().is_set()


class CancelAfter(threading.Event):
    """A cancel event that turns itself on at its n-th check: "Ctrl-C mid-conversion",
    without depending on how fast this machine is."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.left = checks
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        self.left -= 1
        if self.left <= 0:
            self.set()
        return super().is_set()


@pytest.mark.parametrize("name,make", [
    ("big.txt", lambda p: write_large_text(p, 6)),
    ("big.md", lambda p: write_large_text(p, 6, markdown=True)),
    ("big.csv", lambda p: write_large_csv(p, 3)),
    ("big.html", lambda p: write_large_html(p, 3)),
    ("big.docx", lambda p: write_large_docx(p, 3000)),
    ("big.xlsx", lambda p: write_large_xlsx(p, 5000)),
    ("big.pdf", lambda p: write_large_pdf(p, 12)),
])
def test_cancel_mid_conversion_raises_run_cancelled(tmp_path: Path, name: str, make) -> None:
    """Each converter checks the cancel event while it works and stops with RunCancelled."""
    path = make(tmp_path / name)
    cancel = CancelAfter(3)
    with pytest.raises(RunCancelled):
        convert(path, cancel=cancel)
    assert cancel.checks >= 3  # it got going before it was cancelled


@pytest.mark.parametrize("name,make", [
    ("big.csv", lambda p: write_large_csv(p, 8)),
    ("big.pdf", lambda p: write_large_pdf(p, 40)),
])
def test_cancel_from_another_thread_stops_within_two_seconds(tmp_path: Path, name: str,
                                                              make) -> None:
    """Ctrl-C set from another thread during a long conversion ends it within 2 s."""
    path = make(tmp_path / name)
    cancel = CountingEvent()
    outcome: list[BaseException | str] = []

    def work() -> None:
        try:
            convert(path, cancel=cancel)
            outcome.append("finished")
        except BaseException as exc:  # noqa: BLE001 - the test inspects what ended it
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    # Set it mid-conversion (after the converter checked it twice), however fast or loaded
    # this machine is; then the conversion must end within 2 s.
    assert cancel.started.wait(timeout=60), "the conversion never checked for a cancel"
    cancel.set()
    worker.join(timeout=2.0)
    assert not worker.is_alive(), "conversion did not stop within 2 s of cancel"
    assert len(outcome) == 1 and isinstance(outcome[0], RunCancelled)


def test_a_sheet_without_dimensions_is_cancelled_while_openpyxl_scans_it(tmp_path: Path
                                                                         ) -> None:
    """openpyxl opens a sheet lacking ``<dimension>`` by parsing all of it before the first
    row (35 s for 50 MB). The workbook is read through a file that checks the cancel event
    on every read, so a Ctrl-C during that scan stops it there, inside ``load_workbook``."""
    import traceback
    import zipfile

    path = write_large_xlsx(tmp_path / "big.xlsx", 3000)
    with zipfile.ZipFile(path) as z:
        sheet = z.read("xl/worksheets/sheet1.xml")
    assert b"<dimension" not in sheet  # the case this test is about
    cancel = CancelAfter(3)
    with pytest.raises(RunCancelled) as info:
        convert(path, cancel=cancel)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "load_workbook" in frames, frames


def test_a_long_pdf_is_cancelled_while_pypdf_reads_its_page_tree(tmp_path: Path) -> None:
    """pypdf reads a PDF's cross-reference table and page tree before the first page (5 s
    for 50 MB); the file it reads checks the cancel event, so a Ctrl-C stops it there."""
    import traceback

    from tests.support.source_files import write_large_pdf_direct

    path = write_large_pdf_direct(tmp_path / "big.pdf", 0.3)
    with pytest.raises(RunCancelled) as info:
        convert(path, cancel=CancelAfter(3))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(f.name == "__init__" and "pypdf" in f.filename for f in frames), \
        [(f.filename, f.name) for f in frames]


@pytest.mark.parametrize("name,make", [
    ("big.pptx", lambda p: write_large_pptx_direct(p, 0.3)),
    ("big.docx", lambda p: write_large_docx(p, 3000)),
])
def test_an_office_package_is_cancelled_while_its_zip_is_read(tmp_path: Path, name: str,
                                                               make) -> None:
    """A deck of 60,000 slides spends seconds in its zip directory, content types and
    relationships before slide 1; the package is read through the cancel-checking file, so
    a Ctrl-C stops it inside zipfile, before any slide or paragraph."""
    import traceback

    path = make(tmp_path / name)
    with pytest.raises(RunCancelled) as info:
        convert(path, cancel=CancelAfter(2))
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(f.filename.endswith("zipfile.py") for f in frames), \
        [(f.filename, f.name) for f in frames]


def test_no_full_collection_pauses_a_workbook_and_the_thresholds_come_back(tmp_path: Path
                                                                          ) -> None:
    """openpyxl keeps every parsed row element until the sheet ends, so full collections
    during a large sheet paused it for up to 1.7 s at 50 MB: while a workbook converts the
    oldest generation is not collected; after it (converted or cancelled) the thresholds are
    what they were."""
    import gc

    path = write_large_xlsx(tmp_path / "big.xlsx", 3000)
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    class Spy(threading.Event):
        def is_set(self) -> bool:
            seen.append(gc.get_threshold())
            return len(seen) > 40

    with pytest.raises(RunCancelled):
        convert(path, cancel=Spy())
    assert seen and all(t[2] >= 1 << 30 and t[:2] == before[:2] for t in seen)
    assert gc.get_threshold() == before
    assert "Prices" in convert(path).text and gc.get_threshold() == before
