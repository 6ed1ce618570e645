"""PDF with pypdf (pure Python, no dependencies), one page at a time.

Each page becomes a ``page`` segment located ``p. N``. pypdf gives text fragments with their
position and font size; lines are rebuilt from positions, paragraphs from the line spacing,
headings from a font size clearly above the page's body size, bullets from a leading bullet
character. Tables are not recognised (a PDF has no table structure; their cells come out as
lines of text). A PDF whose pages give no text at all has no text layer (scanned): refused.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from pathlib import Path

from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder, clean
from keepstep.engine.files.convert.errors import (
    EncryptedSourceError,
    NoTextError,
    UnreadableSourceError,
)
from keepstep.engine.files.convert.reading import cancellable

_BULLET = re.compile(r"^\s*(?:[\u2022\u25cf\u25aa\u25e6\u2023\u2219\u00b7*\u2013-])\s+")
_HEADING_RATIO = 1.12
_MIN_BODY_CHARS = 200


class _Line:
    __slots__ = ("size", "text", "y")

    def __init__(self, y: float, size: float, text: str) -> None:
        self.y, self.size, self.text = y, size, text


def _page_lines(page) -> list[_Line]:
    frags: list[tuple[float, float, str]] = []

    def visit(text: str, cm, tm, font_dict, font_size) -> None:
        if not text or not text.strip():
            return
        a, b, c, d, e, f = (float(v) for v in tm)
        ca, cb, cc, cd, ce, cf = (float(v) for v in cm)
        y = e * cb + f * cd + cf
        scale = math.hypot(c * ca + d * cc, c * cb + d * cd) or 1.0
        size = float(font_size or 0) * scale or 1.0
        for k, part in enumerate(text.split("\n")):
            if part.strip():
                frags.append((y - k * size * 1.2, size, part))

    page.extract_text(visitor_text=visit)
    lines: list[_Line] = []
    for y, size, text in frags:
        last = lines[-1] if lines else None
        if last is not None and abs(last.y - y) <= 0.3 * max(size, last.size):
            last.text += text
            last.size = max(last.size, size)
        else:
            lines.append(_Line(y, size, text))
    for line in lines:
        line.text = clean(line.text)
    return [line for line in lines if line.text]


def _body_size(lines: list[_Line], doc_sizes: Counter) -> float:
    sizes: Counter = Counter()
    for line in lines:
        sizes[round(line.size * 2) / 2] += len(line.text)
    doc_sizes.update(sizes)
    source = sizes if sum(sizes.values()) >= _MIN_BODY_CHARS else doc_sizes
    return source.most_common(1)[0][0] if source else 10.0


def _line_pitch(lines: list[_Line]) -> float | None:
    gaps: Counter = Counter()
    for prev, line in zip(lines, lines[1:], strict=False):
        gap = prev.y - line.y
        if gap > 0 and abs(prev.size - line.size) < 0.5:
            gaps[round(gap * 2) / 2] += 1
    return min(gaps, key=lambda g: (-gaps[g], g)) if gaps else None


def _join(left: str, right: str) -> str:
    # A word broken at the line end ("instal-" / "led") is kept together with its hyphen:
    # dropping it would corrupt real hyphenated words such as "NB-IoT".
    if left.endswith("-") and len(left) > 1 and left[-2].isalpha() and right[:1].islower():
        return left + right
    return left + " " + right


def _emit_page(lines: list[_Line], body: float, builder: MarkdownBuilder) -> None:
    pitch = _line_pitch(lines)
    kind: str | None = None  # "p", "li", "h"
    text, size, last_y = "", 0.0, 0.0

    def flush() -> None:
        if not text:
            return
        if kind == "h":
            ratio = size / body
            builder.heading(1 if ratio >= 1.6 else 2 if ratio >= 1.3 else 3, text)
        elif kind == "li":
            builder.list_item(text)
        else:
            builder.paragraph(text)

    for line in lines:
        heading = line.size >= body * _HEADING_RATIO and len(line.text) < 200
        bullet = _BULLET.match(line.text)
        gap = last_y - line.y
        limit = (pitch * 1.3) if pitch else line.size * 1.6
        if heading:
            limit = max(limit, line.size * 1.6)
        same = (text and not bullet and gap > 0 and gap <= limit
                and abs(line.size - size) < 0.5 and (kind == "h") == heading)
        if same:
            text = _join(text, line.text)
        else:
            flush()
            kind = "h" if heading else "li" if bullet else "p"
            text = line.text[bullet.end():] if bullet else line.text
            size = line.size
        last_y = line.y
    flush()


def convert_pdf(path: Path, *, cancel: threading.Event | None
                ) -> Converted:
    """A PDF, page by page; raises EncryptedSourceError, NoTextError (no text layer)."""
    import pypdf  # imported here: only a PDF needs it
    from pypdf.errors import PyPdfError

    builder = MarkdownBuilder(cancel, sections=False, what=f"converting {path}")
    with open(path, "rb") as fh:
        try:
            # Through a file that checks the cancel event: pypdf reads a long PDF's
            # cross-reference table and page tree (seconds) before the first page.
            reader = pypdf.PdfReader(cancellable(fh, cancel, path), strict=False)
            if reader.is_encrypted:
                try:  # "owner password only" PDFs open like this
                    opened = bool(reader.decrypt(""))
                except (PyPdfError, NotImplementedError, ValueError):
                    opened = False
                if not opened:
                    raise EncryptedSourceError(path, "PDF")
            count = len(reader.pages)
        except EncryptedSourceError:
            raise
        except Exception as exc:  # pypdf raises many types for a damaged file
            raise UnreadableSourceError(path, "pdf", type(exc).__name__) from None
        doc_sizes: Counter = Counter()
        empty = 0
        for index in range(count):
            builder.check_cancel()
            try:
                lines = _page_lines(reader.pages[index])
            except Exception as exc:
                raise UnreadableSourceError(path, "pdf",
                                            f"page {index + 1}: {type(exc).__name__}") from None
            builder.begin("page", f"p. {index + 1}")
            if lines:
                _emit_page(lines, _body_size(lines, doc_sizes), builder)
            else:
                empty += 1
            builder.end()
            # pypdf caches every object it resolved; a long PDF would keep them all.
            reader.resolved_objects.clear()
    if builder.text_chars == 0:
        raise NoTextError(path, "pdf")
    warnings = [f"{empty} of {count} pages have no text layer (scanned pages?); they are "
                "left out"] if empty else []
    return builder.result(pages=count, warnings=warnings)


__all__ = ["convert_pdf"]
