"""A file that cannot become source text is refused with an error naming the file and what
to do (OCR it, remove the password, raise the limit, export it, save as UTF-8); no library
exception escapes."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from keepstep.engine.errors import SourceError
from keepstep.engine.files.convert import (
    EmptySourceError,
    EncryptedSourceError,
    NoTextError,
    SourceTooLargeError,
    UndecodableTextError,
    UnreadableSourceError,
    UnsupportedFormatError,
    convert,
    inspect_source,
)
from tests.support.source_files import (
    write_docx,
    write_pdf,
    write_pptx,
    write_scanned_pdf,
    write_xlsx,
)


def _refusal(path: Path, error: type[SourceError], **kwargs) -> str:
    with pytest.raises(error) as caught:
        convert(path, **kwargs)
    assert isinstance(caught.value, SourceError)
    assert str(path) in str(caught.value)
    with pytest.raises(error):  # add-source's preview refuses it the same way
        inspect_source(path, **kwargs)
    return str(caught.value)


def test_scanned_pdf_without_text_layer_says_ocr_it(tmp_path: Path) -> None:
    """A PDF of drawings only has no text layer: "OCR it, or export it with a text layer"."""
    text = _refusal(write_scanned_pdf(tmp_path / "scan.pdf"), NoTextError)
    assert "no text layer" in text and "OCR it" in text


def test_encrypted_pdf_says_remove_the_password(tmp_path: Path) -> None:
    """A password-protected PDF is refused with "remove the password"."""
    path = write_pdf(tmp_path / "locked.pdf", [("p", "Secret figure 42.")],
                     encrypt_password="s3cret")
    text = _refusal(path, EncryptedSourceError)
    assert "encrypted" in text and "remove the password" in text


def test_encrypted_office_file_is_refused_as_encrypted(tmp_path: Path) -> None:
    """An encrypted .xlsx is an OLE2 file holding an EncryptedPackage: refused as encrypted."""
    path = tmp_path / "locked.xlsx"
    path.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 500
                     + "EncryptedPackage".encode("utf-16-le") + b"\x00" * 500)
    assert "remove the password" in _refusal(path, EncryptedSourceError)


def test_empty_file_is_refused(tmp_path: Path) -> None:
    """A 0-byte file is refused as empty."""
    path = tmp_path / "empty.md"
    path.write_bytes(b"")
    assert "is empty" in _refusal(path, EmptySourceError)


def test_file_over_the_limit_names_the_setting(tmp_path: Path) -> None:
    """A file over max_bytes is refused before reading it, naming `max_source_mb`."""
    path = tmp_path / "big.txt"
    path.write_text("x" * 5000)
    text = _refusal(path, SourceTooLargeError, max_bytes=4096)
    assert "max_source_mb" in text and "keepstep.toml" in text


@pytest.mark.parametrize("name,data,what", [
    ("photo.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "a PNG image"),
    ("data.bin", bytes(range(256)) * 4, "a binary file"),
    ("old.doc", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 64, "legacy Word"),
    ("archive.zip", None, "a ZIP archive"),
])
def test_unsupported_type_says_which_formats_to_export(tmp_path: Path, name: str,
                                                        data: bytes | None, what: str) -> None:
    """Images, binaries, legacy Office and plain archives name the formats to export to."""
    path = tmp_path / name
    if data is None:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("readme.txt", "hello")
    else:
        path.write_bytes(data)
    text = _refusal(path, UnsupportedFormatError)
    assert what in text and "PDF, DOCX, XLSX, CSV, PPTX, HTML, TXT or MD" in text


@pytest.mark.parametrize("name", ["notes.txt", "notes.md", "table.csv", "page.html"])
def test_non_utf8_text_names_the_encoding_and_says_save_as_utf8(tmp_path: Path,
                                                                 name: str) -> None:
    """Latin-1 bytes in a text source: "not valid UTF-8 text ... at byte N", save as UTF-8."""
    path = tmp_path / name
    path.write_bytes("Tier,Caf\u00e9 price\nA,12\n".encode("latin-1"))
    text = _refusal(path, UndecodableTextError)
    assert "UTF-8" in text and "at byte 8" in text and "save it as UTF-8" in text


def test_html_declaring_its_charset_is_decoded_with_it(tmp_path: Path) -> None:
    """A page that declares windows-1252 is read as such, not refused."""
    path = tmp_path / "old.html"
    path.write_bytes(b'<html><head><meta charset="windows-1252"></head><body><p>Caf\xe9 '
                     b"prices rose 4%.</p></body></html>")
    assert "Caf\u00e9 prices rose 4%." in convert(path).text


def test_damaged_office_file_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    """A .docx whose XML is cut off is refused with "export it again", not a ParseError."""
    good = write_docx(tmp_path / "good.docx", [("p", "Some text.")])
    bad = tmp_path / "bad.docx"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data[:len(data) // 2] if info.filename.endswith(
                "document.xml") else data)
    text = _refusal(bad, UnreadableSourceError)
    assert "could not be read as DOCX" in text and "export it again" in text


def test_truncated_pdf_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    """Half a PDF is refused as unreadable."""
    good = write_pdf(tmp_path / "good.pdf", [("p", "Figure 12.")])
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises((UnreadableSourceError, NoTextError)) as caught:
        convert(bad)
    assert str(bad) in str(caught.value)


@pytest.mark.parametrize("make", [
    lambda p: write_docx(p / "blank.docx", []),
    lambda p: write_xlsx(p / "blank.xlsx", {"Sheet1": []}),
    lambda p: write_pptx(p / "blank.pptx", [{"title": ""}]),
])
def test_office_file_with_no_text_is_refused(tmp_path: Path, make) -> None:
    """A document, workbook or deck with nothing to read is refused (labels don't count)."""
    _refusal(make(tmp_path), NoTextError)


def test_missing_file_is_a_source_error(tmp_path: Path) -> None:
    """A path that does not exist is refused as a SourceError, not FileNotFoundError."""
    with pytest.raises(UnreadableSourceError, match="no such file"):
        convert(tmp_path / "nope.pdf")
