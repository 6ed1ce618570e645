"""A presentation change is only heading wording, whitespace, emphasis and list/table
formatting (issue 21, release safety 2): tested both ways on the vendor pack's real memo
template, through ``detect_changes`` and the invalidation walk (the audit is redone exactly
when the template's substance changed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.core.changes import ChangeKind, detect_changes
from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.plan import EdgeType
from keepstep.engine.core.templates import headings, layout_hash
from tests.test_root_changes import CONTRACT, PLAN, reach

MEMO = (Path(__file__).resolve().parents[1] / "sample_projects" / "vendor-dd" / "templates"
        / "memo.md").read_text(encoding="utf-8")


def classify(old: str, new: str):  # noqa: ANN201 - a Change
    snap = InputSnapshot(sources={}, groups={})
    (change,) = detect_changes(
        old_inputs={}, new_snapshot=snap, old_contract_fields={}, new_contract=CONTRACT,
        old_plan=None, new_plan=PLAN, old_templates={"memo": "a"}, new_templates={"memo": "b"},
        old_versions={}, new_versions={}, old_layouts={"memo": layout_hash(old)},
        new_layouts={"memo": layout_hash(new)}, old_headings={"memo": headings(old)},
        new_headings={"memo": headings(new)})
    return change


PRESENTATION_EDITS = {
    "heading wording": lambda t: t.replace("## Summary", "## In short"),
    "whitespace and rewrapping": lambda t: t.replace("What supports it:", "What  supports\nit:"),
    "emphasis": lambda t: t.replace("Each of these is closed", "Each of these is **closed**"),
    "list to table formatting": lambda t: t.replace(
        "Every price cited here", "- Every price cited here"),
}
TEMPLATE_EDITS = {
    "a sentence with a figure": lambda t: t.replace(
        "What supports it:", "What supports it: the list price is EUR 48,000 a year."),
    "a removed sentence": lambda t: t.replace(
        "Every price cited here is in the pricing comparison table (`pricing-table.csv`).", ""),
    "a changed figure": lambda t: t + "\nPrices hold for 90 days.\n",
    "a link": lambda t: t.replace("(`pricing-table.csv`)",
                                  "(`pricing-table.csv`, https://example.invalid/prices)"),
    "a placeholder": lambda t: t.replace("{{ notice }}", "{{ notice }} {{ date }}"),
}


@pytest.mark.parametrize("name", sorted(PRESENTATION_EDITS))
def test_formatting_edits_of_the_real_memo_are_presentation(name: str) -> None:
    """Heading wording, whitespace, emphasis and list formatting: presentation, so the audit
    (which reads the template's substance) is not redone; the delivery is."""
    new = PRESENTATION_EDITS[name](MEMO)
    assert new != MEMO
    change = classify(MEMO, new)
    assert change.edge == EdgeType.presentation, change.detail
    assert "AUD" not in reach([change]) and "SHIP" in reach([change])


@pytest.mark.parametrize("name", sorted(TEMPLATE_EDITS))
def test_substance_edits_of_the_real_memo_are_template_changes(name: str) -> None:
    """A sentence, figure, link or placeholder added or removed keeps every section id but is
    a template change: the audit runs again before anything is delivered."""
    new = TEMPLATE_EDITS[name](MEMO)
    assert new != MEMO
    change = classify(MEMO, new)
    assert change.kind == ChangeKind.template and change.edge == EdgeType.template, change.detail
    assert list(reach([change])) == ["MEMO", "AUD", "SHIP"]


def test_a_heading_rename_names_the_old_and_the_new_heading() -> None:
    """Not only a hash change: the detail says which heading became which."""
    change = classify(MEMO, MEMO.replace("## Summary", "## In short"))
    assert "'Summary' → 'In short'" in change.detail
