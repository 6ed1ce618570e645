"""Notebook face: the walkthrough runs offline to done, and the models display as HTML tables."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from keepstep.engine.core.estimates import UnitCost
from keepstep.engine.core.explain import Estimate, Preview, UnitExplanation
from keepstep.engine.core.state import Explanation, ExplanationStep, UnitState
from keepstep.engine.report.display import explanation_html, preview_html, status_html
from keepstep.engine.report.status import RunStatus, UnitView

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"
NOTEBOOK = PACK / "walkthrough.ipynb"

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.fixture(scope="session")
def python3_kernel() -> str:
    """A ``python3`` kernel that starts this interpreter (the venv's), installing a kernelspec
    into the venv's prefix when none resolves."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    def resolves() -> bool:
        try:
            argv = KernelSpecManager().get_kernel_spec("python3").argv
        except NoSuchKernel:
            return False
        # jupyter_client runs a bare "python" as sys.executable of the launching process.
        return bool(argv) and (argv[0] in ("python", "python3") or
                               Path(argv[0]).resolve() == Path(sys.executable).resolve())

    if not resolves():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix",
                        "--name", "python3"], check=True, capture_output=True)
    assert resolves()
    return "python3"


def test_walkthrough_holds_no_stored_outputs():
    """The committed notebook is clean: no outputs, no execution counts."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_walkthrough_imports_only_public_names():
    """Every keepstep import in the walkthrough is ``from keepstep.engine import …``."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    lines = [line.strip() for c in nb.cells if c.cell_type == "code"
             for line in c.source.splitlines() if "keepstep" in line and "import" in line]
    assert lines and all(line.startswith("from keepstep.engine import ") for line in lines)


def test_walkthrough_runs_offline_to_done(python3_kernel, tmp_path, monkeypatch):
    """Executed with nbclient in the venv's kernel: no errors; live progress is a display
    updated in place; the dashboard, an explanation and the preview show as HTML tables; a
    deliverable shows as Markdown and the export's hashes match; the narrative tells the
    run's story; the audience change stops at the gate with a resume token shown once."""
    monkeypatch.setenv("KEEPSTEP_WALKTHROUGH_DIR", str(tmp_path))
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('PREFIX=' + sys.prefix)"))
    pack_before = sorted(p.name for p in PACK.iterdir())
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=python3_kernel,
                                     resources={"metadata": {"path": str(PACK)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    progress = [h for h in html if 'class="keepstep-progress"' in h]
    assert progress and any("36/36 units done" in h and "<b>done</b>" in h for h in progress)
    assert any("28/36 units done" in h and "<b>blocked</b>" in h for h in progress)
    assert len(progress) == 3  # one display per run() call, refreshed in place
    assert any('class="keepstep-status"' in h and "<table" in h and "U36" in h for h in html)
    assert any('class="keepstep-explanation"' in h and "U28" in h for h in html)
    assert any('class="keepstep-preview"' in h and "U27" in h for h in html)
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in
                o.get("data", {})]
    assert len(markdown) == 2
    # Offline, a document's first line is the offline notice, whatever its template (issue 20
    # item 8); the brief's own heading follows it.
    notice, brief = markdown[0].split("\n\n", 1)
    assert notice.startswith("> **Written by keepstep's offline heuristic model")
    assert brief.startswith("# Decision brief")
    assert "# Handover: run ME-042" in markdown[1] and "- Decision: done — " in markdown[1]
    assert "36 of 36 current" in markdown[1]
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream"
                   and o.get("name") == "stdout")
    assert "done: every required final unit is current" in text
    assert "bundle OK" in text
    assert "resume token for gate audience (shown once): " in text
    assert "done: 36 current, 8 superseded" in text  # U27–U31, U33, U35, U36 redone
    assert f"PREFIX={sys.prefix}" in text
    assert (tmp_path / "handover" / "ME-042.zip").is_file()
    folder = tmp_path / "deliverables" / "ME-042"
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert len(manifest["files"]) == 5
    for f in manifest["files"]:
        assert hashlib.sha256((folder / f["file"]).read_bytes()).hexdigest() == f["sha256"]
    assert sorted(p.name for p in PACK.iterdir()) == pack_before  # it worked on a copy


