"""Writers of test documents in every source format, from one small block model.

A document is a list of blocks: ``("h", level, text)``, ``("p", text)``, ``("li", text)``,
``("table", [[header...], [row...], ...])`` and ``("break",)`` (a new PDF page). The same
blocks written as PDF, DOCX, HTML... convert back to the same sentences, which is what the
tests and the sample pack generator (sample_projects/tools/make_format_sources.py) rely on.

Output is byte-deterministic where the writer allows: fixed creation dates and ZIP entry
timestamps. Writers (fpdf2, python-docx, python-pptx, openpyxl) are dev dependencies.
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

FIXED_TIME = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
_ZIP_TIME = (2025, 1, 1, 12, 0, 0)
_CORE_DATE = re.compile(rb"(<dcterms:(created|modified)[^>]*>)[^<]*(</dcterms:\2>)")

Block = tuple


# --- ZIP-based formats: fixed timestamps ---------------------------------------------------
def normalise_zip(path: Path) -> None:
    """Rewrite an OOXML zip with fixed entry times and fixed core-property dates."""
    with zipfile.ZipFile(path) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for info, data in entries:
            if info.filename == "docProps/core.xml":
                data = _CORE_DATE.sub(rb"\g<1>2025-01-01T12:00:00Z\g<3>", data)
            fixed = zipfile.ZipInfo(info.filename, date_time=_ZIP_TIME)
            fixed.compress_type = zipfile.ZIP_DEFLATED
            fixed.external_attr = 0o600 << 16
            dst.writestr(fixed, data)
    path.write_bytes(buf.getvalue())


# --- PDF ------------------------------------------------------------------------------
_PDF_SIZES = {1: 20, 2: 15, 3: 12.5}
_PDF_BODY = 11


def write_pdf(path: Path, blocks: Iterable[Block], *, title: str = "", author: str = "",
              subject: str = "", encrypt_password: str | None = None) -> Path:
    """A PDF with real text (Helvetica): headings larger than the 11 pt body, bullets as
    "-", tables as lines of text; ``("break",)`` starts a new page."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_creation_date(FIXED_TIME)
    pdf.set_producer("keepstep test writer")
    if title:
        pdf.set_title(title)
    if author:
        pdf.set_author(author)
    if subject:
        pdf.set_subject(subject)
    if encrypt_password is not None:
        pdf.set_encryption(owner_password=encrypt_password + "-owner",
                           user_password=encrypt_password)
    pdf.set_auto_page_break(True, 18)
    pdf.add_page()

    def cell(height: float, text: str) -> None:
        pdf.multi_cell(0, height, _latin1(text), new_x="LMARGIN", new_y="NEXT")

    for block in blocks:
        kind = block[0]
        if kind == "break":
            pdf.add_page()
        elif kind == "h":
            size = _PDF_SIZES.get(block[1], 12.5)
            pdf.set_font("Helvetica", "B", size)
            pdf.ln(2)
            cell(size * 0.5, block[2])
            pdf.ln(2)
        elif kind == "p":
            pdf.set_font("Helvetica", "", _PDF_BODY)
            cell(5.5, block[1])
            pdf.ln(3)
        elif kind == "li":
            pdf.set_font("Helvetica", "", _PDF_BODY)
            cell(5.5, "- " + block[1])
        elif kind == "table":
            pdf.set_font("Helvetica", "", _PDF_BODY)
            pdf.ln(2)
            for row in block[1]:
                cell(5.5, "    ".join(str(c) for c in row))
            pdf.ln(3)
    pdf.output(str(path))
    return path


def _latin1(text: str) -> str:
    # The core fonts are Latin-1; replace the few typographic characters the samples use.
    for fancy, plain in (("\u2019", "'"), ("\u2018", "'"), ("\u201c", '"'), ("\u201d", '"'),
                         ("\u2013", "-"), ("\u2014", "-"), ("\u2026", "...")):
        text = text.replace(fancy, plain)
    return text.encode("latin-1", "replace").decode("latin-1")


