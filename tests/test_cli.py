"""The `keepstep` command line, driven through typer's CliRunner on the init example."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app

RUNNER = CliRunner()
STATUS_KEYS = {
    "run_id", "branch", "plan_version", "input_version", "head_version", "checkpoint_commits",
    "units", "counts", "budget", "leases", "pending_approvals", "external_unknown", "alerts",
    "next_action",
}
CALL_KEYS = {"unit", "attempt", "round", "model", "tokens_in", "tokens_out", "cost", "outcome"}
GATE = """
[[gate]]
id = "audience"
unit = "U5"
question = "Write the findings for the owners?"
options = ["owners"]
"""


def invoke(*args: object, input: str | None = None):
    return RUNNER.invoke(app, [str(a) for a in args], input=input)


def assert_clean_failure(result, code: int) -> None:
    """Exit code as given, an 'error:' line, and no traceback."""
    assert result.exit_code == code, result.output
    assert "error:" in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    result = invoke("init", root)
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def done_project(project: Path) -> Path:
    result = invoke("run", project, "--run", "R1", "--quiet")
    assert result.exit_code == 0, result.output
    return project


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def approved(project: Path) -> dict[str, bool]:
    data = tomllib.loads((project / "sources.toml").read_text(encoding="utf-8"))
    return {s["id"]: s["approved"] for s in data["source"]}


# --- init, validate ----------------------------------------------------------------------------
def test_init_creates_a_project_that_validates(project: Path) -> None:
    """`init` writes the example and `validate` reports it OK with its unit and gate counts."""
    assert (project / "keepstep.toml").is_file() and (project / "plan.toml").is_file()
    assert len(list((project / "sources").glob("*.md"))) == 4
    result = invoke("validate", project)
    assert result.exit_code == 0, result.output
    assert "plan OK: 11 units, 0 gates" in result.output


def test_init_refuses_a_non_empty_folder_without_force(project: Path) -> None:
    """A second `init` into the same folder is refused (exit 2) unless --force is given."""
    assert_clean_failure(invoke("init", project), 2)
    assert "not empty" in invoke("init", project).output
    assert invoke("init", project, "--force").exit_code == 0


def test_validate_names_the_units_of_a_cycle(project: Path) -> None:
    """A dependency cycle is reported with the units on it, exit 2."""
    edit(project / "plan.toml", 'depends_on = ["U1"]', 'depends_on = ["U1", "U4"]')
    result = invoke("validate", project)
    assert_clean_failure(result, 2)
    assert "dependency cycle" in result.output and "U3" in result.output and "U4" in result.output


def test_validate_names_an_unknown_dependency(project: Path) -> None:
    """A dependency on a unit that does not exist names both units, exit 2."""
    edit(project / "plan.toml", 'depends_on = ["U3"]', 'depends_on = ["U3", "U99"]')
    result = invoke("validate", project)
    assert_clean_failure(result, 2)
    assert "unit U4" in result.output and "'U99'" in result.output


def test_validate_names_an_unapproved_source(project: Path) -> None:
    """A unit citing a source that is not approved is reported with the command to approve it."""
    edit(project / "plan.toml", 'inputs = ["template:appendix"]',
         'inputs = ["template:appendix", "source:B2"]')
    assert invoke("sources", project, "revoke", "B2").exit_code == 0
    result = invoke("validate", project)
    assert_clean_failure(result, 2)
    assert "unit U10" in result.output and "'B2' is not approved" in result.output
    # Issue 23: no DIR placeholder; outside the project, its real path.
    assert f"`keepstep sources approve {shlex.quote(str(project))} B2`" in result.output


def test_validate_reports_every_problem_at_once(project: Path) -> None:
    """Several problems are listed together, not one per run."""
    edit(project / "plan.toml", 'depends_on = ["U1"]', 'depends_on = ["U1", "U4"]')
    edit(project / "plan.toml", 'depends_on = ["U2", "U5", "U6"]',
         'depends_on = ["U2", "U5", "U6", "U42"]')
    result = invoke("validate", project)
    assert_clean_failure(result, 2)
    assert "2 problem(s)" in result.output


# --- sources ---------------------------------------------------------------------------------
def test_sources_revoke_and_approve_round_trip(project: Path) -> None:
    """revoke then approve flips the flag in sources.toml; list shows it."""
    assert approved(project)["A2"] is True
    assert invoke("sources", project, "revoke", "A2").exit_code == 0
    assert approved(project)["A2"] is False
    listing = invoke("sources", project, "list")
    assert listing.exit_code == 0
    row = next(line for line in listing.output.splitlines() if line.startswith("A2"))
    assert " no " in row
    assert invoke("sources", project, "approve", "A2").exit_code == 0
    assert approved(project)["A2"] is True


def test_sources_list_is_the_default_and_shows_hash_prefixes(project: Path) -> None:
    """`sources DIR` alone lists id, group, approval and a sha256 prefix per source."""
    result = invoke("sources", project)
    assert result.exit_code == 0, result.output
    assert "sha256" in result.output and "4 source(s), 4 approved" in result.output


def test_sources_approve_unknown_id_is_a_usage_error(project: Path) -> None:
    """Approving an id that sources.toml lacks exits 2 and lists the known ids."""
    result = invoke("sources", project, "approve", "ZZ")
    assert_clean_failure(result, 2)
    assert "A1, A2, B1, B2" in result.output


def test_sources_add_copies_an_outside_file_unapproved(project: Path, tmp_path: Path) -> None:
    """`add` copies a file from outside into sources/ and records it as not approved."""
    doc = tmp_path / "C1-notes.md"
    doc.write_text("# Notes\n\nThe bakery sold 120 loaves on 3 May 2025.\n", encoding="utf-8")
    result = invoke("sources", project, "add", doc, "--id", "C1", "--group", "C")
    assert result.exit_code == 0, result.output
    assert (project / "sources" / "C1-notes.md").is_file()
    assert approved(project)["C1"] is False
    assert invoke("sources", project, "add", doc, "--id", "C1").exit_code == 2


def test_sources_list_shows_the_run_snapshot_version(done_project: Path) -> None:
    """With one run, the list shows the input snapshot version the run is at."""
    result = invoke("sources", done_project, "list")
    assert "run R1" in result.output and "in-v1" in result.output


# --- status and errors --------------------------------------------------------------------------
def test_status_json_on_a_fresh_run_has_every_key(project: Path) -> None:
    """status --json on a run that has not executed anything carries the whole contract."""
    from keepstep.engine import open_project

    with open_project(project) as p:
        p.start_run("R1")
    result = invoke("status", project, "--run", "R1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert STATUS_KEYS <= set(data)
    assert set(data["counts"]) >= {"current", "invalidated", "orphans", "ready", "running",
                                   "blocked"}
    assert set(data["budget"]) >= {"used", "limits"}
    assert set(data["units"]["U1"]) >= {"state", "attempts", "current_attempt"}
    assert data["units"]["U1"]["state"] == "pending" and data["head_version"] == 0


def test_status_without_runs_says_how_to_start_one(project: Path) -> None:
    """status on a project with no run explains how to start one (exit 0)."""
    result = invoke("status", project)
    assert result.exit_code == 0
    assert "no runs yet" in result.output and "--run" in result.output


def test_missing_project_folder_is_one_clear_line(tmp_path: Path) -> None:
    """A folder that does not exist gives a single error with what to do, exit 2."""
    result = invoke("status", tmp_path / "nowhere")
    assert_clean_failure(result, 2)
    assert "does not exist" in result.output and "keepstep init" in result.output


def test_folder_without_keepstep_toml_is_one_clear_line(tmp_path: Path) -> None:
    """A folder without keepstep.toml is named as not a project, exit 2."""
    result = invoke("run", tmp_path, "--run", "R1")
    assert_clean_failure(result, 2)
    assert "no keepstep.toml" in result.output


def test_unknown_run_is_a_usage_error(project: Path) -> None:
    """Naming a run that does not exist lists the known runs and how to start one."""
    result = invoke("status", project, "--run", "NOPE")
    assert_clean_failure(result, 2)
    assert "no run 'NOPE'" in result.output


def test_corrupt_state_db_gives_a_clear_message(project: Path) -> None:
    """Garbage in .keepstep/state.db is reported as an unreadable database, no traceback."""
    (project / ".keepstep").mkdir()
    (project / ".keepstep" / "state.db").write_bytes(b"\x13\x37not sqlite at all" * 300)
    result = invoke("status", project)
    assert_clean_failure(result, 1)
    # The storage layer words the cause; what matters is the file named and a way out.
    assert "state.db" in result.output and "database" in result.output
    assert "aside" in result.output or "backup" in result.output


def test_no_arguments_outside_a_project_prints_help_and_a_hint(tmp_path: Path,
                                                               monkeypatch) -> None:
    """`keepstep` alone outside a project shows the commands and says to cd or init."""
    monkeypatch.chdir(tmp_path)
    result = invoke()
    assert result.exit_code == 2
    assert "Commands" in result.output and "no keepstep.toml" in result.output


# --- running -----------------------------------------------------------------------------------
def test_run_takes_the_init_example_to_done(project: Path) -> None:
    """`run` executes every unit of the example offline and ends done, naming the model."""
    result = invoke("run", project, "--run", "R1")
    assert result.exit_code == 0, result.output
    assert "U11/a1 committed" in result.output
    assert "offline heuristic" in result.output
    status = json.loads(invoke("status", project, "--json").stdout)
    assert status["decision"] == "done" and status["counts"]["current"] == 11


def test_run_max_units_stops_early_and_resume_finishes(project: Path) -> None:
    """--max-units stops after N units; resume takes the run to done without redoing them."""
    first = invoke("run", project, "--run", "R1", "--max-units", "2", "--quiet")
    assert first.exit_code == 0, first.output
    assert "2/11 units current" in first.output
    second = invoke("resume", project, "--run", "R1", "--quiet")
    assert second.exit_code == 0 and "done" in second.output
    data = json.loads(invoke("status", project, "--run", "R1", "--json").stdout)
    assert all(u["attempts"] == 1 for u in data["units"].values())


def test_resume_of_an_unknown_run_is_a_usage_error(project: Path) -> None:
    """resume does not create runs: an unknown id exits 2."""
    assert_clean_failure(invoke("resume", project, "--run", "R9"), 2)


def test_bad_approve_syntax_is_a_usage_error(project: Path) -> None:
    """--approve without '=' is refused before anything runs."""
    result = invoke("run", project, "--run", "R1", "--approve", "audience")
    assert_clean_failure(result, 2)
    assert "GATE=CHOICE" in result.output


def test_calls_json_has_one_object_per_call(done_project: Path) -> None:
    """calls --json lists every model call with the documented fields."""
    result = invoke("calls", done_project, "--run", "R1", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all(set(r) == CALL_KEYS for r in rows)
    assert {r["unit"] for r in rows} == {"U3", "U4", "U5", "U6"}
    assert all(r["model"] == "local/keepstep-offline" and r["outcome"] == "ok" for r in rows)
    text = invoke("calls", done_project, "--run", "R1").output
    assert f"{len(rows)} call(s)" in text


def test_events_filter_by_kind_prefix_and_unit(done_project: Path) -> None:
    """events lists the log; --kind and --unit narrow it."""
    everything = json.loads(invoke("events", done_project, "--run", "R1", "--json").stdout)
    assert {"decision.start", "unit.claimed"} <= {e["kind"] for e in everything}
    claims = json.loads(invoke("events", done_project, "--run", "R1", "--kind", "unit.claimed",
                               "--json").stdout)
    assert len(claims) == 11 and all(e["kind"] == "unit.claimed" for e in claims)
    one = json.loads(invoke("events", done_project, "--run", "R1", "--unit", "U3",
                            "--json").stdout)
    assert one and all(e["unit"] == "U3" for e in one)
    assert "decision.start" in invoke("events", done_project, "--run", "R1").output


def test_budget_raise_needs_a_reason(done_project: Path) -> None:
    """Without --reason (or with an empty one) a budget raise is a usage error."""
    missing = invoke("budget", "raise", done_project, "--run", "R1", "--calls", "80")
    assert missing.exit_code == 2 and "--reason" in missing.output
    empty = invoke("budget", "raise", done_project, "--run", "R1", "--calls", "80",
                   "--reason", " ")
    assert_clean_failure(empty, 2)
    assert "needs a reason" in empty.output


def test_budget_raise_needs_a_limit(done_project: Path) -> None:
    """A raise naming no counter is refused with the options to use."""
    result = invoke("budget", "raise", done_project, "--run", "R1", "--reason", "more")
    assert_clean_failure(result, 2)
    assert "--calls" in result.output


def test_budget_raise_is_recorded_as_a_decision(done_project: Path) -> None:
    """A raise updates the limit shown by status and leaves a decision.budget_raise event."""
    result = invoke("budget", "raise", done_project, "--run", "R1", "--calls", "80",
                    "--reason", "room for a rerun", "--who", "tester")
    assert result.exit_code == 0, result.output
    status = json.loads(invoke("status", done_project, "--json").stdout)
    assert status["budget"]["limits"]["calls"] == 80
    events = json.loads(invoke("events", done_project, "--run", "R1", "--kind",
                               "decision.budget_raise", "--json").stdout)
    assert events[-1]["payload"]["who"] == "tester"
    assert events[-1]["payload"]["reason"] == "room for a rerun"


def test_gate_blocks_until_approved(project: Path) -> None:
    """With a gate, run stops at it; approvals lists it; a bad option is refused; approve +
    resume finishes."""
    (project / "plan.toml").write_text((project / "plan.toml").read_text() + GATE)
    first = invoke("run", project, "--run", "R1", "--quiet")
    assert first.exit_code == 3 and "blocked" in first.output  # waits for a person
    assert "approve" in first.output
    listing = invoke("approvals", project, "--run", "R1")
    assert "gate audience" in listing.output and "owners" in listing.output
    assert_clean_failure(invoke("approve", project, "--run", "R1", "audience",
                                "--choice", "investors"), 2)
    assert_clean_failure(invoke("approve", project, "--run", "R1", "nogate",
                                "--choice", "owners"), 2)
    ok = invoke("approve", project, "--run", "R1", "audience", "--choice", "owners")
    assert ok.exit_code == 0, ok.output
    done = invoke("resume", project, "--run", "R1", "--quiet")
    assert done.exit_code == 0 and ": done" in done.output


def test_run_with_approve_answers_the_gate(project: Path) -> None:
    """--approve gate=choice answers the gate when the run reaches it."""
    (project / "plan.toml").write_text((project / "plan.toml").read_text() + GATE)
    result = invoke("run", project, "--run", "R1", "--approve", "audience=owners", "--quiet")
    assert result.exit_code == 0 and ": done" in result.output


def test_retry_names_unknown_units(done_project: Path) -> None:
    """retry of a unit that is not in the plan lists the plan's units, exit 2."""
    result = invoke("retry", done_project, "--run", "R1", "U99")
    assert_clean_failure(result, 2)
    assert "U1, U2" in result.output


