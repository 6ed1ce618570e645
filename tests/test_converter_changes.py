"""A converter upgrade is a typed `tool` change: it reaches exactly the units that read
converted text from sources of the affected format (extract and verify units through their
source:/group: inputs), explained like every change; other formats and other units are
reused, and a change no source needs is recorded without invalidating anything."""

from __future__ import annotations

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.core.changes import (
    ChangeKind,
    converted_refs,
    converter_changes,
)
from keepstep.engine.core.invalidation import invalidate
from keepstep.engine.core.plan import EdgeType
from keepstep.engine.core.state import UnitRecord, UnitState
from keepstep.engine.files.convert import conversion
from keepstep.engine.files.project import load_project_files
from tests.support.small_project import PACK, make_small_project

RUN = "R"
OLD = {"converter:pdf": "pypdf-6.0.0+keepstep-1", "converter:md": "python-3.11+keepstep-1",
       "converter:xlsx": "openpyxl-3.1.5+keepstep-1"}


def _formats() -> tuple[dict[str, str], dict[str, str]]:
    files = load_project_files(PACK)
    return files.source_formats(), {s.id: s.group for s in files.sources.sources}


def test_a_changed_converter_version_is_a_tool_change_naming_its_sources() -> None:
    """Only a version recorded on both sides and different is a change; it names the
    approved sources of that format and their groups, and is labelled content."""
    formats, groups = _formats()
    new = {**OLD, "converter:pdf": "pypdf-6.1.0+keepstep-1", "converter:pptx": "x"}
    [change] = converter_changes(OLD, new, formats, groups)
    assert change.kind == ChangeKind.tool and change.origin == "converter:pdf"
    assert change.edge == EdgeType.content and change.plan_level and not change.cosmetic
    assert change.sources == ["A1"] and change.groups == ["A"]
    assert change.detail == ("converter for PDF changed (pypdf-6.0.0+keepstep-1 → "
                             "pypdf-6.1.0+keepstep-1): A1 converted again")
    assert converter_changes(OLD, dict(OLD), formats, groups) == []


def test_a_tool_change_reaches_exactly_the_readers_of_converted_text() -> None:
    """In ME-042, a PDF converter change reaches E01 (U05, extraction of group A) and V01
    (U17, verification of groups A + B) directly — not U01, which inventories group A
    without reading its text — and everything else only through their edges."""
    files = load_project_files(PACK)
    formats, groups = _formats()
    new = {**OLD, "converter:pdf": "pypdf-6.1.0+keepstep-1"}
    changes = converter_changes(OLD, new, formats, groups)
    records = {u.id: UnitRecord(state=UnitState.succeeded, attempt=f"{u.id}/a1")
               for u in files.plan.units}
    result = invalidate(files.plan, changes, records)
    direct = sorted(uid for uid, exps in result.affected.items()
                    if any(len(e.path) == 1 and e.path[0].source == "converter:pdf"
                           for e in exps))
    assert direct == ["U05", "U17"]
    assert "U01" not in result.affected and "U06" in result.reused
    assert converted_refs(files.plan.unit_map()["U01"]) == []
    [why] = result.affected["U05"]
    assert why.change_kind == "tool" and why.origin == "converter:pdf"
    assert why.render().startswith("tool: converter:pdf → [content] U05 (converter for PDF")
    # Every other reached unit got there through an edge from U05 or U17.
    others = [u for u in result.affected if u not in ("U05", "U17")]
    assert others and all(e.path[0].target in ("unit:U05", "unit:U17")
                          for u in others for e in result.affected[u])


def test_a_change_no_source_needs_is_recorded_and_reaches_nothing() -> None:
    """A PPTX converter upgrade in a project with no PPTX source is cosmetic."""
    old = {**OLD, "converter:pptx": "ooxml-pptx-1"}
    new = {**old, "converter:pptx": "ooxml-pptx-2"}
    [change] = converter_changes(old, new, {"A1": "pdf"}, {"A1": "A"})
    assert change.cosmetic and change.sources == []
    assert "no approved source is PPTX (recorded; changes nothing)" in change.detail


def test_a_converter_upgrade_redoes_exactly_the_affected_units_of_a_run(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a run is done, bumping the PDF converter's revision (an upgrade of keepstep's
    PDF code): the preview explains it, the resume re-runs exactly the extraction of group A
    (A1 is the PDF) and the verification reading group A; group B's extraction is reused.
    A later XLSX bump (no XLSX source) is recorded and re-runs nothing."""
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    cache = root / ".keepstep" / "converted"
    entries = len(list(cache.glob("*.md")))

    monkeypatch.setitem(conversion.CONVERTER_REVISIONS, "pdf",
                        conversion.CONVERTER_REVISIONS["pdf"] + 1)
    with open_project(root) as p:
        run = p.get_run(RUN)
        preview = run.preview()
        [change] = [c for c in preview.changes if c.kind == ChangeKind.tool]
        assert change.origin == "converter:pdf" and change.sources == ["A1"]
        assert {"U03", "U05"} <= set(preview.invalidated)
        assert "U04" in preview.reused
        status = run.resume()
        assert status.decision == "done", status.reasons
        attempts = {a.attempt_id for a in p.store.attempts(RUN)}
        redone = sorted(a.split("/")[0] for a in attempts if a.endswith("/a2"))
        assert redone == ["U03", "U05"]
        [event] = p.get_run(RUN).events(kinds=["decision.plan_change"])
        why = event.payload["invalidated"]
        assert why["U03"] == [f"tool: converter:pdf → [content] U03 ({change.detail})"]
        assert why["U05"][0].startswith("tool: converter:pdf → [content] U05")
        assert "U04" in event.payload["reused"]
    # The new version's conversion is a new cache entry; the old one is left for pruning.
    assert len(list(cache.glob("*.md"))) == entries + 1

    monkeypatch.setitem(conversion.CONVERTER_REVISIONS, "xlsx",
                        conversion.CONVERTER_REVISIONS["xlsx"] + 1)
    with open_project(root) as p:
        run = p.get_run(RUN)
        before = {a.attempt_id for a in p.store.attempts(RUN)}
        status = run.resume()
        assert status.decision == "done"
        assert {a.attempt_id for a in p.store.attempts(RUN)} == before
        events = [e for e in run.events() if e.kind == "decision.plan_change"]
        assert any("converter for XLSX changed" in str(e.payload) for e in events)
