"""The conversion cache: one entry per (source sha256, converter, version), written
atomically with private modes; a converter upgrade converts again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from keepstep.engine.files.convert import (
    ConversionCache,
    conversion,
    convert,
    file_sha256,
    find_quote,
)
from keepstep.engine.files.convert import cache as cache_module
from tests.support.source_files import write_docx, write_markdown

BLOCKS = [("h", 1, "Notes"), ("h", 2, "Fees"), ("p", "The fee is NVK 36 per meter."),
          ("table", [["Tier", "Churn"], ["Premium", "4.1%"]])]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def counting_convert(path, **kwargs):
        calls.append(Path(path))
        return convert(path, **kwargs)

    monkeypatch.setattr(cache_module, "convert", counting_convert)
    return calls


def test_same_key_returns_the_same_object(tmp_path: Path, counted: list[Path]) -> None:
    """Asking twice for the same source gives the identical object, converted once."""
    path = write_docx(tmp_path / "n.docx", BLOCKS)
    cache = ConversionCache(tmp_path / "converted")
    first = cache.get_or_convert(path, file_sha256(path))
    assert cache.get_or_convert(path, file_sha256(path)) is first
    assert len(counted) == 1


def test_a_new_cache_reads_the_entry_from_disk(tmp_path: Path, counted: list[Path]) -> None:
    """A fresh cache on the same folder (a new process) reads the stored entry back equal."""
    path = write_docx(tmp_path / "n.docx", BLOCKS)
    first = ConversionCache(tmp_path / "converted").get_or_convert(path)
    again = ConversionCache(tmp_path / "converted").get_or_convert(path)
    assert len(counted) == 1
    assert again.model_dump() == first.model_dump()
    assert find_quote(again, "Premium 4.1%") == "Fees, table 1, row 1"


def test_new_converter_version_converts_again(tmp_path: Path, counted: list[Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Bumping a format's converter revision is a new key: the source is converted again."""
    path = write_markdown(tmp_path / "n.md", BLOCKS)
    sha = file_sha256(path)
    old = ConversionCache(tmp_path / "converted").get_or_convert(path, sha)
    monkeypatch.setitem(conversion.CONVERTER_REVISIONS, "md", 99)
    new = ConversionCache(tmp_path / "converted").get_or_convert(path, sha)
    assert len(counted) == 2
    assert old.converter_version.endswith("+keepstep-1")
    assert new.converter_version.endswith("+keepstep-99")
    assert len(list((tmp_path / "converted").glob("*.json"))) == 2  # the old entry stays


def test_cache_files_are_private_and_no_temp_file_is_left(tmp_path: Path) -> None:
    """The cache folder is 0700, its files 0600, and only whole entries remain."""
    path = write_markdown(tmp_path / "n.md", BLOCKS)
    folder = tmp_path / "converted"
    old_umask = os.umask(0o022)
    try:
        ConversionCache(folder).get_or_convert(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and not any(n.endswith(".tmp") for n in names)
    for entry in folder.iterdir():
        assert stat.S_IMODE(entry.stat().st_mode) == 0o600


def test_damaged_entry_is_converted_again(tmp_path: Path, counted: list[Path]) -> None:
    """A truncated text file in the cache is not trusted: the source is converted again."""
    path = write_markdown(tmp_path / "n.md", BLOCKS)
    folder = tmp_path / "converted"
    first = ConversionCache(folder).get_or_convert(path)
    text_file = next(folder.glob("*.md"))
    text_file.write_text(first.text[:10], encoding="utf-8")
    again = ConversionCache(folder).get_or_convert(path)
    assert len(counted) == 2 and again.text == first.text


def test_a_failing_source_stores_nothing(tmp_path: Path) -> None:
    """A file that is refused leaves no cache entry behind."""
    path = tmp_path / "empty.md"
    path.write_bytes(b"")
    folder = tmp_path / "converted"
    with pytest.raises(Exception, match="is empty"):
        ConversionCache(folder).get_or_convert(path, "0" * 64)
    assert not folder.exists() or not any(folder.iterdir())
