"""`keepstep takeover DIR --run ID ACTION`: each action previews, then records a decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app

RUNNER = CliRunner()


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


def status(project: Path, run: str = "R1") -> dict:
    return json.loads(invoke("status", project, "--run", run, "--json").stdout)


def takeover_events(project: Path) -> list[dict]:
    return json.loads(invoke("events", project, "--run", "R1", "--kind", "decision.takeover",
                             "--json").stdout)


def assert_usage_error(result) -> None:
    assert result.exit_code == 2, result.output
    assert "error:" in result.output.lower() and "Traceback" not in result.output


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    assert invoke("init", root).exit_code == 0
    return root


@pytest.fixture
def half_run(project: Path) -> Path:
    """The example run stopped after U1–U4."""
    result = invoke("run", project, "--run", "R1", "--max-units", "4", "--quiet")
    assert result.exit_code == 0, result.output
    return project


@pytest.fixture
def done_project(project: Path) -> Path:
    result = invoke("run", project, "--run", "R1", "--quiet")
    assert result.exit_code == 0, result.output
    return project


def test_narrow_previews_then_the_run_finishes_without_the_dropped_units(half_run: Path) -> None:
    """narrow --drop U8 lists what is held back and what stays, records nothing without --yes;
    with --yes the run ends done while U8 and what needs it (U10, U11) never run."""
    preview = invoke("takeover", half_run, "--run", "R1", "narrow", "--drop", "U8")
    assert preview.exit_code == 0, preview.output
    assert "Held back (3): U8, U10, U11" in preview.output
    assert "To run (4): U5–U7, U9" in preview.output and "Invalidated: none" in preview.output
    assert "U11 was required final" in preview.output and "not recorded" in preview.output
    assert takeover_events(half_run) == []

    recorded = invoke("takeover", half_run, "--run", "R1", "narrow", "--drop", "U8", "--yes",
                      "--who", "tester", "--note", "no budget table this time")
    assert recorded.exit_code == 0, recorded.output
    event = takeover_events(half_run)[-1]["payload"]
    assert event["action"] == "narrow_scope" and event["dropped"] == ["U8", "U10", "U11"]
    assert event["who"] == "tester"

    done = invoke("resume", half_run, "--run", "R1", "--quiet")
    assert done.exit_code == 0 and ": done" in done.output, done.output
    st = status(half_run)
    assert st["decision"] == "done"
    assert {u: st["units"][u]["state"] for u in ("U8", "U10", "U11")} == {
        "U8": "blocked", "U10": "blocked", "U11": "blocked"}
    assert all(st["units"][u]["attempts"] == 0 for u in ("U8", "U10", "U11"))


def test_narrowing_is_not_mistaken_for_a_plan_edit(half_run: Path) -> None:
    """Resuming a narrowed run twice commits no plan change (the scope lives in decisions)."""
    assert invoke("takeover", half_run, "--run", "R1", "narrow", "--keep", "U9",
                  "--yes").exit_code == 0
    for _ in range(2):
        assert invoke("resume", half_run, "--run", "R1", "--quiet").exit_code == 0
    st = status(half_run)
    assert st["plan_version"] == "plan-v1" and "plan-change" not in st["commits_by_kind"]
    assert st["decision"] == "done"


def test_rerun_previews_the_invalidation_and_records_it(done_project: Path) -> None:
    """rerun U5 names U5 and what uses its content with their paths, then invalidates exactly
    those; resume runs U5 again and ends done."""
    preview = invoke("takeover", done_project, "--run", "R1", "rerun", "U5")
    assert preview.exit_code == 0, preview.output
    assert "Invalidated (4)" in preview.output
    assert "unit:U5 → [content] U7" in preview.output and "Reused (7)" in preview.output
    assert takeover_events(done_project) == []

    recorded = invoke("takeover", done_project, "--run", "R1", "rerun", "U5", "--yes")
    assert recorded.exit_code == 0, recorded.output
    st = status(done_project)
    invalidated = sorted(u for u, v in st["units"].items() if v["state"] == "invalidated")
    assert invalidated == ["U11", "U5", "U7", "U9"]
    assert takeover_events(done_project)[-1]["payload"]["invalidated"] == ["U5", "U7", "U9",
                                                                            "U11"]
    assert invoke("resume", done_project, "--run", "R1", "--quiet").exit_code == 0
    st = status(done_project)
    assert st["decision"] == "done" and st["units"]["U5"]["attempts"] == 2


def test_expert_blocks_the_unit_with_the_reason(half_run: Path) -> None:
    """expert U5 --note holds U5 (blocked, 'marked for an expert'); its dependents wait."""
    result = invoke("takeover", half_run, "--run", "R1", "expert", "U5", "--note",
                    "check the price claims", "--yes")
    assert result.exit_code == 0, result.output
    assert "Waiting behind it (3): U7, U9, U11" in result.output
    unit = status(half_run)["units"]["U5"]
    assert unit["state"] == "blocked" and unit["reason"] == "marked for an expert"
    assert takeover_events(half_run)[-1]["payload"]["note"] == "check the price claims"
    assert invoke("resume", half_run, "--run", "R1", "--quiet").exit_code == 3  # held
    assert status(half_run)["units"]["U7"]["state"] == "pending"


@pytest.mark.parametrize("action", [
    ["narrow", "--drop", "U8"], ["rerun", "U3"], ["branch", "--at", "2", "--as", "alt"],
    ["cancel"], ["expert", "U5", "--note", "look"],
])
def test_every_preview_is_printed_before_anything_is_recorded(half_run: Path,
                                                              action: list[str]) -> None:
    """Without --yes (no terminal) an action prints its preview and records nothing; with
    --yes the preview comes first in the output, the record line after it."""
    dry = invoke("takeover", half_run, "--run", "R1", *action)
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("Preview: ") and "Will record: " in dry.output
    assert takeover_events(half_run) == []
    assert invoke("status", half_run, "--run", "R1", "--branch", "alt").exit_code != 0
    done = invoke("takeover", half_run, "--run", "R1", *action, "--yes")
    assert done.exit_code == 0, done.output
    assert done.output.index("Preview: ") < done.output.index("Will record: ") \
        < done.output.index("recorded: ")


def test_branch_takeover_forks_the_run(half_run: Path) -> None:
    """branch --at 2 --as alt makes a branch whose head is checkpoint 2."""
    assert invoke("takeover", half_run, "--run", "R1", "branch", "--at", "2", "--as", "alt",
                  "--yes").exit_code == 0
    assert status(half_run)["head_version"] == 4
    alt = json.loads(invoke("status", half_run, "--run", "R1", "--branch", "alt",
                            "--json").stdout)
    assert alt["branch"] == "alt" and alt["head_version"] == 2


@pytest.mark.parametrize("args", [
    ["rerun"], ["rerun", "U99"], ["expert", "U5"], ["narrow"],
    ["narrow", "--drop", "U8", "--keep", "U9"], ["narrow", "--drop", "U99"],
    ["branch", "--at", "99", "--as", "far"], ["branch", "--as", "x"], ["cancel", "U5"],
    ["rerun", "U5", "--at", "2"], ["explode"],
])
def test_takeover_mistakes_are_usage_errors(half_run: Path, args: list[str]) -> None:
    """A missing or unknown unit, a wrong option for the action, a checkpoint past the head:
    exit 2 with one message, nothing recorded."""
    assert_usage_error(invoke("takeover", half_run, "--run", "R1", *args, "--yes"))
    assert takeover_events(half_run) == []
