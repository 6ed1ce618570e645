"""CSV (and TSV): one table, streamed. The first record is the header; each record's locator
is its row number as a spreadsheet shows it (``row 1`` is the header, ``row 2`` the first
data row), so a figure in a CSV cites ``row 12``."""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from pathlib import Path

from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder
from keepstep.engine.files.convert.decoding import iter_text
from keepstep.engine.files.convert.errors import UnreadableSourceError

_SNIFF_CHARS = 64 * 1024
# csv's own limit (128 KiB) is raised so one long quoted field is not an error, but kept
# finite so a file with an unbalanced quote cannot swallow the whole file into one field.
csv.field_size_limit(16 * 1024 * 1024)


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    rest = ""
    for chunk in chunks:
        parts = (rest + chunk).split("\n")
        rest = parts.pop()
        for part in parts:
            yield part + "\n"
    if rest:
        yield rest


def _dialect(path: Path, sample: str) -> type[csv.Dialect] | csv.Dialect:
    if path.suffix.lower() == ".tsv":
        return csv.excel_tab
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        return csv.excel


def convert_csv(path: Path, *, cancel: threading.Event | None
                ) -> Converted:
    """The file as one Markdown table; its one sheet is named after the file's stem."""
    chunks = iter_text(path, cancel=cancel, fmt="csv")
    first = next(chunks, "")
    sample = first[:_SNIFF_CHARS]

    def all_chunks() -> Iterator[str]:
        if first:
            yield first
        yield from chunks

    builder = MarkdownBuilder(cancel, sections=False, what=f"converting {path}")
    reader = csv.reader(_lines(all_chunks()), _dialect(path, sample))
    try:
        header_done = False
        for number, record in enumerate(reader, start=1):
            if not header_done:
                if not any(cell.strip() for cell in record):
                    continue  # blank lines before the header
                builder.table_header(record, locator=f"row {number}")
                header_done = True
                continue
            if not record:
                continue
            builder.table_row(record, template="row {n}", number=number)
    except csv.Error as exc:
        raise UnreadableSourceError(path, "csv", f"line {reader.line_num}: {exc}") from None
    return builder.result(sheets=[path.stem])


__all__ = ["convert_csv"]
