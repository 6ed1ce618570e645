"""Zip-based sources (XLSX, DOCX, PPTX) are checked before any parser reads them: the sizes
their zip directory declares against the expansion limits, and every XML part's prolog for
entity declarations (billion laughs). Each refusal names the file, the part and the limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.files.convert import ConversionError, SourceTooLargeError, archive, convert
from keepstep.engine.files.convert.archive import EntityExpansionError, ZipBombError
from tests.support.bombs import billion_laughs, declare_size, small_office, zip_bomb


@pytest.mark.parametrize("fmt", ["xlsx", "docx", "pptx"])
def test_a_declared_zip_bomb_is_refused_before_any_parser(tmp_path: Path, fmt: str) -> None:
    """A small document whose main part declares 1.5 GB is refused by the directory check,
    naming the size and the limit (a SourceTooLargeError, so callers treat it as one)."""
    path = small_office(tmp_path / f"bomb.{fmt}", fmt)
    part = {"xlsx": "xl/worksheets/sheet1.xml", "docx": "word/document.xml",
            "pptx": "ppt/slides/slide1.xml"}[fmt]
    declare_size(path, part, 1_500 * 1024 * 1024)
    with pytest.raises(ZipBombError) as err:
        convert(path)
    assert isinstance(err.value, SourceTooLargeError)
    text = str(err.value)
    assert str(path) in text and "zip bomb" in text and "limit" in text and part in text


def test_a_real_xlsx_zip_bomb_is_refused_by_the_total_limit(tmp_path: Path,
                                                            monkeypatch) -> None:
    """A workbook that really unpacks far past its budget (scaled down: 24 MB against a 4 MB
    floor) is refused by the declared total, before openpyxl opens it."""
    monkeypatch.setattr(archive, "EXPANSION_FLOOR", 4 * 1024 * 1024)
    monkeypatch.setattr(archive, "RATIO_FLOOR", 1 << 40)  # only the total limit applies
    path = zip_bomb(tmp_path / "bomb.xlsx", "xlsx", 24)
    with pytest.raises(ZipBombError, match=r"declares 24\.\d MB unpacked .* over the [\d.]+ MB "
                       r"limit"):
        convert(path)


def test_xlsx_billion_laughs_is_refused_naming_the_limit(tmp_path: Path) -> None:
    """Nested entity declarations in a workbook are refused naming the part and the limit,
    not as 'could not be read as XLSX (ValueError)'."""
    path = billion_laughs(tmp_path / "laughs.xlsx", "xlsx")
    with pytest.raises(EntityExpansionError) as err:
        convert(path)
    text = str(err.value)
    assert str(path) in text and "xl/worksheets/sheet1.xml" in text
    assert "0 entity declarations" in text and "ValueError" not in text


@pytest.mark.parametrize("fmt", ["docx", "pptx"])
def test_docx_pptx_billion_laughs_is_refused_by_expats_limit(tmp_path: Path, fmt: str) -> None:
    """DOCX and PPTX parts go through expat, whose amplification limit refuses them."""
    path = billion_laughs(tmp_path / f"laughs.{fmt}", fmt)
    with pytest.raises(ConversionError, match="amplification factor"):
        convert(path)


def test_openpyxl_entity_refusal_also_names_the_limit(tmp_path: Path, monkeypatch) -> None:
    """Were the prolog check to miss a declaration, the workbook reader's own refusal is
    mapped to the same message."""
    path = billion_laughs(tmp_path / "laughs.xlsx", "xlsx")
    monkeypatch.setattr(archive, "_check_prologs", lambda *a, **k: None)
    with pytest.raises(EntityExpansionError, match="entity declarations"):
        convert(path)


def test_real_documents_pass_the_checks(tmp_path: Path) -> None:
    """The checks refuse nothing a real document has."""
    for fmt in ("xlsx", "docx", "pptx"):
        assert convert(small_office(tmp_path / f"ok.{fmt}", fmt)).text.strip()
