"""`keepstep validate` reports every plan problem at once, each with its line in plan.toml and
a "did you mean" for a misspelt kind, field or id; the allowed kinds are listed once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.engine import PlanValidationError, load_project_files
from keepstep.engine.run.validation import validate_project

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"

PLAN = """\
[plan]
titel = "x"

[[unit]]
id = "U01"
title = "Schema"
phase = "intake"
kind = "intake"
params = { step = "schema" }

[[unit]]
id = "U02"
title = "Extract"
phase = "extraction"
kind = "extrct"
inputs = ["group:A"]
timeout_minuts = 5

[[unit]]
id = "U03"
title = "Audit"
phase = "audit"
kind = "audit"
depends_on = ["U1"]
required_final = true

[[gate]]
id = "go"
unit = "U3"
question = "Go?"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    (root / "plan.toml").write_text(PLAN, encoding="utf-8")
    return root


def problems_of(root: Path) -> list:
    with pytest.raises(PlanValidationError) as info:
        load_project_files(root)
    return info.value.problems


def test_every_problem_at_once_with_its_line_and_a_near_spelling(project: Path) -> None:
    found = {(p.where, p.field.split(":")[0]): p for p in problems_of(project)}
    kind = found[("unit U02", "kind")]
    assert kind.line_no == 15 and "did you mean 'extract'" in kind.line()
    assert kind.line().count("intake") == 1  # the allowed kinds, listed once
    field = found[("unit U02", "timeout_minuts")]
    assert field.line_no == 17 and "did you mean 'timeout_minutes'" in field.line()
    header = found[("plan.titel", "")]
    assert header.line_no == 2 and "did you mean 'title'" in header.line()
    # The tables that parse are checked too: their ids, dependencies and gates.
    dep = found[("unit U03", "depends_on")]
    assert dep.line_no == 24 and "did you mean 'U01'" in dep.line()
    gate = found[("gate go", "unit")]
    assert gate.line_no == 29 and "did you mean 'U03'" in gate.line()
    assert all(f"(plan.toml line {p.line_no})" in p.located() for p in found.values())


def test_a_dependency_on_a_unit_that_did_not_parse_is_not_unknown(project: Path) -> None:
    text = (project / "plan.toml").read_text(encoding="utf-8")
    (project / "plan.toml").write_text(text.replace('depends_on = ["U1"]',
                                                    'depends_on = ["U02"]'), encoding="utf-8")
    lines = [p.line() for p in problems_of(project)]
    assert not any("unknown unit 'U02'" in line for line in lines), lines
    assert any("extrct" in line for line in lines)


def test_the_report_and_the_cli_carry_the_lines(project: Path) -> None:
    """validate_project's problems (the plan's and the folder's) have their lines; the CLI
    prints them and --json holds line_no."""
    (project / "plan.toml").write_text(PLAN.replace('kind = "extrct"', 'kind = "extract"')
                                       .replace("titel", "title")
                                       .replace("timeout_minuts", "timeout_minutes")
                                       .replace('"U1"', '"U01"').replace('"U3"', '"U03"')
                                       .replace('inputs = ["group:A"]',
                                                'inputs = ["group:A", "template:nope"]'),
                                       encoding="utf-8")
    report = validate_project(project, models=False)
    missing = [p for p in report.problems if p.code == "template_missing"]
    assert missing and missing[0].line_no == 16, [p.line() for p in report.problems]

    from keepstep.app.cli.main import app

    result = CliRunner().invoke(app, ["validate", str(project), "--json"])
    data = json.loads(result.output)
    assert any(p["code"] == "template_missing" and p["line_no"] == 16
               for p in data["problems"]), data
    result = CliRunner().invoke(app, ["validate", str(project)])
    assert result.exit_code == 2 and "template file templates/nope.md is missing" in result.output
    assert "(plan.toml line 16)" in result.output, result.output
