"""Plain text and Markdown: the text is kept as written (newlines normalised); Markdown gets a
``section`` segment per heading (locator = heading path) and a line run per pipe table;
plain text gets one line run (locator ``line N``)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert.builder import Converted, drop_title_prefix
from keepstep.engine.files.convert.decoding import iter_text
from keepstep.engine.files.convert.model import Segment, SegmentKind
from keepstep.engine.files.convert.tables import is_separator

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CANCEL_EVERY = 20_000  # lines between cancel checks (~ a few ms of work)


def read_text(path: Path, *, cancel: threading.Event | None, fmt: str) -> str:
    """The whole decoded text (UTF-8 unless a BOM says otherwise), newlines normalised."""
    return "".join(iter_text(path, cancel=cancel, fmt=fmt))


def convert_plain(path: Path, *, cancel: threading.Event | None) -> Converted:
    """Plain text: the text itself and one ``line N`` run over it."""
    text = read_text(path, cancel=cancel, fmt="txt")
    if not text.endswith("\n") and text:
        text += "\n"
    end = len(text) - 1 if text.endswith("\n") else len(text)
    return Converted(text, [Segment.model_construct(
        locator="line 1", kind="text", start=0, end=end, line_locator="line {n}",
        first_number=1)], bool(text.strip()))


def convert_markdown(path: Path, *, cancel: threading.Event | None
                     ) -> Converted:
    """Markdown: the text itself, with sections and table-row runs as segments."""
    text = read_text(path, cancel=cancel, fmt="md")
    if not text.endswith("\n") and text:
        text += "\n"
    return Converted(text, markdown_segments(text, cancel=cancel), bool(text.strip()))


def markdown_segments(text: str, *, cancel: threading.Event | None = None) -> list[Segment]:
    """Section segments (ATX and setext headings, outside fences and front matter) and one
    line run per pipe table (``<path>, table T, row N``), sorted by start."""
    raw: list[tuple[str, SegmentKind, int, int, str | None, int]] = []
    stack: list[tuple[int, str, int]] = []
    tables_in: dict[str, int] = {}
    h1_count, headings, first_h1 = 0, 0, None
    content_end = 0
    in_fence = False
    lines = text.split("\n")
    pos = 0
    prev: tuple[str, int] | None = None  # previous paragraph line and its start (setext)
    i = 0
    if lines and lines[0].strip() == "---":  # front matter is not a heading or a table
        for j in range(1, len(lines)):
            if lines[j].strip() in ("---", "..."):
                pos = sum(len(x) + 1 for x in lines[:j + 1])
                i = j + 1
                break

    def path() -> str:
        return " > ".join(t for _, t, _ in stack)

    def open_heading(level: int, title: str, start: int) -> None:
        nonlocal h1_count, headings, first_h1
        while stack and stack[-1][0] >= level:
            p = path()
            _, _, s = stack.pop()
            raw.append((p, "section", s, max(s, content_end), None, 1))
        stack.append((level, title, start))
        headings += 1
        if level == 1:
            h1_count += 1
            if headings == 1:
                first_h1 = title

    n_lines = len(lines)
    while i < n_lines:
        if cancel is not None and i % _CANCEL_EVERY == 0 and cancel.is_set():
            raise RunCancelled("reading Markdown sections cancelled")
        line = lines[i]
        start = pos
        pos += len(line) + 1
        i += 1
        if _FENCE.match(line):
            in_fence = not in_fence
            prev = None
            content_end = start + len(line)
            continue
        if in_fence:
            content_end = start + len(line)
            continue
        if not line.strip():
            prev = None
            continue
        atx = _ATX.match(line)
        if atx:
            title = " ".join((atx.group(2) or "").split())
            if title:
                open_heading(len(atx.group(1)), title, start)
            prev = None
            content_end = start + len(line)
            continue
        setext = _SETEXT.match(line)
        if setext and prev is not None and not prev[0].lstrip().startswith("|"):
            # The paragraph line above becomes the heading; its section starts there.
            level = 1 if setext.group(1).startswith("=") else 2
            content_end = prev[1] - 1 if prev[1] > 0 else 0
            open_heading(level, " ".join(prev[0].split()), prev[1])
            prev = None
            content_end = start + len(line)
            continue
        if line.lstrip().startswith("|") and i < n_lines and is_separator(lines[i]) \
                and not is_separator(line):
            p = path()
            count = tables_in.get(p, 0) + 1
            tables_in[p] = count
            template = (f"{p}, " if p else "").replace("{", "{{").replace("}", "}}") \
                + f"table {count}, row {{n}}"
            pos += len(lines[i]) + 1  # the separator line
            i += 1
            first_start, last_end = pos, None
            while i < n_lines and lines[i].lstrip().startswith("|") and not (
                    i + 1 < n_lines and is_separator(lines[i + 1])):
                last_end = pos + len(lines[i])
                pos += len(lines[i]) + 1
                i += 1
            if last_end is not None:
                raw.append((template.format(n=1), "table-row", first_start, last_end,
                            template, 1))
                content_end = last_end
            prev = None
            continue
        prev = (line, start)
        content_end = start + len(line)
    while stack:
        p = path()
        _, _, s = stack.pop()
        raw.append((p, "section", s, max(s, content_end), None, 1))
    doc_title = first_h1 if h1_count == 1 else None
    segments = []
    for locator, kind, s, e, line_locator, first in raw:
        if doc_title is not None:
            locator = drop_title_prefix(locator, doc_title)
            if line_locator is not None:
                line_locator = drop_title_prefix(
                    line_locator, doc_title.replace("{", "{{").replace("}", "}}"))
        segments.append(Segment.model_construct(locator=locator, kind=kind, start=s, end=e,
                                                line_locator=line_locator, first_number=first))
    segments.sort(key=lambda seg: (seg.start, -seg.end))
    return segments


__all__ = ["convert_markdown", "convert_plain", "markdown_segments", "read_text"]
