"""Change detection between the recorded baseline and the project now (engine/changes.py)."""

from __future__ import annotations

from typing import Any

from keepstep.engine.core.changes import Change, ChangeKind, artifact_lost, detect_changes
from keepstep.engine.core.inputs import Contract, InputSnapshot
from keepstep.engine.core.plan import EdgeType, Plan

H1, H2 = "1" * 64, "2" * 64


def contract(**fields: Any) -> Contract:
    base = {"audience": "product team", "goal": "enter Norvania?"}
    return Contract(fields={**base, **fields}, body="The pack.\n")


def plan(*units: dict[str, Any], gates: list[dict[str, Any]] | None = None) -> Plan:
    return Plan.model_validate({"unit": [{"title": u["id"], "phase": "p", "kind": "synthesize",
                                          **u} for u in units], "gate": gates or []})


BASE_PLAN = plan({"id": "U07", "inputs": ["group:C"]},
                 {"id": "U10", "depends_on": ["U07"]},
                 {"id": "U28", "kind": "rank", "max_rounds": 3, "depends_on": ["U10"]})
SNAP = InputSnapshot(sources={"A3": H1, "C1": H1}, groups={"A3": "A", "C1": "C"})
OLD_INPUTS = {"n": 1, "sources": dict(SNAP.sources), "groups": dict(SNAP.groups)}
VERSIONS = {"code": "0.1.0", "model": "local/keepstep-offline", "policy": "policy-1"}


def detect(**overrides: Any) -> list[Change]:
    args: dict[str, Any] = {
        "old_inputs": OLD_INPUTS, "new_snapshot": SNAP,
        "old_contract_fields": contract().field_hashes(), "new_contract": contract(),
        "old_plan": BASE_PLAN, "new_plan": BASE_PLAN,
        "old_templates": {"report": H1}, "new_templates": {"report": H1},
        "old_versions": VERSIONS, "new_versions": VERSIONS,
    }
    args.update(overrides)
    return detect_changes(**args)


def test_nothing_changed_means_no_changes() -> None:
    """Identical baseline and project give an empty list."""
    assert detect() == []


def test_audience_edit_is_an_audience_labelled_plan_change() -> None:
    """An audience edit is contract_audience, labelled audience, and needs a new plan version."""
    (change,) = detect(new_contract=contract(audience="investment committee"))
    assert change.kind == ChangeKind.contract_audience
    assert change.origin == "contract:audience" and change.edge == EdgeType.audience
    assert change.plan_level and change.needs == "plan"
    assert "investment committee" in change.detail
    assert change.old == contract().field_hashes()["audience"]


def test_other_contract_fields_are_policy_changes() -> None:
    """A goal edit, a new field and a body edit are contract_field changes labelled policy."""
    new = Contract(fields={"audience": "product team", "goal": "exit?", "scope": "2026"},
                   body="Other body.\n")
    changes = detect(new_contract=new)
    assert [c.origin for c in changes] == ["contract:body", "contract:goal", "contract:scope"]
    assert {c.kind for c in changes} == {ChangeKind.contract_field}
    assert {c.edge for c in changes} == {EdgeType.policy}
    assert changes[2].old is None and "added" in changes[2].detail


def test_source_changes_carry_their_groups_and_need_an_input_snapshot() -> None:
    """Changed, added, removed and moved sources name their groups; none is plan-level."""
    snap = InputSnapshot(sources={"A3": H2, "C1": H1, "D9": "3" * 64},
                         groups={"A3": "A", "C1": "B", "D9": "D"})
    old = {"sources": {**SNAP.sources, "Z1": H1}, "groups": {**SNAP.groups, "Z1": "Z"}}
    changes = detect(old_inputs=old, new_snapshot=snap)
    got = [(c.kind.value, c.origin, c.groups) for c in changes]
    assert got == [("source_content", "source:A3", ["A"]),
                   ("source_removed", "source:Z1", ["Z"]),
                   ("source_added", "source:D9", ["D"]),
                   ("source_moved", "source:C1", ["B", "C"])]
    assert all(not c.plan_level and c.needs == "inputs" for c in changes)
    assert changes[0].emits() == {"content"}
    # A change of the set of files is structure (what header-only readers see) and content.
    assert all(c.edge == EdgeType.structure and c.emits() == {"structure", "content"}
               for c in changes[1:])
    assert "moved from group C to B" in changes[3].detail


