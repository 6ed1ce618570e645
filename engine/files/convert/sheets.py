"""XLSX workbooks with openpyxl in read-only mode (rows are streamed from the sheet XML).

Each worksheet becomes ``## <sheet name>`` and a ``sheet`` segment. Within a sheet, a block of
rows with two or more filled cells is a table (its first row is the header) and each row's
locator is its cell range (``Prices!A3:D3``; names needing it are quoted as Excel does,
``'Volume tiers'!A3:C3``). A row with a single text cell outside a table is prose (located at
that cell, ``Notes!A7``), or a ``###`` heading when the cell is bold and short. An empty row
ends a table. Values are shown as the cell's number format shows them (``8%``, ``1,150``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keepstep.engine.files.convert.archive import EntityExpansionError, check_zip
from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder
from keepstep.engine.files.convert.errors import UnreadableSourceError
from keepstep.engine.files.convert.model import DEFAULT_MAX_BYTES
from keepstep.engine.files.convert.reading import cancellable

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_CANCEL_ROWS = 500


def sheet_ref(name: str) -> str:
    """The sheet part of an A1 reference: ``Prices`` or ``'Volume tiers'``."""
    if _PLAIN_NAME.fullmatch(name) and not re.fullmatch(r"[A-Za-z]{1,3}\d+", name):
        return name
    return "'" + name.replace("'", "''") + "'"


def column_letter(index: int) -> str:
    """1 -> A, 27 -> AA."""
    letters = ""
    while index > 0:
        index, rem = divmod(index - 1, 26)
        letters = chr(65 + rem) + letters
    return letters


def _decimals(fmt: str) -> int:
    match = re.search(r"\.(0+)", fmt)
    return len(match.group(1)) if match else 0


def format_value(value: object, number_format: str | None = "General") -> str:
    """A cell value as a spreadsheet shows it (percent, thousands separators, decimals)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0, 0):
            return value.date().isoformat()
        return value.isoformat(sep=" ", timespec="minutes")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (int, float)):
        fmt = (number_format or "General").split(";")[0]
        if "%" in fmt:
            return f"{value * 100:.{_decimals(fmt)}f}%"
        if "#,##" in fmt:
            return f"{value:,.{_decimals(fmt)}f}"
        if re.search(r"0\.0", fmt):
            return f"{value:.{_decimals(fmt)}f}"
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() and abs(value) < 1e15 \
                else f"{value:.15g}"
        return str(value)
    return str(value)


def _is_heading(cell, text: str) -> bool:
    try:
        bold = bool(cell.font is not None and cell.font.b)
    except (AttributeError, IndexError):  # a cell without style information
        bold = False
    return bold and len(text) <= 120 and not text.rstrip().endswith((".", ":", ";"))