def write_scanned_pdf(path: Path, pages: int = 2) -> Path:
    """A PDF with drawings only and no text layer, as a scanner without OCR makes."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_creation_date(FIXED_TIME)
    for _ in range(pages):
        pdf.add_page()
        pdf.set_fill_color(90, 90, 90)
        for row in range(30):
            pdf.rect(15, 20 + row * 8, 150 - (row % 4) * 20, 4, style="F")
    pdf.output(str(path))
    return path


# --- DOCX -----------------------------------------------------------------------------
def write_docx(path: Path, blocks: Iterable[Block], *, title: str = "", author: str = "",
               comments: str = "") -> Path:
    """A Word document with Heading N styles, List Bullet items and grid tables."""
    import docx

    document = docx.Document()
    props = document.core_properties
    props.title, props.author, props.comments = title, author, comments
    props.created = props.modified = FIXED_TIME.replace(tzinfo=None)
    props.last_modified_by, props.revision = author or "keepstep", 1
    for block in blocks:
        kind = block[0]
        if kind == "h":
            document.add_heading(block[2], level=block[1])
        elif kind == "p":
            document.add_paragraph(block[1])
        elif kind == "li":
            document.add_paragraph(block[1], style="List Bullet")
        elif kind == "table":
            rows = block[1]
            table = document.add_table(rows=len(rows), cols=max(len(r) for r in rows))
            table.style = "Table Grid"
            for r, row in enumerate(rows):
                for c, value in enumerate(row):
                    table.cell(r, c).text = str(value)
    document.save(str(path))
    normalise_zip(path)
    return path


# --- PPTX -----------------------------------------------------------------------------
def write_pptx(path: Path, slides: Iterable[dict]) -> Path:
    """A deck; each slide dict has ``title``, optional ``bullets`` (list of text or
    (text, level)), ``paragraphs`` (a text box), ``table`` (rows) and ``notes``."""
    from pptx import Presentation
    from pptx.util import Inches, Pt

    deck = Presentation()
    props = deck.core_properties
    props.created = props.modified = FIXED_TIME.replace(tzinfo=None)
    props.last_modified_by, props.revision = "keepstep", 1
    for spec in slides:
        has_body = bool(spec.get("bullets"))
        layout = deck.slide_layouts[1 if has_body else 5]
        slide = deck.slides.add_slide(layout)
        slide.shapes.title.text = spec.get("title", "")
        if has_body:
            body = slide.placeholders[1].text_frame
            for i, item in enumerate(spec["bullets"]):
                text, level = (item, 0) if isinstance(item, str) else item
                para = body.paragraphs[0] if i == 0 else body.add_paragraph()
                para.text, para.level = text, level
        top = 4.6 if has_body else 1.6
        if spec.get("paragraphs"):
            box = slide.shapes.add_textbox(Inches(0.5), Inches(top), Inches(9), Inches(1.5))
            frame = box.text_frame
            frame.word_wrap = True
            for i, text in enumerate(spec["paragraphs"]):
                para = frame.paragraphs[0] if i == 0 else frame.add_paragraph()
                para.text = text
                para.font.size = Pt(14)
            top += 1.6
        if spec.get("table"):
            rows = spec["table"]
            shape = slide.shapes.add_table(len(rows), max(len(r) for r in rows), Inches(0.5),
                                           Inches(top), Inches(9), Inches(0.4 * len(rows)))
            for r, row in enumerate(rows):
                for c, value in enumerate(row):
                    shape.table.cell(r, c).text = str(value)
        if spec.get("notes"):
            slide.notes_slide.notes_text_frame.text = spec["notes"]
    deck.save(str(path))
    normalise_zip(path)
    return path


# --- XLSX -----------------------------------------------------------------------------
class Bold(str):
    """A cell value written in bold (a heading row in a sheet)."""


class Percent(float):
    """A number written with the ``0%`` format (0.08 shows as 8%)."""


class Thousands(float):
    """A number written with the ``#,##0`` format (20000 shows as 20,000)."""


