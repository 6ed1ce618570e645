"""Limits on a zip-based source (XLSX, DOCX, PPTX), checked before any parser reads it.

A zip's central directory declares every member's unpacked size, and Python's ``zipfile``
never returns more bytes than declared (it stops there and checks the CRC), so the
declared sizes bound what any reader can get out of the file. ``check_zip`` reads the
directory alone (no member is unpacked) and refuses a package whose members declare more
than the expansion budget in total, or a large member packed at a ratio no real document
reaches (a zip bomb). For XLSX it then reads the prolog of each XML part (at most a few KB
each) and refuses a document type declaration: Office XML never has one, and it is how
entity expansion ("billion laughs") is carried; openpyxl's parser is not ours to bound.
DOCX and PPTX parts are parsed by expat, whose amplification limit refuses entity expansion
itself. Every refusal names the file, the part and the limit.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from keepstep.engine.files.convert.errors import (
    SIZE_SETTING,
    ConversionError,
    SourceTooLargeError,
    UnreadableSourceError,
)

# How much larger than the file its parts may unpack to in total (text-heavy Office XML
# compresses about 5-15:1, so 100 leaves room for real documents), with a floor for small
# files and a cap of 100 times the ``max_source_mb`` setting.
EXPANSION_LIMIT = 100
EXPANSION_FLOOR = 64 * 1024 * 1024
# One member over RATIO_FLOOR bytes may not be packed tighter than RATIO_LIMIT:1 (deflate's
# best is about 1032:1, reached only by runs of one byte; a real sheet stays under 100:1).
RATIO_LIMIT = 400
RATIO_FLOOR = 16 * 1024 * 1024
MAX_MEMBERS = 250_000
PROLOG_LIMIT = 64 * 1024  # bytes read from an XML part looking for its root element
_ROOT = re.compile(rb"<[A-Za-z_]")
_DTD = re.compile(rb"<!(DOCTYPE|ENTITY)", re.IGNORECASE)


class ZipBombError(SourceTooLargeError):
    """A zip-based source declares more unpacked bytes than the limits allow."""

    def __init__(self, path: Path | str, size_bytes: int, max_bytes: int, why: str) -> None:
        super().__init__(path, size_bytes, max_bytes)
        self.args = (f"{path} {why}: refused as a zip bomb before anything was unpacked",)
        self.hint = (f"if the file is genuine, raise `{SIZE_SETTING}` in keepstep.toml or "
                     "split it; otherwise do not use it")


class EntityExpansionError(ConversionError):
    """An XML part declares a document type (entities): refused to bound entity expansion."""

    def __init__(self, path: Path | str, part: str) -> None:
        super().__init__(
            path, f"{path}: part {part} declares a DTD or XML entities (<!DOCTYPE>/<!ENTITY>); "
            "Office files never need them and keepstep allows none (limit: 0 entity "
            "declarations), so entity expansion (a 'billion laughs' file) is refused",
            hint="open it in its application and save it again (that drops the declarations), "
            "then add the new file")
        self.part = part


def expansion_budget(size: int, max_bytes: int) -> int:
    """How many unpacked bytes a package of ``size`` bytes may declare in total."""
    return min(max(size * EXPANSION_LIMIT, EXPANSION_FLOOR), max(max_bytes, 1) * EXPANSION_LIMIT)


def check_zip(zf: zipfile.ZipFile, path: Path, fmt: str, max_bytes: int, *,
              prologs: bool) -> None:
    """Refuse a zip bomb (and, with ``prologs``, an XML part with a DTD) in the open package
    ``zf`` of ``path`` before a parser reads it. ``zf`` should read through the
    cancel-checking file (``reading.cancellable``): the prolog reads then stop on Ctrl-C.

    Raises ZipBombError (a SourceTooLargeError) naming the declared size and the limit,
    EntityExpansionError naming the part, UnreadableSourceError for a damaged package."""
    path = Path(path)
    try:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UnreadableSourceError(path, fmt, f"{len(infos)} parts, over the limit of "
                                        f"{MAX_MEMBERS} parts for a source")
        _check_sizes(path, infos, path.stat().st_size, max_bytes)
        if prologs:
            _check_prologs(path, fmt, zf, infos)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise UnreadableSourceError(path, fmt, f"the ZIP package is damaged: "
                                    f"{type(exc).__name__}") from None
    except (NotImplementedError, RuntimeError) as exc:  # unknown compression, encrypted part
        raise UnreadableSourceError(path, fmt, f"a part cannot be unpacked: "
                                    f"{type(exc).__name__}") from None


def check_package(path: Path, fmt: str, max_bytes: int) -> None:
    """``check_zip`` over the file at ``path`` with every check (a caller outside a
    conversion, e.g. the bench)."""
    try:
        with zipfile.ZipFile(path) as zf:
            check_zip(zf, path, fmt, max_bytes, prologs=True)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnreadableSourceError(path, fmt, f"the ZIP package is damaged: "
                                    f"{type(exc).__name__}") from None


def _check_sizes(path: Path, infos: list[zipfile.ZipInfo], size: int, max_bytes: int) -> None:
    budget = expansion_budget(size, max_bytes)
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > RATIO_FLOOR and \
                info.file_size > RATIO_LIMIT * max(info.compress_size, 1):
            raise ZipBombError(path, info.file_size, RATIO_FLOOR,
                               f"has part {info.filename} declaring {_mb(info.file_size)} "
                               f"packed at {info.file_size // max(info.compress_size, 1)}:1 "
                               f"(limit {RATIO_LIMIT}:1 for a part over "
                               f"{_mb(RATIO_FLOOR)})")
    if total > budget:
        raise ZipBombError(path, total, budget,
                           f"declares {_mb(total)} unpacked in its zip directory, over the "
                           f"{_mb(budget)} limit ({EXPANSION_LIMIT} times its size, at least "
                           f"{_mb(EXPANSION_FLOOR)}, at most {EXPANSION_LIMIT} × "
                           f"`{SIZE_SETTING}`)")


def _check_prologs(path: Path, fmt: str, zf: zipfile.ZipFile,
                   infos: list[zipfile.ZipInfo]) -> None:
    for info in infos:
        name = info.filename.lower()
        if info.is_dir() or not name.endswith((".xml", ".rels", ".vml")):
            continue
        head = b""
        with zf.open(info) as fh:
            while len(head) < PROLOG_LIMIT:
                chunk = fh.read(4096)
                if not chunk:
                    break
                head += chunk
                if _ROOT.search(_narrow(head)):
                    break
        prolog = _prolog(head)
        if _DTD.search(prolog):
            raise EntityExpansionError(path, info.filename)
        if len(head) >= PROLOG_LIMIT and not _ROOT.search(_narrow(head)):
            raise UnreadableSourceError(path, fmt, f"part {info.filename} has no root element "
                                        f"in its first {PROLOG_LIMIT // 1024} KB")


def _narrow(head: bytes) -> bytes:
    """A UTF-16 part narrowed to its ASCII bytes so the same patterns apply ("<?xml" and
    "<!--" start with '<' but not a letter, so _ROOT skips them)."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or head[1:2] == b"\x00" or head[:1] == b"\x00":
        return head.replace(b"\x00", b"")
    return head


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


def _prolog(head: bytes) -> bytes:
    """The bytes before the root element (all of ``head`` when none is seen)."""
    head = _narrow(head)
    match = _ROOT.search(head)
    return head[:match.start()] if match else head


__all__ = ["EXPANSION_FLOOR", "EXPANSION_LIMIT", "EntityExpansionError", "RATIO_LIMIT",
           "ZipBombError", "check_package", "check_zip", "expansion_budget"]
