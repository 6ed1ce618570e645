"""Each source format converts to Markdown that keeps headings, lists and tables, with the
locators a citation carries (page, sheet + cells, slide, heading path, row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.files.convert import (
    FORMATS,
    convert,
    converter_versions,
    detect_format,
    find_quote,
    inspect_source,
    quote_at,
    table_rows,
)
from tests.support.source_files import (
    Bold,
    Percent,
    Thousands,
    write_csv,
    write_docx,
    write_html,
    write_markdown,
    write_pdf,
    write_pptx,
    write_xlsx,
)

BLOCKS = [
    ("h", 1, "Pricing study"),
    ("p", "Norvania has 1.9 million metered connections. Most meters are read by hand."),
    ("h", 2, "Pricing"),
    ("p", "The list price is NVK 1,150 per unit."),
    ("li", "Volume discount of 8% for orders above 20,000 meters."),
    ("li", "Installation is quoted separately."),
    ("h", 3, "Tiers"),
    ("table", [["Tier", "Monthly fee", "Churn"], ["Basic", "NVK 4", "6.2%"],
               ["Premium", "NVK 7", "4.1%"]]),
    ("h", 2, "Outlook"),
    ("p", "Spending grows by 11.5% a year until 2030."),
]


def _sentences_survive(text: str) -> None:
    for sentence in ("Norvania has 1.9 million metered connections.",
                     "The list price is NVK 1,150 per unit.",
                     "Volume discount of 8% for orders above 20,000 meters.",
                     "Spending grows by 11.5% a year until 2030."):
        assert sentence in text


@pytest.mark.parametrize("writer,name", [(write_docx, "notes.docx"), (write_html, "page.html"),
                                         (write_markdown, "notes.md")])
def test_heading_formats_keep_structure_and_heading_paths(tmp_path: Path, writer, name) -> None:
    """DOCX, HTML and Markdown keep headings, bullets and the table; locators are paths."""
    conv = convert(writer(tmp_path / name, BLOCKS))
    _sentences_survive(conv.text)
    assert "## Pricing\n" in conv.text and "### Tiers\n" in conv.text
    assert "- Volume discount of 8% for orders above 20,000 meters.\n" in conv.text
    assert "| Tier | Monthly fee | Churn |\n| --- | --- | --- |\n" in conv.text
    assert "| Premium | NVK 7 | 4.1% |" in conv.text
    assert find_quote(conv, "NVK 1,150 per unit") == "Pricing"
    assert find_quote(conv, "grows by 11.5%") == "Outlook"
    assert find_quote(conv, "Premium | NVK 7 | 4.1%") == "Pricing > Tiers, table 1, row 2"
    assert quote_at(conv, "Pricing", "Premium NVK 7 4.1%")  # a section holds its sub-sections
    assert not quote_at(conv, "Outlook", "NVK 1,150 per unit")


def test_html_drops_scripts_styles_and_head(tmp_path: Path) -> None:
    """A saved page's script, style and title never reach the converted text."""
    conv = convert(write_html(tmp_path / "p.html", BLOCKS, title="Browser tab title"))
    assert "analytics" not in conv.text and "font-family" not in conv.text
    assert "Browser tab title" not in conv.text


def test_pdf_pages_headings_and_bullets(tmp_path: Path) -> None:
    """A PDF keeps headings (from font size) and bullets; a quote on page 2 is at "p. 2"."""
    blocks = BLOCKS[:6] + [("break",)] + BLOCKS[8:]
    conv = convert(write_pdf(tmp_path / "report.pdf", blocks))
    assert conv.format == "pdf" and conv.pages == 2
    _sentences_survive(conv.text)
    assert conv.text.startswith("# Pricing study\n")
    assert "\n## Pricing\n" in conv.text and "\n## Outlook\n" in conv.text
    assert "- Volume discount of 8% for orders above 20,000 meters.\n" in conv.text
    assert find_quote(conv, "Spending grows by 11.5% a year until 2030.") == "p. 2"
    assert find_quote(conv, "NVK 1,150 per unit") == "p. 1"
    assert quote_at(conv, "p. 2", "grows by 11.5%")
    assert not quote_at(conv, "p. 1", "grows by 11.5%")
    assert "grows by 11.5%" in conv.text_at("p. 2")