def write_xlsx(path: Path, sheets: dict[str, list[list[object]]], *, title: str = "",
               creator: str = "keepstep") -> Path:
    """A workbook; each sheet is a list of rows (an empty list is an empty row). Values may
    be Bold, Percent or Thousands to set the cell's style."""
    from openpyxl import Workbook
    from openpyxl.styles import Font

    wb = Workbook()
    wb.remove(wb.active)
    wb.properties.creator = creator
    wb.properties.title = title or None
    wb.properties.created = wb.properties.modified = FIXED_TIME.replace(tzinfo=None)
    for name, rows in sheets.items():
        ws = wb.create_sheet(name)
        for r, row in enumerate(rows, start=1):
            for c, value in enumerate(row, start=1):
                if value is None or value == "":
                    continue
                cell = ws.cell(row=r, column=c)
                if isinstance(value, Bold):
                    cell.value, cell.font = str(value), Font(bold=True)
                elif isinstance(value, Percent):
                    cell.value, cell.number_format = float(value), "0%"
                elif isinstance(value, Thousands):
                    cell.value, cell.number_format = float(value), "#,##0"
                else:
                    cell.value = value
    wb.save(str(path))
    normalise_zip(path)
    return path


# --- text formats ---------------------------------------------------------------------
def write_html(path: Path, blocks: Iterable[Block], *, title: str = "",
               extra_head: str = "") -> Path:
    """A saved web page with a nav bar, a script and a style (both must be dropped)."""
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{html.escape(title)}</title>", extra_head,
           "<style>body { font-family: sans-serif; }</style>",
           "<script>window.analytics = {id: 'UA-0000-1'};</script></head><body>",
           "<main>"]
    in_list = False
    for block in blocks:
        kind = block[0]
        if kind != "li" and in_list:
            out.append("</ul>")
            in_list = False
        if kind == "h":
            out.append(f"<h{block[1]}>{html.escape(block[2])}</h{block[1]}>")
        elif kind == "p":
            out.append(f"<p>{html.escape(block[1])}</p>")
        elif kind == "li":
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{html.escape(block[1])}</li>")
        elif kind == "table":
            rows = block[1]
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in rows[0])
                       + "</tr>")
            for row in rows[1:]:
                out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                           + "</tr>")
            out.append("</table>")
    if in_list:
        out.append("</ul>")
    out.append("</main></body></html>")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[list[object]]) -> Path:
    """A comma-separated file, UTF-8, CRLF line ends as spreadsheets write them."""
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return path


def write_markdown(path: Path, blocks: Iterable[Block]) -> Path:
    """The blocks as Markdown (what the other writers' output should convert back to)."""
    lines: list[str] = []
    prev = None
    for block in blocks:
        kind = block[0]
        if lines and not (kind == "li" and prev == "li"):
            lines.append("")
        if kind == "h":
            lines.append("#" * block[1] + " " + block[2])
        elif kind == "p":
            lines.append(block[1])
        elif kind == "li":
            lines.append("- " + block[1])
        elif kind == "table":
            rows = [[str(c) for c in r] for r in block[1]]
            lines.append("| " + " | ".join(rows[0]) + " |")
            lines.append("|" + " --- |" * len(rows[0]))
            lines.extend("| " + " | ".join(r) + " |" for r in rows[1:])
        prev = kind
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- large files (cancellation, benchmarks) --------------------------------------------
LOREM = ("Utilities in the northern region replaced 4,200 meters in 2024, and the average "
         "reading interval fell to 15 minutes. ")


