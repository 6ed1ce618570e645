"""Ledgers and decisions from the command line: revoke, effects, budget mistakes, keys,
sources on an invalid plan, and the next-action hints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app

RUNNER = CliRunner()
SAMPLE = Path(__file__).resolve().parent.parent / "sample_projects" / "market-entry"


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


def assert_clean_failure(result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert "error:" in result.output and "Traceback" not in result.output


@pytest.fixture
def done_project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    assert invoke("init", root).exit_code == 0
    assert invoke("run", root, "--run", "R1", "--quiet").exit_code == 0
    return root


@pytest.fixture
def me042_before_gate(tmp_path: Path) -> Path:
    """The ME-042 pack run with the audience approved, stopped before U27 runs."""
    root = tmp_path / "me042"
    shutil.copytree(SAMPLE, root, ignore=shutil.ignore_patterns(".keepstep"))
    result = invoke("run", root, "--run", "ME-042", "--approve", "audience=product team",
                    "--max-units", "26", "--quiet")
    assert result.exit_code == 0, result.output
    return root


# --- revoke ----------------------------------------------------------------------------------
def test_revoke_makes_the_gate_ask_again(me042_before_gate: Path) -> None:
    """After revoking the audience decision, resume stops at the gate with a new request."""
    root = me042_before_gate
    status = json.loads(invoke("status", root, "--run", "ME-042", "--json").stdout)
    assert status["pending_approvals"] == [] and status["units"]["U27"]["state"] == "pending"
    revoked = invoke("revoke", root, "--run", "ME-042", "audience", "--reason",
                     "the audience is under review", "--who", "tester")
    assert revoked.exit_code == 0, revoked.output
    assert "asks again" in revoked.output
    event = json.loads(invoke("events", root, "--run", "ME-042", "--kind", "approval.revoked",
                              "--json").stdout)[-1]
    assert event["payload"]["who"] == "tester"
    assert event["payload"]["reason"] == "the audience is under review"

    assert invoke("resume", root, "--run", "ME-042", "--quiet").exit_code == 3  # the gate
    status = json.loads(invoke("status", root, "--run", "ME-042", "--json").stdout)
    assert [a["gate"] for a in status["pending_approvals"]] == ["audience"]
    assert status["units"]["U27"]["attempts"] == 0
    assert ("keepstep approve --run ME-042 audience --choice 'product team'"
            in status["next_action"])


def test_revoke_mistakes_are_usage_errors(done_project: Path) -> None:
    """An unknown gate, a gate with no decision, an empty reason: exit 2."""
    assert_clean_failure(invoke("revoke", done_project, "--run", "R1", "audience", "--reason",
                                "x"), 2)
    assert_clean_failure(invoke("revoke", done_project, "--run", "R1", "audience", "--reason",
                                " "), 2)


# --- effects ---------------------------------------------------------------------------------
def test_effects_lists_an_empty_ledger_cleanly(done_project: Path) -> None:
    """A run with no external actions prints one line (text) or [] (JSON), exit 0."""
    text = invoke("effects", done_project, "--run", "R1")
    assert text.exit_code == 0, text.output
    assert "no external actions recorded" in text.output
    data = invoke("effects", done_project, "--run", "R1", "--json")
    assert data.exit_code == 0 and json.loads(data.stdout) == []


def test_effects_lists_the_ledger_rows(done_project: Path) -> None:
    """A recorded external action shows its key, unit, action, adapter, status and remote id."""
    from keepstep.engine import open_project
    from keepstep.engine.run.adapters import FileDropAdapter
    from keepstep.engine.run.effects import perform_effect

    outbox = done_project.parent / "outbox"
    outbox.mkdir()
    with open_project(done_project) as project:
        run = project.get_run("R1")
        perform_effect(run.store, FileDropAdapter(outbox), run_id="R1", branch_id="main",
                       unit="U11", attempt_id=None, action="publish", plan_n=1,
                       fencing_token=None, request={"path": str(done_project / "plan.toml")})
    rows = json.loads(invoke("effects", done_project, "--run", "R1", "--json").stdout)
    assert [(r["unit"], r["action"], r["adapter"], r["status"]) for r in rows] == [
        ("U11", "publish", "file-drop", "committed")]
    assert rows[0]["key"] and rows[0]["remote_id"]
    text = invoke("effects", done_project, "--run", "R1").output
    assert "publish" in text and "1 external action(s), 0 without a receipt" in text


# --- budget, keys ----------------------------------------------------------------------------
def test_budget_raise_that_lowers_a_limit_is_a_usage_error(done_project: Path) -> None:
    """A 'raise' below the current limit is refused by the engine (BudgetDecisionError): exit 2,
    nothing recorded."""
    result = invoke("budget", "raise", done_project, "--run", "R1", "--calls", "10", "--reason",
                    "tighter")
    assert_clean_failure(result, 2)
    assert "would lower calls" in result.output
    assert json.loads(invoke("events", done_project, "--run", "R1", "--kind",
                             "decision.budget_raise", "--json").stdout) == []


def test_keys_set_refuses_before_prompting_without_a_keyring(monkeypatch) -> None:
    """At a terminal with no keyring backend, `keys set` refuses before asking for the key."""
    from keepstep.app.cli import records as cli_records
    from keepstep.engine.errors import KeyringUnavailable
    from keepstep.engine.gateway.keys import keyring_available

    assert keyring_available() is False  # conftest selects the null backend
    monkeypatch.setattr(cli_records.sys, "stdin", SimpleNamespace(isatty=lambda: True))

    def no_prompt(*_args, **_kwargs):
        raise AssertionError("prompted for a key that could not be stored")

    monkeypatch.setattr(cli_records.typer, "prompt", no_prompt)
    with pytest.raises(KeyringUnavailable, match="OPENAI_API_KEY"):
        cli_records.keys_set("openai")


# --- sources on an invalid plan --------------------------------------------------------------
def test_sources_list_works_when_the_plan_does_not_validate(done_project: Path) -> None:
    """With a dependency on a missing unit, sources list still shows the run's snapshot."""
    plan = done_project / "plan.toml"
    plan.write_text(plan.read_text().replace('depends_on = ["U3"]',
                                             'depends_on = ["U3", "U99"]', 1))
    assert invoke("validate", done_project).exit_code == 2
    listing = invoke("sources", done_project, "list")
    assert listing.exit_code == 0, listing.output
    assert "run R1" in listing.output and "in-v1" in listing.output
    assert invoke("sources", done_project, "revoke", "A2").exit_code == 0


