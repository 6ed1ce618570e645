"""`keepstep export --format docx`: Word files with headings, tables, a chart and
footnote-style citations naming source and locator; charts as SVG/PNG in charts.md."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.report.charts import (
    ChartData,
    likelihood_impact,
    make_charts,
    placement,
    price_points,
)

RUNNER = CliRunner()


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docx") / "pack"
    assert invoke("init", root).exit_code == 0
    run = invoke("run", root, "--quiet")
    assert run.exit_code == 0, run.output
    result = invoke("export", root, "--format", "docx", "--format", "pdf")
    assert result.exit_code == 0, result.output
    assert "report.docx" in result.output
    if shutil.which("soffice") is None and shutil.which("libreoffice") is None:
        assert "no PDF: it needs LibreOffice" in result.output
    return root / "deliverables" / "R1"


def test_the_word_report_has_headings_tables_a_chart_and_cited_sources(exported: Path) -> None:
    """report.docx: the Markdown's headings, the risk table with a bold header, the charts
    as pictures, superscript note numbers and a notes section naming source and locator."""
    from docx import Document

    doc = Document(str(exported / "report.docx"))
    headings = [p.text for p in doc.paragraphs if p.style.name.startswith(("Heading", "Title"))]
    assert "Summary" in headings and "Risks" in headings and "Charts" in headings
    assert "Sources and notes" in headings
    risk_table = next(t for t in doc.tables if t.cell(0, 0).text == "Rank")
    assert [c.text for c in risk_table.rows[0].cells] == [
        "Rank", "Risk", "Score (likelihood × impact)", "Evidence"]
    assert all(r.bold for r in risk_table.cell(0, 1).paragraphs[0].runs)
    assert risk_table.cell(1, 0).text == "1"  # a plain rank: R1 would read as a source id
    assert len(doc.inline_shapes) >= 2  # the risk matrix and evidence per group at least
    body = "\n".join(p.text for p in doc.paragraphs)
    assert "[A1-e" not in body  # every citation became a note number
    marks = [r for p in doc.paragraphs for r in p.runs if r.font.superscript]
    assert marks and marks[0].text == "[1]"
    notes_at = headings.index("Sources and notes")
    notes = [p.text for p in doc.paragraphs if p.text.startswith("[1] ")]
    assert notes and notes_at >= 0
    verified = {s for s in ("A1", "A2", "B1", "B2") if f"{s} " in notes[0]}
    assert verified and "“" in notes[0]  # the source's id and title, then the quote


def test_charts_are_written_as_svg_and_png_and_shown_in_markdown(exported: Path) -> None:
    page = (exported / "charts.md").read_text(encoding="utf-8")
    assert "![Risk matrix" in page and "charts/risk-matrix.svg" in page
    for name in ("risk-matrix", "evidence-by-group"):
        assert (exported / "charts" / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        assert (exported / "charts" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    manifest = json.loads((exported / "manifest.json").read_text())
    assert {f["name"] for f in manifest["files"]} >= {"report.md", "evidence-table.csv"}


def test_likelihood_and_impact_put_a_risk_on_its_score_cell() -> None:
    assert likelihood_impact({"score": 12, "evidence_ids": ["a", "b", "c"]}) == (3, 4)
    assert likelihood_impact({"score": 25, "evidence_ids": list("abcdefg")}) == (5, 5)
    assert likelihood_impact({"score": 3, "evidence_ids": []}) == (1, 3)


def test_a_risk_is_placed_by_its_own_figures_else_its_score_else_its_rank() -> None:
    """Issue 23: given likelihood and impact come first; a score is split as before; a
    ranking that gives neither (or a score that is no number) is placed by rank, top highest."""
    assert placement({"likelihood": 2, "impact": 4, "score": 8}, 0, 3) == (2, 4, "given")
    assert placement({"score": 12, "evidence_ids": list("abc")}, 0, 3) == (
        3, 4, "derived from score")
    assert [placement({"title": "x", "score": "high"}, i, 3) for i in range(3)] == [
        (5, 5, "derived from rank"), (3, 3, "derived from rank"), (1, 1, "derived from rank")]
    assert placement({"title": "only one"}, 0, 1) == (5, 5, "derived from rank")


def test_the_risk_matrix_of_a_ranking_without_likelihood_impact_or_score(
        tmp_path: Path) -> None:
    """Issue 23: a ranking that only orders its risks still gets its matrix (not nothing, not
    an error), each risk labelled as derived from rank, in the caption and on the chart."""
    risks = [{"id": "R1", "title": "Importers delay stock"},
             {"id": "R2", "title": "A chain cuts prices", "score": None},
             {"id": "R3", "title": "Rents rise", "likelihood": 2, "impact": 3}]
    charts = make_charts(ChartData(risks=risks), tmp_path)
    [matrix] = [c for c in charts if c.name == "risk-matrix"]
    assert "R1: Importers delay stock (likelihood 5, impact 5, derived from rank)" in \
        matrix.caption
    assert "R2: A chain cuts prices (likelihood 3, impact 3, derived from rank)" in \
        matrix.caption
    assert "R3: Rents rise (likelihood 2, impact 3)" in matrix.caption
    svg = (tmp_path / matrix.svg).read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "derived from rank" in svg
    assert (tmp_path / matrix.png).read_bytes()[:4] == b"\x89PNG"


def test_the_price_ladder_reads_the_figure_a_price_word_leads_to() -> None:
    evidence = [{"id": "A1-e1", "quote": "A unit of 85 square metres costs 2,600 a month."},
                {"id": "A1-e2", "quote": "In 2025 the price fell to 2,100."},
                {"id": "A1-e3", "quote": "Footfall was 8,400."}]
    assert [(v, i) for v, i, _ in price_points(evidence)] == [(2100.0, "A1-e2"),
                                                              (2600.0, "A1-e1")]
