"""DOCX (Word) to Markdown, streamed from ``word/document.xml``.

Headings come from the paragraph style ("Heading N", "Title", or a style with an outline
level, following ``basedOn``); their locators are heading paths (``Pricing > Tiers``). List
paragraphs (numbering or a "List ..." style) become ``- `` items, tables pipe tables with rows
located ``<path>, table T, row N``. Deleted revisions, field codes and the fallback copy of
alternate content are left out; headers, footers, footnotes and comments are not read.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from xml.etree import ElementTree as ET

from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder
from keepstep.engine.files.convert.errors import UnreadableSourceError
from keepstep.engine.files.convert.ooxml import Package, q

_P, _TBL, _TR, _TC, _SDT = q("w", "p"), q("w", "tbl"), q("w", "tr"), q("w", "tc"), q("w", "sdt")
_SDT_CONTENT, _PPR, _BODY = q("w", "sdtContent"), q("w", "pPr"), q("w", "body")
_VAL = q("w", "val")
_TEXT = {q("w", "t"): None, q("w", "tab"): " ", q("w", "br"): " ", q("w", "cr"): " ",
         q("w", "noBreakHyphen"): "-"}
_SKIP = {q("mc", "Fallback"), q("w", "del"), q("w", "pPr"), q("w", "rPr"),
         q("w", "moveFrom")}
_HEADING_NAME = re.compile(r"heading\s*(\d)")


class _Styles:
    """Heading level and list-ness of each paragraph style id."""

    def __init__(self, root: ET.Element | None) -> None:
        self.info: dict[str, tuple[str, int | None, str | None]] = {}
        if root is None:
            return
        for style in root.iter(q("w", "style")):
            if style.get(q("w", "type")) not in (None, "paragraph"):
                continue
            sid = style.get(q("w", "styleId"), "")
            name_el = style.find(q("w", "name"))
            name = (name_el.get(_VAL, "") if name_el is not None else sid).lower()
            outline = style.find(f"{_PPR}/{q('w', 'outlineLvl')}")
            level = int(outline.get(_VAL, "9")) + 1 if outline is not None else None
            based = style.find(q("w", "basedOn"))
            self.info[sid] = (name, level, based.get(_VAL) if based is not None else None)

    def heading_level(self, sid: str | None) -> int | None:
        for _ in range(10):  # basedOn chains are short; a cycle must not hang
            if not sid or sid not in self.info:
                break
            name, level, based = self.info[sid]
            match = _HEADING_NAME.fullmatch(name)
            if match:
                return int(match.group(1))
            if name == "title":
                return 1
            if level is not None and level <= 6:
                return level
            sid = based
        if sid and sid not in self.info:  # no styles part: built-in ids such as "Heading2"
            match = re.fullmatch(r"Heading(\d)", sid)
            if match:
                return int(match.group(1))
        return None

    def is_list(self, sid: str | None) -> bool:
        info = self.info.get(sid) if sid else None
        return info is not None and str(info[0]).startswith("list")


def _text(elem: ET.Element) -> str:
    parts: list[str] = []

    def walk(node: ET.Element) -> None:
        for child in node:
            tag = child.tag
            if tag in _SKIP:
                continue
            if tag in _TEXT:
                fixed = _TEXT[tag]
                parts.append((child.text or "") if fixed is None else fixed)
            else:
                walk(child)

    walk(elem)
    return "".join(parts)


class _Emitter:
    def __init__(self, builder: MarkdownBuilder, styles: _Styles) -> None:
        self.b, self.styles = builder, styles

    def block(self, elem: ET.Element) -> None:
        if elem.tag == _P:
            self.paragraph(elem)
        elif elem.tag == _TBL:
            self.table(elem)
        elif elem.tag == _SDT:
            content = elem.find(_SDT_CONTENT)
            for child in content if content is not None else ():
                self.block(child)

    def paragraph(self, elem: ET.Element) -> None:
        text = _text(elem)
        if not text.strip():
            return
        ppr = elem.find(_PPR)
        style = num = None
        if ppr is not None:
            pstyle = ppr.find(q("w", "pStyle"))
            style = pstyle.get(_VAL) if pstyle is not None else None
            num = ppr.find(q("w", "numPr"))
        level = self.styles.heading_level(style)
        if level is not None:
            self.b.heading(level, text)
        elif num is not None or self.styles.is_list(style):
            ilvl = num.find(q("w", "ilvl")) if num is not None else None
            self.b.list_item(text, level=int(ilvl.get(_VAL, "0")) if ilvl is not None else 0)
        else:
            self.b.paragraph(text)

    def table(self, elem: ET.Element) -> None:
        rows: list[list[str]] = []
        for tr in elem.findall(_TR):
            cells = []
            for tc in tr.findall(_TC):
                cells.append(" ".join(_text(p) for p in tc.iter(_P)))
            if any(c.strip() for c in cells):
                rows.append(cells)
        if not rows:
            return
        if len(rows) == 1:  # a one-row table is a layout box, read as prose
            self.b.paragraph(" ".join(rows[0]))
            return
        width = max(len(r) for r in rows)
        self.b.table_header(rows[0] + [""] * (width - len(rows[0])))
        for cells in rows[1:]:
            self.b.table_row(cells)
        self.b.end_table()


def convert_docx(path: Path, *, cancel: threading.Event | None, max_bytes: int
                 ) -> Converted:
    """A Word document, block by block."""
    builder = MarkdownBuilder(cancel, what=f"converting {path}")
    with Package(path, "docx", max_bytes, cancel) as pkg:
        main = "word/document.xml"
        if main not in pkg.names:
            raise UnreadableSourceError(path, "docx", "no word/document.xml part")
        styles = _Styles(pkg.parse("word/styles.xml") if "word/styles.xml" in pkg.names
                         else None)
        emitter = _Emitter(builder, styles)
        with pkg.open(main) as fh:
            depth, body_depth, body = 0, -1, None
            try:
                for event, elem in ET.iterparse(fh, events=("start", "end")):
                    if event == "start":
                        depth += 1
                        if elem.tag == _BODY:
                            body_depth, body = depth, elem
                        continue
                    if body is not None and depth == body_depth + 1:
                        emitter.block(elem)
                        body.clear()  # drop what was emitted: memory stays bounded
                    depth -= 1
            except ET.ParseError as exc:
                raise UnreadableSourceError(path, "docx", f"{main}: {exc}") from None
    return builder.result()


__all__ = ["convert_docx"]
