"""A checkpoint row edited behind keepstep's back (issue 13, item 3): resume stops before
anything runs, a handover refuses (or marks the bundle unverified), and a clean resume only
re-verifies what was committed since the last verified checkpoint."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.storage import ChainBroken
from tests.support.engine_harness import RUN, make_small_project


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    return root


def _edit_checkpoint(root: Path, version: int) -> None:
    """Change a committed checkpoint's delta in SQL, leaving its stored hash as it was."""
    db = sqlite3.connect(root / ".keepstep" / "state.db")
    with db:
        (delta,) = db.execute("SELECT delta FROM checkpoints WHERE run_id = ? AND version = ?",
                              (RUN, version)).fetchone()
        data = json.loads(delta)
        data["edited"] = "by hand"
        db.execute("UPDATE checkpoints SET delta = ? WHERE run_id = ? AND version = ?",
                   (json.dumps(data), RUN, version))
    db.close()


def test_resume_stops_at_a_checkpoint_edited_in_sql_and_names_it(finished: Path) -> None:
    """The first resume verifies the whole chain (nothing was verified before): the edited
    row is named, the run is blocked for a person and nothing is committed or run."""
    _edit_checkpoint(finished, 5)
    with open_project(finished) as p:
        run = p.get_run(RUN)
        head = run.head().version
        status = run.resume()
        assert status.decision == "blocked"
        assert any("checkpoint 5" in r for r in status.reasons), status.reasons
        assert "checkpoint 5" in status.next_action and "keepstep verify" in status.next_action
        assert run.head().version == head
        assert run.events(kinds=["recovery.failed"])


def test_a_handover_of_a_broken_chain_is_marked_unverified_or_refused(finished: Path,
                                                                     tmp_path: Path) -> None:
    """export_handover verifies the whole chain: by default the bundle is written but marked
    unverified (verify_bundle then says it is not OK, naming the checkpoint); required to
    verify, it is refused with the version named and nothing — no zip, no partial — left."""
    from keepstep.engine.report.handover import export_handover, verify_bundle

    _edit_checkpoint(finished, 3)
    with open_project(finished) as p:
        run = p.get_run(RUN)
        with pytest.raises(ChainBroken, match="checkpoint 3"):
            export_handover(run, tmp_path / "bundle.zip", require_verified=True)
        assert list(tmp_path.glob("*bundle*")) == []
        folder = run.handover(tmp_path / "marked")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["chain"]["verified"] is False
    assert any("checkpoint 3" in problem for problem in manifest["chain"]["problems"])
    report = verify_bundle(folder)
    assert report.files_ok and not report.ok
    assert "UNVERIFIED" in report.render() and "checkpoint 3" in report.render()
    assert "bundle OK" not in report.render()


def test_a_bundle_is_private_and_says_its_chain_verified(finished: Path, tmp_path: Path) -> None:
    """Bundle folders are 0700 and files 0600 (a zip too); the manifest records the chain."""
    with open_project(finished) as p:
        run = p.get_run(RUN)
        folder = run.handover(tmp_path / "bundle")
        archive = run.handover(tmp_path / "bundle.zip")
    assert json.loads((folder / "manifest.json").read_text())["chain"]["verified"] is True
    assert folder.stat().st_mode & 0o777 == 0o700
    for path in folder.rglob("*"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
    assert archive.stat().st_mode & 0o777 == 0o600


def test_a_clean_resume_verifies_only_what_was_committed_since(finished: Path) -> None:
    """After one full verification, the next resume checks only the newer checkpoints."""
    with open_project(finished) as p:
        run = p.get_run(RUN)
        run.resume()
        first = p.store.verify_since_last(RUN)
        assert first.ok and first.checked <= 2


def test_through_the_cli_a_broken_chain_fails_resume_verify_and_the_handover_check(
        finished: Path) -> None:
    """`keepstep verify` says BROKEN and exits non-zero; `keepstep resume` exits non-zero
    (blocked on a person) naming the checkpoint; `keepstep handover` writes a bundle whose
    check says UNVERIFIED, never "bundle OK"."""
    from typer.testing import CliRunner

    from keepstep.app.cli.main import app

    runner = CliRunner()
    _edit_checkpoint(finished, 4)
    verify = runner.invoke(app, ["verify", str(finished)])
    assert verify.exit_code != 0 and "BROKEN" in verify.output, verify.output
    resume = runner.invoke(app, ["resume", str(finished), "--quiet"])
    assert resume.exit_code not in (0, None), resume.output
    assert "checkpoint 4" in resume.output
    handover = runner.invoke(app, ["handover", str(finished)])
    assert "UNVERIFIED" in handover.output and "bundle OK" not in handover.output
    assert handover.exit_code != 0, handover.output
