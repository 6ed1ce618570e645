"""PPTX (PowerPoint) to Markdown: one ``slide`` segment per slide, located ``slide N``.

Each slide opens with ``## Slide N: <title>``; text shapes follow in their order on the slide
(bulleted placeholders as ``- `` items, text boxes as paragraphs), tables as pipe tables with
rows located ``slide N, table T, row R``, groups are entered, pictures and charts skipped.
Speaker notes follow under ``### Notes``. Slides are read in presentation order.
"""

from __future__ import annotations

import threading
from pathlib import Path
from xml.etree import ElementTree as ET

from keepstep.engine.files.convert.builder import Converted, MarkdownBuilder, clean
from keepstep.engine.files.convert.errors import UnreadableSourceError
from keepstep.engine.files.convert.ooxml import NS, Package, q

_SP, _GRP, _FRAME = q("p", "sp"), q("p", "grpSp"), q("p", "graphicFrame")
_TXBODY, _AP, _TBL, _TR, _TC = q("p", "txBody"), q("a", "p"), q("a", "tbl"), q("a", "tr"), \
    q("a", "tc")
_TITLE_TYPES = {"title", "ctrTitle"}


def _paragraph_text(p: ET.Element) -> str:
    parts: list[str] = []
    for node in p.iter():
        if node.tag == q("a", "t"):
            parts.append(node.text or "")
        elif node.tag == q("a", "br"):
            parts.append(" ")
    return clean("".join(parts))


def _placeholder(sp: ET.Element) -> tuple[bool, str | None]:
    ph = sp.find("p:nvSpPr/p:nvPr/p:ph", NS)
    return (ph is not None, ph.get("type") if ph is not None else None)


def _slide_title(tree: ET.Element) -> str:
    for sp in tree.iter(_SP):
        is_ph, kind = _placeholder(sp)
        if is_ph and kind in _TITLE_TYPES:
            body = sp.find(_TXBODY)
            if body is not None:
                return " ".join(t for t in (_paragraph_text(p) for p in body.iter(_AP)) if t)
    return ""


class _Slide:
    def __init__(self, builder: MarkdownBuilder, number: int) -> None:
        self.b, self.number, self.tables = builder, number, 0

    def shapes(self, container: ET.Element) -> None:
        for shape in container:
            if shape.tag == _SP:
                self.text_shape(shape)
            elif shape.tag == _GRP:
                self.shapes(shape)
            elif shape.tag == _FRAME:
                table = shape.find(".//" + _TBL)
                if table is not None:
                    self.table(table)

    def text_shape(self, sp: ET.Element) -> None:
        is_ph, kind = _placeholder(sp)
        if is_ph and kind in _TITLE_TYPES:
            return  # already the slide heading
        body = sp.find(_TXBODY)
        if body is None:
            return
        bulleted_default = is_ph and kind in (None, "body", "obj")
        for p in body.findall(_AP):
            text = _paragraph_text(p)
            if not text:
                continue
            ppr = p.find(q("a", "pPr"))
            level = int(ppr.get("lvl", "0")) if ppr is not None else 0
            bullet = bulleted_default
            if ppr is not None:
                if ppr.find(q("a", "buNone")) is not None:
                    bullet = False
                elif ppr.find(q("a", "buChar")) is not None or \
                        ppr.find(q("a", "buAutoNum")) is not None:
                    bullet = True
            if bullet:
                self.b.list_item(text, level=level)
            else:
                self.b.paragraph(text)

    def table(self, tbl: ET.Element) -> None:
        rows = []
        for tr in tbl.findall(_TR):
            cells = [" ".join(_paragraph_text(p) for p in tc.iter(_AP)) for tc in
                     tr.findall(_TC)]
            if any(cells):
                rows.append(cells)
        if len(rows) < 2:
            for cells in rows:
                self.b.paragraph(" ".join(cells))
            return
        self.tables += 1
        template = f"slide {self.number}, table {self.tables}, row {{n}}"
        width = max(len(r) for r in rows)
        self.b.table_header(rows[0] + [""] * (width - len(rows[0])))
        for n, cells in enumerate(rows[1:], start=1):
            self.b.table_row(cells, template=template, number=n)
        self.b.end_table()


def _notes(pkg: Package, slide_part: str) -> list[str]:
    out: list[str] = []
    for notes_part in pkg.related(slide_part, "/notesSlide"):
        if notes_part not in pkg.names:
            continue
        for sp in pkg.parse(notes_part).iter(_SP):
            is_ph, kind = _placeholder(sp)
            body = sp.find(_TXBODY)
            if is_ph and kind == "body" and body is not None:
                out.extend(t for t in (_paragraph_text(p) for p in body.findall(_AP)) if t)
    return out


def convert_pptx(path: Path, *, cancel: threading.Event | None, max_bytes: int
                 ) -> Converted:
    """A presentation, slide by slide."""
    builder = MarkdownBuilder(cancel, sections=False, what=f"converting {path}")
    with Package(path, "pptx", max_bytes, cancel) as pkg:
        main = "ppt/presentation.xml"
        if main not in pkg.names:
            raise UnreadableSourceError(path, "pptx", "no ppt/presentation.xml part")
        rels = pkg.rels(main)
        order = [rels.get(s.get(q("r", "id"), ""), "") for s in
                 pkg.parse(main).iterfind("p:sldIdLst/p:sldId", NS)]
        slides = [part for part in order if part in pkg.names]
        for number, part in enumerate(slides, start=1):
            builder.check_cancel()
            tree = pkg.parse(part)
            title = _slide_title(tree)
            builder.begin("slide", f"slide {number}")
            if title:
                builder.heading(2, f"Slide {number}: {title}")
            else:
                builder.heading(2, f"Slide {number}", label=True)
            tree_root = tree.find("p:cSld/p:spTree", NS)
            if tree_root is not None:
                _Slide(builder, number).shapes(tree_root)
            notes = _notes(pkg, part)
            if notes:
                builder.heading(3, "Notes", label=True)
                for text in notes:
                    builder.paragraph(text)
            builder.end()
    return builder.result(slides=len(slides))


__all__ = ["convert_pptx"]
