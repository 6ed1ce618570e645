"""HTML (a saved web page) to Markdown with the standard library's streaming parser.

Why not BeautifulSoup/markdownify: both build the whole tree first; ``html.parser`` is fed in
chunks, so a large page costs about its text in memory. Kept: headings (h1-h6, locator = heading
path), paragraphs, list items, tables (as pipe tables, rows located ``<path>, table T, row N``),
preformatted blocks. Dropped: scripts, styles, templates, SVG, the ``<head>``, and link targets
(the link text stays, so quotes read as the page does).
"""

from __future__ import annotations

import codecs
import re
import threading
from html.parser import HTMLParser
from pathlib import Path

from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder
from keepstep.engine.files.convert.decoding import iter_text

_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe",
                   "object", "canvas", "select", "math"})
_BLOCK = frozenset({"p", "div", "section", "article", "main", "header", "footer", "nav",
                    "aside", "blockquote", "figure", "figcaption", "form", "fieldset", "dl",
                    "dt", "dd", "address", "details", "summary", "body", "html", "hr",
                    "center"})
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "wbr", "area", "base", "col",
                   "embed", "source", "track", "param"})
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.I)


def sniff_encoding(head: bytes) -> str:
    """The encoding a page declares in its first bytes (``<meta charset>``), else UTF-8."""
    match = _META_CHARSET.search(head[:4096])
    if match:
        name = match.group(1).decode("ascii", "ignore").lower()
        try:
            return codecs.lookup(name).name
        except LookupError:
            pass
    return "utf-8"


class _MarkdownParser(HTMLParser):
    def __init__(self, builder: MarkdownBuilder) -> None:
        super().__init__(convert_charrefs=True)
        self.b = builder
        self.skip_depth = 0
        self.skip_tag: str | None = None
        self.inline: list[str] = []
        self.heading: int | None = None
        self.lists: list[str] = []  # "ul"/"ol" stack
        self.in_li = False
        self.pre_depth = 0
        self.pre: list[str] = []
        self.table_depth = 0
        self.row: list[str] | None = None
        self.row_has_th = False
        self.cell: list[str] | None = None
        self.table_rows: list[tuple[list[str], bool]] = []
        self.title_seen = False

    # --- flushing ---------------------------------------------------------------------
    def flush_inline(self) -> None:
        text = "".join(self.inline)
        self.inline.clear()
        if not text.strip():
            return
        if self.heading is not None:
            self.b.heading(self.heading, text)
        elif self.in_li:
            self.b.list_item(text, level=max(len(self.lists) - 1, 0))
        else:
            self.b.paragraph(text)

    def flush_table(self) -> None:
        rows = [r for r in self.table_rows if any(c.strip() for c in r[0])]
        self.table_rows = []
        if not rows:
            return
        # The first row is the header when it is made of <th> cells or when no row is; a
        # table of one row is better read as prose.
        if len(rows) == 1:
            self.b.paragraph(" ".join(rows[0][0]))
            return
        width = max(len(r[0]) for r in rows)
        header, *body = rows
        self.b.table_header(header[0] + [""] * (width - len(header[0])))
        for cells, _ in body:
            self.b.table_row(cells + [""] * (width - len(cells)))
        self.b.end_table()

    # --- parser events ----------------------------------------------------------------
    def handle_starttag(self, tag: str, attrs) -> None:
        if self.skip_depth:
            if tag == self.skip_tag:
                self.skip_depth += 1
            return
        if tag in _SKIP:
            self.skip_tag, self.skip_depth = tag, 1
            return
        if tag == "pre":
            self.flush_inline()
            self.pre_depth += 1
            return
        if self.pre_depth:
            return
        if tag == "table":
            self.flush_inline()
            self.table_depth += 1
            return
        if self.table_depth:
            if self.table_depth == 1:
                if tag == "tr":
                    self._end_row()
                    self.row, self.row_has_th = [], False
                elif tag in ("td", "th"):
                    self._end_cell()
                    if self.row is None:
                        self.row = []
                    self.cell = []
                    self.row_has_th = self.row_has_th or tag == "th"
            if tag == "br" and self.cell is not None:
                self.cell.append(" ")
            return
        if tag in _HEADINGS:
            self.flush_inline()
            self.heading = _HEADINGS[tag]
        elif tag in ("ul", "ol"):
            self.flush_inline()
            self.lists.append(tag)
        elif tag == "li":
            self.flush_inline()
            self.in_li = True
        elif tag == "br":
            self.inline.append(" ")
        elif tag in _BLOCK:
            self.flush_inline()

    def handle_startendtag(self, tag: str, attrs) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if self.skip_depth:
            if tag == self.skip_tag:
                self.skip_depth -= 1
            return
        if tag == "pre":
            if self.pre_depth:
                self.pre_depth -= 1
                if not self.pre_depth:
                    self.b.code_block("".join(self.pre))
                    self.pre.clear()
            return
        if self.pre_depth:
            return
        if self.table_depth:
            if tag == "table":
                self.table_depth -= 1
                if not self.table_depth:
                    self._end_row()
                    self.flush_table()
            elif self.table_depth == 1 and tag in ("td", "th"):
                self._end_cell()
            elif self.table_depth == 1 and tag == "tr":
                self._end_row()
            return
        if tag in _HEADINGS:
            self.flush_inline()
            self.heading = None
        elif tag in ("ul", "ol"):
            self.flush_inline()
            if self.lists:
                self.lists.pop()
            self.in_li = bool(self.lists)
        elif tag == "li":
            self.flush_inline()
            self.in_li = False
        elif tag in _BLOCK:
            self.flush_inline()

    def handle_data(self, data: str) -> None:
        if self.skip_depth:
            return
        if self.pre_depth:
            self.pre.append(data)
        elif self.table_depth:
            if self.cell is not None:
                self.cell.append(data)
        else:
            self.inline.append(data)

    def _end_cell(self) -> None:
        if self.cell is not None and self.row is not None:
            self.row.append(" ".join("".join(self.cell).split()))
        self.cell = None

    def _end_row(self) -> None:
        self._end_cell()
        if self.row is not None:
            self.table_rows.append((self.row, self.row_has_th))
        self.row = None

    def close(self) -> None:
        super().close()
        if self.table_depth:
            self._end_row()
            self.flush_table()
        if self.pre:
            self.b.code_block("".join(self.pre))
        self.flush_inline()


def convert_html(path: Path, *, cancel: threading.Event | None) -> Converted:
    """A saved web page; its encoding is its BOM, its ``<meta charset>``, or UTF-8."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    builder = MarkdownBuilder(cancel, what=f"converting {path}")
    parser = _MarkdownParser(builder)
    for chunk in iter_text(path, encoding=sniff_encoding(head), cancel=cancel, fmt="html"):
        parser.feed(chunk)
        builder.check_cancel()
    parser.close()
    return builder.result()


__all__ = ["convert_html", "sniff_encoding"]
