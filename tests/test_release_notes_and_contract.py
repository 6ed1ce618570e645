"""Issue 21's smaller items, each pinned: a gate's change note says what it binds; a resume
that only applied changes is not logged as an interruption; contract.md's YAML (or TOML)
front matter; a contract field a template names reaches that template's documents; the
built-in templates are overridable; a memo without a contract title uses the plan's title;
a validator failure that repeats identically is not retried (and `status` shows no orphans
after it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.core.changes import ChangeKind, detect_changes
from keepstep.engine.core.inputs import Contract, InputSnapshot
from keepstep.engine.errors import ProjectError
from keepstep.engine.files.project import DEFAULT_TEMPLATES_DIR, parse_contract, template_file
from keepstep.engine.kinds.audit import _note
from keepstep.engine.kinds.parts import with_provenance
from tests.test_root_changes import PLAN, reach


def test_a_gate_change_note_says_what_it_binds() -> None:
    """An audience gate's note names the audience it binds; a release gate's the delivered
    bytes and the audit verdict — not "Applies while the contract is unchanged"."""
    audience = _note("approval.decided", "S01", {"gate": "audience", "choice": "CFO",
                     "bound_object": {"binds": {"contract:audience": "CFO"}}})
    assert audience is not None
    assert audience[1] == ["Applies while the contract's audience is 'CFO'."]
    release = _note("approval.decided", "X01", {"gate": "release", "choice": "release",
                    "bound_object": {"binds": {
                        "verdict:A01": {"passed": True, "failed": []},
                        "deliver:X01": {"D01:memo.md": "1a2b3c4d5e6f7788"},
                        "audited:X01": {}}}})
    assert release is not None
    note = release[1][0]
    assert "A01's verdict is passed" in note and "memo.md sha256 1a2b3c4d5e6f" in note
    assert "the audit passed on the bytes X01 delivers" in note
    assert "contract is unchanged" not in note


def test_a_resume_that_only_applied_changes_is_not_an_interruption() -> None:
    """recovery.done with changes and no orphan or fenced lease: "Resumed: applied what
    changed"; with an orphan: "Recovered after an interruption"."""
    plain = _note("recovery.done", None, {"did_work": True, "changes": ["template: x"],
                                          "invalidated": ["D01"], "reused": 3})
    crashed = _note("recovery.done", None, {"did_work": True, "orphans": ["D01/a2"],
                                            "reused": 3})
    assert plain is not None and plain[0] == "Resumed: applied what changed"
    assert crashed is not None and crashed[0] == "Recovered after an interruption"


YAML = """---
title: "Market entry"
audience: finance director
goal: Decide
date: 2025-03-14
---

Body.
"""


def test_contract_front_matter_may_be_yaml_or_toml() -> None:
    """YAML (---) and TOML (+++) front matter give the same fields; a YAML date is text."""
    yaml = parse_contract(YAML)
    toml = parse_contract(YAML.replace("---", "+++").replace(": ", " = ").replace(
        "= finance director", '= "finance director"').replace("= Decide", '= "Decide"')
        .replace("= 2025-03-14", '= "2025-03-14"'))
    assert yaml.fields == toml.fields == {"title": "Market entry", "audience":
                                          "finance director", "goal": "Decide",
                                          "date": "2025-03-14"}
    assert yaml.body == "Body.\n"
    with pytest.raises(ProjectError, match="not valid YAML"):
        parse_contract("---\naudience: [unclosed\n---\n")
    with pytest.raises(ProjectError, match="has no front matter"):
        parse_contract("# no front matter\n")


def test_a_contract_field_a_template_names_reaches_its_documents() -> None:
    """'status' changed in contract.md: the memo template names it, so MEMO (and what reads
    the memo) is redone without any contract intake dependency."""
    old = Contract(fields={"audience": "a", "goal": "g", "status": "draft"}, body="b\n")
    new = Contract(fields={"audience": "a", "goal": "g", "status": "final"}, body="b\n")
    changes = detect_changes(
        old_inputs={}, new_snapshot=InputSnapshot(sources={}, groups={}),
        old_contract_fields=old.field_hashes(), new_contract=new, old_plan=None,
        new_plan=PLAN, old_templates={}, new_templates={}, old_versions={}, new_versions={},
        template_fields={"memo": ["title", "status"], "other": ["title"]})
    kinds = sorted((c.kind.value, c.origin) for c in changes)
    assert kinds == [("contract_field", "contract:status"), ("template", "template:memo")]
    template = next(c for c in changes if c.kind == ChangeKind.template)
    assert "MEMO" in reach([template])


