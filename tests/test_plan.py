"""Plan validation: every error comes from a real plan file and names the unit, the field and
what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keepstep.engine import PlanValidationError, load_project_files
from keepstep.engine.core.plan import MAX_ROUNDS_CAP, load_plan

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"

UNIT = """
[[unit]]
id = "{id}"
title = "t"
phase = "p"
kind = "{kind}"
outputs = {outputs}
depends_on = {deps}
inputs = {inputs}
required_final = {final}
{extra}
"""


def unit(id: str, kind: str = "audit", deps: str = "[]", inputs: str = "[]",
         outputs: str = "[]", final: bool = False, extra: str = "") -> str:
    return UNIT.format(id=id, kind=kind, deps=deps, inputs=inputs, outputs=outputs,
                       final=str(final).lower(), extra=extra)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    return root


def problems_of(project: Path, plan_text: str) -> list[str]:
    (project / "plan.toml").write_text(plan_text)
    with pytest.raises(PlanValidationError) as info:
        load_project_files(project)
    return info.value.errors


def test_the_sample_plan_validates(project):
    """The ME-042 plan has 36 units, one gate and no problem."""
    files = load_project_files(project)
    assert len(files.plan.units) == 36 and len(files.plan.gates) == 1


def test_cycle_is_printed(project):
    """A dependency cycle is reported with the units in order."""
    errs = problems_of(project, unit("U1", deps='["U2"]') + unit("U2", deps='["U1"]', final=True))
    assert any("dependency cycle" in e and ("U1 -> U2 -> U1" in e or "U2 -> U1 -> U2" in e)
               for e in errs), errs


def test_unknown_dependency_names_unit_and_field(project):
    """A dependency on a unit that does not exist names the unit and depends_on."""
    errs = problems_of(project, unit("U1", deps='["U9"]', final=True))
    assert errs == ["unit U1: depends_on names unknown unit 'U9' — add that unit or remove the "
                    "dependency"]


def test_unknown_source_and_unapproved_source(project):
    """Inputs naming a source missing from sources.toml, or not approved, are reported."""
    text = (project / "sources.toml").read_text().replace("approved = true", "approved = false", 1)
    (project / "sources.toml").write_text(text)
    errs = problems_of(project, unit("U1", inputs='["source:ZZ9", "source:A1"]', final=True))
    assert any("input source 'ZZ9' is not in sources.toml" in e for e in errs), errs
    assert any("input source 'A1' is not approved" in e and "keepstep sources" in e
               for e in errs), errs


def test_duplicate_ids(project):
    """Two units with one id are reported once, with the count."""
    errs = problems_of(project, unit("U1", final=True) + unit("U1"))
    assert "unit U1: id is used 2 times — give each unit its own id" in errs


def test_loop_unit_without_max_rounds(project):
    """A rank (loop) unit without max_rounds is rejected: unbounded loops are not allowed."""
    errs = problems_of(project, unit("U1", kind="rank", final=True))
    assert any("unit U1: field max_rounds is required" in e and "unbounded" in e for e in errs)


def test_loop_unit_above_the_cap(project):
    """max_rounds above the hard cap is rejected with the allowed range."""
    errs = problems_of(project, unit("U1", kind="rank", final=True,
                                     extra=f"max_rounds = {MAX_ROUNDS_CAP + 1}"))
    assert any(f"between 1 and {MAX_ROUNDS_CAP}" in e for e in errs), errs


def test_gate_on_unknown_unit(project):
    """A gate pointing at a unit that does not exist names the gate and field."""
    text = unit("U1", final=True) + '\n[[gate]]\nid = "g"\nunit = "U7"\nquestion = "ok?"\n'
    errs = problems_of(project, text)
    assert any("gate g: field unit names unknown unit 'U7'" in e for e in errs), errs


def test_gate_holding_unknown_unit(project):
    """A gate's extra held units must exist."""
    text = unit("U1", final=True) + ('\n[[gate]]\nid = "g"\nunit = "U1"\nalso = ["U8"]\n'
                                     'question = "ok?"\n')
    errs = problems_of(project, text)
    assert any("gate g: field also names unknown unit 'U8'" in e for e in errs), errs


def test_deliverable_produced_by_no_unit(project):
    """A deliverable no unit produces is reported."""
    text = '[plan]\ndeliverables = ["report.md"]\n' + unit("U1", final=True)
    errs = problems_of(project, text)
    assert any("deliverable 'report.md' is produced by no unit" in e for e in errs), errs


def test_deliverable_unreachable_from_the_required_finals(project):
    """A deliverable made by a unit no required final depends on is unreachable."""
    text = ('[plan]\ndeliverables = ["report.md"]\n' + unit("U1", final=True)
            + unit("U2", outputs='["report.md"]'))
    errs = problems_of(project, text)
    assert any("deliverable 'report.md' is produced by U2, which no required final unit "
               "depends on" in e for e in errs), errs


def test_no_required_final_unit(project):
    """A plan without a required final unit could never be done."""
    errs = problems_of(project, unit("U1"))
    assert any("no unit has required_final = true" in e for e in errs), errs


def test_bad_edge_type_and_unknown_field(project):
    """Shape errors name the unit and field: an unknown edge type and a misspelt field."""
    text = unit("U1", final=True) + unit("U2", deps='[{unit = "U1", edge = "vibes"}]',
                                         extra='titel = "x"')
    errs = problems_of(project, text)
    assert any(e.startswith("unit U2: field depends_on.0.edge") and "content" in e for e in errs)
    assert any(e.startswith("unit U2: field titel") and "unknown field" in e for e in errs)


def test_not_toml(project):
    """A plan file that is not TOML says so, with the position."""
    errs = problems_of(project, "[[unit]\nid = 1\n")
    assert len(errs) == 1 and "is not valid TOML" in errs[0]


def test_every_problem_is_reported_at_once(project):
    """Several problems in one file come back together, not one per attempt."""
    errs = problems_of(project, unit("U1", deps='["U9"]') + unit("U1", kind="rank"))
    assert len(errs) >= 3


def test_plan_round_trips_through_tomli_w(project, tmp_path):
    """Saving a plan (as the TUI does) and loading it again gives the same plan."""
    plan = load_plan(project / "plan.toml")
    out = tmp_path / "plan.toml"
    plan.save(out)
    assert load_plan(out).fingerprint() == plan.fingerprint()
