"""The sample pack's format sources (in sample_projects/market-entry/sources/) are what the
generator makes, and convert back with every figure sentence of their Markdown originals
(sample_projects/tools/originals/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from keepstep.engine.files.convert import convert, find_quote, quote_at, table_rows

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "sample_projects" / "tools" / "make_format_sources.py"
COMMITTED = REPO / "sample_projects" / "market-entry" / "sources"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("make_format_sources", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_is_deterministic_and_matches_the_committed_files(tool,
                                                                    tmp_path: Path) -> None:
    """Two runs write identical bytes, converting to the committed files' text.

    (Text, not bytes, against the committed files: a newer writer library may lay out the
    same content differently; the bytes of one library version are compared run to run.)
    """
    first = tool.generate(tmp_path / "one")
    second = tool.generate(tmp_path / "two")
    assert all((COMMITTED / p.name).is_file() for p in first.values())
    assert not any((COMMITTED / name).exists() for name in first)  # no Markdown twin left
    for name, path in first.items():
        assert path.read_bytes() == second[name].read_bytes(), path.name
        assert convert(path).text == convert(COMMITTED / path.name).text, path.name


def test_every_figure_sentence_survives_conversion(tool) -> None:
    """Each converted file yields exactly its original's figure sentences, in order."""
    written = {name: COMMITTED / (name.removesuffix(".md") + "." + fmt)
               for name, fmt in _FORMATS.items()}
    assert tool.check(written) == []


_FORMATS = {"A1-market-overview.md": "pdf", "D1-interview-ostmark.md": "docx",
            "E1-brightwell-price-list.md": "xlsx", "L3-pilot-proposal.md": "pptx",
            "C1-aquilon-product-page.md": "html"}


def test_table_only_figure_is_a_located_table_row() -> None:
    """The XLSX's 12% Framework discount is only in a table row, found with its cell range."""
    conv = convert(COMMITTED / "E1-brightwell-price-list.xlsx")
    rows = [r for r in table_rows(conv) if "12%" in r.cells]
    assert len(rows) == 1
    row = rows[0]
    assert row.locator == "'Volume tiers'!A6:C6"
    assert row.pairs() == [("Tier", "Framework"), ("Minimum order (meters)", "50,000"),
                           ("Discount", "12%")]
    assert quote_at(conv, row.locator, row.quote)
    prose = "\n".join(line for line in conv.text.splitlines() if not line.startswith("|"))
    assert "12%" not in prose


def test_sample_locators_read_as_citations() -> None:
    """Figures in the samples cite a page, a heading path, a cell and a slide."""
    cases = {
        "A1-market-overview.pdf": ("compound annual growth rate of 11.5%", "p. 2"),
        "D1-interview-ostmark.docx": ("tender the next 180,000 meters in 2026", "Key points"),
        "E1-brightwell-price-list.xlsx": ("NVK 1,150 per unit", "'Price list'!A4"),
        "L3-pilot-proposal.pptx": ("Estimated cost to Brightwell is NVK 1.6 million",
                                   "slide 2"),
        "C1-aquilon-product-page.html": ("16 years at standard reading intervals",
                                         "Trusted by utilities since 1987"),
    }
    for name, (quote, locator) in cases.items():
        conv = convert(COMMITTED / name)
        assert find_quote(conv, quote) == locator, name
        assert quote_at(conv, locator, quote), name