def test_retry_takes_the_unit_and_the_folder_in_either_order(done_project: Path) -> None:
    """`keepstep retry U1 DIR` (unit first) is read as `keepstep retry DIR U1`, not as a
    folder named U1; a current unit that passed its checks is not tried again, and the CLI
    says so and what to do instead."""
    result = invoke("retry", "U1", done_project, "--run", "R1", "--quiet")
    assert result.exit_code == 0, result.output
    assert "does not exist" not in result.output
    assert "U1 is current and its checks passed" in result.output
    assert "keepstep takeover rerun U1" in result.output
    same = invoke("retry", done_project, "U1", "--run", "R1", "--quiet")
    assert same.exit_code == 0 and "U1 is current and its checks passed" in same.output
    missing = invoke("retry", "U1", done_project / "nowhere", "--run", "R1")
    assert_clean_failure(missing, 2)


def test_retry_reruns_a_current_unit_whose_final_check_failed(project: Path) -> None:
    """The audit unit is current but its final validator failed (the report states a
    figure no evidence holds): `keepstep retry U11` says what it does and makes a new
    attempt, a recorded rerun (it used to do nothing, exit 3, no message)."""
    plan = project / "plan.toml"
    edit(plan, 'check = "conflicts"\ndocuments = ["report", "decision-brief"]\n',
         'check = "conflicts"\ndocuments = ["report", "decision-brief"]\n\n'
         '[[unit.params.checks]]\ncheck = "figures"\ndocument = "report"\n')
    report = project / "templates" / "report.md"
    edit(report, "## Summary\n", "## Summary\n\nRent is 98,765 euro a month.\n")
    first = invoke("run", project, "--run", "R1", "--quiet")
    assert first.exit_code == 3, first.output
    assert "U11 is current but its final validator did not pass" in first.output
    again = invoke("retry", project, "U11", "--run", "R1", "--quiet")
    assert again.exit_code == 3, again.output
    assert "U11 is current but its final validator did not pass: it is rerun" in again.output
    events = json.loads(invoke("events", project, "--run", "R1", "--json").stdout)
    rerun = next(i for i, e in enumerate(events) if e.get("unit") == "U11"
                 and e.get("payload", {}).get("action") == "rerun")
    assert ("unit.claimed", "U11") in [(e.get("kind"), e.get("unit"))
                                       for e in events[rerun:]]


