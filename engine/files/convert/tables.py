"""Markdown pipe tables in converted text: finding them, splitting rows into cells, and
listing each data row with its header and locator (so a figure held only in a table can
become evidence that cites its row)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from keepstep.engine.files.convert.model import ConvertedSource, TableRow
from keepstep.engine.files.convert.spill import TextFile, line_pieces

_PIPE_LINE = re.compile(r"(?m)^ {0,3}\|.*$")
_SEPARATOR = re.compile(r"^ {0,3}\|?(\s*:?-+:?\s*\|)*\s*:?-+:?\s*\|?\s*$")
_SPLIT = re.compile(r"(?<!\\)\|")


def is_separator(line: str) -> bool:
    """True for a header separator line such as ``| --- | :---: |``."""
    return bool(_SEPARATOR.match(line))


def split_row(line: str) -> list[str]:
    """The cells of one pipe-table line, stripped, with ``\\|`` unescaped."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip().replace("\\|", "|") for cell in _SPLIT.split(body)]


def _pipe_lines(text: str | TextFile) -> Iterator[tuple[str, int, int]]:
    for base, piece in line_pieces(text):  # whole lines: a line never spans pieces
        for match in _PIPE_LINE.finditer(piece):
            yield match.group(0), base + match.start(), base + match.end()


def iter_table_lines(text: str | TextFile) -> Iterator[tuple[tuple[str, int, int],
                                                              list[tuple[str, int, int]]]]:
    """Each table as (header line, data lines), every line given as (line, start, end).

    A table is a header line, a separator line, then every following pipe line that directly
    continues it (up to the next header + separator pair).
    """
    block: list[tuple[str, int, int]] = []
    for line, start, end in _pipe_lines(text):
        if block and start != block[-1][2] + 1:
            yield from _tables_in(block)
            block = []
        block.append((line, start, end))
    if block:
        yield from _tables_in(block)


def _tables_in(block: list[tuple[str, int, int]]):
    i = 0
    while i + 1 < len(block):
        if is_separator(block[i + 1][0]) and not is_separator(block[i][0]):
            j = i + 2
            while j < len(block) and not (j + 1 < len(block) and is_separator(block[j + 1][0])):
                j += 1
            yield block[i], block[i + 2:j]
            i = j
        else:
            i += 1


def iter_table_rows(conv: ConvertedSource) -> Iterator[TableRow]:
    """Every data row of every Markdown table in ``conv.text``, in document order.

    Linear in the text size: consecutive rows of one line run are numbered incrementally
    instead of being located one by one.
    """
    for (header_line, _, _), rows in iter_table_lines(conv.text):
        header = split_row(header_line)
        run = None
        k = 0
        locator: str | None
        for line, start, end in rows:
            if run is not None and run.line_locator is not None and \
                    run.start <= start < run.end:
                k += 1
                locator = run.line_locator.format(n=run.first_number + k)
            else:
                seg = conv.segment_at(start)
                if seg is not None and seg.line_locator is not None:
                    run, k = seg, conv.text.count("\n", seg.start, start)
                    locator = seg.line_locator.format(n=seg.first_number + k)
                else:
                    run, locator = None, (seg.locator if seg is not None else None)
            cells = split_row(line)
            if len(cells) < len(header):
                cells += [""] * (len(header) - len(cells))
            yield TableRow(locator=locator, header=header, cells=cells, start=start, end=end)


def table_rows(conv: ConvertedSource) -> list[TableRow]:
    """All data rows (see ``iter_table_rows``; prefer that for sources with huge tables)."""
    return list(iter_table_rows(conv))


__all__ = ["is_separator", "iter_table_lines", "iter_table_rows", "split_row", "table_rows"]
