"""The artifact store: safe names, durable staging, immutability, sealing, hashes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from keepstep.storage import ArtifactImmutable, ArtifactStore, UnsafeArtifactName, safe_name

RUN = "ME-042"
ATTEMPT = "U07/a1"


@pytest.fixture
def artifacts(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


def _stage(store: ArtifactStore, name: str, data: bytes = b"{}", *, run: str = RUN,
           attempt: str = ATTEMPT):
    return store.stage(run, attempt, name, data, media_type="application/json",
                       producer_version="test", created_at="2024-01-01T00:00:00+00:00")


@pytest.mark.parametrize(
    "name",
    ["../x", "/etc/passwd", "a/../../b", "a\\b", "", "a\x00b", "x.tmp", "dir.tmp/x", "..",
     "a/..", "sp ace.json"],
)
def test_unsafe_artifact_names_are_refused(artifacts: ArtifactStore, name: str) -> None:
    """A name that could escape (or confuse) the attempt directory raises UnsafeArtifactName."""
    with pytest.raises(UnsafeArtifactName):
        safe_name(name)
    with pytest.raises(UnsafeArtifactName):
        _stage(artifacts, name)
    assert not any(p.is_file() for p in artifacts.root.rglob("*"))


@pytest.mark.parametrize("name", ["evidence.json", "tables/evidence.csv", "a/b/c@2+x=y.md"])
def test_plain_relative_names_are_accepted(name: str) -> None:
    """Ordinary relative names, including nested folders, pass validation unchanged."""
    assert str(safe_name(name)) == name


@pytest.mark.parametrize(
    ("run", "attempt"),
    [("../r", "U1/a1"), ("r", "../a1"), ("r", "U1/.."), ("r/x", "U1/a1"), ("", "U1/a1"),
     ("r", "U1/"), (".", "U1/a1"), ("r", "U 1/a1")],
)
def test_unsafe_run_or_attempt_ids_are_refused(
    artifacts: ArtifactStore, run: str, attempt: str
) -> None:
    """Run, unit and attempt ids that would make a bad path raise UnsafeArtifactName."""
    with pytest.raises(UnsafeArtifactName):
        artifacts.attempt_dir(run, attempt)
    with pytest.raises(UnsafeArtifactName):
        _stage(artifacts, "x.json", run=run, attempt=attempt)


def test_staging_the_same_name_twice_raises_artifact_immutable(artifacts: ArtifactStore) -> None:
    """A staged file is never overwritten: the second stage raises and the bytes stay."""
    entry = _stage(artifacts, "evidence.json", b"first")
    with pytest.raises(ArtifactImmutable):
        _stage(artifacts, "evidence.json", b"second")
    assert artifacts.read(entry) == b"first"


def test_sealed_files_are_read_only(artifacts: ArtifactStore) -> None:
    """seal() removes every write permission bit from committed files."""
    entry = _stage(artifacts, "evidence.json", b"data")
    artifacts.seal([entry])
    mode = artifacts.path_of(entry).stat().st_mode
    assert mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) == 0
    if os.geteuid() != 0:  # root ignores permission bits
        with pytest.raises(PermissionError):
            artifacts.path_of(entry).write_bytes(b"edited")


def test_manifest_entry_size_and_sha256_match_the_file(artifacts: ArtifactStore) -> None:
    """The returned entry describes the file on disk: path, size, sha256, unit, attempt."""
    data = os.urandom(5000)
    entry = _stage(artifacts, "raw/blob.bin", data)
    on_disk = artifacts.path_of(entry).read_bytes()
    assert on_disk == data
    assert entry.size == len(data)
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert (entry.unit, entry.attempt_id, entry.name) == ("U07", ATTEMPT, "raw/blob.bin")
    assert entry.path == f"{RUN}/U07/a1/raw/blob.bin"
    assert artifacts.verify([entry]) == []


def test_staging_creates_nested_directories_and_leaves_no_tmp(artifacts: ArtifactStore) -> None:
    """Nested names create their folders; a finished stage leaves no .tmp file behind."""
    _stage(artifacts, "a/b/c/deep.json")
    directory = artifacts.attempt_dir(RUN, ATTEMPT)
    assert (directory / "a" / "b" / "c" / "deep.json").is_file()
    assert not list(directory.rglob("*.tmp"))
    listed = list(artifacts.attempt_dirs(RUN))
    assert listed == [("U07", ATTEMPT, directory, ["a/b/c/deep.json"])]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory fsynced by the artifact store, in order (as absolute paths)."""
    from keepstep.storage import artifacts as artifacts_module

    calls: list[str] = []
    real = artifacts_module.fsync_dir

    def record(path) -> None:
        calls.append(str(path))
        real(path)

    monkeypatch.setattr(artifacts_module, "fsync_dir", record)
    return calls


def test_prepare_units_creates_unit_folders_with_one_fsync(
    artifacts: ArtifactStore, synced: list[str]
) -> None:
    """Unit folders are made once, durably (one fsync of the run folder); a repeat is free."""
    artifacts.root.mkdir(parents=True)
    assert artifacts.prepare_units(RUN, ["U01", "U02", "U01"]) == ["U01", "U02"]
    run_dir = artifacts.root / RUN
    assert sorted(p.name for p in run_dir.iterdir()) == ["U01", "U02"]
    assert synced == [str(artifacts.root), str(run_dir)]
    synced.clear()
    assert artifacts.prepare_units(RUN, ["U01", "U02"]) == [] and synced == []
    with pytest.raises(UnsafeArtifactName):
        artifacts.prepare_units(RUN, ["../U03"])


def test_staging_syncs_the_file_once_and_no_folder(
    artifacts: ArtifactStore, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging makes one fsync, of the file itself after its rename into place (its bytes
    and its name), and syncs no folder: not the attempt folder, not a calls/ folder, not
    the parents of folders it created."""
    from keepstep.storage import artifacts as artifacts_module

    files: list[int] = []  # inode numbers of the fsynced files
    real_fsync = os.fsync

    def record(fd: int) -> None:
        files.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def ino(path: Path) -> list[int]:
        return [path.stat().st_ino]

    monkeypatch.setattr(artifacts_module.os, "fsync", record)
    artifacts.prepare_units(RUN, ["U07"])
    synced.clear()
    files.clear()
    _stage(artifacts, "a.json")
    attempt = artifacts.attempt_dir(RUN, ATTEMPT)
    assert synced == [] and files == ino(attempt / "a.json")
    files.clear()
    _stage(artifacts, "calls/r1-001.json")
    assert synced == [] and files == ino(attempt / "calls" / "r1-001.json")
    files.clear()
    _stage(artifacts, "c.json", attempt="U08/a1")  # a unit nobody prepared
    fresh = artifacts.attempt_dir(RUN, "U08/a1")
    assert synced == [] and files == ino(fresh / "c.json")
    assert (fresh / "c.json").read_bytes() == b"{}"