def test_replay_restart_and_branch_make_new_runs(done_project: Path) -> None:
    """replay and restart create new run ids; branch forks at a checkpoint; duplicates refused."""
    replay = invoke("replay", done_project, "--run", "R1", "--as", "R1b", "--quiet")
    assert replay.exit_code == 0 and ": done" in replay.output
    assert json.loads(invoke("calls", done_project, "--run", "R1b", "--json").stdout) == []
    assert_clean_failure(invoke("replay", done_project, "--run", "R1", "--as", "R1b"), 2)
    restart = invoke("restart", done_project, "--run", "R1", "--as", "R2")
    assert restart.exit_code == 0 and "R2" in restart.output
    runs = json.loads(invoke("status", done_project, "--all", "--json").stdout)["runs"]
    assert {r["run_id"] for r in runs} == {"R1", "R1b", "R2"}
    branch = invoke("branch", done_project, "--run", "R1", "--at", "3", "--as", "alt")
    assert branch.exit_code == 0, branch.output
    alt = json.loads(invoke("status", done_project, "--run", "R1", "--branch", "alt",
                            "--json").stdout)
    assert alt["branch"] == "alt" and alt["head_version"] == 3
    assert_clean_failure(invoke("branch", done_project, "--run", "R1", "--at", "999", "--as",
                                "far"), 2)