def test_pdf_paragraph_wrapped_over_lines_stays_one_sentence(tmp_path: Path) -> None:
    """A long sentence wrapped over several PDF lines comes back as one line of prose."""
    long = ("Utilities in the capital region plan to replace 180,000 mechanical meters with "
            "smart meters between 2026 and 2029, with most of the volume in the second half "
            "of the period, once the new framework contracts are signed.")
    conv = convert(write_pdf(tmp_path / "wrap.pdf", [("p", long), ("p", "Next one.")]))
    assert long in conv.text


def test_xlsx_cells_sheets_and_ranges(tmp_path: Path) -> None:
    """A workbook: one section per sheet, tables with cell-range locators, prose cells."""
    path = write_xlsx(tmp_path / "prices.xlsx", {
        "Prices": [[Bold("Clearline price list")],
                   ["All prices exclude installation and 25% value added tax."], [],
                   ["Item", "Price (NVK)", "Discount"],
                   ["Clearline meter", Thousands(1150), Percent(0.08)],
                   ["Clearline Pro", Thousands(1420), Percent(0.1)]],
        "Volume tiers": [["Tier", "Minimum order"], ["Framework", Thousands(50000)]],
    })
    conv = convert(path)
    assert conv.format == "xlsx" and conv.sheets == ["Prices", "Volume tiers"]
    assert "## Prices\n" in conv.text and "### Clearline price list\n" in conv.text
    assert "| Clearline meter | 1,150 | 8% |" in conv.text
    assert find_quote(conv, "Clearline Pro | 1,420 | 10%") == "Prices!A6:C6"
    assert find_quote(conv, "exclude installation and 25% value added tax") == "Prices!A2"
    assert find_quote(conv, "Framework 50,000") == "'Volume tiers'!A2:B2"
    assert conv.text_at("Prices!A5:C5") == "| Clearline meter | 1,150 | 8% |"
    assert quote_at(conv, "Prices", "Clearline meter 1,150")
    assert not quote_at(conv, "Prices!A5:C5", "1,420")


def test_csv_is_one_table_with_row_numbers(tmp_path: Path) -> None:
    """A CSV is one table; row 1 is its header, so the second data row is "row 3"."""
    conv = convert(write_csv(tmp_path / "tiers.csv", [["Tier", "Churn"], ["Basic", "6.2%"],
                                                      ["Premium", "4.1%"]]))
    assert conv.format == "csv" and conv.sheets == ["tiers"]
    assert conv.text.startswith("| Tier | Churn |\n| --- | --- |\n| Basic | 6.2% |\n")
    assert find_quote(conv, "Premium 4.1%") == "row 3"
    assert conv.text_at("row 1") == "| Tier | Churn |"


def test_pptx_slides_bullets_tables_and_notes(tmp_path: Path) -> None:
    """A deck: one section per slide with its title; tables and speaker notes are kept."""
    path = write_pptx(tmp_path / "deck.pptx", [
        {"title": "Entry plan", "bullets": ["Target 12% share by 2028.", ("Start in 2 regions",
                                                                           1)],
         "notes": "Board asked for a 3-year view."},
        {"title": "Tier economics", "paragraphs": ["Churn differs by tier."],
         "table": [["Tier", "Churn"], ["Basic", "6.2%"], ["Premium", "4.1%"]]},
    ])
    conv = convert(path)
    assert conv.format == "pptx" and conv.slides == 2
    assert "## Slide 1: Entry plan\n" in conv.text
    assert "- Target 12% share by 2028.\n  - Start in 2 regions\n" in conv.text
    assert "Board asked for a 3-year view." in conv.text
    assert find_quote(conv, "Target 12% share") == "slide 1"
    assert find_quote(conv, "Churn differs by tier.") == "slide 2"
    assert find_quote(conv, "Premium 4.1%") == "slide 2, table 1, row 2"
    assert quote_at(conv, "slide 2", "Premium | 4.1%")
    assert not quote_at(conv, "slide 1", "Premium | 4.1%")


