"""engine.sources.add_source: the checks and the copy into sources/ that the CLI and TUI share."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from keepstep.engine import SourceError
from keepstep.engine.files.sources import add_source

SOURCES_TOML = """
[[source]]
id = "A1"
path = "sources/A1-overview.md"
group = "A"
title = "Overview"
approved = true
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project folder holding only what add_source reads: sources.toml and one source."""
    root = tmp_path / "proj"
    (root / "sources").mkdir(parents=True)
    (root / "sources" / "A1-overview.md").write_text("# Overview\n", encoding="utf-8")
    (root / "sources.toml").write_text(SOURCES_TOML, encoding="utf-8")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A document outside the project folder."""
    doc = tmp_path / "elsewhere" / "C1-notes.md"
    doc.parent.mkdir()
    doc.write_text("# Notes\n\nThe bakery sold 120 loaves on 3 May 2025.\n", encoding="utf-8")
    return doc


def recorded(root: Path) -> dict[str, dict]:
    data = tomllib.loads((root / "sources.toml").read_text(encoding="utf-8"))
    return {s["id"]: s for s in data["source"]}


def test_an_outside_file_is_copied_into_sources_and_recorded_unapproved(
        root: Path, outside: Path) -> None:
    """A file outside the project is copied to sources/<name>; the entry is not approved."""
    entry = add_source(root, outside, source_id="C1", group="C")
    copy = root / "sources" / "C1-notes.md"
    assert copy.read_bytes() == outside.read_bytes()
    assert entry.path == "sources/C1-notes.md" and entry.title == "C1-notes"
    assert recorded(root)["C1"] == {"id": "C1", "path": "sources/C1-notes.md", "group": "C",
                                    "title": "C1-notes", "kind": "", "approved": False}


def test_the_approved_flag_title_and_kind_are_recorded(root: Path, outside: Path) -> None:
    """approved=True, a title and a kind go into sources.toml as given."""
    entry = add_source(root, outside, source_id="C1", group="C", title="Bakery notes",
                       kind="field notes", approved=True)
    assert entry.approved is True
    saved = recorded(root)["C1"]
    assert saved["approved"] is True
    assert saved["title"] == "Bakery notes" and saved["kind"] == "field notes"


def test_a_file_inside_the_project_is_recorded_where_it_is(root: Path) -> None:
    """A file already in the project is not copied; its path is recorded relative to root."""
    doc = root / "notes" / "B1.md"
    doc.parent.mkdir()
    doc.write_text("# B1\n", encoding="utf-8")
    entry = add_source(root, doc, source_id="B1", group="B")
    assert entry.path == "notes/B1.md"
    assert not (root / "sources" / "B1.md").exists()


def test_a_duplicate_id_is_refused_and_nothing_is_written(root: Path, outside: Path) -> None:
    """An id already in sources.toml raises SourceError; neither file nor entry is added."""
    before = (root / "sources.toml").read_bytes()
    with pytest.raises(SourceError, match="'A1' is already used"):
        add_source(root, outside, source_id="A1", group="C")
    assert (root / "sources.toml").read_bytes() == before
    assert not (root / "sources" / "C1-notes.md").exists()


def test_a_missing_file_is_refused(root: Path, tmp_path: Path) -> None:
    """A path that does not exist raises SourceError naming it."""
    missing = tmp_path / "nowhere.md"
    with pytest.raises(SourceError, match="nowhere.md does not exist"):
        add_source(root, missing, source_id="C1", group="C")
    assert "C1" not in recorded(root)


def test_a_folder_or_binary_file_is_refused(root: Path, tmp_path: Path) -> None:
    """A folder is not a file; bytes that are not text in their encoding are not a source."""
    with pytest.raises(SourceError, match="is not a file"):
        add_source(root, tmp_path, source_id="C1", group="C")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SourceError, match="not valid UTF-16 text") as caught:
        add_source(root, blob, source_id="C1", group="C")
    assert "save it as UTF-8" in caught.value.hint
    latin = tmp_path / "notes.md"
    latin.write_bytes(b"Prices rose 4\xa0% in 2024.\n")
    with pytest.raises(SourceError, match="not valid UTF-8 text"):
        add_source(root, latin, source_id="C1", group="C")
    assert "C1" not in recorded(root)


def test_a_document_format_is_added_as_it_is(root: Path, tmp_path: Path) -> None:
    """A PDF (or DOCX, XLSX, PPTX, HTML, CSV) is copied byte for byte and recorded: its
    identity stays its own bytes; the converted text lives only in the conversion cache."""
    from tests.support.source_files import write_pdf

    doc = write_pdf(tmp_path / "R1-report.pdf", [("p", "Crews fitted 640 meters in 2024.")])
    entry = add_source(root, doc, source_id="R1", group="R")
    assert entry.path == "sources/R1-report.pdf"
    assert (root / entry.path).read_bytes() == doc.read_bytes()
    cached = sorted(p.suffix for p in (root / ".keepstep" / "converted").iterdir())
    assert cached == [".json", ".md"]
    assert oct((root / ".keepstep").stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("bad", ["", "C 1", "source:C1", "-C1", "C1/x"])
def test_ids_with_spaces_colons_or_slashes_are_refused(root: Path, outside: Path,
                                                       bad: str) -> None:
    """An id must fit in a plan input such as source:ID: letters, digits, _ - . only."""
    with pytest.raises(SourceError, match="source id .* is not allowed") as info:
        add_source(root, outside, source_id=bad, group="C")
    assert "letters, digits" in info.value.hint


def test_a_bad_group_is_refused_and_an_empty_group_is_allowed(root: Path, outside: Path) -> None:
    """A group with a space is refused; no group at all is fine (as with the CLI)."""
    with pytest.raises(SourceError, match="group 'C group' is not allowed"):
        add_source(root, outside, source_id="C1", group="C group")
    assert add_source(root, outside, source_id="C1", group="").group == ""


def test_an_existing_different_copy_is_never_overwritten(root: Path, outside: Path) -> None:
    """sources/<name> with other bytes stays as it is; SourceError says what to do."""
    clash = root / "sources" / outside.name
    clash.write_text("someone else's notes\n", encoding="utf-8")
    with pytest.raises(SourceError, match="already exists with different content"):
        add_source(root, outside, source_id="C1", group="C")
    assert clash.read_text(encoding="utf-8") == "someone else's notes\n"
    assert "C1" not in recorded(root)


def test_an_existing_identical_copy_is_reused(root: Path, outside: Path) -> None:
    """The same bytes already in sources/ are recorded without complaint."""
    (root / "sources" / outside.name).write_bytes(outside.read_bytes())
    entry = add_source(root, outside, source_id="C1", group="C")
    assert entry.path == "sources/C1-notes.md"
