"""A handover bundle or a backup from someone else may be hostile: verify-bundle and restore
refuse members the manifest does not list without reading them, compare declared sizes with
the manifest before reading, and hash listed files in blocks up to their declared size."""

from __future__ import annotations

import resource
import shutil
import zipfile
from pathlib import Path

import pytest

from keepstep.engine import open_project
from keepstep.engine.report.handover import verify_bundle
from tests.support.bombs import declare_size
from tests.support.engine_harness import RUN, make_small_project

HUGE = 3_900 * 1024 * 1024  # declared, never written


@pytest.fixture(scope="module")
def bundle_zip(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bundle")
    root = make_small_project(tmp / "p")
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        run.run()
        out = run.handover(tmp / "bundle.zip")
    assert verify_bundle(out).ok
    return out


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_an_unlisted_huge_member_is_refused_without_reading_it(bundle_zip: Path,
                                                               tmp_path: Path) -> None:
    """A member the manifest does not list, declaring 3.9 GB, is reported as not in the
    manifest; it is never unpacked (peak memory stays where it was)."""
    bomb = tmp_path / "bomb.zip"
    shutil.copy(bundle_zip, bomb)
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("deliverables/extra.bin", b"\0" * 4096)
    declare_size(bomb, "deliverables/extra.bin", HUGE)
    before = _peak_mb()
    report = verify_bundle(bomb)
    assert not report.ok
    assert report.unlisted == ["deliverables/extra.bin"]
    assert "not in the manifest: deliverables/extra.bin" in report.render()
    assert _peak_mb() - before < 100


def test_a_listed_member_declaring_another_size_is_changed_unread(bundle_zip: Path,
                                                                  tmp_path: Path) -> None:
    """A listed file whose zip directory declares a size other than the manifest's is a
    change found from the directory alone."""
    bomb = tmp_path / "bomb.zip"
    shutil.copy(bundle_zip, bomb)
    declare_size(bomb, "narrative.md", HUGE)
    report = verify_bundle(bomb)
    assert not report.ok
    assert [c.path for c in report.changed] == ["narrative.md"]
    assert "not read" in report.changed[0].actual_sha256


def test_a_huge_manifest_is_not_read(bundle_zip: Path, tmp_path: Path) -> None:
    """manifest.json declaring gigabytes is refused by its declared size."""
    bomb = tmp_path / "bomb.zip"
    shutil.copy(bundle_zip, bomb)
    declare_size(bomb, "manifest.json", HUGE)
    report = verify_bundle(bomb)
    assert not report.ok and any("manifest.json declares" in p for p in report.problems)


def test_a_symlink_in_a_bundle_folder_is_not_followed(bundle_zip: Path,
                                                     tmp_path: Path) -> None:
    """A folder bundle holding a link to an outside file reports the link, never reads it."""
    folder = tmp_path / "b"
    with zipfile.ZipFile(bundle_zip) as zf:
        zf.extractall(folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("sk-" + "a" * 40)
    (folder / "deliverables" / "x.md").symlink_to(secret)
    report = verify_bundle(folder)
    assert not report.ok
    assert any("x.md is a symbolic link" in p for p in report.problems)
    assert not report.secrets


@pytest.fixture(scope="module")
def backup_zip(tmp_path_factory) -> tuple[Path, Path]:
    from keepstep.engine.run.maintenance import backup_project

    tmp = tmp_path_factory.mktemp("backup")
    root = make_small_project(tmp / "p")
    with open_project(root) as project:
        project.open_or_start(RUN).run(max_units=3)
        backup_project(project, tmp / "backup.zip")
    return tmp / "backup.zip", root


def _fresh(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(".keepstep"))
    return dest


def test_restore_names_a_file_not_in_the_backups_manifest(backup_zip, tmp_path: Path) -> None:
    """A file the backup holds but its manifest does not list is not restored, and the
    report says so (it used to be dropped silently); a huge declared one is never read."""
    from keepstep.storage import restore

    src, root = backup_zip
    bomb = tmp_path / "b.zip"
    shutil.copy(src, bomb)
    with zipfile.ZipFile(bomb, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("artifacts/extra.bin", b"\0" * 4096)
    declare_size(bomb, "artifacts/extra.bin", HUGE)
    report = restore(bomb, _fresh(root, tmp_path / "dest"))
    assert report.restored and report.unlisted == ["artifacts/extra.bin"]
    assert "not in its manifest and were not restored: artifacts/extra.bin" in report.message


def test_restore_refuses_a_listed_file_declaring_another_size(backup_zip,
                                                              tmp_path: Path) -> None:
    """A listed file whose zip directory declares a size other than the manifest's is
    tampered, found before reading it; nothing is restored."""
    import json

    from keepstep.storage import RestoreRefused, restore

    src, root = backup_zip
    bomb = tmp_path / "b.zip"
    shutil.copy(src, bomb)
    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    victim = next(f["path"] for f in manifest["files"] if f["path"].startswith("artifacts/"))
    declare_size(bomb, victim, HUGE)
    with pytest.raises(RestoreRefused) as info:
        restore(bomb, _fresh(root, tmp_path / "dest"))
    assert info.value.report.tampered == [victim]


def test_a_corrupt_deflate_stream_is_reported_not_raised(bundle_zip: Path,
                                                         tmp_path: Path) -> None:
    """Found by fuzzing: damaged compressed bytes of a listed member raised zlib.error out
    of verify_bundle; the report now says the bundle is damaged (or the file changed)."""
    bad = tmp_path / "bad.zip"
    data = bytearray(bundle_zip.read_bytes())
    with zipfile.ZipFile(bundle_zip) as zf:
        info = zf.getinfo("narrative.md")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 2, start + 40):
        data[i] ^= 0xFF
    bad.write_bytes(bytes(data))
    report = verify_bundle(bad)
    assert not report.ok
    assert report.problems or report.changed