def _status() -> RunStatus:
    return RunStatus(
        run_id="R<1>", branch="main", plan_version="plan-v1", input_version="in-v1",
        head_version=3, checkpoint_commits=3, commits_by_kind={"unit-success": 3},
        units={"U01": UnitView(state="succeeded", attempts=1, current_attempt="U01/a1"),
               "U02": UnitView(state="blocked", attempts=1, current_attempt=None,
                               reason="budget: calls 5/5 <b>")},
        counts={"current": 1, "blocked": 1}, budget={"used": {"calls": 5.0, "cost": 0.25},
                                                     "limits": {"calls": 5.0},
                                                     "left": {"calls": 0.0}},
        leases=[], pending_approvals=[{"gate": "audience", "unit": "U02", "question": "Who?",
                                       "options": [{"label": "a"}], "token_hash": "f" * 64}],
        external_unknown=[], alerts=[], next_action="raise the budget", decision="blocked",
        reasons=["U02 blocked"])


def test_status_displays_as_tables_with_escaped_values():
    """RunStatus._repr_html_ gives tables (units, budget, approvals) and escapes every value."""
    html = _status()._repr_html_()
    assert html == status_html(_status())
    assert html.count("<table") >= 4
    assert "R&lt;1&gt;" in html and "calls 5/5 &lt;b&gt;" in html and "<b>blocked</b>" in html
    assert "no limit" in html and "$0.25" in html and "Who?" in html
    assert "f" * 64 not in html


def test_preview_and_explanation_display_as_tables():
    """Preview and UnitExplanation render their paths, reuse and figures as HTML tables."""
    exp = Explanation(change_kind="contract_audience", origin="contract:audience",
                      path=[ExplanationStep(source="contract:audience", target="unit:U27",
                                            edge="audience")])
    cost = UnitCost(unit="U27", calls=2, tokens=1500, cost=0.01)
    preview = Preview(changes=[], invalidated={"U27": [exp]}, will_run=["U31"],
                      reused=["U01", "U02"],
                      estimate=Estimate(total=cost, redo=cost, first_run=UnitCost(unit="f"),
                                        units=[cost]),
                      summary="audience changed: reuse 2 units · redo U27")
    html = preview._repr_html_()
    assert html == preview_html(preview) and "<table" in html
    assert "contract:audience → [audience] U27" in html and "U01, U02" in html
    assert "1,500" in html and "$0.01" in html
    explanation = UnitExplanation(unit="U27", title="S03 <audience>", kind="synthesize",
                                  state=UnitState.invalidated, why="invalidated: because",
                                  explanations=[exp], details=["next: waits"], attempts=1,
                                  ledger=cost)
    html = explanation._repr_html_()
    assert html == explanation_html(explanation) and "<table" in html
    assert "S03 &lt;audience&gt;" in html and "invalidated" in html and "2 calls" in html


def test_the_units_table_shows_titles_and_exports_display_with_links(tmp_path) -> None:
    """A notebook's units table names each unit's title; export_deliverables() shows the
    folder and each file as links; the DAG's nodes carry the titles."""
    from keepstep.engine.report.deliverables import DeliverablesExport, ExportedFile
    from keepstep.engine.report.display import status_html as html_of

    status = _status()
    status.units["U01"].title = "Inventory <the> sources"
    html = html_of(status)
    assert "<th" in html and ">title<" in html and "Inventory &lt;the&gt; sources" in html
    export = DeliverablesExport(
        folder=str(tmp_path), run_id="R1", branch="main", plan_version="plan-v1",
        exported_at="2026-01-01T00:00:00Z", missing=["U9"],
        files=[ExportedFile(unit="U7", name="report.md", file="report.md", attempt="U7/a1",
                            sha256="a" * 64, size=2048)])
    shown = export._repr_html_()
    assert (tmp_path / "report.md").as_uri() in shown and "2,048 bytes" in shown
    assert "U9" in shown and "1 deliverable(s) exported" in shown

    from keepstep.engine.plan import load_plan
    from keepstep.engine.report.dag_svg import dag_svg

    plan = load_plan(PACK / "plan.toml")
    svg = dag_svg(plan, {})
    first = plan.units[0]
    assert first.title[:15] in svg
