"""Backup and restore: a mid-run backup resumes to done; damaged backups are refused."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from keepstep.engine import open_project
from keepstep.engine.run.maintenance import backup_project, restore_project
from keepstep.storage import RestoreRefused, StorageError, backup, restore

PACK = Path(__file__).resolve().parent.parent / "sample_projects" / "market-entry"
RUN = "ME-042"
APPROVE = {"audience": "product team"}


def _project_files(dest: Path) -> Path:
    """A copy of the pack's project files without any state (backups do not hold them)."""
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep"))
    return dest


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    for p in dest.rglob("*"):  # sealed artifacts are read-only; tests edit the copies
        if p.is_file():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dest


@pytest.fixture(scope="module")
def midrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pack run for 10 units, backed up as a folder and as a zip (taken once)."""
    base = tmp_path_factory.mktemp("midrun")
    src = _project_files(base / "project")
    with open_project(src) as project:
        status = project.open_or_start(RUN).run(approve=APPROVE, max_units=10)
        assert status.decision == "claim" and status.counts["current"] == 10
        backup_project(project, base / "backup")
        backup_project(project, base / "backup.zip")
    return {"project": src, "folder": base / "backup", "zip": base / "backup.zip"}


def _resume_to_done(root: Path) -> None:
    with open_project(root) as project:
        run = project.get_run(RUN)
        assert run.run(approve=APPROVE).decision == "done"
        assert project.store.verify_chain(RUN).ok


def test_a_backup_holds_the_database_artifacts_plan_snapshot_and_a_manifest(midrun) -> None:
    """manifest.json lists every file with sha256 and size, and the head of each run/branch."""
    folder = midrun["folder"]
    manifest = json.loads((folder / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert "state.db" in paths
    assert f"artifacts/{RUN}/_plan/v1/plan.toml" in paths
    assert sum(p.startswith(f"artifacts/{RUN}/U") for p in paths) >= 10
    for f in manifest["files"]:
        assert (folder / f["path"]).stat().st_size == f["size"] and len(f["sha256"]) == 64
    assert [(h["run_id"], h["branch_id"], h["version"]) for h in manifest["heads"]] == [
        (RUN, "main", 10)]
    assert manifest["skipped"] == []


@pytest.mark.parametrize("kind", ["zip", "folder"])
def test_a_backup_taken_mid_run_restores_into_a_new_folder_and_resumes_to_done(
    midrun, tmp_path: Path, kind: str
) -> None:
    """Restoring the mid-run backup next to fresh project files lets the run finish."""
    dest = _project_files(tmp_path / "restored")
    report = restore_project(midrun[kind], dest)
    assert report.restored and report.complete and report.units_to_redo == {}
    assert [(b.head_version, b.verified_version) for b in report.baselines] == [(10, 10)]
    assert (dest / ".keepstep" / "state.db").is_file()
    assert not list(dest.glob(".keepstep.restoring-*"))
    _resume_to_done(dest)


def test_a_restore_with_missing_artifacts_is_refused_with_the_list(
    midrun, tmp_path: Path
) -> None:
    """Files the manifest lists but the backup lacks are named; nothing is restored."""
    damaged = _copy(midrun["folder"], tmp_path / "damaged")
    manifest = json.loads((damaged / "manifest.json").read_text())
    gone = sorted(f["path"] for f in manifest["files"] if f["path"].startswith("artifacts/"))[:2]
    for rel in gone:
        (damaged / rel).unlink()
    dest = tmp_path / "dest"
    with pytest.raises(RestoreRefused) as info:
        restore(damaged, dest)
    assert info.value.report.missing == gone
    assert all(rel in str(info.value) for rel in gone)
    assert not (dest / ".keepstep").exists()
    assert not list(dest.glob(".keepstep.restoring-*"))


@pytest.mark.parametrize("kind", ["folder", "zip"])
def test_a_tampered_artifact_in_the_backup_is_refused(
    midrun, tmp_path: Path, kind: str
) -> None:
    """An artifact whose bytes no longer match the manifest's sha256 stops the restore."""
    damaged = _copy(midrun["folder"], tmp_path / "damaged")
    manifest = json.loads((damaged / "manifest.json").read_text())
    victim = next(f["path"] for f in manifest["files"] if f["path"].endswith(".json"))
    (damaged / victim).write_bytes((damaged / victim).read_bytes() + b" ")
    source = damaged
    if kind == "zip":
        source = Path(shutil.make_archive(str(tmp_path / "damaged"), "zip", damaged))
    with pytest.raises(RestoreRefused) as info:
        restore(source, tmp_path / "dest")
    assert info.value.report.tampered == [victim]
    assert not (tmp_path / "dest" / ".keepstep").exists()