def test_built_in_templates_serve_the_standard_documents_unless_the_project_has_its_own(
        tmp_path: Path) -> None:
    for name in ("evidence-table", "risk-register", "appendix", "change-notes"):
        assert template_file(tmp_path, name) == DEFAULT_TEMPLATES_DIR / f"{name}.md"
    assert template_file(tmp_path, "memo") is None
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "risk-register.md").write_text("# Ours {{ risks }}\n")
    assert template_file(tmp_path, "risk-register") == tmp_path / "templates" / \
        "risk-register.md"


def test_the_provenance_line_is_added_once_whatever_the_template() -> None:
    line = "_Produced with the offline heuristic model._"
    assert with_provenance("# Memo\n\nText.\n", line).endswith("\n\n" + line + "\n")
    assert with_provenance(f"# Memo\n\n{line}\n", line) == f"# Memo\n\n{line}\n"
    assert with_provenance("# Memo\n", "") == "# Memo\n"


def test_a_validator_failure_that_repeats_identically_is_not_retried(tmp_path: Path) -> None:
    """A model that answers every extract request for A2 with no JSON: the first attempt
    fails its validators, the second fails the same way on the same inputs, and the unit
    stops there (not a third blind attempt), saying so and what to do."""
    from keepstep.engine.api import open_project
    from tests.support.engine_harness import RUN, make_small_project
    from tests.support.model_server import running_server

    rule = {"match": {"task": "extract", "source_id": "A2"}, "do": "no_json", "times": 100}
    with running_server("clean", rules=[rule]) as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")
        root = make_small_project(tmp_path / "small", default_model="openai/gpt-4o-mini",
                                  api_base=server.api_base, policy={"max_unit_retries": 3})
        with open_project(root) as p:
            status = p.start_run(RUN).run()
            attempts = [a for a in p.store.attempts(RUN, "U03")]
            # Two ordinary validation failures leave their diagnosis files, not orphans.
            assert p.get_run(RUN).status().counts["orphans"] == 0
    assert status.decision == "blocked"
    assert len(attempts) == 2, [a.attempt_id for a in attempts]
    reason = next(r for r in status.reasons if r.startswith("U03"))
    assert "same failure as attempt U03/a1 on the same inputs" in reason
    assert "keepstep retry U03" in reason


def test_a_memo_without_a_contract_title_takes_the_plans_title(tmp_path: Path) -> None:
    """No title in contract.md and no contract intake unit: the plan's title, not
    "Research pack"."""
    from keepstep.engine.api import open_project
    from tests.support.engine_harness import RUN, make_small_project
    from tests.support.small_project import small_units

    units = [*small_units(), {
        "id": "U09", "title": "Brief", "phase": "deliverables", "kind": "render",
        "inputs": ["template:brief"], "outputs": ["brief.md"], "depends_on": ["U06", "U05"],
        "validators": ["structure", "citations"], "required_final": True,
        "params": {"document": "brief", "template": "brief"}}]
    root = make_small_project(tmp_path / "small", units=units)
    (root / "templates" / "brief.md").write_text("# {{ title }}\n\n{{ findings }}\n")
    text = (root / "contract.md").read_text()
    (root / "contract.md").write_text("\n".join(
        line for line in text.splitlines() if not line.startswith("title")) + "\n")
    with open_project(root) as p:
        run = p.start_run(RUN)
        assert run.run().decision == "done"
        ref = run.facts_records()["U09"].outputs["brief.md"]
        brief = (p.store.artifacts.root / ref.path).read_text()
    # The offline notice stands first in every document (issue 20); the title heads the rest.
    headings = [line for line in brief.splitlines() if line.startswith("# ")]
    assert headings[0] == "# small keepstep test plan"