_WORDS = ("meter utility tender region price reading network battery installer contract "
          "district supplier framework pilot customer leak alert tariff budget forecast "
          "household survey partner warehouse duty freight approval standard coverage signal "
          "water connection annual growth share volume discount service portal rate card "
          "capital spending replacement mechanical smart remote data privacy consent "
          "procurement board margin target entry risk market analyst report").split()


def varied_sentence(n: int, words: int = 14) -> str:
    """A deterministic sentence that differs from its neighbours, so a generated file
    compresses about as much as real prose does (not 100:1 like one repeated line)."""
    state = (n * 2654435761 + 12345) & 0xFFFFFFFF
    picked = []
    for _ in range(words):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        picked.append(_WORDS[state % len(_WORDS)])
    return (" ".join(picked).capitalize() + f" rose {n % 97}.{n % 10}% in {2000 + n % 30}.")


def write_large_text(path: Path, megabytes: float, *, markdown: bool = False) -> Path:
    """About ``megabytes`` of prose (with a heading every ~200 lines when ``markdown``)."""
    target = int(megabytes * 1024 * 1024)
    line = (LOREM * 3).strip() + "\n"
    with open(path, "w", encoding="utf-8") as fh:
        written, n = 0, 0
        while written < target:
            if markdown and n % 200 == 0:
                heading = f"\n## Section {n // 200 + 1}\n\n"
                fh.write(heading)
                written += len(heading)
            fh.write(line + ("\n" if markdown else ""))
            written += len(line) + (1 if markdown else 0)
            n += 1
    return path


def write_large_csv(path: Path, megabytes: float) -> Path:
    """About ``megabytes`` of a five-column price table."""
    target = int(megabytes * 1024 * 1024)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Region", "Utility", "Meters", "Price (NVK)", "Share"])
        n = 0
        while fh.tell() < target:
            for _ in range(1000):
                n += 1
                writer.writerow([f"Region {n % 17}", f"Utility {n % 311}", 1000 + n % 9000,
                                 f"{1090 + n % 400}", f"{(n % 100) / 10:.1f}%"])
    return path


def write_large_html(path: Path, megabytes: float) -> Path:
    """About ``megabytes`` of a saved page: sections of paragraphs and a table each."""
    target = int(megabytes * 1024 * 1024)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Big</title></head>"
                 "<body>\n")
        n = 0
        while fh.tell() < target:
            n += 1
            fh.write(f"<h2>Section {n}</h2>\n" + f"<p>{LOREM * 3}</p>\n" * 20
                     + "<table><tr><th>Tier</th><th>Churn</th></tr>"
                     + "".join(f"<tr><td>T{i}</td><td>{i}.5%</td></tr>" for i in range(10))
                     + "</table>\n")
        fh.write("</body></html>\n")
    return path


def write_large_xlsx(path: Path, rows: int) -> Path:
    """A one-sheet workbook of ``rows`` five-column rows (written in write-only mode)."""
    from openpyxl import Workbook

    wb = Workbook(write_only=True)
    ws = wb.create_sheet("Prices")
    ws.append(["Region", "Utility", "Meters", "Price (NVK)", "Note"])
    for n in range(rows):
        ws.append([f"Region {n % 17}", f"Utility {n % 311}", 1000 + n % 9000, 1090 + n % 400,
                   varied_sentence(n, 6)])
    wb.save(str(path))
    return path


