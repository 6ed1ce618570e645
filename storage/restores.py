"""Restore a backup into a project after verifying all of it (see storage/backups.py).

Restore checks everything before it writes into ``<into>/.keepstep``: every listed file's
hash, every checkpoint chain, and the database's manifest rows against the files. Which
files are current comes from the store's current pointers and manifest rows.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from keepstep.storage.backups import (
    DB_NAME,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    STATE_DIR,
    BackupManifest,
    RunHead,
    copy_hashed,
    fsync_tree,
    open_store,
    safe_rel,
)
from keepstep.storage.errors import NotFound, StorageError
from keepstep.storage.models import ArtifactEntry
from keepstep.storage.permissions import SEALED_MODE, fsync_dir
from keepstep.storage.sqlite import SQLiteStore


class Baseline(BaseModel):
    """How far one run/branch of a restored database is backed by verified artifacts."""

    run_id: str
    branch_id: str
    head_version: int
    verified_version: int  # the last checkpoint whose current artifacts all verify
    units_to_redo: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class RestoreReport(BaseModel):
    restored: bool
    source: str
    target: str
    files: int = 0
    heads: list[RunHead] = Field(default_factory=list)
    complete: bool = True  # every current artifact verified
    baselines: list[Baseline] = Field(default_factory=list)
    units_to_redo: dict[str, list[str]] = Field(default_factory=dict)  # "run/branch" -> units
    historical_missing: list[str] = Field(default_factory=list)  # no longer current: harmless
    missing: list[str] = Field(default_factory=list)
    # Files the backup holds that its manifest does not list: not restored, never read.
    unlisted: list[str] = Field(default_factory=list)
    tampered: list[str] = Field(default_factory=list)
    chain_problems: list[str] = Field(default_factory=list)
    replaced: str | None = None  # where a forced restore moved the old state folder
    message: str = ""


class RestoreRefused(StorageError):
    """A restore was refused before anything was written into the target state folder.

    ``report`` lists what failed (missing or tampered files, broken chains).
    """

    def __init__(self, message: str, report: RestoreReport, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.report = report


class Source:
    """Read access to a backup folder or zip, by manifest path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        if path.is_file() and zipfile.is_zipfile(path):
            self.zip = zipfile.ZipFile(path)
        elif path.is_file():
            raise StorageError(f"{path} is not a zip file (damaged or cut short?)",
                               hint="pass a backup folder or a complete .zip written by "
                               "`keepstep backup`")
        elif not path.is_dir():
            raise NotFound(f"no backup at {path}", hint="pass a backup folder or .zip")

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()

    def sizes(self) -> dict[str, int]:
        """Every file the backup holds -> its declared size (the zip directory, or lstat for
        a folder), read without opening any file. A symbolic link in a folder is listed
        with size -1: it is never followed."""
        if self.zip is not None:
            return {i.filename: i.file_size for i in self.zip.infolist() if not i.is_dir()}
        out: dict[str, int] = {}
        for folder, _dirs, files in os.walk(self.path, followlinks=False):
            for name in files:
                full = Path(folder) / name
                rel = full.relative_to(self.path).as_posix()
                out[rel] = -1 if full.is_symlink() else full.lstat().st_size
        return out

    def exists(self, rel: str) -> bool:
        if self.zip is not None:
            try:
                self.zip.getinfo(rel)
                return True
            except KeyError:
                return False
        return (self.path / rel).is_file()

    def open(self, rel: str) -> IO[bytes]:
        if self.zip is not None:
            return self.zip.open(rel)
        return open(self.path / rel, "rb")


def read_manifest(src: Source) -> BackupManifest:
    if not src.exists(MANIFEST):
        raise StorageError(f"{src.path} is not a keepstep backup (no {MANIFEST})",
                           hint="pass a folder or .zip written by `keepstep backup`")
    declared = src.sizes().get(MANIFEST, 0)
    if declared > MANIFEST_LIMIT or declared < 0:
        raise StorageError(f"{src.path}: {MANIFEST} declares {declared} bytes (over the "
                           f"{MANIFEST_LIMIT // (1024 * 1024)} MB limit, or a link); not read",
                           hint="this is not a keepstep backup, or it was edited")
    with src.open(MANIFEST) as fh:
        data = json.loads(fh.read(MANIFEST_LIMIT + 1).decode("utf-8"))
    manifest = BackupManifest.model_validate(data)
    if manifest.format != FORMAT or manifest.format_version > FORMAT_VERSION:
        raise StorageError(f"{src.path}: unsupported backup format {manifest.format} "
                           f"v{manifest.format_version}", hint="upgrade keepstep")
    return manifest


