"""Shared reading of Office Open XML packages (DOCX, PPTX) with the standard library.

Why not python-docx/python-pptx: both parse each part into a full lxml tree (python-pptx also
pulls Pillow and XlsxWriter); here parts are streamed from the zip through
``xml.etree.ElementTree.iterparse`` and dropped as soon as they are emitted, so memory stays
bounded, and no binary wheel is needed. expat refuses external entities, and the bytes read
from the zip are capped so a zip bomb ends in a clear refusal.
"""

from __future__ import annotations

import posixpath
import threading
import zipfile
from pathlib import Path
from typing import IO
from xml.etree import ElementTree as ET

from keepstep.engine.files.convert.archive import check_zip
from keepstep.engine.files.convert.errors import SourceTooLargeError, UnreadableSourceError
from keepstep.engine.files.convert.reading import cancellable

NS = {
    "w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main",
    "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
    "p": "http://schemas.openxmlformats.org/presentationml/2006/main",
    "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
    "rel": "http://schemas.openxmlformats.org/package/2006/relationships",
    "mc": "http://schemas.openxmlformats.org/markup-compatibility/2006",
}
# How much larger than the file its XML may unpack to before it is refused as a zip bomb:
# text-heavy Office XML compresses about 5-15:1, so 100 leaves room for real documents
# while keeping the converted text (and so memory) proportional to the file.
EXPANSION_LIMIT = 100
EXPANSION_FLOOR = 64 * 1024 * 1024


def q(prefix: str, name: str) -> str:
    """Clark notation for a namespaced tag: ``q("w", "p")`` -> ``{...main}p``."""
    return f"{{{NS[prefix]}}}{name}"


class Package:
    """An open OOXML zip with a budget on the bytes its parts may unpack to."""

    def __init__(self, path: Path, fmt: str, max_bytes: int,
                 cancel: threading.Event | None = None) -> None:
        self.path, self.fmt = path, fmt
        # Read through a file that checks the cancel event: a deck of 60,000 slides spends
        # seconds in its zip directory, content types and relationships before slide 1.
        self._file: IO[bytes] | None = None
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
            self.zip = zipfile.ZipFile(cancellable(self._file, cancel, path))
        except (zipfile.BadZipFile, OSError) as exc:
            self._close_file()
            raise UnreadableSourceError(path, fmt, f"not a valid {fmt.upper()} package: "
                                        f"{type(exc).__name__}") from None
        except BaseException:
            self._close_file()
            raise
        try:  # a zip bomb is refused from the directory, before any part is read
            check_zip(self.zip, path, fmt, max_bytes, prologs=False)
        except BaseException:
            self.close()
            raise
        self.names = set(self.zip.namelist())
        self.budget = min(max(path.stat().st_size * EXPANSION_LIMIT, EXPANSION_FLOOR),
                          max(max_bytes, 1) * EXPANSION_LIMIT)
        self.read_bytes = 0

    def close(self) -> None:
        self.zip.close()
        self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, name: str) -> IO[bytes]:
        """A stream over one part, counted against the expansion budget."""
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise UnreadableSourceError(self.path, self.fmt, f"part {name} is missing") from None
        self.read_bytes += info.file_size
        if self.read_bytes > self.budget:
            raise SourceTooLargeError(self.path, self.read_bytes, self.budget,
                                      what="unpacks to")
        return self.zip.open(info)

    def parse(self, name: str) -> ET.Element:
        """A whole (small) part as an element tree."""
        with self.open(name) as fh:
            try:
                return ET.parse(fh).getroot()
            except ET.ParseError as exc:
                raise UnreadableSourceError(self.path, self.fmt,
                                            f"{name}: {exc}") from None

    def rels(self, part: str) -> dict[str, str]:
        """Relationship id -> target part name for ``part`` (empty when it has none)."""
        return {rid: target for rid, (target, _) in self.typed_rels(part).items()}

    def related(self, part: str, type_suffix: str) -> list[str]:
        """Target parts of ``part``'s relationships whose type ends with ``type_suffix``."""
        return [t for t, kind in self.typed_rels(part).values() if kind.endswith(type_suffix)]

    def typed_rels(self, part: str) -> dict[str, tuple[str, str]]:
        """Relationship id -> (target part name, relationship type) for ``part``."""
        folder, base = posixpath.split(part)
        rels_name = posixpath.join(folder, "_rels", base + ".rels")
        if rels_name not in self.names:
            return {}
        out: dict[str, tuple[str, str]] = {}
        for rel in self.parse(rels_name).iter(q("rel", "Relationship")):
            target = rel.get("Target", "")
            if rel.get("TargetMode") == "External":
                continue
            if target.startswith("/"):
                resolved = target.lstrip("/")
            else:
                resolved = posixpath.normpath(posixpath.join(folder, target))
            out[rel.get("Id", "")] = (resolved, rel.get("Type", ""))
        return out


__all__ = ["EXPANSION_LIMIT", "NS", "Package", "q"]
