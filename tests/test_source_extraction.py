"""Sources in every format run through a real extract unit (offline model): each evidence
item carries a locator (page, sheet!cells, slide, heading path, row, line) at which its quote
is found verbatim; a figure held only in a table becomes evidence citing that row; verify
keeps the locators; documents can cite them ("A3, p. 4")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.files.convert import convert
from keepstep.engine.kinds.common import cite, cite_source, evidence_index, quote_cited
from tests.support.small_project import PACK, write_config, write_plan
from tests.support.source_files import (
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

RUN = "R"
# The churn rates 6.2% and 4.1% are only in the table.
BLOCKS = [
    ("h", 1, "Pricing study"),
    ("p", "Norvania has 1.9 million metered connections. Most meters are read by hand."),
    ("h", 2, "Pricing"),
    ("p", "The list price is NVK 1,150 per unit."),
    ("h", 3, "Tiers"),
    ("table", [["Tier", "Monthly fee", "Churn"], ["Basic", "NVK 4", "6.2%"],
               ["Premium", "NVK 7", "4.1%"]]),
    ("h", 2, "Outlook"),
    ("p", "Spending grows by 11.5% a year until 2030."),
]


def _write_sources(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True)
    return {
        "P1": write_pdf(folder / "P1-study.pdf", BLOCKS[:4] + [("break",)] + BLOCKS[6:]),
        "W1": write_docx(folder / "W1-study.docx", BLOCKS),
        "X1": write_xlsx(folder / "X1-prices.xlsx", {
            "Prices": [["All prices exclude 25% value added tax."], [],
                       ["Item", "Price (NVK)", "Discount"],
                       ["Clearline meter", Thousands(1150), Percent(0.08)],
                       ["Clearline Pro", Thousands(1420), Percent(0.1)]]}),
        "S1": write_csv(folder / "S1-tiers.csv", [["Tier", "Churn"], ["Basic", "6.2%"],
                                                  ["Premium", "4.1%"]]),
        "K1": write_pptx(folder / "K1-deck.pptx", [
            {"title": "Entry plan", "bullets": ["Target 12% share by 2028."]},
            {"title": "Tier economics", "paragraphs": ["Churn differs by tier."],
             "table": [["Tier", "Churn"], ["Basic", "6.2%"], ["Premium", "4.1%"]]}]),
        "H1": write_html(folder / "H1-page.html", BLOCKS, title="Pricing study"),
        "M1": write_markdown(folder / "M1-notes.md", BLOCKS),
        "T1": _text(folder / "T1-notes.txt"),
    }


def _text(path: Path) -> Path:
    path.write_text("Field notes.\nThe fee is NVK 36 per meter.\n", encoding="utf-8")
    return path


def _project(root: Path) -> tuple[Path, dict[str, Path]]:
    """One source per format, one extract unit each, one verify unit over all of them."""
    files = _write_sources(root / "sources")
    entries = "".join(
        f'[[source]]\nid = "{sid}"\npath = "sources/{p.name}"\ngroup = "{sid}"\n'
        f'title = "{sid}"\napproved = true\n\n' for sid, p in files.items())
    (root / "sources.toml").write_text(entries, encoding="utf-8")
    shutil.copy2(PACK / "contract.md", root / "contract.md")
    units: list[dict[str, Any]] = [
        {"id": f"E-{sid}", "title": f"Extract {sid}", "phase": "extraction", "kind": "extract",
         "inputs": [f"source:{sid}"], "outputs": ["evidence.json"],
         "validators": ["structure", "citations"]} for sid in files]
    units.append({"id": "V", "title": "Verify all", "phase": "verification", "kind": "verify",
                  "inputs": [f"group:{sid}" for sid in files], "outputs": ["verified.json"],
                  "depends_on": [u["id"] for u in units],
                  "validators": ["structure", "citations", "claim_check"],
                  "required_final": True})
    write_plan(root, units, deliverables=[])
    write_config(root, name="formats")
    return root, files


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root, files = _project(tmp_path_factory.mktemp("formats") / "p")
    with open_project(root) as p:
        status = p.start_run(RUN).run()
        run = p.get_run(RUN)
        records = run.facts_records()
        art = p.store.artifacts.root
        evidence = {uid.removeprefix("E-"): json.loads(
            (art / rec.outputs["evidence.json"].path).read_text())["evidence"]
            for uid, rec in records.items() if uid.startswith("E-")}
        verified = json.loads((art / records["V"].outputs["verified.json"].path).read_text())
        facts = {uid: rec.facts for uid, rec in records.items()}
    return {"root": root, "files": files, "status": status, "evidence": evidence,
            "verified": verified, "facts": facts}


def _located(ran: dict[str, Any], sid: str) -> dict[str, str]:
    return {e["quote"]: e.get("locator", "") for e in ran["evidence"][sid]}


def test_every_format_runs_to_done_with_citations_at_their_locators(ran: dict[str, Any]) -> None:
    """All eight extract units and the verify unit succeed; every item's quote is verbatim at
    its locator in the converted text (checked again here, outside the kind)."""
    assert ran["status"].decision == "done", ran["status"].reasons
    assert sorted(ran["evidence"]) == sorted(ran["files"])
    for sid, path in ran["files"].items():
        conv = convert(path)
        items = ran["evidence"][sid]
        assert items, sid
        for e in items:
            assert e["locator"], (sid, e)
            assert quote_cited(conv, e["quote"], e["locator"]), (sid, e)
            assert all(str(f) in e["quote"] for f in e["figures"])


def test_locators_name_page_cells_slide_heading_row_and_line(ran: dict[str, Any]) -> None:
    """Each format cites the way its reader looks things up."""
    assert _located(ran, "P1")["Spending grows by 11.5% a year until 2030."] == "p. 2"
    assert _located(ran, "P1")["The list price is NVK 1,150 per unit."] == "p. 1"
    assert _located(ran, "W1")["The list price is NVK 1,150 per unit."] == "Pricing"
    assert _located(ran, "H1")["Spending grows by 11.5% a year until 2030."] == "Outlook"
    assert _located(ran, "X1")["Clearline Pro | 1,420 | 10%"] == "Prices!A5:C5"
    assert _located(ran, "X1")["All prices exclude 25% value added tax."] == "Prices!A1"
    assert _located(ran, "S1")["Premium | 4.1%"] == "row 3"
    assert _located(ran, "K1")["Target 12% share by 2028."] == "slide 1"
    assert _located(ran, "K1")["Premium | 4.1%"] == "slide 2, table 1, row 2"
    assert _located(ran, "T1")["The fee is NVK 36 per meter."] == "line 2"


@pytest.mark.parametrize("sid", ["W1", "H1", "M1"])
def test_a_figure_found_only_in_a_table_becomes_evidence_citing_its_row(
        ran: dict[str, Any], sid: str) -> None:
    """Premium's 4.1% churn is in no sentence, only in the tier table: it is an evidence item
    whose quote is the row, whose figures come from it and whose locator is that row."""
    conv = convert(ran["files"][sid])
    prose = "\n".join(line for line in conv.text.splitlines() if not line.startswith("|"))
    assert "4.1%" not in prose
    [item] = [e for e in ran["evidence"][sid] if "4.1%" in e["figures"]]
    assert item["quote"] == "Premium | NVK 7 | 4.1%"
    assert item["figures"] == ["7", "4.1%"]
    assert item["locator"] == "Pricing > Tiers, table 1, row 2"
    assert conv.text_at(item["locator"]) == "| Premium | NVK 7 | 4.1% |"
    assert ran["facts"][f"E-{sid}"]["table_rows"] == 2


def test_verify_keeps_the_locators_and_supports_table_rows(ran: dict[str, Any]) -> None:
    """The verify unit checks every item (rows too) and keeps its locator for the documents."""
    verified = ran["verified"]
    extracted = sum(len(items) for items in ran["evidence"].values())
    assert verified["checked"] == extracted and not verified["rejected"]
    by_id = {e["id"]: e for e in verified["evidence"]}
    [row] = [e for e in by_id.values() if e["source_id"] == "X1" and "10%" in e["figures"]]
    assert row["locator"] == "Prices!A5:C5"
    assert ran["facts"]["E-X1"]["formats"] == ["xlsx"]


def test_documents_can_cite_evidence_with_its_locator(ran: dict[str, Any]) -> None:
    """cite(locators=True) names source and place ("P1, p. 2"), parsed back by the audit's
    helpers; cite_source alone gives "A3, p. 4"."""
    from keepstep.engine.kinds.common import cited_evidence_ids, cited_source_ids

    verified = ran["verified"]["evidence"]
    index = evidence_index(verified)
    spend = next(e["id"] for e in verified if e["source_id"] == "P1" and "11.5%" in e["figures"])
    churn = next(e["id"] for e in verified if e["source_id"] == "S1" and "4.1%" in e["figures"])
    text = f"Spending grows and churn differs {cite([spend, churn], index, locators=True)}."
    assert f"({cite_source('P1', 'p. 2')}; {cite_source('S1', 'row 3')})" in text
    assert "(P1, p. 2; S1, row 3)" in text
    assert cited_evidence_ids(text) == {spend, churn}
    assert cited_source_ids(text) == {"P1", "S1"}
    assert cite_source("A3") == "A3"


def test_the_database_holds_hashes_not_source_text(ran: dict[str, Any]) -> None:
    """The input snapshot keeps each source's sha256 only; converted text lives in the
    conversion cache (0700), not in the database."""
    root = ran["root"]
    db = (root / ".keepstep" / "state.db").read_bytes()
    assert b"Spending grows by 11.5% a year" not in db
    assert b"Clearline Pro" not in db
    cache = root / ".keepstep" / "converted"
    assert len(list(cache.glob("*.md"))) == len(ran["files"])
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in cache.iterdir())
