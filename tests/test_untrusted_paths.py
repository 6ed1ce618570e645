"""Every path a project names stays inside the project: a template that is a symbolic link
to an outside file, or that is named with ``../``, is refused by ``validate`` and again when a
unit reads it, naming the file; nothing from outside lands in a report or a bundle. Output
and deliverable names with ``../``, absolute paths or shell characters are unsafe names."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine import open_project, validate_project
from keepstep.engine.files import confine
from keepstep.engine.files.confine import UnsafePathError, project_file, unsafe_name
from tests.support.engine_harness import RUN, make_small_project
from tests.support.hypothesis_profiles import examples

RUNNER = CliRunner()
SECRET = "TOP-SECRET-7d1e"


def _outside_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.md"
    secret.parent.mkdir()
    secret.write_text(f"- id\n- quote\n\n{SECRET}\n", encoding="utf-8")
    return secret


def _edit_plan(root: Path, change) -> None:
    doc = tomllib.loads((root / "plan.toml").read_text())
    change(doc)
    (root / "plan.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")


def _unit(doc: dict, uid: str) -> dict:
    return next(u for u in doc["unit"] if u["id"] == uid)


def _problems(root: Path) -> list[dict]:
    result = RUNNER.invoke(app, ["validate", str(root), "--json"])
    assert result.exit_code == 2, result.output
    return json.loads(result.output)["problems"]


def _nothing_outside_landed(root: Path) -> None:
    for path in (root / ".keepstep").rglob("*"):
        if path.is_file() and path.suffix in (".csv", ".md", ".json", ".html"):
            assert SECRET not in path.read_text(errors="replace"), path


def test_a_symlinked_template_is_refused_by_validate_naming_it(tmp_path: Path) -> None:
    """templates/evidence-table.md linked to a file outside the project: validate refuses
    it as leading outside the project, naming the template."""
    root = make_small_project(tmp_path / "p")
    target = root / "templates" / "evidence-table.md"
    target.unlink()
    target.symlink_to(_outside_secret(tmp_path))
    problems = _problems(root)
    assert any(p["code"] == "unsafe_path" and "templates/evidence-table.md" in p["message"]
               and "outside the project" in p["message"] for p in problems), problems
    assert not validate_project(root).ok


def test_a_dotdot_template_is_refused_by_validate(tmp_path: Path) -> None:
    """A template named ``../../outside/secret`` is refused, naming it."""
    root = make_small_project(tmp_path / "p")
    _outside_secret(tmp_path)

    def change(doc: dict) -> None:
        u = _unit(doc, "U08")
        u["inputs"] = ["template:../../outside/secret"]
        u["params"]["template"] = "../../outside/secret"
    _edit_plan(root, change)
    problems = _problems(root)
    assert any(p["code"] == "unsafe_path" and "../../outside/secret" in p["message"]
               for p in problems), problems


def test_a_template_swapped_for_a_link_after_validate_is_refused_at_render(
        tmp_path: Path) -> None:
    """The folder may change after validate: the render unit reads its template through the
    same check, fails naming the file, and the outside text lands in no artifact or bundle."""
    root = make_small_project(tmp_path / "p")
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        target = root / "templates" / "evidence-table.md"
        target.unlink()
        target.symlink_to(_outside_secret(tmp_path))
        run.run()
        status = run.status()
        assert status.units["U08"].state != "succeeded"
        events = [e for e in run.store.events(run.run_id) if e.unit == "U08"]
        text = json.dumps([e.payload for e in events])
        assert "templates/evidence-table.md" in text and "outside the project" in text
        bundle = run.handover(tmp_path / "bundle")
    _nothing_outside_landed(root)
    files = [p for p in Path(bundle).rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path


def test_project_file_follows_links_and_refuses_escapes(tmp_path: Path) -> None:
    """A link inside the project to a file inside it is fine; ``..`` out, an absolute part
    and a link out are refused."""
    root = tmp_path / "p"
    (root / "templates").mkdir(parents=True)
    (root / "templates" / "a.md").write_text("x")
    (root / "templates" / "b.md").symlink_to(root / "templates" / "a.md")
    assert project_file(root, "templates", "b.md") == (root / "templates" / "a.md").resolve()
    for parts in (("templates", "../../x.md"), ("templates", "/etc/passwd")):
        try:
            project_file(root, *parts, what="template")
        except UnsafePathError as exc:
            assert "outside the project" in str(exc)
        else:
            raise AssertionError(parts)


def test_unsafe_output_and_deliverable_names_are_refused_at_validate(tmp_path: Path) -> None:
    """Output names with ``../``, an absolute path or shell characters are unsafe names."""
    for bad in ("../escape.csv", "/tmp/escape.csv", "table;rm -rf ~.csv", "$(id).csv"):
        root = make_small_project(tmp_path / f"p{abs(hash(bad))}")

        def change(doc: dict, bad: str = bad) -> None:
            u = _unit(doc, "U08")
            u["outputs"] = [bad]
            u["params"]["output"] = bad
            doc["plan"]["deliverables"] = [bad]
        _edit_plan(root, change)
        problems = _problems(root)
        assert any(p["code"] == "unsafe_name" and bad in p["message"]
                   and "unsafe name" in p["message"] for p in problems), (bad, problems)
    assert unsafe_name("report.md") == "" and unsafe_name("sub/report.md") == ""


def test_a_template_cannot_reach_python_or_build_huge_values() -> None:
    """Templates are rendered in a bounded sandbox: no private attributes (no way to a
    shell), no ``'x' * 10**10``; each refusal is a TemplateRefused naming the template."""
    import pytest
    from jinja2.exceptions import SecurityError, UndefinedError

    from keepstep.engine.files.sandbox import TemplateRefused
    from keepstep.engine.kinds.render import render_text

    escape = "{{ cycler.__init__.__globals__.os.popen('echo pwned').read() }}"
    with pytest.raises((TemplateRefused, SecurityError, UndefinedError)) as err:
        render_text(escape, {})
    assert "pwned" not in str(err.value)
    with pytest.raises((TemplateRefused, SecurityError, UndefinedError)):
        render_text("{{ ''.__class__.__mro__[1].__subclasses__() }}", {})
    with pytest.raises(TemplateRefused, match="the template tried something"):
        render_text("{{ 'x' * 10000000000 }}", {})
    assert render_text("# {{ title }}\n", {"title": "Pricing"}) == "# Pricing\n"


def test_a_source_swapped_for_an_outside_link_is_refused_at_use(tmp_path: Path) -> None:
    """An approved source replaced by a link to an outside file after validate: reading it
    is refused naming the source, and validate names it too."""
    import pytest

    from keepstep.engine.errors import SourceError
    from keepstep.engine.files.project import load_project_files

    root = make_small_project(tmp_path / "p")
    files = load_project_files(root)
    sid, entry = next(iter(files.approved_sources().items()))
    (root / entry.path).unlink()
    (root / entry.path).symlink_to(_outside_secret(tmp_path))
    with pytest.raises(SourceError, match=f"source {sid}.*outside the project"):
        files.source_text(sid)
    assert any("outside the project" in p["message"] for p in _problems(root))


@settings(max_examples=examples(400), deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
       | st.from_regex(r"[\w./\\:$ -]{0,12}", fullmatch=True))
def test_the_plain_name_shortcut_answers_as_the_full_checks(name: str) -> None:
    """``unsafe_name`` accepts a name at once when it is certainly plain; every answer is the
    one the full checks give."""
    assert unsafe_name(name) == confine._unsafe_name_checks(name)
