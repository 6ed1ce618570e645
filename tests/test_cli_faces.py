"""The CLI for daily use: DIR found from the working directory, sources' command order, full
help, exit codes, --json outputs, live progress, export, resume tokens, superseded counts."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import click
import pytest
import typer.main
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from tests.support.tui_support import gate_project

RUNNER = CliRunner()


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    assert invoke("init", root).exit_code == 0
    return root


@pytest.fixture
def done_project(project: Path) -> Path:
    result = invoke("run", project, "--quiet")
    assert result.exit_code == 0, result.output
    return project


# --- DIR from the working directory ----------------------------------------------------------
READ_COMMANDS = [
    ["status"], ["status", "--json"], ["status", "--all"], ["events", "--limit", "3"],
    ["calls", "--json"], ["effects"], ["effects", "list", "--json"], ["approvals"],
    ["explain", "U1"], ["explain", "U1", "--json"], ["preview"], ["verify"],
    ["verify", "--json"], ["narrative"], ["narrative", "--json"], ["sources"],
    ["sources", "list", "--json"], ["validate"], ["validate", "--json"],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=" ".join)
def test_every_read_command_works_from_inside_the_project_without_dir(
        done_project: Path, monkeypatch, args: list[str]) -> None:
    """Run from a subfolder of the project, without DIR or --run: the project is found
    upward and the run is keepstep.toml's default_run (R1)."""
    monkeypatch.chdir(done_project / "sources")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "error:" not in result.output


def test_dir_is_still_accepted_first_and_outside_a_project_it_is_needed(
        done_project: Path, tmp_path: Path, monkeypatch) -> None:
    """`keepstep explain DIR U1` works from anywhere; without DIR outside a project the
    error says how to go on."""
    monkeypatch.chdir(tmp_path)
    assert invoke("explain", done_project, "U1").exit_code == 0
    lost = invoke("explain", "U1")
    assert lost.exit_code == 2 and "no keepstep project in" in lost.output


def test_suggested_commands_name_the_project_only_when_you_are_outside_it(
        done_project: Path, tmp_path: Path, monkeypatch) -> None:
    """Inside the project the next step reads `keepstep export --run R1`; outside, the
    real path is put in; never a placeholder DIR."""
    monkeypatch.chdir(done_project)
    inside = invoke("status").output
    assert "`keepstep export --run R1`" in inside and "DIR" not in inside
    monkeypatch.chdir(tmp_path)
    outside = invoke("status", done_project).output
    assert f"`keepstep export {done_project} --run R1`" in outside and "DIR" not in outside


# --- sources ----------------------------------------------------------------------------------
def test_sources_list_takes_dir_after_the_command_and_the_old_order_still_works(
        project: Path) -> None:
    """`sources list DIR` like every command; `sources DIR list` still lists, with a note."""
    new = invoke("sources", "list", project)
    assert new.exit_code == 0 and "4 source(s), 4 approved" in new.stdout
    old = invoke("sources", project, "list")
    assert old.exit_code == 0 and old.stdout == new.stdout
    assert "is the old order; use `keepstep sources list" in old.stderr
    revoke = invoke("sources", project, "revoke", "A2")
    assert revoke.exit_code == 0 and "source A2 revoked" in revoke.stdout


def test_sources_list_json(done_project: Path) -> None:
    """--json gives each source with its hash and how it stands against the run."""
    data = json.loads(invoke("sources", "list", done_project, "--json").stdout)
    assert data["run"] == "R1" and data["snapshot"] == "in-v1"
    assert {s["id"] for s in data["sources"]} == {"A1", "A2", "B1", "B2"}
    assert all(len(s["sha256"]) == 64 and s["snapshot"] == "in-v1" for s in data["sources"])


def test_revoking_a_source_prints_its_impact_before_writing(done_project: Path) -> None:
    """The impact on the run is printed before sources.toml changes."""
    result = invoke("sources", "revoke", done_project, "A1")
    assert result.exit_code == 0, result.output
    impact = result.stdout.index("impact on run R1: the next resume invalidates")
    assert impact < result.stdout.index("source A1 revoked")


