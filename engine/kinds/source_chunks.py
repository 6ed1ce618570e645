"""Splitting a converted source into pieces that each fit one model request.

A piece boundary is a paragraph boundary (blank lines, never inside a fenced block) or a row
boundary of a Markdown table: a table too long for one request is split between rows, and a
piece that starts inside a table repeats the table's header and separator lines, so every
piece reads as Markdown on its own. A chunk knows its range ``[start, end)`` in the converted
text, so what the model quotes from it is located in that range (page, sheet!cells, slide,
heading path, table row).

The plan is made in one pass over the text and keeps only the chunk boundaries (a few per
request), not a list of every paragraph or row: a 50 MB spreadsheet costs its text, not
millions of small objects. A paragraph (or a table row) too long for any request is refused
before anything is paid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

from keepstep.engine.files.convert.spill import TextFile, line_pieces

_PIPE = re.compile(r" {0,3}\|")
_SEPARATOR = re.compile(r" {0,3}\|?(\s*:?-+:?\s*\|)*\s*:?-+:?\s*\|?\s*$")
_FENCE = ("```", "~~~")


class Chunk(NamedTuple):
    """``text[start:end]`` of the converted text, sent as ``prefix + text[start:end]``
    (``prefix``: the header lines of the table the chunk starts inside, else "")."""

    start: int
    end: int
    prefix: str = ""

    def text(self, source: str | TextFile) -> str:
        body = source[self.start:self.end]
        return self.prefix + body + ("" if body.endswith("\n") else "\n")


class Unit(NamedTuple):
    """One indivisible piece: a paragraph, or a table row with its table's header span."""

    start: int
    end: int
    header: tuple[int, int] | None  # the header + separator lines of the row's table


def _lines(text: str | TextFile) -> Iterator[tuple[int, int, str]]:
    """(start, end, line) of each line, its newline excluded."""
    for base, piece in line_pieces(text):
        pos, size = 0, len(piece)
        while pos < size:
            nl = piece.find("\n", pos)
            end = size if nl < 0 else nl
            yield base + pos, base + end, piece[pos:end]
            pos = end + 1


def units(text: str | TextFile, *, check: Callable[[], None] | None = None
          ) -> Iterator[Unit]:
    """The text's paragraphs and table rows in order (see the module docstring)."""
    para: list[int] | None = None  # [start, end] of the paragraph being read
    fenced = False
    table: tuple[int, int] | None = None  # header span of the table being read
    pending_header: int | None = None  # start of a pipe line that may be a table header
    n = 0
    for start, end, line in _lines(text):
        n += 1
        if check is not None and n % 20_000 == 0:
            check()
        stripped = line.strip()
        if stripped.startswith(_FENCE):
            fenced = not fenced
        if table is not None and not fenced:
            if _PIPE.match(line) and stripped:
                yield Unit(start, end, table)
                continue
            table = None
        if pending_header is not None:
            header_start, pending_header = pending_header, None
            if not fenced and _SEPARATOR.match(line):
                if para is not None and para[0] < header_start:
                    yield Unit(para[0], header_start - 1, None)
                para = None
                table = (header_start, end)
                continue
        if not stripped and not fenced:
            if para is not None:
                yield Unit(para[0], para[1], None)
                para = None
            continue
        if not fenced and _PIPE.match(line) and not _SEPARATOR.match(line):
            pending_header = start
        if para is None:
            para = [start, end]
        else:
            para[1] = end
    if para is not None:
        yield Unit(para[0], para[1], None)


def plan_chunks(text: str | TextFile, room: int, count: Callable[[str], int], *,
                too_large: Callable[[int, int], Exception],
                check: Callable[[], None] | None = None) -> list[Chunk]:
    """Chunks of ``text`` whose pieces together stay within ``room`` tokens (``count`` gives
    a piece's tokens as it is sent). ``too_large(n, tokens)`` builds the error raised for the
    n-th piece (from 1) when one alone is over ``room``."""
    chunks: list[Chunk] = []
    first: Unit | None = None
    last: Unit | None = None
    used = 0
    prefix = ""
    for n, unit in enumerate(units(text, check=check), start=1):
        if unit.header is not None and unit.header[1] + 1 == unit.start:
            # The first row of a table: its header lines travel with it.
            unit = Unit(unit.header[0], unit.end, unit.header)
        size = count(text[unit.start:unit.end] + "\n\n")
        if size > room:
            raise too_large(n, size)
        if first is not None and used + size > room:
            chunks.append(Chunk(first.start, last.end, prefix))  # type: ignore[union-attr]
            first, used = None, 0
        if first is None:
            first = unit
            prefix = ""
            if unit.header is not None and unit.start > unit.header[1]:
                prefix = text[unit.header[0]:unit.header[1]] + "\n"
                used = count(prefix)
        last = unit
        used += size
    if first is not None:
        chunks.append(Chunk(first.start, last.end, prefix))  # type: ignore[union-attr]
    return chunks


def json_tokens(count_text: Callable[[str], int]) -> Callable[[str], int]:
    """A piece's tokens as it travels inside the INPUT block (JSON-escaped)."""
    return lambda piece: count_text(json.dumps(piece))


__all__ = ["Chunk", "json_tokens", "plan_chunks", "units"]
