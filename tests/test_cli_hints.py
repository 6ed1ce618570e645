"""Hints that matter most, each pinned on the init example through the CLI: the budget block
(a sensible limit, the real project path), `budget raise` in dollars, no resume token after
a run that finished, wall time as a duration, a mistyped --run refused, and plain readable
timestamped lines outside a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app

RUNNER = CliRunner()
GATE = """
[[gate]]
id = "audience"
unit = "U5"
question = "Write the findings for the owners?"
options = ["owners"]
"""


def invoke(*args: object, env: dict[str, str] | None = None):
    return RUNNER.invoke(app, [str(a) for a in args], env=env)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    assert invoke("init", root).exit_code == 0
    return root


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory):
    """The example stopped by a calls limit of 3: (root, the run's output)."""
    root = tmp_path_factory.mktemp("hints") / "proj"
    assert invoke("init", root).exit_code == 0
    config = root / "keepstep.toml"
    config.write_text(config.read_text().replace("calls = 50", "calls = 3"))
    result = invoke("run", root)
    assert result.exit_code == 3, result.output
    return root, result.output


def test_a_budget_block_suggests_a_limit_from_the_runs_rate_and_the_real_path(blocked) -> None:
    root, output = blocked
    assert " DIR " not in output
    status = invoke("status", root).output
    m = re.search(r"raise the calls limit to (\d+) \(([^)]*)\)", status)
    assert m, status
    assert int(m.group(1)) > 3 and "per finished unit so far" in m.group(2)
    assert f"keepstep budget raise {root} --run R1 --calls {m.group(1)}" in status
    assert " DIR " not in status


def test_budget_raise_prints_money_with_a_dollar_sign(blocked) -> None:
    root, _ = blocked
    result = invoke("budget", "raise", root, "--cost", "0.05", "--reason", "client ok")
    assert result.exit_code == 0, result.output
    assert "cost: limit now $0.05 (used $0.0000)" in result.output


def test_a_run_answered_with_approve_that_finishes_prints_no_resume_token(project: Path) -> None:
    (project / "plan.toml").write_text((project / "plan.toml").read_text() + GATE)
    result = invoke("run", project, "--approve", "audience=owners")
    assert result.exit_code == 0 and "done" in result.output, result.output
    assert "resume token" not in result.output


def test_wall_time_is_a_duration_not_raw_seconds(blocked) -> None:
    root, _ = blocked
    status = invoke("status", root).output
    assert "wall_time_s" not in status
    assert re.search(r"wall time\s+\d+ s", status), status


def test_a_mistyped_run_id_is_refused_unless_new(blocked) -> None:
    root, _ = blocked
    result = invoke("run", root, "--run", "R7", "--max-units", "1")
    assert result.exit_code == 2 and "no run 'R7'" in result.output
    assert "did you mean R1?" in result.output and "--run R7 --new" in result.output
    status = invoke("status", root, "--all").output
    assert "R7" not in status
    started = invoke("run", root, "--run", "R7", "--new", "--max-units", "1", "--quiet")
    assert started.exit_code in (0, 3), started.output
    assert "R7" in invoke("status", root, "--all").output


def test_no_eta_while_most_remaining_units_are_of_kinds_not_timed_yet() -> None:
    from types import SimpleNamespace

    from keepstep.engine.report.progress import ProgressTracker

    tracker = SimpleNamespace(
        _titles={f"U{i}": "" for i in range(10)}, _current={"U0", "U1"},
        _durations={"intake": [0.1, 0.1]}, _kinds={"U0": "intake", "U1": "intake"} | {
            f"U{i}": "extract" for i in range(2, 10)}, _most_parallel=1)
    assert ProgressTracker._eta(tracker, []) is None
    tracker._durations["extract"] = [30.0]
    assert ProgressTracker._eta(tracker, []) == pytest.approx(240.0)


# -- output outside a terminal ----------------------------------------------------------------
def test_outside_a_terminal_lines_are_plain_timestamped_and_readable(project: Path) -> None:
    result = invoke("run", project, env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    progress = [ln for ln in lines if re.match(r"\d\d:\d\d:\d\d ", ln)]
    assert len(progress) > 10
    assert not any("recovery" in ln for ln in progress)  # a first run recovers nothing
    assert not re.search(r"started=\d{6,}", result.output)
    assert any(re.match(r"\d\d:\d\d:\d\d +U3 · ", ln) for ln in progress)
    assert "\x1b[" not in result.output


def test_quiet_prints_only_the_outcome(project: Path) -> None:
    result = invoke("run", project, "--quiet")
    assert result.exit_code == 0
    assert len(result.output.strip().splitlines()) <= 3


def test_completion_install_writes_the_shell_script(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    result = invoke("completion", "install", "bash")
    assert result.exit_code == 0, result.output
    script = tmp_path / ".bash_completions" / "keepstep.sh"
    assert script.is_file() and "_KEEPSTEP_COMPLETE" in script.read_text()
    assert "keepstep.sh" in (tmp_path / ".bashrc").read_text()
    shown = invoke("completion", "show", "zsh")
    assert shown.exit_code == 0 and "compdef keepstep" in shown.output
    unknown = invoke("completion", "install", "tcsh")
    assert unknown.exit_code == 2 and "name it" in unknown.output


def test_the_block_and_the_status_suggest_one_limit_with_the_quoted_project_path(
        tmp_path: Path) -> None:
    """Issue 23: the run that stops on the budget and the status afterwards suggest the same
    new limit (one function computes it), in a command holding the real project path quoted
    for the shell, never a DIR placeholder."""
    root = tmp_path / "my pack"
    assert invoke("init", root).exit_code == 0
    config = root / "keepstep.toml"
    config.write_text(config.read_text().replace("calls = 50", "calls = 3"))
    run = invoke("run", root)
    assert run.exit_code == 3, run.output
    status = invoke("status", root, "--run", "R1").output
    said = set(re.findall(r"--calls (\d+)", run.output))
    assert len(said) == 1 and said == set(re.findall(r"--calls (\d+)", status)), (run.output,
                                                                                   status)
    [n] = said
    assert f"raise the calls limit to {n} (" in status
    assert f"keepstep budget raise {shlex.quote(str(root))} --run R1 --calls {n}" in run.output
    assert "DIR" not in run.output and "DIR" not in status


def test_an_approvals_estimate_counts_the_model_calls_of_units_not_run_yet(
        project: Path) -> None:
    """Issue 23: the gate holds U5 (synthesize) before any unit of its kind has run; its
    option still estimates U5's own model call (the preview's estimate), not ~0 calls."""
    (project / "plan.toml").write_text((project / "plan.toml").read_text() + GATE)
    assert invoke("run", project, "--quiet").exit_code == 3
    shown = invoke("approvals", project, "--json")
    assert shown.exit_code == 0, shown.output
    [request] = json.loads(shown.stdout)
    [option] = request["options"]
    assert "U5" in option["redo"] and option["estimate"]["calls"] >= 1
    text = invoke("approvals", project).output
    assert "~0 call" not in text and re.search(r"~[1-9]\d* call", text), text


def _in_a_terminal(args: list[str], env: dict[str, str]) -> bytes:
    """What ``keepstep ARGS`` writes to a pseudo-terminal (so it sees a TTY)."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "keepstep.app.cli", *args], stdin=child,
                            stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=120) == 0, out.decode(errors="replace")
    return out


def test_colour_on_a_terminal_and_none_when_no_color_is_set(project: Path) -> None:
    """Issue 23: on a terminal the live display is coloured; NO_COLOR removes the colours
    (bold may stay: NO_COLOR is about colour)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env |= {"TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    colour = re.compile(rb"\x1b\[(?:\d+;)*(?:3\d|9\d)(?:;\d+)*m")
    coloured = _in_a_terminal(["run", str(project)], env)
    assert colour.search(coloured), coloured[-400:]
    plain = _in_a_terminal(["run", str(project), "--run", "R2", "--new"], env | {"NO_COLOR": "1"})
    assert b"done" in plain and not colour.search(plain), plain[-400:]
