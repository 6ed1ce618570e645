"""Commands that only look open the database read-only; damaged state is named, not re-made.

A read-only store raises on any write, so a read command that tried to write would fail
here; the database files are compared byte for byte before and after as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from tests.support.db_rows import rows_digest

RUNNER = CliRunner()
LOOKING = [
    ["status"], ["status", "--json"], ["verify"], ["verify", "--json"], ["explain", "U1"],
    ["preview"], ["events", "--limit", "3"], ["calls"], ["effects"],
]


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


def _fingerprint(state: Path) -> str:
    """Every row of the database (read through the WAL), hashed: see tests.support.db_rows."""
    return rows_digest(state / "state.db")


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ro") / "proj"
    assert invoke("init", root).exit_code == 0
    result = invoke("run", root, "--quiet")
    assert result.exit_code == 0, result.output
    return root


@pytest.mark.parametrize("args", LOOKING, ids=" ".join)
def test_read_commands_change_nothing_in_the_state_folder(done: Path, args: list[str]) -> None:
    """status, verify, explain, preview, events, calls, effects: exit 0 and not one row of
    the database changed."""
    state = done / ".keepstep"
    before = _fingerprint(state)
    result = invoke(args[0], done, *args[1:])
    assert result.exit_code == 0, result.output
    assert _fingerprint(state) == before


def test_status_before_the_first_run_says_no_runs_yet(tmp_path: Path) -> None:
    """A new project has no database: status says so and how to start, and exits 0."""
    root = tmp_path / "fresh"
    assert invoke("init", root).exit_code == 0
    result = invoke("status", root)
    assert result.exit_code == 0, result.output
    assert "no runs yet" in result.output.lower() and "keepstep run" in result.output


@pytest.mark.parametrize("command", ["status", "run"])
def test_an_emptied_database_beside_earlier_work_is_refused_not_recreated(
        done: Path, tmp_path: Path, command: str) -> None:
    """state.db truncated to zero bytes next to a full artifacts folder: read and write
    commands refuse with restore / move-aside advice; nothing is re-created."""
    root = tmp_path / "emptied"
    shutil.copytree(done, root)
    db = root / ".keepstep" / "state.db"
    for side in ("state.db-wal", "state.db-shm"):
        (root / ".keepstep" / side).unlink(missing_ok=True)
    db.write_bytes(b"")
    result = invoke(command, root)
    assert result.exit_code not in (0, None), result.output
    assert "keepstep restore" in result.output and "aside" in result.output
    assert db.stat().st_size == 0


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` and its files made unwritable — chmod for a user, the immutable attribute
    for root (whom permissions do not stop) — and restored afterwards."""
    paths = [folder, *(p for p in folder.iterdir() if p.is_file())]
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(0o500 if p.is_dir() else 0o400)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    chattr = shutil.which("chattr")
    done = chattr and subprocess.run([chattr, "+i", *map(str, paths)], capture_output=True)
    if not done or done.returncode != 0:
        pytest.skip("running as root where the immutable attribute cannot be set: no way "
                    "to make a folder read-only for this process")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", *map(str, paths)], check=True)


def test_a_read_only_state_folder_can_be_inspected_and_a_write_names_permissions(
        done: Path, tmp_path: Path) -> None:
    """With .keepstep unwritable, status and verify still answer (exit 0); run refuses with
    a permission message that says read commands only need read access."""
    root = tmp_path / "locked"
    shutil.copytree(done, root)
    with _read_only(root / ".keepstep"):
        for args in (["status"], ["verify"], ["explain", "U1"]):
            result = invoke(args[0], root, *args[1:])
            assert result.exit_code == 0, (args, result.output)
        result = invoke("run", root)
        assert result.exit_code not in (0, None)
        assert "permission denied" in result.output
        assert "only need read access" in result.output
