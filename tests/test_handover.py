"""The handover bundle: its contents, its hashes, no secrets, and the CLI commands."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree

import pytest
import typer
from typer.testing import CliRunner

from keepstep.app.cli.handover import register
from keepstep.engine import open_project
from keepstep.engine.errors import KeepstepError
from keepstep.engine.report.dag_svg import STATE_COLORS, dag_svg
from keepstep.engine.report.handover import bundle_files, export_handover, verify_bundle
from keepstep.engine.report.narrative import check_narrative, narrative

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"
EXPECTED = {
    "index.html", "narrative.md", "contract.md", "plan.toml", "dag.svg", "manifest.json",
    "state/baseline.json", "state/status.json", "state/units.json", "state/inputs.json",
    "state/invalidations.json", "state/orphans.json", "state/approvals.json",
    "state/budget.json", "state/external_unknowns.json", "state/recent_errors.json",
    "state/errors_by_cause.json",
    "state/recoveries.json", "state/next_step.json",
    "deliverables/report.md", "deliverables/evidence-table.csv",
    "deliverables/decision-brief.md", "deliverables/appendix.md",
    "deliverables/change-notes.md",
}
# Written independently of engine.handover's own patterns on purpose.
KEY_LIKE = [
    re.compile(r"sk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"AKIA[0-9A-Z]{12,}"),
    re.compile(r"(?i)(key|secret|token)[\"']?\s*[:=]\s*[\"']?[0-9a-f]{32,}"),
    re.compile(r"(?i)api_key"),
]


@pytest.fixture
def run(story_dir):
    project = open_project(story_dir)
    yield project.get_run("ME-042")
    project.close()


@pytest.fixture(scope="module")
def bundle(story_dir, tmp_path_factory) -> Path:
    with open_project(story_dir) as project:
        return export_handover(project.get_run("ME-042"), tmp_path_factory.mktemp("hb") / "bundle")


def _json(bundle: Path, rel: str):
    return json.loads((bundle / rel).read_text(encoding="utf-8"))


def test_bundle_holds_the_promised_files(bundle):
    """Contract, plan, state files, deliverables, DAG, index, narrative and manifest are there,
    and the manifest lists every other file with its sha256 and size."""
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    # Issue 23: the engine's default bundle holds the cited excerpts, as the CLI's does.
    pages = {f for f in files if f.startswith("sources/")}
    assert pages and all(re.fullmatch(r"sources/[A-Z]\d+\.html", f) for f in pages)
    assert files - pages == EXPECTED
    manifest = _json(bundle, "manifest.json")
    listed = {f["path"]: f for f in manifest["files"]}
    assert set(listed) == (EXPECTED | pages) - {"manifest.json"}
    for rel, entry in listed.items():
        data = (bundle / rel).read_bytes()
        assert entry == {"path": rel, "sha256": hashlib.sha256(data).hexdigest(),
                         "size": len(data)}


def test_deliverables_match_the_committed_artifacts(bundle, run):
    """Each copied deliverable has the sha256 of its artifact manifest row."""
    manifest = _json(bundle, "manifest.json")
    rows = {r["bundle_path"]: r for r in manifest["artifacts"] if "bundle_path" in r}
    assert sorted(rows) == sorted(p for p in EXPECTED if p.startswith("deliverables/"))
    committed = {(e.attempt_id, e.name): e.sha256 for e in run.store.manifest("ME-042")}
    for rel, row in rows.items():
        digest = hashlib.sha256((bundle / rel).read_bytes()).hexdigest()
        assert digest == row["sha256"] == committed[(row["attempt_id"], row["name"])]
    current = {(r.attempt, n) for r in run.facts_records().values() for n in r.outputs}
    assert {(r["attempt_id"], r["name"]) for r in manifest["artifacts"]} == current


def test_state_files_carry_the_run_facts(bundle, run):
    """Baseline, unit states, input snapshot, invalidations, orphans, budget, errors, next step."""
    st = run.status()
    base = _json(bundle, "state/baseline.json")
    head = run.store.get_checkpoint("ME-042", st.head_version)
    assert (base["version"], base["hash"], base["kind"], base["state_hash"], base["verified"]) \
        == (41, head.hash, head.kind, head.state_hash, True)
    units = _json(bundle, "state/units.json")
    assert len(units) == 36 and {u["state"] for u in units.values()} == {"succeeded"}
    assert units["U07"]["current_attempt"] == "U07/a2"
    inputs = _json(bundle, "state/inputs.json")
    assert inputs["label"] == "in-v1" and len(inputs["sources"]) == 48
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in inputs["sources"].values())
    [change] = _json(bundle, "state/invalidations.json")["history"]
    assert sorted(change["invalidated"]) == ["U27", "U28", "U29", "U30"]
    assert change["reused"][0] == "U01" and len(change["reused"]) == 26
    assert [o["attempt_id"] for o in _json(bundle, "state/orphans.json")] == ["U07/a1"]
    assert _json(bundle, "state/budget.json") == json.loads(json.dumps(st.budget))
    errors = _json(bundle, "state/recent_errors.json")
    assert any(e["kind"] == "unit.blocked" and e["unit"] == "U21" and "budget" in e["message"]
               for e in errors)
    assert _json(bundle, "state/next_step.json")["next_action"] == st.next_action
    assert _json(bundle, "state/approvals.json")["pending"] == []
    assert (bundle / "plan.toml").read_text() == (
        run.store.artifacts.root / run.plan_info["snapshot_path"]).read_text()


def test_state_files_hold_no_source_text(bundle):
    """The input snapshot is ids and hashes: no sentence of a source reaches the state files."""
    source = sorted((PACK / "sources").glob("*.md"))[0]  # a text source (A1 is a PDF)
    lines = [ln.strip() for ln in source.read_text().splitlines() if len(ln.strip()) > 40]
    state_text = "".join(p.read_text() for p in (bundle / "state").glob("*.json"))
    assert lines and not any(ln in state_text for ln in lines)


def test_bundle_holds_no_secrets_or_model_responses(bundle, story_dir):
    """No key-like string in any file; no calls/*.json model response is copied."""
    for path in bundle.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            for rx in KEY_LIKE:
                assert not rx.search(text), f"{path.name}: {rx.pattern}"
    assert not any("calls/" in f for f in bundle_files(bundle))
    responses = {p.read_bytes() for p in (story_dir / ".keepstep" / "artifacts").rglob(
        "calls/*.json")}
    assert responses
    assert not any(p.read_bytes() in responses for p in bundle.rglob("*") if p.is_file())
    assert "token_hash" not in (bundle / "state" / "approvals.json").read_text()


def test_planted_secrets_are_redacted(story_dir, tmp_path):
    """A key in an error message or in the contract never reaches the bundle."""
    work = tmp_path / "me042"
    shutil.copytree(story_dir, work)
    fake_openai = "sk-" + "Zq9" * 12
    fake_aws = "AKIA" + "QWERTYUIOPASDFGH"
    with (work / "contract.md").open("a") as fh:
        fh.write(f"\nNote: api_key = {fake_openai}\nAPI-KEY: hunter2-not-a-hex-value\n")
    with open_project(work) as project:
        run = project.get_run("ME-042")
        run.store.append_event("ME-042", "attempt.failed", unit="U12", attempt_id="U12/a1",
                               payload={"error_class": "auth", "message": f"bad key "
                                        f"{fake_openai} / {fake_aws} secret_token="
                                        + "ab12" * 10})
        out = export_handover(run, tmp_path / "bundle.zip")
        story = narrative(run)
        assert "Failed attempt U12/a1" in story and fake_openai not in story
        assert check_narrative(run, story) == []
    report = verify_bundle(out)
    assert report.ok, report.render()
    with zipfile.ZipFile(out) as zf:
        text = "".join(zf.read(n).decode() for n in zf.namelist())
    assert fake_openai not in text and fake_aws not in text and "ab12" * 10 not in text
    assert "hunter2" not in text
    assert "[redacted]" in text
    manifest = json.loads(zipfile.ZipFile(out).read("manifest.json"))
    assert manifest["contract_matches_run"] is False


def test_folder_bundle_verifies_and_reports_changes(bundle, tmp_path):
    """verify_bundle passes an intact copy and lists changed, missing and unlisted files."""
    assert verify_bundle(bundle).ok
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    (copy / "narrative.md").write_text("# a different story\n")
    (copy / "deliverables" / "report.md").unlink()
    (copy / "notes.txt").write_text("added later\n")
    report = verify_bundle(copy)
    assert not report.ok
    assert [c.path for c in report.changed] == ["narrative.md"]
    assert report.missing == ["deliverables/report.md"]
    assert report.unlisted == ["notes.txt"]
    assert "changed: narrative.md" in report.render()


def test_zip_bundle_verifies_and_reports_changes(run, tmp_path):
    """A .zip bundle holds the same files, verifies, and a changed entry is reported."""
    out = export_handover(run, tmp_path / "ME-042.zip")
    assert out.suffix == ".zip"
    assert {f for f in bundle_files(out) if not f.startswith("sources/")} == EXPECTED
    assert verify_bundle(out).ok
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(out) as src, zipfile.ZipFile(tampered, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data.replace(b"36", b"35") if name == "state/units.json"
                         else data)
    report = verify_bundle(tampered)
    assert not report.ok and [c.path for c in report.changed] == ["state/units.json"]


def test_export_is_deterministic_and_replaces_only_a_bundle(run, tmp_path):
    """Exporting twice gives the same hashes; an earlier bundle is replaced, anything else is
    refused."""
    first = export_handover(run, tmp_path / "b")
    files = _json(first, "manifest.json")["files"]
    again = export_handover(run, tmp_path / "b")
    assert _json(again, "manifest.json")["files"] == files
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(KeepstepError, match="not a keepstep handover bundle"):
        export_handover(run, other)
    assert (other / "keep.txt").read_text() == "mine"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.refs += [v for k, v in attrs if k in ("href", "src") and v]


def test_index_links_bundle_files_and_loads_nothing_external(bundle):
    """Every link in index.html points into the bundle; no script, stylesheet link or URL."""
    html = (bundle / "index.html").read_text()
    parser = _Links()
    parser.feed(html)
    assert not parser.tags & {"script", "link", "iframe", "img"}
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}
    for ref in parser.refs:  # a citation links to its excerpt: sources/A1.html#A1-e1
        assert ref.startswith("#") or ref.split("#")[0] in files, ref
    assert {"narrative.md", "manifest.json", "contract.md", "plan.toml", "dag.svg",
            "deliverables/report.md"} <= set(parser.refs)
    assert not re.search(r"(?:href|src)=\"https?:", html)
    for text in ("U07/a1", "ME-042", "Errors by cause", "Pending approvals", "External unknowns",
                 "suggested next step"):
        assert text in html


def test_index_names_the_model_and_groups_errors_by_cause(bundle):
    """index.html says which model produced the work, and lists errors once per cause, each
    with one action (the story's budget block and its orphan are two causes, not a dump)."""
    page = (bundle / "index.html").read_text(encoding="utf-8")
    assert "local/keepstep-offline" in page and "offline heuristic" in page
    assert "Errors by cause" in page and "Recent errors" not in page
    groups = _json(bundle, "state/errors_by_cause.json")
    causes = [g["cause"] for g in groups]
    assert len(causes) == len(set(causes)) and groups
    assert all(g["action"] and g["count"] >= 1 for g in groups)
    assert sum(g["count"] for g in groups) == len(_json(bundle, "state/recent_errors.json"))


def test_errors_of_one_cause_are_one_row_with_the_units_action():
    """Twelve budget errors over three units become one row naming the three units and the
    budget raise the run needs (the Needs-you action, not a repeated message)."""
    from types import SimpleNamespace

    from keepstep.engine.report.handover import group_errors
    from keepstep.engine.report.next_action import Need

    errors = [{"ts": f"t{i}", "kind": "unit.blocked", "unit": f"U{20 + i % 3}",
               "class": "budget", "message": "budget: calls 56/56"} for i in range(12)]
    errors.append({"ts": "t99", "kind": "attempt.failed", "unit": "U07", "class": "InvalidOutput",
                   "message": "not JSON"})
    need = Need(kind="budget", unit="U20", units=["U20", "U21", "U22"], message="blocked",
                action="raise the calls limit (e.g. to 84), then resume",
                command="`keepstep budget raise --run R --calls 84 --reason 'x'`")
    groups = group_errors(errors, SimpleNamespace(needs=[need], run_id="R"))
    assert [g["cause"] for g in groups] == ["budget", "InvalidOutput"]
    assert groups[0]["count"] == 12 and groups[0]["units"] == ["U20", "U21", "U22"]
    assert "--calls 84" in groups[0]["action"]
    assert "keepstep retry --run R U07" in groups[1]["action"]


def test_dag_svg_colours_units_by_state(run):
    """The DAG is well-formed SVG with one node per unit, filled with its state's colour."""
    plan = run.plan
    states = {u.id: "succeeded" for u in plan.units} | {"U27": "invalidated", "U21": "blocked"}
    svg = dag_svg(plan, states, attempts={"U07": "U07/a2"}, orphans=["U07/a1"], title="t")
    root = ElementTree.fromstring(svg)
    ns = {"s": "http://www.w3.org/2000/svg"}
    groups = root.findall(".//s:g", ns)
    assert len(groups) == 36
    fills = {g.find("s:title", ns).text.split(" ")[0]: g.find("s:rect", ns).get("fill")
             for g in groups}
    assert fills["U27"] == STATE_COLORS["invalidated"][0]
    assert fills["U21"] == STATE_COLORS["blocked"][0]
    assert fills["U01"] == STATE_COLORS["succeeded"][0]
    assert "orphan(s): U07/a1" in svg and "gate audience" in svg
    assert dag_svg(plan, states) == dag_svg(plan, states)


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """keepstep (test)"""

    register(app)
    return app


def test_cli_handover_verify_and_narrative(story_dir, tmp_path):
    """`handover` exports and verifies; `verify-bundle` fails on a changed file;
    `narrative` prints the story and `--check` flags a changed figure."""
    runner, app = CliRunner(), _cli()
    out = tmp_path / "hb.zip"
    res = runner.invoke(app, ["handover", str(story_dir), "--run", "ME-042", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "bundle OK" in res.output and out.is_file()
    res = runner.invoke(app, ["verify-bundle", str(out)])
    assert res.exit_code == 0 and "bundle OK" in res.output
    folder = tmp_path / "hb"
    runner.invoke(app, ["handover", str(story_dir), "--run", "ME-042", "--out", str(folder)])
    (folder / "plan.toml").write_text("edited\n")
    res = runner.invoke(app, ["verify-bundle", str(folder)])
    assert res.exit_code == 1 and "changed: plan.toml" in res.output
    res = runner.invoke(app, ["narrative", str(story_dir), "--run", "ME-042"])
    assert res.exit_code == 0 and "41 checkpoint commits" in res.output
    good = tmp_path / "narrative.md"
    good.write_text(res.output)
    res = runner.invoke(app, ["narrative", str(story_dir), "--run", "ME-042", "--check",
                              str(good)])
    assert res.exit_code == 0, res.output


def test_cli_errors_are_one_line(story_dir, tmp_path):
    """An unknown run and a story workdir holding the pack are usage errors, not tracebacks."""
    runner, app = CliRunner(), _cli()
    res = runner.invoke(app, ["handover", str(story_dir), "--run", "NOPE", "--out",
                              str(tmp_path / "x")])
    assert res.exit_code == 2 and "no run 'NOPE'" in res.output
    res = runner.invoke(app, ["story", str(PACK), "--workdir", str(PACK.parent)])
    assert res.exit_code == 2 and "holds the pack itself" in res.output
    res = runner.invoke(app, ["verify-bundle", str(tmp_path / "missing.zip")])
    assert res.exit_code == 2


def test_the_engine_default_holds_the_cited_excerpts_and_the_setting_changes_it(run, tmp_path):
    """Issue 23: Run.handover(out) bundles what `keepstep handover` does by default, the
    cited excerpts; sources="files" adds the source files, sources="none" leaves them out."""
    default = {f for f in bundle_files(run.handover(tmp_path / "default")) if
               f.startswith("sources/")}
    assert default and all(f.endswith(".html") for f in default)
    assert not any(f.startswith("sources/") for f in
                   bundle_files(run.handover(tmp_path / "none", sources="none")))
    files = set(bundle_files(run.handover(tmp_path / "files", sources="files")))
    assert default < files and any(f.startswith("sources/files/") for f in files)
    with pytest.raises(KeepstepError, match="unknown sources mode"):
        run.handover(tmp_path / "bad", sources="all")
