"""MarkdownBuilder: the one writer every format converter emits through.

Converters call ``heading``/``paragraph``/``list_item``/``table_*`` in document order and
``begin``/``end`` around pages, sheets and slides; the builder lays out the Markdown, records
segments, and checks for cancellation on every block so a converter that emits as it reads
honours Ctrl-C promptly. Text is gathered in ~1 MB chunks, so a large source costs about its
converted size in memory, not a Python string per line.
"""

from __future__ import annotations

import re
import threading
from typing import NamedTuple

from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert import spill
from keepstep.engine.files.convert.model import Segment, SegmentKind
from keepstep.engine.files.convert.spill import SpillWriter, TextFile

_CHUNK_CHARS = 1 << 20
_BLOCK_SYNTAX = re.compile(r"^(#{1,6}(\s|$)|\||```|~~~)")


class Converted(NamedTuple):
    """What a format converter hands back; ``has_text`` is False when the source yielded
    nothing but made-up labels (an empty workbook, a deck of pictures)."""

    text: str | TextFile
    segments: list[Segment]
    has_text: bool
    pages: int | None = None
    sheets: list[str] = []
    slides: int | None = None
    warnings: list[str] = []


def clean(text: str) -> str:
    """One line: runs of whitespace (newlines, tabs, no-break spaces) become one space."""
    return " ".join(text.split())


def cell_text(value: str) -> str:
    """A table cell: one line, with ``|`` escaped so the row still splits into its cells."""
    return clean(value).replace("|", "\\|")


def _escape_block(text: str) -> str:
    # Prose that happens to start like Markdown syntax ("# 1 priority", "| x") would turn into
    # a heading or table; a backslash keeps it prose.
    return "\\" + text if _BLOCK_SYNTAX.match(text) else text