def test_verify_reports_the_chain(done_project: Path) -> None:
    """verify checks every checkpoint of the run and says OK."""
    result = invoke("verify", done_project, "--run", "R1")
    assert result.exit_code == 0, result.output
    assert "chain OK" in result.output


def test_explain_and_preview_an_audience_edit(done_project: Path) -> None:
    """explain shows a unit's state; preview of an audience edit names the units it reaches."""
    result = invoke("explain", done_project, "--run", "R1", "U5")
    assert result.exit_code == 0, result.output
    assert "U5" in result.output and "current" in result.output
    edit(done_project / "contract.md", 'audience = "owners"', 'audience = "investors"')
    preview = invoke("preview", done_project, "--run", "R1", "--json")
    assert preview.exit_code == 0, preview.output
    data = json.loads(preview.stdout)
    assert {"U5", "U6"} <= set(data["invalidated"])
    assert {"U1", "U3", "U4"} <= set(data["reused"])
    assert_clean_failure(invoke("explain", done_project, "--run", "R1", "U99"), 2)


def test_backup_copies_the_database(done_project: Path, tmp_path: Path) -> None:
    """backup writes a copy of state.db and refuses to overwrite one."""
    target = tmp_path / "copy.db"
    assert invoke("backup", done_project, "--to", target).exit_code == 0
    assert target.stat().st_size > 0
    assert_clean_failure(invoke("backup", done_project, "--to", target), 1)