def convert_xlsx(path: Path, *, cancel: threading.Event | None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Converted:
    """A workbook, sheet by sheet, row by row (refused first if its zip is a bomb or a part
    declares XML entities: ``archive.check_zip``)."""
    import openpyxl  # imported here: only a workbook needs it

    # Read through a file that checks the cancel event: openpyxl opens a sheet without a
    # <dimension> element by parsing all of it, with no other point to notice a Ctrl-C.
    with open(path, "rb") as fh, _no_full_collections():
        source = cancellable(fh, cancel, path)
        try:  # bounded (the directory, a few KB per XML part): no cancel point needed
            with zipfile.ZipFile(fh) as zf:
                check_zip(zf, path, "xlsx", max_bytes, prologs=True)
        except zipfile.BadZipFile:
            raise UnreadableSourceError(path, "xlsx", "the ZIP package is damaged") from None
        fh.seek(0)
        return _read_workbook(openpyxl, path, source, cancel)


_gc_lock = threading.Lock()
_gc_holders = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def _no_full_collections() -> Iterator[None]:
    """No full garbage collection while a workbook converts (young ones go on).

    openpyxl clears each row's element but leaves it attached to the sheet's root until the
    sheet ends, so a 50 MB sheet holds millions of elements, and each full collection scans
    them all, again and again as the sheet grows: pauses of up to 1.7 s between cancel checks
    and 15 % of the time. When a pass over a sheet ends, its elements become one cycle of
    garbage that only a full collection frees; ``_collect`` runs one after each pass (the
    dimension scans load_workbook makes of sheets that lack ``<dimension>``, then each
    sheet), so garbage never piles up across passes. Process-wide, so overlapping
    conversions share one setting and the last to finish restores the thresholds."""
    global _gc_holders, _gc_saved
    with _gc_lock:
        if _gc_holders == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(_gc_saved[0], _gc_saved[1], 1 << 30)
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_saved is not None:
                gc.set_threshold(*_gc_saved)


def _collect(builder: MarkdownBuilder) -> None:
    """Free the elements of a finished pass over a sheet (see ``_no_full_collections``):
    one full collection, which costs about 0.35 s per 10 MB of sheet, between two checks."""
    builder.check_cancel()
    gc.collect()
    builder.check_cancel()


def _read_workbook(openpyxl: Any, path: Path, source: Any,
                   cancel: threading.Event | None) -> Converted:
    try:
        wb = openpyxl.load_workbook(source, read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises zip, KeyError and its own errors
        raise _refusal(path, exc) from None
    builder = MarkdownBuilder(cancel, sections=False, what=f"converting {path}")
    names: list[str] = []
    warnings: list[str] = []
    try:
        for chart in getattr(wb, "chartsheets", []):
            warnings.append(f"chart sheet {chart.title!r} has no cells; skipped")
        for ws in wb.worksheets:
            _collect(builder)  # what load_workbook's scans or the last sheet left
            names.append(ws.title)
            _convert_sheet(ws, builder)
        _collect(builder)
    except Exception as exc:
        raise _refusal(path, exc) from None
    finally:
        wb.close()
    return builder.result(sheets=names, warnings=warnings)


def _refusal(path: Path, exc: Exception) -> Exception:
    """What to raise for a library error: entity declarations (defusedxml, used by openpyxl
    when installed, refuses them) name the limit; anything else is an unreadable workbook."""
    try:
        from defusedxml import DefusedXmlException  # openpyxl's optional XML guard
    except ImportError:  # pragma: no cover - defusedxml absent: check_package caught them
        DefusedXmlException = ()  # noqa: N806
    cause: BaseException | None = exc
    for _ in range(8):  # openpyxl wraps it in a plain ValueError: follow the chain
        if cause is None:
            break
        if DefusedXmlException and isinstance(cause, DefusedXmlException):
            return EntityExpansionError(path, "a workbook part")
        cause = cause.__cause__ or cause.__context__
    return UnreadableSourceError(path, "xlsx", type(exc).__name__)


def _convert_sheet(ws, builder: MarkdownBuilder) -> None:
    ref = sheet_ref(ws.title)
    builder.begin("sheet", ws.title)
    builder.heading(2, ws.title, label=True)
    table: tuple[int, int] | None = None  # first and last column of the open table
    for number, row in enumerate(ws.iter_rows(min_row=1), start=1):
        if number % _CANCEL_ROWS == 0:
            builder.check_cancel()
        filled: list[tuple[int, str, Any]] = []
        for index, cell in enumerate(row, start=1):
            value = getattr(cell, "value", None)
            if value is None:
                continue
            text = format_value(value, getattr(cell, "number_format", "General"))
            if text.strip():
                filled.append((index, text, cell))
        if not filled:
            if table is not None:
                builder.end_table()
                table = None
            continue
        first, last = filled[0][0], filled[-1][0]
        if table is not None:
            # A row reaching past the table's columns widens it (a new line run follows).
            c0, c1 = min(table[0], first), max(table[1], last)
            table = (c0, c1)
            by_col = {i: t for i, t, _ in filled}
            cells = [by_col.get(i, "") for i in range(c0, c1 + 1)]
            span = f"{column_letter(c0)}{{n}}:{column_letter(c1)}{{n}}"
            builder.table_row(cells, template=f"{_braces(ref)}!{span}", number=number)
            continue
        if len(filled) == 1 and isinstance(filled[0][2].value, str):
            index, text, cell = filled[0]
            locator = f"{ref}!{column_letter(index)}{number}"
            stripped = text.strip()
            if stripped[:2] in ("- ", "• ", "* "):
                builder.list_item(stripped[2:], locator=locator)
            elif _is_heading(cell, stripped):
                builder.heading(3, stripped)
            else:
                builder.paragraph(stripped, locator=locator)
            continue
        if len(filled) == 1:
            index, text, _ = filled[0]
            builder.paragraph(text, locator=f"{ref}!{column_letter(index)}{number}")
            continue
        by_col = {i: t for i, t, _ in filled}
        builder.table_header([by_col.get(i, "") for i in range(first, last + 1)],
                             locator=f"{ref}!{column_letter(first)}{number}:"
                                     f"{column_letter(last)}{number}")
        table = (first, last)
    builder.end()


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


__all__ = ["column_letter", "convert_xlsx", "format_value", "sheet_ref"]
