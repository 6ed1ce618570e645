"""Which format a file is: magic bytes first, then the extension, then a look at the text.

A ZIP is told apart by its parts (``word/document.xml``, ``xl/workbook.xml``,
``ppt/presentation.xml``); an OLE2 file is a password-protected Office document (encrypted
OOXML is stored that way) or a legacy .doc/.xls/.ppt; known binary types are named in the
refusal so the person knows what they picked.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from keepstep.engine.files.convert.errors import (
    EmptySourceError,
    EncryptedSourceError,
    UnreadableSourceError,
    UnsupportedFormatError,
)

HEAD_BYTES = 8192
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"II*\x00", "a TIFF image"), (b"MM\x00*", "a TIFF image"), (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"), (b"Rar!", "a RAR archive"), (b"\x7fELF", "a program"),
    (b"MZ", "a Windows program"), (b"{\\rtf", "an RTF document"), (b"%!PS", "a PostScript file"),
    (b"SQLite format 3", "an SQLite database"), (b"BM", "a bitmap image"),
)
_EXTENSIONS = {".pdf": "pdf", ".docx": "docx", ".xlsx": "xlsx", ".xlsm": "xlsx",
               ".pptx": "pptx", ".html": "html", ".htm": "html", ".xhtml": "html",
               ".csv": "csv", ".tsv": "csv", ".txt": "txt", ".text": "txt", ".md": "md",
               ".markdown": "md"}
_LEGACY = {".doc": "a legacy Word (.doc) document", ".xls": "a legacy Excel (.xls) workbook",
           ".ppt": "a legacy PowerPoint (.ppt) deck", ".odt": "an OpenDocument text",
           ".ods": "an OpenDocument spreadsheet", ".odp": "an OpenDocument presentation",
           ".epub": "an EPUB book", ".rtf": "an RTF document"}
_ZIP_PARTS = (("word/document.xml", "docx"), ("xl/workbook.xml", "xlsx"),
              ("ppt/presentation.xml", "pptx"))
_HTML_MARKS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<meta ", b"<title>")


def detect_format(path: Path, data_head: bytes | None = None) -> str:
    """One of ``pdf docx xlsx pptx html csv txt md`` for the file at ``path``.

    ``data_head`` (the first bytes, if the caller already has them) saves a read. Raises
    EmptySourceError for a 0-byte file, EncryptedSourceError for a password-protected Office
    file, UnsupportedFormatError for anything else that is not a supported format.
    """
    path = Path(path)
    if data_head is None:
        try:
            with open(path, "rb") as fh:
                data_head = fh.read(HEAD_BYTES)
        except OSError as exc:
            raise UnreadableSourceError(path, path.suffix.lstrip(".") or "file",
                                        exc.strerror or str(exc)) from None
    if not data_head:
        raise EmptySourceError(path)
    suffix = path.suffix.lower()
    if data_head.lstrip(b"\xef\xbb\xbf \t\r\n\x00").startswith(b"%PDF-"):
        return "pdf"
    if data_head.startswith(b"PK\x03\x04") or data_head.startswith(b"PK\x05\x06"):
        return _zip_format(path, suffix)
    if data_head.startswith(_OLE):
        if suffix in (".docx", ".xlsx", ".xlsm", ".pptx") or _ole_is_encrypted(path):
            raise EncryptedSourceError(path, "Office document")
        raise UnsupportedFormatError(path, _LEGACY.get(suffix, "a legacy Office (OLE2) file"))
    for magic, what in _BINARY_MAGIC:
        if data_head.startswith(magic):
            raise UnsupportedFormatError(path, what)
    if not _looks_textual(data_head):
        raise UnsupportedFormatError(path, _LEGACY.get(suffix, "a binary file"))
    known = _EXTENSIONS.get(suffix)
    if known in ("pdf", "docx", "xlsx", "pptx"):
        # A ".pdf" that is text inside is a saved error page or a mislabelled export.
        raise UnsupportedFormatError(path, f"not a real {known.upper()} (its bytes are text)")
    if known is not None and known != "txt":
        return known
    if suffix in _LEGACY:
        raise UnsupportedFormatError(path, _LEGACY[suffix])
    probe = data_head[:2048].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if any(probe.startswith(mark) for mark in _HTML_MARKS) or b"<html" in probe:
        return "html"
    return "txt"


def _zip_format(path: Path, suffix: str) -> str:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError):
        fmt = _EXTENSIONS.get(suffix)
        if fmt in ("docx", "xlsx", "pptx"):
            raise UnreadableSourceError(path, fmt, "the ZIP package is damaged") from None
        raise UnsupportedFormatError(path, "a damaged ZIP archive") from None
    for part, fmt in _ZIP_PARTS:
        if part in names:
            return fmt
    if "content.xml" in names and "mimetype" in names:
        raise UnsupportedFormatError(path, _LEGACY.get(suffix, "an OpenDocument file"))
    raise UnsupportedFormatError(path, _LEGACY.get(suffix, "a ZIP archive"))


def _ole_is_encrypted(path: Path) -> bool:
    # Encrypted OOXML is an OLE2 file holding an "EncryptedPackage" stream; its name is
    # stored in UTF-16 in the directory, which sits early in small files.
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20)
    except OSError:
        return False
    return "EncryptedPackage".encode("utf-16-le") in data


def _looks_textual(head: bytes) -> bool:
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True  # UTF-16 with a byte-order mark
    if b"\x00" in head:
        return False
    control = sum(1 for b in head if b < 9 or 13 < b < 32)
    return control <= len(head) // 100


__all__ = ["HEAD_BYTES", "detect_format"]