def test_restore_refuses_a_non_empty_state_folder_unless_forced(midrun, tmp_path: Path) -> None:
    """A second restore into the same folder is refused; --force moves the old state aside."""
    dest = _project_files(tmp_path / "dest")
    restore(midrun["zip"], dest)
    with pytest.raises(RestoreRefused, match="not empty"):
        restore(midrun["zip"], dest)
    report = restore(midrun["zip"], dest, force=True)
    assert report.restored and report.replaced is not None
    assert (Path(report.replaced) / "state.db").is_file()
    _resume_to_done(dest)


def test_a_backup_never_overwrites_an_existing_path(midrun, tmp_path: Path) -> None:
    """Backing up onto an existing file or a non-empty folder raises and changes nothing."""
    target = tmp_path / "exists.zip"
    target.write_bytes(b"keep me")
    with pytest.raises(StorageError, match="already exists"):
        backup(midrun["project"], target)
    assert target.read_bytes() == b"keep me"


def test_db_and_artifacts_from_different_moments_stop_at_the_last_verifiable_baseline(
    midrun, tmp_path: Path
) -> None:
    """A current artifact lost before the backup: restore names the unit to redo and the
    last checkpoint whose current artifacts all verify; resuming redoes it and finishes."""
    src = _copy(midrun["project"], tmp_path / "src")
    with open_project(src) as project:
        records = project.get_run(RUN).facts_records()
        cps = project.store.list_checkpoints(RUN, kinds=["unit-success"])
        lost_cp = cps[len(cps) // 2]
        lost_unit = lost_cp.unit
        lost_path = next(iter(records[lost_unit].outputs.values())).path
        (project.store.artifacts.root / lost_path).unlink()
        made = backup_project(project, tmp_path / "backup.zip")
    assert [(s.path, s.problem) for s in made.skipped] == [(lost_path, "missing")]
    dest = _project_files(tmp_path / "dest")
    report = restore_project(tmp_path / "backup.zip", dest)
    assert report.restored and not report.complete
    assert report.units_to_redo == {f"{RUN}/main": [lost_unit]}
    (baseline,) = report.baselines
    assert (baseline.head_version, baseline.verified_version) == (10, lost_cp.version - 1)
    assert "stops at the last baseline both can verify" in report.message
    assert lost_unit in report.message
    _resume_to_done(dest)


def test_a_backup_of_a_broken_chain_is_refused_naming_the_version(tmp_path: Path) -> None:
    """A checkpoint row edited by SQL makes backup raise ChainBroken naming run, branch and
    version; nothing is written at the target."""
    import sqlite3

    from keepstep.storage import ChainBroken, SQLiteStore

    state = tmp_path / "p" / ".keepstep"
    s = SQLiteStore(state)
    s.create_run("R1", {"plan": "p"})
    for v in range(3):
        s.commit_checkpoint("R1", "main", v, {f"k{v}": v})
    s.close()
    conn = sqlite3.connect(state / "state.db")
    conn.execute("UPDATE checkpoints SET delta = '{\"k1\":7}' WHERE version = 2")
    conn.commit()
    conn.close()
    for target in (tmp_path / "backup", tmp_path / "backup.zip"):
        with pytest.raises(ChainBroken) as info:
            backup(tmp_path / "p", target)
        assert "R1/main: checkpoint 2 does not verify" in str(info.value)
        assert "keepstep verify" in str(info.value)
        assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
