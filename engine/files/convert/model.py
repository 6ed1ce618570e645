"""What a conversion returns: the Markdown text of a source plus segments that map every part
of that text back to where it came from (page, sheet and cells, slide, heading path).

A caller may rely on: ``text`` is Markdown (ATX headings, ``- `` list items, pipe tables with a
``| --- |`` separator line, blank lines between blocks); segment offsets are ``str`` indices
into ``text``; the same source bytes and converter version give the same text and segments.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from keepstep.engine.files.convert.spill import TextFile

DEFAULT_MAX_SOURCE_MB = 100
DEFAULT_MAX_BYTES = DEFAULT_MAX_SOURCE_MB * 1024 * 1024
PREVIEW_CHARS = 600

SegmentKind = Literal["page", "sheet", "slide", "section", "table-row", "text"]

# Formats a source can have, with the media type shown before approval.
MEDIA_TYPES: dict[str, str] = {
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "html": "text/html",
    "csv": "text/csv",
    "txt": "text/plain",
    "md": "text/markdown",
}
FORMATS: tuple[str, ...] = tuple(MEDIA_TYPES)
# What a person calls each format (shown before approval).
FORMAT_NAMES: dict[str, str] = {
    "pdf": "PDF document", "docx": "Word document", "xlsx": "Excel workbook",
    "pptx": "PowerPoint deck", "html": "web page", "csv": "CSV table", "txt": "plain text",
    "md": "Markdown text",
}


class Segment(BaseModel):
    """A span ``text[start:end]`` and the locator a citation of it carries.

    Segments nest (a table row inside a section, a cell paragraph inside a sheet); the
    innermost one containing an offset names it. A *line run* (``line_locator`` set) stands
    for many one-line segments at once, so a million-row CSV needs one segment, not a million:
    line ``k`` (0-based) of the span has the locator ``line_locator.format(n=first_number+k)``.
    """

    model_config = ConfigDict(frozen=True)

    locator: str
    kind: SegmentKind
    start: int
    end: int
    line_locator: str | None = None
    first_number: int = 1


class TableRow(BaseModel):
    """One data row of a Markdown table in a converted source.

    ``cells`` line up with ``header`` (padded with "" when a row is shorter); ``quote`` is the
    row as a citation quotes it (cells joined by `` | ``), which ``quote_at(conv, locator,
    quote)`` accepts; ``text[start:end]`` of the source is the row's Markdown line.
    """

    locator: str | None
    header: list[str]
    cells: list[str]
    start: int
    end: int

    @property
    def quote(self) -> str:
        return " | ".join(c for c in self.cells if c)

    def pairs(self) -> list[tuple[str, str]]:
        """(header, cell) for each non-empty cell: what a figure in this row stands for."""
        return [(h, c) for h, c in zip(self.header, self.cells, strict=False) if c]


class ConvertedSource(BaseModel):
    """The converted text of one source and the map back to its original structure.

    ``converter`` and ``converter_version`` identify the tool that made ``text``; a different
    version may make different text (the engine treats an upgrade as a typed ``tool`` change).
    ``pages`` is set for PDF, ``slides`` for PPTX, ``sheets`` for XLSX and CSV.

    ``text`` is a ``str``, or for a large source (past ``spill.SPILL_CHARS``) a ``TextFile``
    read by window: ``len``, slicing, ``find`` and ``count`` work on both; code that needs
    the whole string at once calls ``whole_text()``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: str | TextFile
    format: str
    converter: str
    converter_version: str
    segments: list[Segment] = Field(default_factory=list)
    pages: int | None = None
    sheets: list[str] = Field(default_factory=list)
    slides: int | None = None
    warnings: list[str] = Field(default_factory=list)

    _by_locator: dict[str, Segment] | None = PrivateAttr(default=None)
    _starts: list[int] | None = PrivateAttr(default=None)
    _run_lines: dict[int, array] = PrivateAttr(default_factory=dict)

    def whole_text(self) -> str:
        """The text as one string (for a large source this reads it all into memory)."""
        return self.text if isinstance(self.text, str) else self.text.read()

    def in_memory(self) -> int:
        """Characters of text this object holds in memory (0 for a ``TextFile``)."""
        return len(self.text) if isinstance(self.text, str) else 0

    def _segment_starts(self) -> list[int]:
        if self._starts is None or len(self._starts) != len(self.segments):
            self._starts = [seg.start for seg in self.segments]
        return self._starts

    def _containing(self, start: int, end: int, *, runs: bool = True) -> int | None:
        """Index of the innermost segment holding ``text[start:end]`` (``runs=False``: not a
        line run). Segments nest, so walking back from the last one starting at or before
        ``start``, the first that holds the span is the innermost (equal starts are sorted
        longest first)."""
        i = bisect_right(self._segment_starts(), start) - 1
        while i >= 0:
            seg = self.segments[i]
            if (runs or seg.line_locator is None) and seg.start <= start and (
                    end <= seg.end or seg.start == start == end == seg.end):
                return i
            i -= 1
        return None

    def segment_at(self, offset: int) -> Segment | None:
        """The innermost (shortest) segment holding ``text[offset]``, or None."""
        i = self._containing(offset, offset + 1 if offset < len(self.text) else offset)
        return None if i is None else self.segments[i]

    def _line_index(self, seg_index: int) -> array:
        # Offsets of the line starts of a line run, built once per run (a CSV of a million
        # rows is then located by index, not by counting newlines again for every row).
        lines = self._run_lines.get(seg_index)
        if lines is None:
            seg = self.segments[seg_index]
            lines = array("q", [seg.start])
            pos = self.text.find("\n", seg.start, seg.end)
            while pos >= 0:
                lines.append(pos + 1)
                pos = self.text.find("\n", pos + 1, seg.end)
            self._run_lines[seg_index] = lines
        return lines

    def _run_line(self, seg_index: int, offset: int) -> tuple[int, int]:
        """(line number k from 0, line end) of ``offset`` inside the line run ``seg_index``."""
        lines = self._line_index(seg_index)
        k = bisect_right(lines, offset) - 1
        end = lines[k + 1] - 1 if k + 1 < len(lines) else self.segments[seg_index].end
        return k, end

    def locator_at(self, offset: int) -> str | None:
        """Locator of the innermost segment holding ``text[offset]``; None outside all."""
        i = self._containing(offset, offset + 1 if offset < len(self.text) else offset)
        if i is None:
            return None
        seg = self.segments[i]
        if seg.line_locator is None:
            return seg.locator
        k, _ = self._run_line(i, offset)
        return seg.line_locator.format(n=seg.first_number + k)

    def locator_of(self, start: int, end: int) -> str | None:
        """The locator of the innermost part holding all of ``text[start:end]`` (one row of a
        line run when the span lies in one row); None when no located part holds it."""
        end = max(end, start)
        i = self._containing(start, end)
        template = self.segments[i].line_locator if i is not None else None
        if i is not None and template is not None:
            seg = self.segments[i]
            k, line_end = self._run_line(i, start)
            if end <= line_end:
                return template.format(n=seg.first_number + k)
            i = self._containing(start, end, runs=False)  # across rows: the part around them
        return None if i is None else self.segments[i].locator

    def span_of(self, locator: str) -> tuple[int, int] | None:
        """(start, end) in ``text`` of the part a locator names, or None if none has it."""
        found = self._find(locator)
        return None if found is None else found[1]

    def kind_of(self, locator: str) -> SegmentKind | None:
        """The kind of part a locator names (``page``, ``table-row``…), or None."""
        found = self._find(locator)
        return None if found is None else found[0].kind

    def _find(self, locator: str) -> tuple[Segment, tuple[int, int]] | None:
        seg = self._locator_index().get(locator)
        if seg is not None:
            return seg, (seg.start, seg.end)
        for index, seg in enumerate(self.segments):
            if seg.line_locator is None:
                continue
            n = _number_in(seg.line_locator, locator)
            if n is None or n < seg.first_number:
                continue
            lines = self._line_index(index)
            k = n - seg.first_number
            if k >= len(lines):
                continue
            line_end = lines[k + 1] - 1 if k + 1 < len(lines) else seg.end
            return seg, (lines[k], line_end)
        return None

    def text_at(self, locator: str) -> str | None:
        """The text of the part a locator names (a page, a sheet, a row...), or None."""
        span = self.span_of(locator)
        return None if span is None else self.text[span[0]:span[1]]

    def _locator_index(self) -> dict[str, Segment]:
        if self._by_locator is None:
            index: dict[str, Segment] = {}
            for seg in self.segments:
                if seg.line_locator is None:
                    index.setdefault(seg.locator, seg)
            self._by_locator = index
        return self._by_locator