def write_large_docx(path: Path, paragraphs: int) -> Path:
    """A Word document of ``paragraphs`` paragraphs, a heading every 50 (document.xml is
    written directly: python-docx would need the whole document in memory)."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml",
                    '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.'
                    'openxmlformats.org/package/2006/content-types"><Default Extension="xml" '
                    'ContentType="application/xml"/><Override PartName="/word/document.xml" '
                    'ContentType="application/vnd.openxmlformats-officedocument.'
                    'wordprocessingml.document.main+xml"/></Types>')
        with zf.open("word/document.xml", "w") as fh:
            fh.write(f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{w}">'
                     "<w:body>".encode())
            for n in range(paragraphs):
                if n % 50 == 0:
                    fh.write(f'<w:p><w:pPr><w:pStyle w:val="Heading2"/></w:pPr><w:r><w:t>'
                             f"Part {n // 50 + 1}</w:t></w:r></w:p>".encode())
                text = " ".join(varied_sentence(n * 3 + k) for k in range(3))
                fh.write(f"<w:p><w:r><w:t>{html.escape(text)}</w:t></w:r></w:p>".encode())
            fh.write(b"</w:body></w:document>")
    return path


def write_large_pptx(path: Path, slides: int) -> Path:
    """A deck of ``slides`` slides, each a title, four bullets and a small table."""
    specs = [{"title": f"Region {n + 1}",
              "bullets": [varied_sentence(n * 4 + k) for k in range(4)],
              "table": [["Tier", "Churn"], ["Basic", f"{n % 9}.2%"], ["Premium", "4.1%"]]}
             for n in range(slides)]
    return write_pptx(path, specs)


def write_large_pdf(path: Path, pages: int) -> Path:
    """A text PDF of ``pages`` pages (a heading and five paragraphs each)."""
    blocks: list[Block] = []
    for n in range(pages):
        if n:
            blocks.append(("break",))
        blocks.append(("h", 2, f"Chapter {n + 1}"))
        blocks.extend(("p", " ".join(varied_sentence(n * 20 + k * 4 + j) for j in range(4)))
                      for k in range(5))
    return write_pdf(path, blocks)


def write_large_pdf_direct(path: Path, megabytes: float) -> Path:
    """About ``megabytes`` of a text PDF written as PDF syntax directly (fpdf2 needs minutes
    for a 50 MB file): pages of a heading and five paragraphs in Helvetica, each page's
    content stream Flate-compressed as writers do, one xref table."""
    import zlib

    target = int(megabytes * 1024 * 1024)
    offsets: list[int] = []
    with open(path, "wb") as fh:
        def obj(body: bytes) -> int:
            offsets.append(fh.tell())
            fh.write(f"{len(offsets)} 0 obj\n".encode() + body + b"\nendobj\n")
            return len(offsets)

        fh.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
        obj(b"<< /Type /Catalog /Pages 2 0 R >>")
        offsets.append(0)  # 2: the page tree, written last (it lists every page)
        obj(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")  # 3
        pages: list[int] = []
        n = 0
        while fh.tell() < target:
            lines = [f"BT /F1 18 Tf 50 790 Td (Chapter {len(pages) + 1}) Tj ET"]
            y = 760
            for _ in range(5):
                words = " ".join(varied_sentence(n + j) for j in range(4)).split()
                n += 4
                for k in range(0, len(words), 12):
                    text = " ".join(words[k:k + 12]).replace("(", "[").replace(")", "]")
                    lines.append(f"BT /F1 10 Tf 50 {y} Td ({text}) Tj ET")
                    y -= 13
                y -= 9
            data = zlib.compress("\n".join(lines).encode("latin-1"))
            content = obj(f"<< /Length {len(data)} /Filter /FlateDecode >>\nstream\n"
                          .encode() + data + b"\nendstream")
            pages.append(obj(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] "
                             f"/Resources << /Font << /F1 3 0 R >> >> /Contents {content} 0 R >>"
                             .encode()))
        offsets[1] = fh.tell()
        kids = " ".join(f"{p} 0 R" for p in pages)
        fh.write(f"2 0 obj\n<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>\nendobj\n"
                 .encode())
        xref = fh.tell()
        fh.write(f"xref\n0 {len(offsets) + 1}\n0000000000 65535 f \n".encode())
        fh.write("".join(f"{o:010d} 00000 n \n" for o in offsets).encode())
        fh.write(f"trailer\n<< /Size {len(offsets) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n"
                 "%%EOF\n".encode())
    return path


def write_large_pptx_direct(path: Path, megabytes: float) -> Path:
    """About ``megabytes`` of a deck: a one-slide deck made by python-pptx (title, four
    bullets) whose slide is then written again and again straight into the zip with new text
    (python-pptx needs many minutes for tens of thousands of slides)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        seed = write_pptx(Path(tmp) / "seed.pptx", [
            {"title": "TITLE-SLOT", "bullets": [f"BULLET-SLOT-{k}" for k in range(4)]}])
        with zipfile.ZipFile(seed) as z:
            parts = {name: z.read(name) for name in z.namelist()}
    slide = parts.pop("ppt/slides/slide1.xml").decode()
    slide_rels = parts.pop("ppt/slides/_rels/slide1.xml.rels")
    pres_rels = parts["ppt/_rels/presentation.xml.rels"].decode()
    [rid] = re.findall(r'Id="(rId\d+)"[^>]*Target="slides/slide1.xml"', pres_rels) or \
        re.findall(r'Target="slides/slide1.xml"[^>]*Id="(rId\d+)"', pres_rels)
    target = int(megabytes * 1024 * 1024)
    count = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        while count == 0 or path.stat().st_size < target:
            for _ in range(200):
                count += 1
                xml = slide.replace("TITLE-SLOT", f"Region {count}")
                for k in range(4):
                    xml = xml.replace(f"BULLET-SLOT-{k}",
                                      html.escape(varied_sentence(count * 4 + k)))
                out.writestr(f"ppt/slides/slide{count}.xml", xml)
                out.writestr(f"ppt/slides/_rels/slide{count}.xml.rels", slide_rels)
            out.fp.flush()  # type: ignore[union-attr]
        ids = "".join(f'<p:sldId id="{256 + i}" r:id="rIdS{i}"/>' for i in range(1, count + 1))
        pres = re.sub(r"<p:sldIdLst>.*?</p:sldIdLst>", f"<p:sldIdLst>{ids}</p:sldIdLst>",
                      parts.pop("ppt/presentation.xml").decode(), flags=re.S)
        rel_type = re.search(r'Type="([^"]+/slide)"', pres_rels).group(1)  # type: ignore[union-attr]
        rels = re.sub(rf'<Relationship[^>]*Id="{rid}"[^>]*/>', "", pres_rels)
        rels = rels.replace("</Relationships>", "".join(
            f'<Relationship Id="rIdS{i}" Type="{rel_type}" Target="slides/slide{i}.xml"/>'
            for i in range(1, count + 1)) + "</Relationships>")
        types = parts.pop("[Content_Types].xml").decode()
        slide_type = re.search(r'PartName="/ppt/slides/slide1.xml" ContentType="([^"]+)"',
                               types).group(1)  # type: ignore[union-attr]
        types = types.replace('<Override PartName="/ppt/slides/slide1.xml" ContentType="'
                              f'{slide_type}"/>', "")
        types = types.replace("</Types>", "".join(
            f'<Override PartName="/ppt/slides/slide{i}.xml" ContentType="{slide_type}"/>'
            for i in range(1, count + 1)) + "</Types>")
        parts.pop("ppt/_rels/presentation.xml.rels")
        out.writestr("ppt/presentation.xml", pres)
        out.writestr("ppt/_rels/presentation.xml.rels", rels)
        out.writestr("[Content_Types].xml", types)
        for name, data in parts.items():
            out.writestr(name, data)
    return path


__all__ = ["FIXED_TIME", "LOREM", "Block", "Bold", "Percent", "Thousands", "normalise_zip",
           "varied_sentence",
           "write_csv", "write_docx", "write_html", "write_large_csv", "write_large_docx",
           "write_large_html", "write_large_pdf", "write_large_pdf_direct", "write_large_pptx",
           "write_large_pptx_direct", "write_large_text",
           "write_large_xlsx", "write_markdown", "write_pdf", "write_pptx",
           "write_scanned_pdf", "write_xlsx"]
