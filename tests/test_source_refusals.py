"""A source file that cannot be read is refused with a message naming it and what to do —
at `sources add` (engine and CLI, nothing written), at `validate`, and when a run starts
(no run is created, no unit claimed) — never a crash or a unit left running mid-run."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine import SourceError
from keepstep.engine.api import open_project
from keepstep.engine.files.sources import add_source
from tests.support.small_project import extract_only_units, make_small_project, write_config
from tests.support.source_files import write_pdf, write_scanned_pdf

RUNNER = CliRunner()
RUN = "R"


def _scanned(folder: Path) -> Path:
    return write_scanned_pdf(folder / "scan.pdf")


def _encrypted(folder: Path) -> Path:
    return write_pdf(folder / "locked.pdf", [("p", "The secret figure is 42.")],
                     encrypt_password="s3cret")


def _empty(folder: Path) -> Path:
    path = folder / "empty.md"
    path.write_bytes(b"")
    return path


def _too_large(folder: Path) -> Path:
    path = folder / "large.txt"
    path.write_text("The meter count grew by 4% in 2024.\n" * 40_000)  # ~1.4 MB > 1 MB
    return path


def _unsupported(folder: Path) -> Path:
    path = folder / "chart.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 200)
    return path


def _undecodable(folder: Path) -> Path:
    path = folder / "latin1.md"
    path.write_bytes("# Prices\n\nThe meter costs 120 \u20ac.\n".encode("cp1252"))
    return path


# (maker, what the message says, what the hint says)
CASES: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "scanned PDF": (_scanned, "has no text layer", "OCR it"),
    "encrypted PDF": (_encrypted, "is an encrypted (password-protected) PDF",
                      "remove the password"),
    "empty file": (_empty, "is empty (0 bytes)", "export it again"),
    "over max_source_mb": (_too_large, "over the 1.0 MB limit", "raise `max_source_mb`"),
    "unsupported type": (_unsupported, "is a PNG image, which keepstep cannot read",
                         "export it as PDF, DOCX, XLSX, CSV, PPTX, HTML, TXT or MD"),
    "undecodable text": (_undecodable, "is not valid UTF-8 text", "save it as UTF-8"),
}


def _invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """Two approved sources (A1 a PDF, B1 Markdown), one extract unit, a 1 MB source limit."""
    root = make_small_project(tmp_path / "p", per_group=1, units=extract_only_units(2))
    write_config(root, max_source_mb=1)
    return root


def _listed(root: Path) -> list[dict]:
    return tomllib.loads((root / "sources.toml").read_text(encoding="utf-8"))["source"]


def _swap_in(root: Path, source_id: str, bad: Path) -> None:
    """Make the approved source ``source_id`` the bad file (its own name in sources/)."""
    target = root / "sources" / bad.name
    target.write_bytes(bad.read_bytes())
    text = (root / "sources.toml").read_text(encoding="utf-8")
    old = next(s["path"] for s in _listed(root) if s["id"] == source_id)
    (root / "sources.toml").write_text(text.replace(old, f"sources/{bad.name}"),
                                       encoding="utf-8")


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_file_is_refused_at_add_with_nothing_written(project: Path, tmp_path: Path,
                                                           case: str) -> None:
    """add_source and `keepstep sources add` refuse it, naming the file and what to do; the
    file is not copied and sources.toml is unchanged."""
    make, says, hint = CASES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    bad = make(outside)
    before = (project / "sources.toml").read_bytes()
    with pytest.raises(SourceError) as caught:
        add_source(project, bad, source_id="Z1", group="Z")
    assert str(bad) in str(caught.value) and says in str(caught.value)
    assert hint in caught.value.hint
    result = _invoke("sources", project, "add", bad, "--id", "Z1", "--group", "Z")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert says in result.output and hint in result.output
    assert (project / "sources.toml").read_bytes() == before
    assert not (project / "sources" / bad.name).exists()


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_approved_file_fails_validate_and_no_run_starts(project: Path, tmp_path: Path,
                                                              case: str) -> None:
    """`validate` names the source, the file and what to do (exit 2); starting a run raises
    the same refusal before the run exists, so no unit is ever claimed."""
    make, says, hint = CASES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    _swap_in(project, "B1", make(outside))
    result = _invoke("validate", project)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = next(x for x in result.output.splitlines() if x.startswith("error: source B1"))
    assert says in line and "sources/" in line
    assert hint in result.output and "1 source problem(s) above" in result.output

    with open_project(project) as p:
        with pytest.raises(SourceError) as caught:
            p.start_run(RUN)
        assert "source B1" in str(caught.value) and says in str(caught.value)
        assert "nothing was started" in str(caught.value)
        assert not p.store.run_exists(RUN)

    result = _invoke("run", project, "--run", RUN, "--quiet")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and says in result.output


def test_an_unapproved_bad_file_is_a_warning_in_validate(project: Path, tmp_path: Path) -> None:
    """A listed source that is not approved cannot reach a unit: validate warns, passes."""
    bad = _unsupported(tmp_path)
    _swap_in(project, "B1", bad)
    text = (project / "sources.toml").read_text(encoding="utf-8")
    head, _, tail = text.partition('id = "B1"')
    (project / "sources.toml").write_text(
        head + 'id = "B1"' + tail.replace("approved = true", "approved = false", 1),
        encoding="utf-8")
    (project / "plan.toml").write_text((project / "plan.toml").read_text().replace(
        '"group:B"', '"group:A"'), encoding="utf-8")
    result = _invoke("validate", project)
    assert result.exit_code == 0, result.output
    assert "warning: (not approved) source B1" in result.output
    assert "plan OK" in result.output


def test_approving_a_bad_listed_file_is_refused(project: Path, tmp_path: Path) -> None:
    """`sources approve` converts the file first: one that yields no text stays unapproved."""
    _swap_in(project, "B1", _scanned(tmp_path))
    assert _invoke("sources", project, "revoke", "B1").exit_code == 0
    result = _invoke("sources", project, "approve", "B1")
    assert result.exit_code == 2, result.output
    assert "has no text layer" in result.output and "OCR it" in result.output
    assert next(s for s in _listed(project) if s["id"] == "B1")["approved"] is False


def test_a_good_file_is_added_after_its_type_and_preview_are_shown(project: Path,
                                                                   tmp_path: Path) -> None:
    """`sources add` of a PDF shows the detected type, its pages and a text preview, then
    records it unapproved; --dry-run shows the same and adds nothing."""
    doc = write_pdf(tmp_path / "Z1-report.pdf",
                    [("h", 1, "Field report"), ("p", "Crews fitted 640 meters in March."),
                     ("break",), ("p", "Rework fell to 3% of visits.")])
    dry = _invoke("sources", project, "add", doc, "--id", "Z1", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "detected: PDF document (PDF), 2 pages" in dry.output
    assert "| Crews fitted 640 meters in March." in dry.output
    assert "nothing added" in dry.output and "Z1" not in {s["id"] for s in _listed(project)}
    result = _invoke("sources", project, "add", doc, "--id", "Z1", "--group", "Z")
    assert result.exit_code == 0, result.output
    assert "detected: PDF document (PDF), 2 pages" in result.output
    assert "source Z1 added (sources/Z1-report.pdf" in result.output
    entry = next(s for s in _listed(project) if s["id"] == "Z1")
    assert entry["approved"] is False
    listing = _invoke("sources", project, "list")
    row = next(line for line in listing.output.splitlines() if line.startswith("Z1"))
    assert " PDF " in row