def test_plain_text_lines_are_located(tmp_path: Path) -> None:
    """Plain text stays as written (CRLF normalised) and is located by line."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"First line.\r\nThe fee is NVK 36 per meter.\r\n")
    conv = convert(path)
    assert conv.text == "First line.\nThe fee is NVK 36 per meter.\n"
    assert find_quote(conv, "NVK 36 per meter") == "line 2"
    assert conv.text_at("line 1") == "First line."


def test_markdown_title_is_left_out_of_heading_paths(tmp_path: Path) -> None:
    """The one level-1 title is implied: paths start below it; its own section keeps it."""
    conv = convert(write_markdown(tmp_path / "a.md", BLOCKS))
    locators = [s.locator for s in conv.segments if s.kind == "section"]
    assert locators == ["Pricing study", "Pricing", "Pricing > Tiers", "Outlook"]
    assert find_quote(conv, "1.9 million metered connections") == "Pricing study"


@pytest.mark.parametrize("name,fmt", [("a.pdf", "pdf"), ("a.docx", "docx"), ("a.xlsx", "xlsx"),
                                      ("a.pptx", "pptx"), ("a.html", "html"), ("a.csv", "csv"),
                                      ("a.md", "md"), ("a.txt", "txt")])
def test_detect_format_by_magic_then_extension(tmp_path: Path, name: str, fmt: str) -> None:
    """Office files are told apart by their parts, PDF by its header, text by extension."""
    writers = {"pdf": lambda p: write_pdf(p, BLOCKS), "docx": lambda p: write_docx(p, BLOCKS),
               "xlsx": lambda p: write_xlsx(p, {"S": [["a", "b"], [1, 2]]}),
               "pptx": lambda p: write_pptx(p, [{"title": "T"}]),
               "html": lambda p: write_html(p, BLOCKS),
               "csv": lambda p: write_csv(p, [["a", "b"]]),
               "md": lambda p: write_markdown(p, BLOCKS),
               "txt": lambda p: p.write_text("hello\n") and p}
    path = writers[fmt](tmp_path / name)
    assert detect_format(path) == fmt
    renamed = path.rename(tmp_path / "no-extension")
    expected = {"csv": "txt", "md": "txt"}.get(fmt, fmt)  # text without extension is text
    assert detect_format(renamed) == expected


def test_converter_versions_name_library_and_revision() -> None:
    """Every format has a "<library>-<version>+keepstep-<n>" converter version."""
    versions = converter_versions()
    assert set(versions) == set(FORMATS)
    assert versions["pdf"].startswith("pypdf-") and versions["xlsx"].startswith("openpyxl-")
    assert all("+keepstep-" in v for v in versions.values())


def test_inspect_source_shows_type_structure_and_preview(tmp_path: Path) -> None:
    """inspect_source gives the detected type, page count and a short text preview."""
    path = write_pdf(tmp_path / "r.pdf", BLOCKS[:6] + [("break",)] + BLOCKS[8:])
    info = inspect_source(path)
    assert (info.format, info.media_type, info.pages) == ("pdf", "application/pdf", 2)
    assert info.size_bytes == path.stat().st_size
    assert info.preview.startswith("# Pricing study") and len(info.preview) <= 602
    assert info.converter == "pypdf" and info.converter_version.startswith("pypdf-")


def test_table_rows_carry_header_and_locator(tmp_path: Path) -> None:
    """table_rows lists each data row with its header cells, so a row's figure has a name."""
    conv = convert(write_docx(tmp_path / "t.docx", BLOCKS))
    rows = table_rows(conv)
    assert [r.cells for r in rows] == [["Basic", "NVK 4", "6.2%"], ["Premium", "NVK 7", "4.1%"]]
    premium = rows[1]
    assert premium.header == ["Tier", "Monthly fee", "Churn"]
    assert premium.locator == "Pricing > Tiers, table 1, row 2"
    assert ("Churn", "4.1%") in premium.pairs()
    assert quote_at(conv, premium.locator, premium.quote)
