"""`keepstep validate` reports every plan that cannot run, each from a real plan file, naming
the unit, the field and what to do — in text and in --json — and a run refuses such a plan
before it spends a model call or takes a lease."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine import PlanValidationError, open_project, validate_project

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "vendor-dd"
RUNNER = CliRunner()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "vendor-dd"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def only_problem(root: Path) -> dict:
    """The one problem `keepstep validate --json` reports (exit 2)."""
    result = RUNNER.invoke(app, ["validate", str(root), "--json"])
    assert result.exit_code == 2, result.output
    report = json.loads(result.output)
    assert not report["ok"]
    assert len(report["problems"]) == 1, report["problems"]
    return report["problems"][0]


def test_the_sample_packs_validate() -> None:
    """Both sample packs are runnable plans."""
    for name in ("vendor-dd", "market-entry"):
        report = validate_project(PACK.parent / name)
        assert report.ok and not report.problems, [p.line() for p in report.problems]


def test_an_extract_unit_with_no_sources(project: Path) -> None:
    """An extract unit whose inputs name no source is refused: unit, field inputs, the fix."""
    edit(project / "plan.toml", 'inputs = [{ ref = "group:O", edges = ["content"] }]',
         "inputs = []")
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("E04", "inputs", "extract_sources")
    assert "names no sources" in p["message"] and "group:<G>" in p["hint"]


def test_an_extract_unit_whose_group_has_no_approved_source(project: Path) -> None:
    """group:O exists but none of its sources is approved: the group input is refused."""
    text = (project / "sources.toml").read_text()
    for sid in ("O1", "O2", "O3", "O4", "O5"):
        start = text.index(f'id = "{sid}"')
        end = text.index("approved = true", start)
        text = text[:end] + "approved = false" + text[end + len("approved = true"):]
    (project / "sources.toml").write_text(text)
    report = validate_project(project)
    assert any(p.unit == "E04" and "group 'O' has no approved source" in p.message
               for p in report.problems), [p.line() for p in report.problems]


def test_a_verify_unit_without_evidence_producing_dependencies(project: Path) -> None:
    """C02 made to depend on the contract intake only: nothing it could verify."""
    edit(project / "plan.toml", 'depends_on = ["E03", "E04"]', 'depends_on = ["I02"]')
    report = validate_project(project)
    problem = next(p for p in report.problems if p.code == "verify_evidence")
    assert (problem.unit, problem.field) == ("C02", "depends_on")
    assert "evidence-producing" in problem.message and "extract" in problem.hint


def test_an_unknown_render_document(project: Path) -> None:
    """The audit checks a document no render dependency produces."""
    edit(project / "plan.toml", 'document = "memo"\nsection = "pricing"',
         'document = "memorandum"\nsection = "pricing"')
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("A01", "params.checks.4", "unknown_document")
    assert "'memorandum'" in p["message"] and "memo" in p["message"]


def test_a_missing_template_file(project: Path) -> None:
    """The release memo's template file is gone."""
    (project / "templates" / "release-memo.md").unlink()
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("D04", "params.template", "template_missing")
    assert "templates/release-memo.md is missing" in p["message"]


def test_a_template_with_unknown_placeholders(project: Path) -> None:
    """{{ margin_forecast }} is neither a part, nor a fill name, nor a contract field."""
    path = project / "templates" / "risk-register.md"
    path.write_text(path.read_text() + "\n{{ margin_forecast }}\n")
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("D02", "params.template",
                                                  "template_placeholder")
    assert "{{ margin_forecast }}" in p["message"] and "params.fill" in p["hint"]


def test_a_unit_id_with_shell_metacharacters(project: Path) -> None:
    """A unit id with a space and a semicolon is refused with the allowed alphabet."""
    text = (project / "plan.toml").read_text().replace('"N01"', '"N01; rm -rf"')
    (project / "plan.toml").write_text(text)
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("N01; rm -rf", "id", "unit_id")
    assert "a letter, then up to 63 letters" in p["hint"]


def test_a_deliver_file_reference_that_does_not_exist(project: Path) -> None:
    """X01 delivers D01:scorecard.md, but D01 writes memo.md."""
    edit(project / "plan.toml", '"D01:memo.md"', '"D01:scorecard.md"')
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("X01", "params.files", "deliver_file")
    assert "D01 writes no 'scorecard.md' (it writes memo.md)" in p["message"]


