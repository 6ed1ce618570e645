"""Typed root changes: a source's body vs its header lines vs the set of files, a template's
sections vs its wording, the contract's audience vs its goal — each detected from real files
and invalidating exactly the closure over the edges that read that aspect, explained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

from keepstep.engine.core.changes import Change, ChangeKind, detect_changes
from keepstep.engine.core.inputs import Contract, split_header
from keepstep.engine.core.invalidation import invalidate
from keepstep.engine.core.plan import EdgeType, Plan
from keepstep.engine.core.state import OutputRef, UnitRecord, UnitState
from keepstep.engine.core.templates import (
    layout,
    layout_hash,
    rendered_sections,
    strip_sections,
)
from keepstep.engine.files.project import load_sources, snapshot_sources

SOURCE = """---
title: Corvane price list
type: price list
date: 2025-03-01
---
# Corvane price list

The Professional edition costs AMC 204,000 per year.
"""

# A small plan with every kind of root edge (u: unit id, inputs, deps):
#   INV   reads group:V's header lines only (structure)
#   EXT   reads group:V's bodies only (content)      VER  <- EXT
#   SYN   reads the audience                          <- VER
#   POL   reads the goal (policy)
#   MEMO  renders template:memo (all its changes)     <- INV, SYN, POL
#   AUD   reads template:memo's sections only         <- MEMO (content)
#   SHIP  delivers MEMO's bytes                       <- MEMO (presentation), AUD
PLAN = Plan.model_validate({"unit": [
    {"id": "INV", "title": "t", "phase": "p", "kind": "intake", "params": {"step": "inventory"},
     "inputs": [{"ref": "group:V", "edges": ["structure"]}]},
    {"id": "EXT", "title": "t", "phase": "p", "kind": "extract",
     "inputs": [{"ref": "group:V", "edges": ["content"]}]},
    {"id": "VER", "title": "t", "phase": "p", "kind": "verify", "depends_on": ["EXT"]},
    {"id": "SYN", "title": "t", "phase": "p", "kind": "synthesize",
     "inputs": ["contract:audience"], "depends_on": ["VER"]},
    {"id": "POL", "title": "t", "phase": "p", "kind": "intake", "params": {"step": "contract"},
     "inputs": ["contract:goal"]},
    {"id": "MEMO", "title": "t", "phase": "p", "kind": "render", "inputs": ["template:memo"],
     "params": {"document": "memo", "template": "memo"}, "depends_on": ["INV", "SYN", "POL"]},
    {"id": "AUD", "title": "t", "phase": "p", "kind": "audit",
     "inputs": [{"ref": "template:memo", "edges": ["template"]}], "depends_on": ["MEMO"]},
    {"id": "SHIP", "title": "t", "phase": "p", "kind": "deliver", "required_final": True,
     "params": {"adapter": "a", "files": ["MEMO:memo.md"]},
     "depends_on": [{"unit": "MEMO", "edge": "presentation"}, "AUD"]},
]})


def project(root: Path, sources: dict[str, str]) -> Path:
    (root / "sources").mkdir(parents=True, exist_ok=True)
    entries = []
    for sid, text in sources.items():
        (root / "sources" / f"{sid}.md").write_text(text)
        entries.append({"id": sid, "path": f"sources/{sid}.md", "group": "V", "title": sid,
                        "approved": True})
    (root / "sources.toml").write_text(tomli_w.dumps({"source": entries}))
    return root


def snapshot(root: Path) -> Any:
    return snapshot_sources(root, load_sources(root))


def inputs_of(snap: Any) -> dict[str, Any]:
    return {"sources": snap.sources, "groups": snap.groups, "headers": snap.headers,
            "bodies": snap.bodies}


CONTRACT = Contract(fields={"audience": "operations director", "goal": "Choose a vendor"},
                    body="Body.\n")


def detect(*, old_snap: Any = None, new_snap: Any = None, contract: Contract = CONTRACT,
           templates: tuple[str, str] | None = None) -> list[Change]:
    old_t, new_t = templates or ("# Memo\n", "# Memo\n")
    empty = type("S", (), {"sources": {}, "groups": {}, "headers": {}, "bodies": {}})()
    return detect_changes(
        old_inputs=inputs_of(old_snap) if old_snap else {}, new_snapshot=new_snap or empty,
        old_contract_fields=CONTRACT.field_hashes(), new_contract=contract,
        old_plan=PLAN, new_plan=PLAN,
        old_templates={"memo": "a" * 64}, new_templates={"memo": ("a" if old_t == new_t
                                                                   else "b") * 64},
        old_versions={}, new_versions={},
        old_layouts={"memo": layout_hash(old_t)}, new_layouts={"memo": layout_hash(new_t)})


def done() -> dict[str, UnitRecord]:
    return {u.id: UnitRecord(state=UnitState.succeeded, attempt=f"{u.id}/a1",
                             outputs={"o": OutputRef(sha256="0" * 64, path="p")})
            for u in PLAN.units}


def reach(changes: list[Change]) -> dict[str, list[str]]:
    result = invalidate(PLAN, changes, done(), source_groups={"V1": "V", "V2": "V"})
    return {u: [e.render() for e in exps] for u, exps in result.affected.items()}


def test_split_header_takes_the_front_matter_block_only() -> None:
    """The header lines are the leading --- block; a text without one is all body."""
    header, body = split_header(SOURCE)
    assert header.startswith("---\ntitle:") and header.endswith("---\n")
    assert body.startswith("# Corvane price list")
    assert split_header("# No header\nText.\n") == ("", "# No header\nText.\n")


def test_a_body_edit_is_content_and_reaches_the_body_readers_only(tmp_path: Path) -> None:
    """A sentence added to the body: source_content, which reaches EXT (content edge) and its
    downstream by content — not INV, which reads header lines only."""
    root = project(tmp_path, {"V1": SOURCE})
    before = snapshot(root)
    (root / "sources" / "V1.md").write_text(SOURCE + "It rose by 10% in 2025.\n")
    (change,) = detect(old_snap=before, new_snap=snapshot(root))
    assert change.kind == ChangeKind.source_content and change.emits() == {"content"}
    got = reach([change])
    assert list(got) == ["EXT", "VER", "SYN", "MEMO", "AUD", "SHIP"]
    assert got["EXT"] == ["source_content: source:V1 → [content] EXT (source V1: its body "
                          f"changed (sha256 {before.sources['V1'][:12]} → "
                          f"{snapshot(root).sources['V1'][:12]}))"]
    assert "INV" not in got


def test_a_header_line_edit_is_structure_and_reaches_the_header_readers_only(
        tmp_path: Path) -> None:
    """The date line changed: source_header (structure), which reaches INV and what uses it
    (MEMO, then what MEMO feeds) — not EXT or VER, which read bodies."""
    root = project(tmp_path, {"V1": SOURCE})
    before = snapshot(root)
    (root / "sources" / "V1.md").write_text(SOURCE.replace("2025-03-01", "2025-03-02"))
    (change,) = detect(old_snap=before, new_snap=snapshot(root))
    assert change.kind == ChangeKind.source_header and change.edge == EdgeType.structure
    got = reach([change])
    assert list(got) == ["INV", "MEMO", "AUD", "SHIP"]
    assert got["INV"][0].startswith("source_header: source:V1 → [structure] INV")


def test_a_sources_toml_title_edit_is_a_header_change(tmp_path: Path) -> None:
    """The title in sources.toml is a header line too: same bytes, structure change."""
    root = project(tmp_path, {"V1": SOURCE})
    before = snapshot(root)
    text = (root / "sources.toml").read_text().replace('title = "V1"', 'title = "Prices"')
    (root / "sources.toml").write_text(text)
    after = snapshot(root)
    assert after.sources == before.sources and after.hash() != before.hash()
    (change,) = detect(old_snap=before, new_snap=after)
    assert change.kind == ChangeKind.source_header


def test_added_removed_and_renamed_sources_are_structure_and_content(tmp_path: Path) -> None:
    """A file added, removed or renamed (same bytes under a new id) changes the set of files:
    it reaches both the header readers and the body readers."""
    root = project(tmp_path, {"V1": SOURCE})
    before = snapshot(root)
    project(root, {"V1": SOURCE, "V2": SOURCE.replace("204,000", "186,000")})
    (added,) = detect(old_snap=before, new_snap=snapshot(root))
    assert added.kind == ChangeKind.source_added and added.emits() == {"structure", "content"}
    assert {"INV", "EXT"} <= set(reach([added]))
    (removed,) = detect(old_snap=snapshot(root), new_snap=before)
    assert removed.kind == ChangeKind.source_removed and {"INV", "EXT"} <= set(reach([removed]))
    renamed_root = project(tmp_path / "renamed", {"V9": SOURCE})
    (renamed,) = detect(old_snap=before, new_snap=snapshot(renamed_root))
    assert renamed.kind == ChangeKind.source_renamed and renamed.old == "V1"
    assert "V1 was renamed V9" in renamed.detail
    assert {"INV", "EXT"} <= set(reach([renamed]))


def test_a_section_change_is_template_and_reaches_the_section_readers(tmp_path: Path) -> None:
    """A section added to the memo template: a template change — MEMO re-renders and emits
    content, the audit (which reads the sections) is redone, and the delivery."""
    old = "# Memo\n<!-- section: a -->\n{{ findings }}\n"
    new = old + "<!-- section: b -->\n{{ risks }}\n"
    assert layout(new).section_ids == ["a", "b"]
    (change,) = detect(templates=(old, new))
    assert change.kind == ChangeKind.template and change.edge == EdgeType.template
    got = reach([change])
    assert list(got) == ["MEMO", "AUD", "SHIP"]
    assert got["AUD"][0].startswith("template: template:memo → [template] AUD")


def test_a_heading_only_edit_is_presentation_and_stops_at_the_presentation_edges() -> None:
    """Only a heading's wording changed: presentation. MEMO re-renders and emits presentation
    (only presentation edges fired into it), so SHIP (which delivers its bytes) is redone and
    AUD (the memo's content, the template's sections) is not."""
    old = "# Memo\n<!-- section: a -->\n## Findings\n{{ findings }}\n"
    new = old.replace("## Findings", "## What we found")
    (change,) = detect(templates=(old, new))
    assert change.kind == ChangeKind.template and change.edge == EdgeType.presentation
    assert "wording or formatting only" in change.detail
    got = reach([change])
    assert list(got) == ["MEMO", "SHIP"]
    assert got["SHIP"] == ["template: template:memo → [presentation] MEMO → [presentation] SHIP "
                           f"({change.detail})"]


def test_a_unit_reached_by_content_later_emits_content_after_all() -> None:
    """The emission rule: a unit reached first over a presentation edge and then over a
    content edge emits content, and the walk carries it on over content edges."""
    plan = Plan.model_validate({"unit": [
        {"id": "A", "title": "t", "phase": "p", "kind": "notes", "inputs": ["template:t"]},
        {"id": "B", "title": "t", "phase": "p", "kind": "notes",
         "depends_on": [{"unit": "A", "edge": "presentation"}]},
        {"id": "C", "title": "t", "phase": "p", "kind": "notes", "depends_on": ["A"]},
        {"id": "D", "title": "t", "phase": "p", "kind": "notes",
         "depends_on": [{"unit": "B", "edge": "presentation"}, "C"]},
        {"id": "E", "title": "t", "phase": "p", "kind": "notes", "depends_on": ["D"]},
    ]})
    records = {u.id: UnitRecord(state=UnitState.succeeded, attempt=f"{u.id}/a1")
               for u in plan.units}
    content = Change(kind=ChangeKind.template, origin="template:t", detail="sections")
    pres = Change(kind=ChangeKind.template, origin="template:t", edge=EdgeType.presentation,
                  detail="wording")
    assert list(invalidate(plan, [content], records).affected) == ["A", "B", "C", "D", "E"]
    # presentation: A emits presentation; B (presentation edge) too; C and E use content
    assert list(invalidate(plan, [pres], records).affected) == ["A", "B", "D"]


def test_an_audience_edit_reaches_the_audience_readers_a_goal_edit_the_policy_readers() -> None:
    """Per field: the audience edit is audience-labelled and reaches SYN (not POL); the goal
    edit is policy-labelled and reaches POL (not SYN); neither reaches the extraction."""
    audience = Contract(fields={**CONTRACT.fields, "audience": "finance director"},
                        body=CONTRACT.body)
    goal = Contract(fields={**CONTRACT.fields, "goal": "Choose two vendors"}, body=CONTRACT.body)
    (a,) = detect(contract=audience)
    (g,) = detect(contract=goal)
    assert (a.kind, a.edge) == (ChangeKind.contract_audience, EdgeType.audience)
    assert (g.kind, g.edge) == (ChangeKind.contract_field, EdgeType.policy)
    assert list(reach([a])) == ["SYN", "MEMO", "AUD", "SHIP"]
    assert list(reach([g])) == ["POL", "MEMO", "AUD", "SHIP"]
    assert reach([g])["POL"][0].startswith("contract_field: contract:goal → [policy] POL")


def test_a_baseline_without_header_hashes_types_a_byte_change_as_content(tmp_path: Path) -> None:
    """Recorded before header hashes existed: any byte change is content (the old rule)."""
    root = project(tmp_path, {"V1": SOURCE})
    before = snapshot(root)
    (root / "sources" / "V1.md").write_text(SOURCE.replace("2025-03-01", "2025-03-02"))
    old = {"sources": before.sources, "groups": before.groups}
    (change,) = detect_changes(
        old_inputs=old, new_snapshot=snapshot(root), old_contract_fields={},
        new_contract=CONTRACT, old_plan=None, new_plan=PLAN, old_templates={},
        new_templates={}, old_versions={}, new_versions={})
    assert change.kind == ChangeKind.source_content


def test_adding_a_template_file_with_the_audience_unchanged_does_not_ask_the_gate_again(
        tmp_path: Path) -> None:
    """ME-042's audience gate binds contract:audience only: after the run is done, a new
    template file (the plan version and contract hash move, the audience does not) changes
    nothing the gate bound — the resume asks nothing and records no new request."""
    from keepstep.engine.api import open_project
    from tests.support.engine_harness import copy_pack

    root = copy_pack(tmp_path / "me042")
    with open_project(root) as p:
        run = p.start_run("ME-042")
        assert run.run(approve={"audience": "product team"}).decision == "done"
        asked = len(run.events(kinds=["approval.requested"]))
        assert asked >= 1
    (root / "templates" / "client-letter.md").write_text("# A letter\n\nDear client,\n",
                                                          encoding="utf-8")
    with open_project(root) as p:
        run = p.get_run("ME-042")
        status = run.resume()
        assert status.decision == "done", status.reasons
        assert status.pending_approvals == []
        assert len(run.events(kinds=["approval.requested"])) == asked


def test_a_rendered_document_carries_no_section_marker_and_its_sections_are_found() -> None:
    """The markers stay in the template; the rendered text loses each one whose section
    starts with a fixed line (its heading), and the sections are found again by those lines
    in the template's order. A marker with no fixed line after it is kept (nothing else
    says where its section starts)."""
    template = ("# {{ title }}\n<!-- section: a -->\n## Findings\n{{ findings }}\n"
                "<!-- section: b -->\n## Risks\n{{ risks }}\n<!-- section: c -->\n{{ x }}\n")
    rendered = template.replace("{{ title }}", "Memo").replace("{{ findings }}", "- f1") \
        .replace("{{ risks }}", "- r1").replace("{{ x }}", "tail")
    text = strip_sections(rendered, template)
    assert "<!-- section: a -->" not in text and "<!-- section: b -->" not in text
    assert "<!-- section: c -->" in text
    parts = rendered_sections(text, template)
    assert list(parts) == ["a", "b", "c"]
    assert parts["a"].strip() == "## Findings\n- f1" and parts["b"].strip() == "## Risks\n- r1"
    assert parts["c"].strip() == "tail"
    # A document without the template: only the markers it kept.
    assert list(rendered_sections(text)) == ["c"]