def test_demo_runs_the_pack_to_done(tmp_path: Path, capsys) -> None:
    """The demo runs ME-042 offline to done, says the model is the offline heuristic, and
    lists the deliverables with hashes that match the files."""
    from keepstep.app import demo

    assert demo.main([str(tmp_path / "demo")]) == 0
    text = capsys.readouterr().out
    assert "offline heuristic" in text
    assert "report.md" in text and "MISMATCH" not in text
    assert "is done" in text


def test_approve_for_a_gate_the_plan_lacks_is_refused_before_starting(project: Path) -> None:
    """--approve naming no gate of the plan exits 2 and creates no run."""
    result = invoke("run", project, "--run", "R1", "--approve", "nogate=x")
    assert_clean_failure(result, 2)
    assert "no runs yet" in invoke("status", project).output


def test_ctrl_c_sets_cancel_and_reports_cancelled() -> None:
    """In `drive`, SIGINT sets the cancel event; the engine's RunCancelled becomes
    (None, cancelled=True) instead of a traceback."""
    import os
    import signal

    from keepstep.app.cli.main import drive
    from keepstep.engine import RunCancelled

    def action(cancel, on_event):
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread's handler
        assert cancel.wait(10), "SIGINT did not set the cancel event"
        on_event({"kind": "attempt", "unit": "U1", "attempt": "U1/a1", "outcome": "cancelled"})
        raise RunCancelled("cancelled at a safe point")

    previous = signal.getsignal(signal.SIGINT)
    assert drive(action, quiet=True) == (None, True)
    assert signal.getsignal(signal.SIGINT) is previous


def test_no_arguments_inside_a_project_opens_the_tui(project: Path, monkeypatch) -> None:
    """`keepstep` alone inside a project builds the TUI with make_app(root) and runs it."""
    import keepstep.app.tui as tui

    opened: list[tuple[Path, str | None]] = []

    class FakeApp:
        def __init__(self, root: Path, run_id: str | None) -> None:
            self.args = (Path(root), run_id)

        def run(self) -> None:
            opened.append(self.args)

    monkeypatch.setattr(tui, "make_app", FakeApp)
    monkeypatch.chdir(project)
    assert invoke().exit_code == 0
    assert invoke("tui", project, "--run", "R1").exit_code == 0
    assert [(p.resolve(), r) for p, r in opened] == [(project.resolve(), None),
                                                     (project.resolve(), "R1")]