MANIFEST_LIMIT = 64 * 1024 * 1024
# What reading a damaged zip or manifest raises (ValueError covers JSON, pydantic and a
# manifest that is not UTF-8).
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError,
            NotImplementedError, KeyError, OSError)


def _refuse(report: RestoreReport, message: str, hint: str) -> RestoreRefused:
    report.message = message
    return RestoreRefused(message, report, hint=hint)


def _listed(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def restore(backup_path: Path, into_dir: Path, *, force: bool = False) -> RestoreReport:
    """Restore a backup into ``<into_dir>/.keepstep`` after verifying all of it.

    Refused (RestoreRefused, nothing written into the target state folder) when a
    file the backup lists is missing or does not hash to its manifest entry, when a
    checkpoint chain does not verify, or when the target state folder is not empty
    and ``force`` is not given (a forced restore moves the old folder aside, it
    never deletes it). When the database names current artifacts the backup does
    not hold (database and files from different moments), the restore goes ahead
    and the report says, per run/branch, the last checkpoint both can verify and
    the units that leaves to redo; the engine's recovery re-hashes current
    artifacts on resume and redoes exactly those.
    """
    source = Path(backup_path)
    into = Path(into_dir)
    target = into / STATE_DIR
    report = RestoreReport(restored=False, source=str(source), target=str(target))
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not force:
        raise _refuse(report, f"{target} is not empty",
                      "restore into a new folder, or pass --force (the old state folder is "
                      "moved aside, not deleted)")
    try:
        src = Source(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise _refuse(report, f"{source} is a damaged zip ({type(exc).__name__})",
                      "use another backup; nothing was restored") from None
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STATE_DIR}.restoring-", dir=into))
    try:
        try:
            manifest = read_manifest(src)
            report.heads = manifest.heads
            _stage_files(src, manifest, staging, report)
        except _DAMAGED as exc:
            # A backup from elsewhere may be truncated or edited: refused, never a crash.
            raise _refuse(report, f"the backup {source} is damaged: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}",
                          "use another backup; nothing was restored") from None
        if report.missing or report.tampered:
            what = []
            if report.missing:
                what.append(f"{len(report.missing)} missing file(s): {_listed(report.missing)}")
            if report.tampered:
                what.append(f"{len(report.tampered)} file(s) that do not match the manifest: "
                            f"{_listed(report.tampered)}")
            raise _refuse(report, "the backup does not verify — " + "; ".join(what),
                          "use another backup; nothing was restored")
        hashes = {f.path: f.sha256 for f in manifest.files}
        _check_database(staging, manifest, hashes, report)
        if report.chain_problems:
            raise _refuse(report, "the backup's checkpoint chain does not verify: "
                          + _listed(report.chain_problems, 5),
                          "use another backup; nothing was restored")
        for f in (staging / "artifacts").rglob("*") if (staging / "artifacts").is_dir() else ():
            if f.is_file():  # committed files are read-only, as in a live project
                f.chmod(SEALED_MODE)
        fsync_tree(staging)
        if target.exists():
            if target.is_dir() and not any(target.iterdir()):
                target.rmdir()
            else:
                stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
                aside = into / f"{STATE_DIR}.replaced-{stamp}"
                os.replace(target, aside)
                report.replaced = str(aside)
        os.replace(staging, target)
        fsync_dir(into)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        src.close()
    report.restored = True
    report.files = len(manifest.files)
    report.complete = not report.units_to_redo
    if report.complete:
        report.message = f"restored {report.files} files; every checkpoint chain and " \
                         "current artifact verified"
    else:
        parts = [f"{b.run_id}/{b.branch_id} stops at the last baseline both can verify "
                 f"(checkpoint {b.verified_version} of {b.head_version}); units to redo: "
                 + ", ".join(b.units_to_redo) for b in report.baselines if b.units_to_redo]
        report.message = "the database and the artifacts come from different moments: " \
                         + "; ".join(parts) + " — resuming the run redoes them"
    if report.unlisted:
        report.message += (f"; {len(report.unlisted)} file(s) in the backup are not in its "
                           f"manifest and were not restored: {_listed(report.unlisted)}")
    return report


def _stage_files(src: Source, manifest: BackupManifest, staging: Path,
                 report: RestoreReport) -> None:
    """Copy every listed file into ``staging`` while hashing it (never past its listed
    size); record what fails. A file whose declared size differs from the manifest's is
    tampered without being read; files the manifest does not list are named, never read."""
    sizes = src.sizes()
    listed = {f.path for f in manifest.files}
    report.unlisted = sorted(n for n in sizes if n not in listed and n != MANIFEST)
    for f in manifest.files:
        rel = safe_rel(f.path)
        if rel.parts[0] not in (DB_NAME, "artifacts"):
            raise _refuse(report, f"the backup manifest lists an unexpected file {f.path!r}",
                          "this is not a keepstep backup, or it was edited")
        if not src.exists(f.path):
            report.missing.append(f.path)
            continue
        if sizes.get(f.path, f.size) != f.size:
            report.tampered.append(f.path)
            continue
        dst = staging.joinpath(*rel.parts)
        with src.open(f.path) as fh:
            digest, size = copy_hashed(fh, dst, limit=f.size)
        if digest != f.sha256 or size != f.size:
            report.tampered.append(f.path)


def _check_database(staging: Path, manifest: BackupManifest, hashes: dict[str, str],
                    report: RestoreReport) -> None:
    """Verify chains and heads on a throwaway copy; find the last verifiable baselines."""
    with tempfile.TemporaryDirectory(prefix="keepstep-restore-check-") as tmp:
        shutil.copyfile(staging / DB_NAME, Path(tmp) / DB_NAME)
        with open_store(Path(tmp)) as store:
            listed = {(h.run_id, h.branch_id): h for h in manifest.heads}
            for run in store.runs():
                files: dict[str, list[ArtifactEntry]] = {}  # attempt -> its committed files
                historical: set[str] = set()
                for e in store.manifest(run):
                    files.setdefault(e.attempt_id, []).append(e)
                    if hashes.get(f"artifacts/{e.path}") != e.sha256:
                        historical.add(e.path)
                current_paths: set[str] = set()
                for b in store.branches(run):
                    branch = b["branch_id"]
                    head = store.get_head(run, branch)
                    chain = store.verify_chain(run, branch)
                    report.chain_problems += [f"{run}/{branch} v{p.version}: {p.problem}"
                                              for p in chain.problems]
                    noted = listed.get((run, branch))
                    if noted is None or (noted.version, noted.hash) != (head.version, head.hash):
                        report.chain_problems.append(
                            f"{run}/{branch}: head v{head.version} is not the head the backup "
                            "manifest recorded")
                    baseline = _baseline(store, run, branch, head.version, hashes, files)
                    report.baselines.append(baseline)
                    if baseline.units_to_redo:
                        report.units_to_redo[f"{run}/{branch}"] = baseline.units_to_redo
                    for attempt in store.current_attempts(run, branch).values():
                        current_paths |= {e.path for e in files.get(attempt, [])}
                report.historical_missing += sorted(historical - current_paths)


def _baseline(store: SQLiteStore, run: str, branch: str, head: int, hashes: dict[str, str],
              files: dict[str, list[ArtifactEntry]]) -> Baseline:
    """Replay the current pointers version by version; keep the last version at which every
    current attempt's committed files are in the backup with the recorded hash."""
    def wrong(attempt: str) -> list[str]:
        return [e.path for e in sorted(files.get(attempt, []), key=lambda e: e.path)
                if hashes.get(f"artifacts/{e.path}") != e.sha256]

    bad: dict[str, list[str]] = {}  # unit -> its current files that do not verify
    verified = 0
    changes = store.current_history(run, branch)
    for i, change in enumerate(changes):
        if not bad and change.version > 0:
            verified = change.version - 1  # nothing bad up to just before this change
        missing = [] if change.attempt_id is None else wrong(change.attempt_id)
        if missing:
            bad[change.unit] = missing
        else:
            bad.pop(change.unit, None)
        last_of_version = i + 1 == len(changes) or changes[i + 1].version != change.version
        if last_of_version and not bad:
            verified = change.version
    if not bad:
        verified = head
    return Baseline(run_id=run, branch_id=branch, head_version=head,
                    verified_version=verified, units_to_redo=sorted(bad),
                    problems=[f"{u}: {p} missing or changed" for u, ps in sorted(bad.items())
                              for p in ps])


__all__ = ["Baseline", "RestoreRefused", "RestoreReport", "Source", "read_manifest", "restore"]