def test_template_changes_are_template_labelled_plan_changes() -> None:
    """A changed, added or removed template is labelled template and is plan-level."""
    changes = detect(new_templates={"report": H2, "appendix": H1})
    assert [(c.origin, c.edge, c.plan_level) for c in changes] == [
        ("template:appendix", EdgeType.template, True),
        ("template:report", EdgeType.template, True)]


def test_title_only_unit_change_is_cosmetic() -> None:
    """A title or phase edit is recorded as a cosmetic unit_definition change."""
    new = plan({"id": "U07", "title": "E03 extraction (renamed)", "phase": "x",
                "inputs": ["group:C"]}, *BASE_PLAN.model_dump(by_alias=True)["unit"][1:])
    (change,) = detect(new_plan=new)
    assert change.kind == ChangeKind.unit_definition and change.cosmetic
    assert change.edge == EdgeType.structure and change.detail.startswith(
        "unit U07 changed: phase, title")


def test_unit_definition_and_dependency_changes() -> None:
    """Input/param edits are real definition changes; added, removed and re-typed
    dependencies are dependency changes on the dependent unit; added/removed units show."""
    new = plan({"id": "U07", "inputs": ["group:C", "source:A3"]},
               {"id": "U10", "depends_on": [{"unit": "U07", "edge": "presentation"}]},
               {"id": "U28", "kind": "rank", "max_rounds": 3, "depends_on": ["U07"]},
               {"id": "U40", "depends_on": ["U28"]})
    got = [(c.kind.value, c.origin, c.cosmetic) for c in detect(new_plan=new)]
    assert got == [
        ("unit_definition", "unit:U07", False),
        ("unit_definition", "unit:U40", False),
        ("dependency_added", "unit:U10", False),
        ("dependency_added", "unit:U28", False),
        ("dependency_removed", "unit:U10", False),
        ("dependency_removed", "unit:U28", False),
    ]


def test_gate_changes_are_recorded_but_cosmetic() -> None:
    """Adding a gate before U28 is a cosmetic change of U28: it decides whether, not what."""
    gate = {"id": "G1", "unit": "U28", "question": "Confirm?"}
    new = plan(*BASE_PLAN.model_dump(by_alias=True)["unit"], gates=[gate])
    (change,) = detect(new_plan=new)
    assert change.origin == "unit:U28" and change.cosmetic and "gate G1 added" in change.detail


def test_version_changes_label_policy_and_content() -> None:
    """A policy version change is labelled policy; model/code changes content."""
    changes = detect(new_versions={**VERSIONS, "policy": "policy-2", "model": "openai/gpt-x"})
    assert [(c.origin, c.edge) for c in changes] == [("version:model", EdgeType.content),
                                                    ("version:policy", EdgeType.policy)]
    assert all(c.plan_level for c in changes)


def test_empty_baseline_reports_nothing() -> None:
    """No recorded contract fields, sources, versions or plan means nothing to compare."""
    assert detect(old_contract_fields={}, old_inputs={}, old_versions={}, old_plan=None,
                  new_contract=contract(audience="x"), new_versions={"code": "9"}) == []


def test_order_is_deterministic_and_natural() -> None:
    """Changes sort by kind, then origin in natural order (U7 before U10), every time."""
    old = plan({"id": "U7"}, {"id": "U10"}, {"id": "U2"})
    new = plan({"id": "U7", "inputs": ["source:A3"]}, {"id": "U10", "inputs": ["source:A3"]},
               {"id": "U2", "inputs": ["source:A3"]})
    kwargs = {"old_plan": old, "new_plan": new, "new_contract": contract(audience="board"),
              "new_templates": {"report": H2}}
    first = detect(**kwargs)
    assert [c.origin for c in first] == ["contract:audience", "template:report", "unit:U2",
                                         "unit:U7", "unit:U10"]
    assert all(detect(**kwargs) == first for _ in range(3))


def test_change_defaults_come_from_its_kind() -> None:
    """edge and plan_level default from the kind; explicit values are kept (recovery's form)."""
    lost = artifact_lost("U07", "evidence.json missing")
    assert (lost.edge, lost.plan_level, lost.needs) == (EdgeType.content, False, "repair")
    explicit = Change(kind=ChangeKind.artifact_lost, origin="unit:U07", edge=EdgeType.content,
                      detail="x", plan_level=False)
    assert explicit.model_dump(mode="json")["edge"] == "content"
    assert Change(kind="contract_audience", origin="contract:audience", detail="a").plan_level
    assert Change.model_validate(explicit.model_dump(mode="json")) == explicit