def _number_in(template: str, locator: str) -> int | None:
    # A template may hold {n} more than once ("Prices!A{n}:D{n}"): all must be one number.
    parts = [p.replace("{{", "{").replace("}}", "}") for p in template.split("{n}")]
    pattern = re.escape(parts[0]) + r"(?P<n>\d+)" + "".join(
        re.escape(p) if i == 0 else r"(?P=n)" + re.escape(p) for i, p in enumerate(parts[1:]))
    match = re.fullmatch(pattern, locator)
    return int(match.group("n")) if match else None


class SourceInfo(BaseModel):
    """What a person sees before approving a source: detected type, size, structure, preview."""

    path: str
    format: str
    media_type: str
    size_bytes: int
    pages: int | None = None
    sheets: list[str] = Field(default_factory=list)
    slides: int | None = None
    chars: int = 0
    preview: str = ""
    converter: str = ""
    converter_version: str = ""
    warnings: list[str] = Field(default_factory=list)

    def structure(self) -> str:
        """``2 pages``, ``2 sheets: Price list, Volume tiers``, ``3 slides`` or ""."""
        if self.pages is not None:
            return f"{self.pages} page{'s' if self.pages != 1 else ''}"
        if self.slides is not None:
            return f"{self.slides} slide{'s' if self.slides != 1 else ''}"
        if self.sheets and self.format == "xlsx":
            n = len(self.sheets)
            return f"{n} sheet{'s' if n != 1 else ''}: {', '.join(self.sheets)}"
        return ""

    def describe(self) -> str:
        """One line for a person: ``PDF document (PDF), 2 pages, 12.3 KB, 932 characters of
        text``."""
        size = (f"{self.size_bytes / (1024 * 1024):.1f} MB" if self.size_bytes >= 1024 * 1024
                else f"{self.size_bytes / 1024:.1f} KB")
        name = FORMAT_NAMES.get(self.format, self.format)
        parts = [f"{name} ({self.format.upper()})", self.structure(), size,
                 f"{self.chars:,} characters of text"]
        return ", ".join(p for p in parts if p)


__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_SOURCE_MB", "FORMATS", "FORMAT_NAMES",
           "MEDIA_TYPES", "PREVIEW_CHARS", "ConvertedSource", "Segment", "SegmentKind",
           "SourceInfo", "TableRow"]