def test_at_a_terminal_revoking_a_source_that_redoes_work_asks_first(
        done_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a terminal: the impact, then "Revoke A1?"; answering no leaves sources.toml as it
    was; yes (or --yes) revokes."""
    from keepstep.app.cli import common

    monkeypatch.setattr(common, "on_terminal", lambda: True)
    monkeypatch.setattr("keepstep.app.cli.project.on_terminal", lambda: True)
    sources = done_project / "sources.toml"
    before = sources.read_bytes()
    declined = RUNNER.invoke(app, ["sources", "revoke", str(done_project), "A1"], input="n\n")
    assert declined.exit_code == 0, declined.output
    assert "Revoke A1?" in declined.output and "not revoked" in declined.output
    assert declined.output.index("the next resume invalidates") < declined.output.index(
        "Revoke A1?")
    assert sources.read_bytes() == before
    accepted = RUNNER.invoke(app, ["sources", "revoke", str(done_project), "A1"], input="y\n")
    assert accepted.exit_code == 0 and "source A1 revoked" in accepted.output
    assert sources.read_bytes() != before


# --- help ---------------------------------------------------------------------------------------
def _commands():
    group = typer.main.get_command(app)
    ctx = click.Context(group, info_name="keepstep")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                yield f"{name} {sub}", command.get_command(ctx, sub)
        else:
            yield name, command


def test_help_summaries_are_whole_and_usage_lines_have_no_braces() -> None:
    """No summary is cut with "..." or "…"; no usage line shows {DIR}."""
    top = invoke("--help").output
    assert "..." not in top.split("Commands:")[1] and "…" not in top
    for name, _ in _commands():
        text = invoke(*name.split(), "--help").output
        usage = text.splitlines()[0]
        assert "{" not in usage, usage
        assert "..." not in text.split("Commands:")[-1] if "Commands:" in text else True


@pytest.mark.parametrize("name", ["status", "run", "resume", "explain", "export", "validate",
                                  "approve", "approvals", "takeover", "effects settle",
                                  "sources list", "budget raise", "handover", "narrative"])
def test_major_commands_show_an_example(name: str) -> None:
    """Each major command's help has an Example with a real command line."""
    text = invoke(*name.split(), "--help").output
    assert "Example:" in text and f"keepstep {name.split()[0]}" in text.split("Example:")[1]


# --- exit codes and --json ---------------------------------------------------------------------
def test_run_exit_codes_say_done_blocked_or_usage(project: Path) -> None:
    """0 when done, 3 when the run waits for a person (a gate), 2 for a usage error."""
    gated = gate_project(project.parent / "gated")
    blocked = invoke("run", gated, "--quiet")
    assert blocked.exit_code == 3, blocked.output
    assert invoke("resume", gated, "--approve", "depth=summary", "--quiet").exit_code == 0
    assert invoke("run", project, "--approve", "x", "--quiet").exit_code == 2


def test_failed_units_exit_4(project: Path, monkeypatch) -> None:
    """A run that ends with a failed unit exits 4 (and says so in --json)."""
    from keepstep.engine.api import Run

    real = Run.run

    def failing(self, **kwargs):
        status = real(self, **kwargs)
        status.decision = "blocked"
        status.units["U3"] = status.units["U3"].model_copy(update={"state": "failed"})
        return status

    monkeypatch.setattr(Run, "run", failing)
    result = invoke("run", project, "--json")
    assert result.exit_code == 4
    assert json.loads(result.stdout)["exit_code"] == 4


def test_run_json_is_the_final_status_and_progress_goes_to_stderr(project: Path) -> None:
    """`run --json`: stdout is one JSON document (the final status, with exit_code); the
    plain progress lines go to stderr."""
    result = invoke("run", project, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["decision"] == "done" and data["exit_code"] == 0
    assert data["counts"]["current"] == 11 and data["counts"]["superseded"] == 0
    assert "U11/a1 committed" in result.stderr and "[11/11 done]" in result.stderr


def test_plain_progress_lines_when_not_a_terminal(project: Path) -> None:
    """Without a terminal, one line per event with done of total (no live display codes)."""
    result = invoke("run", project)
    assert result.exit_code == 0
    assert "▶ U1 started" in result.stdout and "[1/11 done]" in result.stdout
    assert "\x1b[" not in result.stdout


def test_validate_json_lists_every_problem(project: Path) -> None:
    """--json: ok with counts, or every problem (exit 2)."""
    ok = json.loads(invoke("validate", project, "--json").stdout)
    assert ok["ok"] and ok["units"] == 11 and ok["approved_sources"] == 4
    plan = project / "plan.toml"
    plan.write_text(plan.read_text().replace('depends_on = ["U1"]', 'depends_on = ["U99"]', 1))
    bad = invoke("validate", project, "--json")
    assert bad.exit_code == 2
    data = json.loads(bad.stdout)
    assert not data["ok"] and any("U99" in p["line"] for p in data["problems"])


def test_verify_and_narrative_json(done_project: Path, tmp_path: Path) -> None:
    """verify --json is the chain report; narrative --json the text, --check the mismatches."""
    chain = json.loads(invoke("verify", done_project, "--json").stdout)
    assert chain["ok"] and chain["checked"] >= 11
    story = json.loads(invoke("narrative", done_project, "--json").stdout)
    assert story["run"] == "R1" and story["narrative"].startswith("# Handover: run R1")
    wrong = tmp_path / "n.md"
    wrong.write_text(story["narrative"].replace("11 of 11 current", "10 of 11 current"))
    checked = invoke("narrative", done_project, "--check", wrong, "--json")
    assert checked.exit_code == 1 and json.loads(checked.stdout)["ok"] is False


# --- export -------------------------------------------------------------------------------------
def test_export_writes_the_deliverables_with_hashes_matching_the_manifest(
        done_project: Path) -> None:
    """deliverables/R1 holds each current deliverable and manifest.json with its sha256;
    exporting again replaces the earlier export; a foreign folder is refused."""
    result = invoke("export", done_project)
    assert result.exit_code == 0, result.output
    folder = done_project / "deliverables" / "R1"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "keepstep-deliverables/1" and manifest["files"]
    for f in manifest["files"]:
        assert hashlib.sha256((folder / f["file"]).read_bytes()).hexdigest() == f["sha256"]
        assert f["size"] == (folder / f["file"]).stat().st_size
    assert invoke("export", done_project).exit_code == 0
    foreign = done_project / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = invoke("export", done_project, "--out", foreign)
    assert refused.exit_code == 1 and "not an earlier deliverables export" in refused.output
    assert (foreign / "notes.txt").read_text() == "mine"


def test_export_refuses_a_deliverable_that_no_longer_matches(done_project: Path) -> None:
    """A changed artifact stops the export, naming the file; nothing is written."""
    from keepstep.engine import open_project

    with open_project(done_project) as p:
        d = p.get_run("R1").deliverables()[0]
    path = Path(d.path)
    path.chmod(0o644)
    path.write_text("tampered")
    result = invoke("export", done_project)
    assert result.exit_code == 1 and "no longer matches its committed sha256" in result.output
    assert not (done_project / "deliverables").exists()


# --- resume tokens ----------------------------------------------------------------------------
def test_the_resume_token_is_shown_once_and_works_once(project: Path) -> None:
    """The run that reaches a gate prints its token; approvals does not show it again (only
    its hash is kept); --new-token issues a fresh one and the old one stops working."""
    gated = gate_project(project.parent / "gated")
    first = invoke("run", gated, "--quiet")
    [token] = re.findall(r"single use\): (\S+)", first.stdout)
    listing = invoke("approvals", gated)
    assert token not in listing.stdout and "needs no token" in listing.stdout
    fresh = invoke("approvals", gated, "--new-token")
    [new_token] = re.findall(r"single use\): (\S+)", fresh.stdout)
    assert new_token != token
    old = invoke("approve", gated, "depth", "--choice", "summary", "--token", token)
    assert old.exit_code == 2 and "no longer open" in old.output
    ok = invoke("approve", gated, "depth", "--choice", "summary", "--token", new_token)
    assert ok.exit_code == 0, ok.output
    again = invoke("approve", gated, "depth", "--choice", "summary", "--token", new_token)
    assert again.exit_code == 2


# --- figures -------------------------------------------------------------------------------------
def test_me042_status_reports_superseded_successes_beside_current(story_dir: Path) -> None:
    """ME-042 ends with 36 current and 4 superseded successes, in --json and in text."""
    data = json.loads(invoke("status", story_dir, "--run", "ME-042", "--json").stdout)
    assert data["counts"]["current"] == 36 and data["counts"]["superseded"] == 4
    assert data["counts"]["invalidated"] == 0  # nothing is invalidated now
    text = invoke("status", story_dir).stdout
    assert "current 36  superseded 4" in text


def test_status_default_run_is_keepstep_toml_default_run(story_dir: Path,
                                                         tmp_path: Path) -> None:
    """The sample pack's default_run is ME-042: status without --run shows it, with the
    other runs named."""
    copy = tmp_path / "me042"
    shutil.copytree(story_dir, copy)
    assert invoke("restart", copy, "--as", "ME-043").exit_code == 0
    text = invoke("status", copy).stdout
    assert "run ME-042 (main)" in text and "other runs: ME-043" in text
