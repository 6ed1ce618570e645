"""Early cut-off in the real run loop: a byte-identical re-run keeps its dependents current."""

from __future__ import annotations

import shutil
from pathlib import Path

from keepstep.engine import open_project

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"
APPROVE = {"audience": "product team"}


def _tamper_output(project, run, unit: str) -> None:
    rec = run.facts_records()[unit]
    path = project.store.artifacts.root / next(iter(rec.outputs.values())).path
    path.chmod(0o644)
    path.write_bytes(path.read_bytes() + b" ")


def test_cutoff_keeps_dependents_of_a_byte_identical_rerun(tmp_path):
    """A changed artifact of U05 redoes U05; its re-run output is byte-identical, so U17
    (which consumed it) is restored to current in the same commit, with a note, not redone."""
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    project = open_project(root)
    run = project.open_or_start("CUT")
    run.run(approve=APPROVE, stop_after={"U17"})
    u17_calls = len(run.store.calls(run.run_id, unit="U17"))
    _tamper_output(project, run, "U05")
    st = run.run(approve=APPROVE, stop_after={"U18"})
    records = run.facts_records()
    assert records["U05"].attempt == "U05/a2"
    assert records["U17"].state.value == "succeeded"
    assert records["U17"].attempt == "U17/a1"
    assert "U05's output is byte-identical" in records["U17"].cutoff_note
    assert len(run.store.calls(run.run_id, unit="U17")) == u17_calls
    assert {e.unit for e in run.events(kinds=["unit.kept_current"])} == {"U17"}
    assert "byte-identical" in run.explain("U17").render()
    assert st.units["U18"].state == "succeeded"
    project.close()


def test_changed_output_is_not_cut_off(tmp_path):
    """When the re-run output differs from what a dependent consumed, the dependent stays
    invalidated and is redone."""
    root = tmp_path / "pack"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    project = open_project(root)
    run = project.open_or_start("CUT2")
    run.run(approve=APPROVE, stop_after={"U17"})
    # Pretend U17 consumed different bytes from U05 than U05 will produce again.
    rec = run.facts_records()["U17"].model_copy(deep=True)
    rec.consumed["U05"] = {"evidence.json": "0" * 64}
    new_u05 = run.facts_records()["U05"]
    records = run.facts_records()
    records["U17"] = rec.model_copy(update={"state": "invalidated"})
    from keepstep.engine.core.invalidation import cutoff

    assert cutoff(run.plan, "U05", {n: o.sha256 for n, o in new_u05.outputs.items()},
                  records) == []
    project.close()
