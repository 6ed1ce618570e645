"""Smoke test: `keepstep tui DIR` in a real terminal (tmux), driven by keys, read back as text.

tmux is required, not optional: without it this test fails (CI must install tmux — see
.ci/run), because a skipped smoke test would let a TUI that cannot start pass CI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tui_support import RUN_ID, copy_of, gate_project, gate_template

WIDTH, HEIGHT = 100, 30


@pytest.fixture
def at_gate(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    return copy_of(gate_template(tmp_path_factory), tmp_path / "market-entry")


def _tui_command(root: Path) -> list[str]:
    """The installed console script when there is one, else the package's __main__."""
    script = Path(sys.executable).parent / "keepstep"
    if script.is_file():
        return [str(script), "tui", str(root)]
    return [sys.executable, "-m", "keepstep.app.tui", str(root)]


class Tmux:
    """One tmux server of its own (-L), so the test never touches a user's sessions."""

    def __init__(self, binary: str, name: str) -> None:
        self.binary, self.name = binary, name

    def __call__(self, *args: str) -> str:
        done = subprocess.run([self.binary, "-L", self.name, *args], capture_output=True,
                              text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tui")

    def keys(self, *keys: str) -> None:
        for key in keys:
            self("send-keys", "-t", "tui", key)
            time.sleep(0.3)

    def wait_for(self, text: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            if text in shown:
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared on the terminal; it shows:\n"
                                     f"{shown}")
            time.sleep(0.25)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    binary = shutil.which("tmux")
    if binary is None:
        pytest.fail("tmux is not installed: this smoke test needs a real terminal. Install it "
                    "(Debian/Ubuntu: apt-get install -y tmux) — CI must, too.")
    server = Tmux(binary, f"keepstep-test-{os.getpid()}")
    yield server
    subprocess.run([binary, "-L", server.name, "kill-server"], capture_output=True,
                   timeout=30, check=False)


def _start(tmux: Tmux, root: Path) -> None:
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "TERM": "xterm-256color",
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()),
                          *_tui_command(root)])
    # The pane stays after the TUI exits, showing its exit status (and any traceback).
    # The TUI starts a second later, once the window has its final size: a detached session
    # may begin at 80×24, and the app must read 100×30 when it starts.
    tmux("new-session", "-d", "-s", "tui", "-x", str(WIDTH), "-y", str(HEIGHT),
         f"sleep 1; {command}; echo KEEPSTEP-EXIT=$?; sleep 60")
    tmux("set-option", "-t", "tui", "window-size", "manual")  # no client: keep 100×30
    tmux("resize-window", "-t", "tui", "-x", str(WIDTH), "-y", str(HEIGHT))
    tmux.wait_for("q quit")  # the footer is drawn last, at the final size


def test_keepstep_tui_runs_in_a_real_terminal(tmux: Tmux, at_gate: Path) -> None:
    """The TUI starts, shows the dashboard, opens sources and the gate, and quits cleanly."""
    _start(tmux, at_gate)
    shown = tmux.wait_for("Needs you")
    assert f"run {RUN_ID} (main)" in shown and "checkpoint 28" in shown
    tmux.keys("s")
    tmux.wait_for("Sources · 48 in sources.toml, 48 approved")
    tmux.keys("Escape")
    tmux.wait_for("Needs you")
    tmux.keys("a")
    tmux.wait_for("Gate: audience")
    shown = tmux.wait_for("y approve highlighted")  # the modal's footer, drawn last
    assert "product team" in shown and "Binds: audience = " in shown
    assert "y approve highlighted" in shown and "q quit" not in shown  # the modal's own keys
    tmux.keys("n")
    tmux.wait_for("Needs you")
    tmux.keys("q")
    shown = tmux.wait_for("KEEPSTEP-EXIT=", timeout=30)
    assert "KEEPSTEP-EXIT=0" in shown, shown
    assert "Traceback" not in shown


def test_highlighting_the_second_option_and_y_records_it(tmux: Tmux, tmp_path: Path) -> None:
    """In a real terminal: r runs to the gate, Down highlights the second option, y approves
    it — the event log records that option, and the run finishes."""
    from keepstep.engine import open_project

    root = gate_project(tmp_path / "proj")
    _start(tmux, root)
    tmux.keys("r")
    tmux.wait_for("Gate: depth")
    tmux.keys("Down", "y")
    tmux.wait_for("✓ done", timeout=90)
    tmux.keys("q")
    shown = tmux.wait_for("KEEPSTEP-EXIT=", timeout=30)
    assert "KEEPSTEP-EXIT=0" in shown, shown
    with open_project(root) as project:
        decided = project.get_run("R1").events(kinds=["approval.decided"])
    assert [e.payload["choice"] for e in decided] == ["full report"]