def test_open_project_without_validation_opens_an_invalid_plan(done_project: Path) -> None:
    """open_project(validate=False) opens a project whose plan refers to a missing unit;
    the default still refuses it."""
    from keepstep.engine import PlanValidationError, open_project

    plan = done_project / "plan.toml"
    plan.write_text(plan.read_text().replace('depends_on = ["U3"]',
                                             'depends_on = ["U3", "U99"]', 1))
    with pytest.raises(PlanValidationError):
        open_project(done_project)
    with open_project(done_project, validate=False) as project:
        assert project.runs() == ["R1"]


# --- next-action hints -----------------------------------------------------------------------
def _unit(state: str, reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(state=state, reason=reason)


@pytest.mark.parametrize("branch", ["main", "alt"])
def test_every_suggested_command_exists_and_names_dir_and_run(branch: str) -> None:
    """Each next-action hint suggests only real commands, each with --run RUN (and --branch
    off main) and no placeholder: DIR is left out (the command runs inside the project)."""
    from keepstep.engine.core.decide import Decision, DecisionKind
    from keepstep.engine.report.next_action import next_action

    def status(**units: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(run_id="R7", branch=branch, units=units, pending_approvals=[],
                               external_unknown=[], budget={"limits": {"calls": 10.0}})

    cases = [
        (status(), Decision(kind=DecisionKind.done)),
        (status(), Decision(kind=DecisionKind.claim, unit="U1")),
        (status(), Decision(kind=DecisionKind.waiting, reasons=["U1 running elsewhere"])),
        (status(U1=_unit("blocked", "budget: calls 10/10")), Decision(kind=DecisionKind.blocked)),
        (status(U1=_unit("failed", "boom")), Decision(kind=DecisionKind.blocked)),
    ]
    gate = status()
    gate.pending_approvals = [{"gate": "audience"}]
    unknown = status()
    unknown.external_unknown = [{"idem_key": "ks-r7-u1-notify-p1-0123456789abcdef",
                                 "unit": "U1", "action": "notify", "adapter": "hook",
                                 "detail": {"needs_person": True, "reason": "no answer"}}]
    cases += [(gate, Decision(kind=DecisionKind.blocked)),
              (unknown, Decision(kind=DecisionKind.blocked))]

    import click
    import typer.main

    group = typer.main.get_command(app)
    ctx = click.Context(group)
    for st, decision in cases:
        text = next_action(st, decision)
        commands = re.findall(r"`keepstep ([^`]+)`", text)
        assert commands, text
        for command in commands:
            words = command.split()
            found = group.get_command(ctx, words[0])
            assert found is not None, f"{words[0]} is not a keepstep command ({text})"
            if isinstance(found, click.Group):
                assert found.get_command(ctx, words[1]) is not None, text
            assert "--run R7" in command and "DIR" not in command, text
            assert not re.search(r"\b(KEY|UNIT|GATE|OPTION|N)\b", command), text
            assert ("--branch alt" in command) == (branch == "alt"), text


def test_recovery_reset_records_a_decision(done_project: Path) -> None:
    """`keepstep recovery reset` records the decision the circuit breaker asks for; without a
    reason it is a usage error."""
    result = invoke("recovery", "reset", done_project, "--run", "R1", "--reason",
                    "checked the chain with keepstep verify", "--who", "tester")
    assert result.exit_code == 0, result.output
    assert "recovery reset recorded" in result.output
    events = json.loads(invoke("events", done_project, "--run", "R1", "--kind",
                               "decision.recovery_reset", "--json").output)
    assert [e["payload"]["who"] for e in events] == ["tester"]
    assert_clean_failure(invoke("recovery", "reset", done_project, "--run", "R1",
                                "--reason", " "), 1)