class MarkdownBuilder:
    """Accumulates Markdown and its segments; ``finish()`` returns both.

    ``sections=True`` records a ``section`` segment per heading, with the heading path as its
    locator (``Pricing > Tiers``). When the first heading is the only level-1 heading it is the
    document's title: it is left out of the other paths (its own section keeps its name).
    """

    def __init__(self, cancel: threading.Event | None = None, *, sections: bool = True,
                 what: str = "conversion") -> None:
        self._cancel = cancel
        self._what = what
        self._sections_on = sections
        self._chunks: list[str] = []
        self._chunks_len = 0
        self._spill: SpillWriter | None = None  # past spill.SPILL_CHARS: text goes to a file
        self._parts: list[str] = []
        self._parts_len = 0
        self.pos = 0
        self._content_end = 0
        self._newlines = 2  # trailing newlines so far; 2 means "a block may start here"
        self.text_chars = 0
        self._segments: list[tuple[str, SegmentKind, int, int, str | None, int]] = []
        self._sections: list[tuple[int, str, int]] = []
        self._h1_count = 0
        self._first_heading_h1: str | None = None
        self._headings = 0
        self._tables_in_section: dict[str, int] = {}
        self._container: tuple[SegmentKind, str, int] | None = None
        self._table_cols = 0
        self._table_rows = 0
        self._table_template: str | None = None
        self._run: list | None = None  # [template, first, last, start, end]
        self._in_list = False

    # --- low level --------------------------------------------------------------------
    def check_cancel(self) -> None:
        """Raise RunCancelled when the caller's cancel event is set."""
        if self._cancel is not None and self._cancel.is_set():
            raise RunCancelled(f"{self._what} cancelled")

    def _emit(self, s: str) -> None:
        if not s:
            return
        self._parts.append(s)
        self._parts_len += len(s)
        self.pos += len(s)
        stripped = s.rstrip("\n")
        if stripped:
            self._content_end = self.pos - (len(s) - len(stripped))
            self._newlines = len(s) - len(stripped)
        else:
            self._newlines += len(s)
        if self._parts_len >= _CHUNK_CHARS:
            self._flush_parts()

    def _flush_parts(self) -> None:
        chunk = "".join(self._parts)
        self._parts.clear()
        self._parts_len = 0
        if self._spill is not None:
            self._spill.write(chunk)
            return
        self._chunks.append(chunk)
        self._chunks_len += len(chunk)
        if self._chunks_len > spill.SPILL_CHARS:
            self._spill = SpillWriter()
            for piece in self._chunks:
                self._spill.write(piece)
            self._chunks.clear()

    def _start_block(self, *, list_item: bool = False) -> None:
        self.check_cancel()
        if self._table_cols:
            self.end_table()
        if self.pos > 0:
            want = 1 if (list_item and self._in_list) else 2
            if self._newlines < want:
                self._emit("\n" * (want - self._newlines))
        self._in_list = list_item

    def _segment(self, locator: str, kind: SegmentKind, start: int, end: int,
                 line_locator: str | None = None, first: int = 1) -> None:
        self._segments.append((locator, kind, start, end, line_locator, first))

    # --- containers: pages, sheets, slides --------------------------------------------
    def begin(self, kind: SegmentKind, locator: str) -> None:
        """Start a page, sheet or slide; everything until ``end()`` belongs to it."""
        self.end()
        self._start_block()
        self._container = (kind, locator, self.pos)

    def end(self) -> None:
        """Close the open page, sheet or slide (no-op when none is open)."""
        if self._table_cols:
            self.end_table()
        if self._container is not None:
            kind, locator, start = self._container
            self._segment(locator, kind, start, max(start, self._content_end))
            self._container = None

    # --- blocks -----------------------------------------------------------------------
    def heading(self, level: int, text: str, *, label: bool = False) -> None:
        """An ATX heading (level clamped to 1..6); empty text is dropped. ``label=True`` marks
        a heading the converter made up (``Slide 3``, a sheet name): it does not count as text
        the source yielded."""
        text = clean(text)
        if not text:
            return
        level = min(max(level, 1), 6)
        self._start_block()
        if self._sections_on:
            self._close_sections(level)
            self._sections.append((level, text, self.pos))
        self._headings += 1
        if level == 1:
            self._h1_count += 1
            if self._headings == 1:
                self._first_heading_h1 = text
        self._emit("#" * level + " " + text + "\n")
        if not label:
            self.text_chars += len(text)

    def paragraph(self, text: str, *, locator: str | None = None,
                  kind: SegmentKind = "text") -> None:
        """A prose paragraph on one line; ``locator`` records a segment for just this text."""
        text = clean(text)
        if not text:
            return
        self._start_block()
        start = self.pos
        self._emit(_escape_block(text) + "\n")
        self.text_chars += len(text)
        if locator is not None:
            self._segment(locator, kind, start, self._content_end)

    def list_item(self, text: str, *, level: int = 0, locator: str | None = None) -> None:
        """A ``- `` bullet (indented two spaces per level); consecutive items form one list."""
        text = clean(text)
        if not text:
            return
        self._start_block(list_item=True)
        start = self.pos
        self._emit("  " * max(level, 0) + "- " + text + "\n")
        self.text_chars += len(text)
        if locator is not None:
            self._segment(locator, "text", start, self._content_end)

    def code_block(self, text: str) -> None:
        """A fenced block, kept verbatim (preformatted text in HTML)."""
        if not text.strip():
            return
        self._start_block()
        fence = "````" if "```" in text else "```"
        self._emit(f"{fence}\n{text.rstrip()}\n{fence}\n")
        self.text_chars += len(text.strip())

    # --- tables -----------------------------------------------------------------------
    def table_header(self, cells: list[str], *, locator: str | None = None) -> None:
        """Start a table whose header row is ``cells`` (an empty header gets column names)."""
        self._start_block()
        cells = [cell_text(c) for c in cells] or [""]
        if not any(cells):
            cells = [f"Column {i + 1}" for i in range(len(cells))]
        self._table_cols = len(cells)
        self._table_rows = 0
        self._table_template = self._default_row_template()
        start = self.pos
        self._emit("| " + " | ".join(cells) + " |\n")
        if locator is not None:
            self._segment(locator, "table-row", start, self.pos - 1)
        self._emit("|" + " --- |" * len(cells) + "\n")
        self.text_chars += sum(len(c) for c in cells)

    def table_row(self, cells: list[str], *, template: str | None = None,
                  number: int | None = None) -> None:
        """One data row. Its locator is ``template.format(n=number)``; by default
        ``"<heading path>, table T, row N"`` counting data rows from 1.

        Rows whose numbers follow each other under one template share one line-run segment.
        """
        if not self._table_cols:
            raise RuntimeError("table_row before table_header")
        self.check_cancel()
        self._table_rows += 1
        if template is None:
            template, number = self._table_template, self._table_rows
        if number is None:
            number = self._table_rows
        cells = [cell_text(c) for c in cells]
        if len(cells) < self._table_cols:
            cells += [""] * (self._table_cols - len(cells))
        line = "| " + " | ".join(cells) + " |"
        start = self.pos
        self._emit(line + "\n")
        end = self.pos - 1
        self.text_chars += sum(len(c) for c in cells)
        run = self._run
        if run is not None and run[0] == template and number == run[2] + 1:
            run[2], run[4] = number, end
        else:
            self._close_run()
            self._run = [template, number, number, start, end]

    def end_table(self) -> None:
        """Close the open table (the next block also closes it)."""
        self._close_run()
        self._table_cols = 0
        self._in_list = False

    def _close_run(self) -> None:
        if self._run is not None:
            template, first, _last, start, end = self._run
            self._segment(template.format(n=first), "table-row", start, end, template, first)
            self._run = None

    def _default_row_template(self) -> str:
        path = self.heading_path()
        count = self._tables_in_section.get(path, 0) + 1
        self._tables_in_section[path] = count
        prefix = f"{path}, " if path else ""
        return (prefix.replace("{", "{{").replace("}", "}}") + f"table {count}, row {{n}}")

    # --- sections ---------------------------------------------------------------------
    def heading_path(self) -> str:
        """The current heading path, e.g. ``Pricing > Tiers`` ("" before any heading)."""
        return " > ".join(title for _, title, _ in self._sections)

    def _close_sections(self, level: int) -> None:
        while self._sections and self._sections[-1][0] >= level:
            path = self.heading_path()
            _, _, start = self._sections.pop()
            self._segment(path, "section", start, max(start, self._content_end))

    # --- result -----------------------------------------------------------------------
    def result(self, **extra) -> Converted:
        """``finish()`` packed as a Converted; ``extra`` sets pages, sheets, slides, warnings."""
        has_text = self.text_chars > 0
        text, segments = self.finish()
        return Converted(text, segments, has_text, **extra)

    def finish(self) -> tuple[str | TextFile, list[Segment]]:
        """The Markdown text (ending in one newline) and its segments, sorted by start; the
        text is a ``TextFile`` when it grew past ``spill.SPILL_CHARS``."""
        self.end()
        self._close_run()
        self._close_sections(1)
        if self._spill is not None:
            return self._finish_spilled()
        # One join, the final newline included: stripping and appending after it would copy
        # the whole text twice more (a 50 MB Word file can hold 250 M characters).
        pieces = self._chunks + self._parts
        self._chunks.clear()
        self._parts.clear()
        had_text = any(pieces)
        while pieces and not pieces[-1].rstrip("\n"):
            pieces.pop()
        if pieces:
            pieces[-1] = pieces[-1].rstrip("\n") + "\n"
        elif had_text:
            pieces = ["\n"]  # only blank lines: one newline, as before
        text = "".join(pieces)
        del pieces
        return text, self._final_segments(len(text))

    def _finish_spilled(self) -> tuple[TextFile, list[Segment]]:
        # The same text as the joined one: up to the last character that is not a newline,
        # then one newline (what follows that character is newlines only: one byte each).
        assert self._spill is not None
        if self._parts:
            self._flush_parts()
        written = self._spill.starts[-1]
        if self._content_end >= written:
            self._spill.write("\n")
            written += 1
        text = self._spill.finish(self._content_end + 1)
        self._spill = None
        return text, self._final_segments(len(text))

    def _final_segments(self, size: int) -> list[Segment]:
        title = self._first_heading_h1 if self._h1_count == 1 else None
        segments = []
        for locator, kind, start, end, line_locator, first in self._segments:
            if title is not None and kind in ("section", "table-row"):
                locator = drop_title_prefix(locator, title)
                if line_locator is not None:
                    line_locator = drop_title_prefix(line_locator,
                                                title.replace("{", "{{").replace("}", "}}"))
            segments.append(Segment.model_construct(
                locator=locator, kind=kind, start=min(start, size), end=min(end, size),
                line_locator=line_locator, first_number=first))
        segments.sort(key=lambda s: (s.start, -s.end))
        return segments


def drop_title_prefix(locator: str, title: str) -> str:
    """``locator`` without a leading ``"<title> > "`` (the document title is implied)."""
    return locator[len(title) + 3:] if locator.startswith(title + " > ") else locator


__all__ = ["Converted", "MarkdownBuilder", "cell_text", "clean", "drop_title_prefix"]
