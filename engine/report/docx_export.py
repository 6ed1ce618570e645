"""Deliverables a consultant can send: each exported Markdown deliverable as a Word file,
the charts of the run's findings, and PDF where a converter is installed.

``export_documents(run, folder, formats)`` works on a folder ``export_deliverables`` just
wrote (its files were hash-checked on the way out). For each Markdown deliverable it writes
``<name>.docx`` with python-docx: headings, paragraphs with bold/italic/code, bulleted and
numbered lists, tables (the ``Table Grid`` style, a bold header row). A citation
``[A1-e2, B1-e1] (…)`` becomes a superscript note number; the document ends with "Sources
and notes", one entry per note naming each evidence id's source (id and title), where in it
(the locator: page, sheet and cells, slide…) and the quoted statement — footnote-style
citations a reader can check. The first document also gets the charts (``charts.py``),
which are written to ``charts/`` with a ``charts.md`` page showing them.

PDF: LibreOffice (``soffice``) converts each Word file when it is installed; when it is not,
the result says so and what to install, and the Word files are still written.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.errors import KeepstepError
from keepstep.engine.report.charts import Chart, ChartData, charts_markdown, make_charts

if TYPE_CHECKING:
    from keepstep.engine.report.deliverables import DeliverablesExport
    from keepstep.engine.run.runtime import Run

EXPORT_FORMATS = FORMATS = ("md", "docx", "pdf")
CHARTS_DIR, CHARTS_PAGE = "charts", "charts.md"
# [A1-e2, B1-e1] optionally followed by " (A1, p. 2; B1, title)" — what documents cite.
CITATION = re.compile(r"\[((?:[A-Za-z][\w.]*-e\d+)(?:,\s*[A-Za-z][\w.]*-e\d+)*)\]"
                      r"(?:\s*\(([^()]*)\))?")
PDF_TIMEOUT_S = 120


class DocumentsExport(BaseModel):
    """What ``export_documents`` wrote next to the exported deliverables."""

    folder: str
    docx: list[str] = Field(default_factory=list)
    pdf: list[str] = Field(default_factory=list)
    charts: list[Chart] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # e.g. why there is no PDF

    def render(self) -> str:
        lines = [f"  {name:<28} Word" for name in self.docx]
        lines += [f"  {name:<28} PDF" for name in self.pdf]
        if self.charts:
            lines.append(f"  {CHARTS_PAGE:<28} charts: "
                         + ", ".join(f"{CHARTS_DIR}/{c.svg}" for c in self.charts))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# -- what the run found ------------------------------------------------------------------
def _outputs(run: Run, name: str) -> list[Any]:
    from keepstep.engine.report.deliverables import unit_output

    docs = []
    for unit_id, rec in run.facts_records().items():
        if rec.state.value == "succeeded" and name in rec.outputs:
            try:
                docs.append(json.loads(unit_output(run, unit_id, name).text))
            except (KeepstepError, ValueError):
                continue
    return docs


def chart_data(run: Run) -> ChartData:
    """The current ranked risks and verified evidence of ``run``."""
    risks = [r for doc in _outputs(run, "ranking.json") if isinstance(doc, dict)
             for r in doc.get("risks") or [] if isinstance(r, dict)]
    evidence = [e for doc in _outputs(run, "verified.json") if isinstance(doc, dict)
                for e in doc.get("evidence") or [] if isinstance(e, dict)]
    return ChartData(risks=risks, evidence=evidence)


def source_titles(run: Run) -> dict[str, str]:
    return {s.id: s.title for s in run.project.files.sources.sources}


# -- Markdown -> Word --------------------------------------------------------------------
class _Notes:
    """Citation groups numbered in order of first appearance."""

    def __init__(self, evidence: dict[str, dict[str, Any]], titles: dict[str, str]) -> None:
        self.evidence, self.titles = evidence, titles
        self.numbers: dict[tuple[str, ...], int] = {}
        self.shown: dict[tuple[str, ...], str] = {}

    def number(self, ids: tuple[str, ...], shown: str) -> int:
        if ids not in self.numbers:
            self.numbers[ids] = len(self.numbers) + 1
            self.shown[ids] = shown
        return self.numbers[ids]

    def entries(self) -> list[tuple[int, list[str]]]:
        out = []
        for ids, n in self.numbers.items():
            lines = []
            for eid in ids:
                e = self.evidence.get(eid)
                if e is None:
                    lines.append(f"{eid}: {self.shown[ids] or 'source not in this run'}")
                    continue
                sid = str(e.get("source_id", ""))
                title = self.titles.get(sid, "")
                where = str(e.get("locator") or "")
                place = ", ".join(p for p in (f"{sid} {title}".strip(),
                                              where if where and where != title else "") if p)
                lines.append(f"{eid}: {place}: “{str(e.get('quote', '')).strip()}”")
            out.append((n, lines))
        return out


def _add_text(paragraph: Any, text: str, notes: _Notes, *, bold: bool = False,
              italic: bool = False, code: bool = False) -> None:
    """``text`` as runs, each citation replaced by a superscript note number."""
    at = 0
    for m in CITATION.finditer(text):
        if m.start() > at:
            _run(paragraph, text[at:m.start()].rstrip(" "), bold, italic, code)
        ids = tuple(i.strip() for i in m.group(1).split(","))
        n = notes.number(ids, m.group(2) or "")
        sup = paragraph.add_run(f"[{n}]")
        sup.font.superscript = True
        at = m.end()
    if at < len(text):
        _run(paragraph, text[at:], bold, italic, code)


def _run(paragraph: Any, text: str, bold: bool, italic: bool, code: bool) -> None:
    if not text:
        return
    run = paragraph.add_run(text)
    run.bold, run.italic = bold or None, italic or None
    if code:
        run.font.name = "Consolas"


def _inline(paragraph: Any, token: Any, notes: _Notes) -> None:
    bold = italic = code = False
    buffer: list[str] = []

    def flush() -> None:
        if buffer:
            _add_text(paragraph, "".join(buffer), notes, bold=bold, italic=italic)
            buffer.clear()

    for child in token.children or []:
        kind = child.type
        if kind == "text":
            buffer.append(child.content)
        elif kind in ("softbreak", "hardbreak"):
            buffer.append(" ")
        elif kind == "code_inline":
            flush()
            _run(paragraph, child.content, bold, italic, True)
        elif kind in ("strong_open", "strong_close"):
            flush()
            bold = kind == "strong_open"
        elif kind in ("em_open", "em_close"):
            flush()
            italic = kind == "em_open"
        elif kind == "image":
            buffer.append(child.content or "")
    flush()
    del code


def markdown_to_docx(text: str, target: Path, *, notes: _Notes,
                     charts: list[tuple[Chart, Path]] | None = None) -> None:
    """Write ``text`` (Markdown) as a Word file at ``target``."""
    from docx import Document
    from docx.shared import Inches
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    doc = Document()
    lists: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == "heading_open":
            level = min(int(tok.tag[1]), 4)
            heading = doc.add_heading("", level=0 if level == 1 else level - 1)
            _inline(heading, tokens[i + 1], notes)
            i += 3
            continue
        if tok.type in ("bullet_list_open", "ordered_list_open"):
            lists.append("List Number" if tok.type == "ordered_list_open" else "List Bullet")
        elif tok.type in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
        elif tok.type == "paragraph_open":
            style = lists[-1] if lists else None
            paragraph = doc.add_paragraph(style=style)
            _inline(paragraph, tokens[i + 1], notes)
            i += 3
            continue
        elif tok.type == "table_open":
            i = _table(doc, tokens, i, notes)
            continue
        elif tok.type in ("fence", "code_block"):
            paragraph = doc.add_paragraph()
            _run(paragraph, tok.content.rstrip("\n"), False, False, True)
        i += 1
    if charts:
        doc.add_heading("Charts", level=1)
        for chart, png in charts:
            doc.add_heading(chart.title, level=2)
            doc.add_picture(str(png), width=Inches(5.5))
            doc.add_paragraph(chart.caption, style="Caption")
    entries = notes.entries()
    if entries:
        doc.add_heading("Sources and notes", level=1)
        for n, lines in entries:
            paragraph = doc.add_paragraph()
            paragraph.add_run(f"[{n}] ").bold = True
            paragraph.add_run(" · ".join(lines))
    doc.save(str(target))


def _table(doc: Any, tokens: list[Any], start: int, notes: _Notes) -> int:
    """A Markdown table at ``tokens[start]`` as a Word table; the index after it."""
    rows: list[list[Any]] = []
    header_rows = 0
    i = start + 1
    in_head = False
    while tokens[i].type != "table_close":
        t = tokens[i]
        if t.type == "thead_open":
            in_head = True
        elif t.type == "thead_close":
            in_head = False
        elif t.type == "tr_open":
            rows.append([])
            header_rows += 1 if in_head else 0
        elif t.type == "inline":
            rows[-1].append(t)
        i += 1
    width = max((len(r) for r in rows), default=0)
    if width:
        table = doc.add_table(rows=len(rows), cols=width)
        table.style = "Table Grid"
        for r, row in enumerate(rows):
            for c, cell_token in enumerate(row):
                paragraph = table.cell(r, c).paragraphs[0]
                _inline(paragraph, cell_token, notes)
                if r < header_rows:
                    for run in paragraph.runs:
                        run.bold = True
    return i + 1


# -- the export --------------------------------------------------------------------------
def _pdf(docx_files: list[Path], folder: Path) -> tuple[list[str], list[str]]:
    office = shutil.which("soffice") or shutil.which("libreoffice")
    if office is None:
        return [], ["no PDF: it needs LibreOffice (`apt-get install libreoffice-writer`, or "
                    "open the .docx in Word and save as PDF); the Word files are written"]
    made, notes = [], []
    for docx_file in docx_files:
        try:
            subprocess.run([office, "--headless", "--convert-to", "pdf", "--outdir",
                            str(folder), str(docx_file)], check=True, capture_output=True,
                           timeout=PDF_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            notes.append(f"no PDF of {docx_file.name}: LibreOffice failed ({exc})")
            continue
        pdf = docx_file.with_suffix(".pdf")
        if pdf.is_file():
            made.append(pdf.name)
    return made, notes


def export_documents(run: Run, exported: DeliverablesExport,
                     formats: tuple[str, ...] = ("docx",), *,
                     charts: bool = True) -> DocumentsExport:
    """Word files (and PDFs) and charts for the deliverables in ``exported.folder``."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise KeepstepError(f"unknown export format(s): {', '.join(unknown)}",
                            hint=f"choose from {', '.join(FORMATS)}")
    folder = Path(exported.folder)
    result = DocumentsExport(folder=str(folder))
    data = chart_data(run)
    if charts:
        result.charts = make_charts(data, folder / CHARTS_DIR)
        if result.charts:
            (folder / CHARTS_PAGE).write_text(charts_markdown(result.charts), encoding="utf-8")
    if "docx" not in formats and "pdf" not in formats:
        return result
    evidence = {str(e.get("id")): e for e in data.evidence}
    titles = source_titles(run)
    written: list[Path] = []
    for n, f in enumerate(f for f in exported.files if f.file.endswith(".md")):
        target = folder / (Path(f.file).stem + ".docx")
        text = (folder / f.file).read_text(encoding="utf-8")
        with_charts = [(c, folder / CHARTS_DIR / c.png) for c in result.charts] if n == 0 \
            else None
        markdown_to_docx(text, target, notes=_Notes(evidence, titles), charts=with_charts)
        written.append(target)
    result.docx = [p.name for p in written]
    if "pdf" in formats:
        result.pdf, result.notes = _pdf(written, folder)
    return result


__all__ = ["EXPORT_FORMATS", "FORMATS", "DocumentsExport", "chart_data", "export_documents",
           "markdown_to_docx"]
