"""A prompt edit is a typed change: it invalidates exactly the units that use that prompt
(and what depends on their substance), explained like every other change."""

from __future__ import annotations

from pathlib import Path

from keepstep.engine.api import open_project
from keepstep.engine.gateway.prompts import load_prompt
from tests.support.engine_harness import RUN, calls_by_attempt, make_small_project


def _edit_prompt(root: Path, name: str) -> None:
    packaged = load_prompt(name)
    own = root / "prompts" / f"{name}.md"
    own.parent.mkdir(exist_ok=True)
    text = (f'+++\nname = "{name}"\nversion = "{packaged.version}-local"\n+++\n'
            f"=== system ===\n{packaged.system}\nWrite in plain words.\n"
            f"=== user ===\n{packaged.user}\n")
    own.write_text(text, encoding="utf-8")


def _done(tmp_path: Path) -> Path:
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    return root


def test_a_prompt_edit_invalidates_only_the_units_that_use_it(tmp_path: Path) -> None:
    """Overriding the synthesize prompt reaches U06 (the only synthesize unit) and nothing
    else; the preview and the stored explanation name the prompt; only U06 runs again."""
    root = _done(tmp_path)
    before = calls_by_attempt(root)
    _edit_prompt(root, "synthesize")
    with open_project(root) as p:
        run = p.get_run(RUN)
        preview = run.preview()
        assert sorted(preview.invalidated) == ["U06"]
        [why] = preview.invalidated["U06"]
        assert why.change_kind == "prompt" and why.origin == "prompt:synthesize"
        assert "prompt 'synthesize' changed" in why.render()
        status = run.run()
        assert status.decision == "done", status.reasons
        [change] = run.events(kinds=["decision.plan_change"])
        assert [c["kind"] for c in change.payload["changes"]] == ["prompt"]
        assert change.payload["invalidated"] == {"U06": [why.render()]}
        record = run.facts_records()["U06"]
        assert record.attempt == "U06/a2"
        assert record.inputs_fp["prompt:synthesize"] == p.versions()["prompt:synthesize"]
    after = calls_by_attempt(root)
    assert {u for u, atts in after.items() if len(atts) > 1} == {"U06"}
    assert {u: list(a) for u, a in after.items() if u != "U06"} == {
        u: list(a) for u, a in before.items() if u != "U06"}


def test_the_revise_prompt_reaches_every_model_unit(tmp_path: Path) -> None:
    """The revise round's prompt is used by every model step: editing it reaches the model
    units (and their content dependents), never the intake units."""
    root = _done(tmp_path)
    _edit_prompt(root, "revise")
    with open_project(root) as p:
        preview = p.get_run(RUN).preview()
    assert sorted(preview.invalidated) == ["U03", "U04", "U05", "U06", "U07", "U08"]
    assert "U01" in preview.reused and "U02" in preview.reused


def test_an_unchanged_prompt_file_changes_nothing(tmp_path: Path) -> None:
    """A project copy of a packaged prompt with the same bytes is not a change."""
    root = _done(tmp_path)
    own = root / "prompts" / "rank.md"
    own.parent.mkdir()
    from importlib.resources import files

    own.write_bytes(files("keepstep.engine.gateway").joinpath("prompt_templates/rank.md")
                    .read_bytes())
    with open_project(root) as p:
        preview = p.get_run(RUN).preview()
    assert preview.invalidated == {}