def test_a_deliver_unit_naming_an_unconfigured_adapter(project: Path) -> None:
    """adapter = "clients" has no [adapters.clients] table."""
    edit(project / "plan.toml", 'adapter = "client"', 'adapter = "clients"')
    p = only_problem(project)
    assert (p["unit"], p["field"], p["code"]) == ("X01", "params.adapter", "adapter")
    assert "configured: client" in p["message"]


def test_a_misspelled_provider(project: Path) -> None:
    """default_model names provider 'opnai': an error naming the model and the units."""
    edit(project / "keepstep.toml", 'default_model = "local/keepstep-offline"',
         'default_model = "opnai/gpt-4o-mini"')
    result = RUNNER.invoke(app, ["validate", str(project), "--json"])
    assert result.exit_code == 2, result.output
    report = json.loads(result.output)
    errors = [m for m in report["models"] if m["level"] == "error"]
    assert errors and "opnai/gpt-4o-mini" in errors[0]["message"]
    assert "E01" in errors[0]["units"]


def test_a_misspelled_providers_table(project: Path) -> None:
    """[providers.locl] limits no model of the project uses: did you mean local?"""
    text = (project / "keepstep.toml").read_text()
    (project / "keepstep.toml").write_text(text + "\n[providers.locl]\nmax_concurrent = 2\n")
    p = only_problem(project)
    assert p["code"] == "provider" and "[providers.locl]" in p["message"]
    assert "did you mean [providers.local]" in p["hint"]


def test_text_output_lists_every_problem_with_unit_and_field(project: Path) -> None:
    """Without --json: every problem at once, as 'unit X: field F …', exit 2."""
    edit(project / "plan.toml", '"D01:memo.md"', '"D01:scorecard.md"')
    (project / "templates" / "release-memo.md").unlink()
    result = RUNNER.invoke(app, ["validate", str(project)])
    assert result.exit_code == 2
    assert "2 problem(s)" in result.output
    assert "unit X01: field params.files" in result.output
    assert "unit D04: field params.template" in result.output


def test_a_run_refuses_an_unrunnable_plan_before_any_call_or_lease(project: Path) -> None:
    """The unsafe unit id is refused when the project is opened: no run starts, no model is
    called, no lease is left."""
    text = (project / "plan.toml").read_text().replace('"N01"', '"N01 $(x)"')
    (project / "plan.toml").write_text(text)
    with pytest.raises(PlanValidationError) as err:
        open_project(project)
    assert any(p.code == "unit_id" for p in err.value.problems)
    assert not (project / ".keepstep" / "state.db").exists()


def test_validate_names_the_steps_that_will_not_fit_the_models_window(project: Path) -> None:
    """On a model with a small window (Ollama with context_tokens 6000), `keepstep validate`
    names each synthesis or ranking whose one request (the evidence of the sources it reaches,
    estimated from their text) will not fit, with what to do, and an extract unit whose
    source has a paragraph too long to send; on a large window, none."""
    cfg = project / "keepstep.toml"
    edit(cfg, 'default_model = "local/keepstep-offline"',
         'default_model = "ollama_chat/llama3.1"\ncontext_tokens = 6000')
    report = validate_project(project)
    windows = [m for m in report.models if "will need ~" in m["message"]]
    assert windows, report.models
    units = {u for m in windows for u in m["units"]}
    from keepstep.engine.files.project import load_project_files

    kinds = {u.id: u.kind.value for u in load_project_files(project).plan.units}
    assert units and {kinds[u] for u in units} <= {"synthesize", "rank", "model"}
    for m in windows:
        assert m["level"] == "warning" and "ollama_chat/llama3.1 takes at most" in m["message"]
        assert "Split it into smaller units" in m["message"] and "larger window" in m["message"]

    # One paragraph of a source longer than the whole window: its extract unit is named.
    source = next(p for p in sorted((project / "sources").glob("*.md")))
    source.write_text(source.read_text(encoding="utf-8") + "\n\n" + "word " * 8000,
                      encoding="utf-8")
    report = validate_project(project)
    long = [m for m in report.models if "cannot be split further" in m["message"]]
    assert long and kinds[long[0]["units"][0]] == "extract"
    assert "Break that paragraph up" in long[0]["message"]

    cfg.write_text(cfg.read_text(encoding="utf-8").replace("context_tokens = 6000",
                                                           "context_tokens = 2000000"),
                   encoding="utf-8")
    source.write_text(source.read_text(encoding="utf-8").split("\n\nword ")[0],
                      encoding="utf-8")
    report = validate_project(project)
    assert not [m for m in report.models if "will need ~" in m["message"]
                or "cannot be split further" in m["message"]]
