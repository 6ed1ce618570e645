"""Backup and restore of a project's state: the database, its committed artifacts, a manifest.

A backup is a folder, or a ``.zip`` of the same tree::

    state.db                a consistent copy (SQLite's online backup API)
    artifacts/<run>/...     every file a committed manifest row references, and the
                            plan snapshots under ``<run>/_plan/``
    manifest.json           sha256 and size of every file above, the head of every
                            run/branch, and any committed file that could not be copied

Restore checks everything before it writes into ``<into>/.keepstep``: every listed
file's hash, every checkpoint chain, and the database's manifest rows against the
files. Project files (keepstep.toml, plan.toml, sources) are not part of a backup.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from pydantic import BaseModel, Field

from keepstep.storage.artifacts import fsync_dir
from keepstep.storage.current import UNIT_PREFIX, current_unit, current_units
from keepstep.storage.errors import NotFound, StorageError
from keepstep.storage.schema import SCHEMA_VERSION
from keepstep.storage.sqlite_store import SQLiteStore

STATE_DIR = ".keepstep"
DB_NAME = "state.db"
MANIFEST = "manifest.json"
FORMAT = "keepstep-backup"
FORMAT_VERSION = 1
_CHUNK = 1 << 20


class BackupFile(BaseModel):
    path: str  # relative to the backup root, "/"-separated
    sha256: str
    size: int


class RunHead(BaseModel):
    run_id: str
    branch_id: str
    version: int
    hash: str


class SkippedArtifact(BaseModel):
    """A committed file that was not copied because the project's copy did not verify."""

    path: str  # relative to the artifact root
    unit: str
    attempt_id: str
    problem: str  # "missing" | "changed"


class BackupManifest(BaseModel):
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    created_at: str
    schema_version: int
    heads: list[RunHead]
    files: list[BackupFile]
    skipped: list[SkippedArtifact] = Field(default_factory=list)


class BackupReport(BaseModel):
    out: str
    kind: str  # "folder" | "zip"
    files: int
    bytes: int
    heads: list[RunHead]
    skipped: list[SkippedArtifact] = Field(default_factory=list)


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


def _utc(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds")


def _copy_hashed(src: IO[bytes], dst_path: Path, *, limit: int | None = None) -> tuple[str, int]:
    """Stream ``src`` into a new file, fsynced; return (sha256, size). Stops past ``limit``."""
    h = hashlib.sha256()
    size = 0
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    with open(dst_path, "xb") as out:
        while block := src.read(_CHUNK):
            size += len(block)
            if limit is not None and size > limit:
                break
            h.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest(), size


def _fsync_tree(root: Path) -> None:
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_dir(d)
    fsync_dir(root)


def _safe_rel(path: str) -> PurePosixPath:
    p = PurePosixPath(path)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts) \
            or "\\" in path:
        raise StorageError(f"unsafe path {path!r} in a backup manifest",
                           hint="this is not a keepstep backup, or it was edited")
    return p


@contextmanager
def _store(root: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(root)
    try:
        yield store
    finally:
        store.close()


# -- backup --------------------------------------------------------------------------------
def backup(project_root: Path, out_path: Path, *, now: float | None = None,
           store: SQLiteStore | None = None) -> BackupReport:
    """Back up ``<project_root>/.keepstep`` into a folder, or a zip when ``out_path`` ends .zip.

    The database is copied through SQLite's online backup API (safe while a run is
    going); the artifacts copied are those the copy's committed manifest rows name,
    plus the plan snapshots. A committed file that is missing or changed in the
    project is not copied; it is listed as skipped (restore then reports the units
    to redo). ``out_path`` must not exist (an empty folder is fine).
    """
    state = Path(project_root) / STATE_DIR
    if not (state / DB_NAME).is_file():
        raise NotFound(f"no keepstep state in {project_root} ({state / DB_NAME} is missing)",
                       hint="pass the project folder (the one holding .keepstep)")
    out = Path(out_path)
    as_zip = out.suffix.lower() == ".zip"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StorageError(f"{out} already exists", hint="pick a new backup path")
    out.parent.mkdir(parents=True, exist_ok=True)
    created = _utc(now if now is not None else _dt.datetime.now(_dt.UTC).timestamp())
    artifacts_root = state / "artifacts"
    with tempfile.TemporaryDirectory(prefix=".keepstep-backup-", dir=out.parent) as tmp:
        work = Path(tmp)
        tree = work / "tree"
        (tree / "db").mkdir(parents=True)
        if store is None:
            with _store(state) as own:
                own.backup_to(tree / "db" / DB_NAME)
        else:
            store.backup_to(tree / "db" / DB_NAME)
        # Read what to copy from the copy, so the files match the database saved.
        with _store(tree / "db") as snap:
            heads = [RunHead(run_id=run, branch_id=b["branch_id"], version=b["head_version"],
                             hash=b["head_hash"]) for run in snap.runs()
                     for b in snap.branches(run)]
            wanted: dict[str, tuple[str | None, str, str]] = {}  # path -> (sha, unit, attempt)
            for run in snap.runs():
                for e in snap.manifest(run):
                    wanted[e.path] = (e.sha256, e.unit, e.attempt_id)
                plan_dir = artifacts_root / run / "_plan"
                if plan_dir.is_dir():
                    for f in sorted(plan_dir.rglob("*")):
                        if f.is_file() and not f.name.endswith(".tmp"):
                            rel = f.relative_to(artifacts_root).as_posix()
                            wanted.setdefault(rel, (None, "_plan", f.parent.name))
        os.replace(tree / "db" / DB_NAME, tree / DB_NAME)
        shutil.rmtree(tree / "db")  # the copy's WAL is folded in on close; drop leftovers
        files = [_described(tree, DB_NAME)]
        skipped: list[SkippedArtifact] = []
        for rel, (sha, unit, attempt) in sorted(wanted.items()):
            src = artifacts_root / rel
            if not src.is_file():
                skipped.append(SkippedArtifact(path=rel, unit=unit, attempt_id=attempt,
                                               problem="missing"))
                continue
            dst = tree / "artifacts" / rel
            with open(src, "rb") as fh:
                digest, size = _copy_hashed(fh, dst)
            if sha is not None and digest != sha:
                dst.unlink()
                skipped.append(SkippedArtifact(path=rel, unit=unit, attempt_id=attempt,
                                               problem="changed"))
                continue
            files.append(BackupFile(path=f"artifacts/{rel}", sha256=digest, size=size))
        manifest = BackupManifest(created_at=created, schema_version=SCHEMA_VERSION,
                                  heads=heads, files=files, skipped=skipped)
        _write_manifest(tree, manifest)
        if as_zip:
            _zip_tree(tree, files, work / "backup.zip")
            os.replace(work / "backup.zip", out)
        else:
            _fsync_tree(tree)
            if out.exists():
                out.rmdir()
            os.replace(tree, out)
        fsync_dir(out.parent)
    return BackupReport(out=str(out), kind="zip" if as_zip else "folder", files=len(files),
                        bytes=sum(f.size for f in files), heads=heads, skipped=skipped)


def _described(tree: Path, rel: str) -> BackupFile:
    h = hashlib.sha256()
    size = 0
    with open(tree / rel, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
            size += len(block)
    return BackupFile(path=rel, sha256=h.hexdigest(), size=size)


def _write_manifest(tree: Path, manifest: BackupManifest) -> None:
    with open(tree / MANIFEST, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True))
        fh.flush()
        os.fsync(fh.fileno())


def _zip_tree(tree: Path, files: list[BackupFile], target: Path) -> None:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(tree / MANIFEST, MANIFEST)
        for f in files:
            zf.write(tree / f.path, f.path)
    with open(target, "rb+") as fh:
        os.fsync(fh.fileno())


# -- restore -------------------------------------------------------------------------------
class _Source:
    """Read access to a backup folder or zip, by manifest path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        if path.is_file() and zipfile.is_zipfile(path):
            self.zip = zipfile.ZipFile(path)
        elif not path.is_dir():
            raise NotFound(f"no backup at {path}", hint="pass a backup folder or .zip")

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()

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


def _load_manifest(src: _Source) -> BackupManifest:
    if not src.exists(MANIFEST):
        raise StorageError(f"{src.path} is not a keepstep backup (no {MANIFEST})",
                           hint="pass a folder or .zip written by `keepstep backup`")
    with src.open(MANIFEST) as fh:
        data = json.loads(fh.read().decode("utf-8"))
    manifest = BackupManifest.model_validate(data)
    if manifest.format != FORMAT or manifest.format_version > FORMAT_VERSION:
        raise StorageError(f"{src.path}: unsupported backup format {manifest.format} "
                           f"v{manifest.format_version}", hint="upgrade keepstep")
    return manifest


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
    src = _Source(source)
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STATE_DIR}.restoring-", dir=into))
    try:
        manifest = _load_manifest(src)
        report.heads = manifest.heads
        _stage_files(src, manifest, staging, report)
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
                f.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        _fsync_tree(staging)
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
    return report


def _stage_files(src: _Source, manifest: BackupManifest, staging: Path,
                 report: RestoreReport) -> None:
    """Copy every listed file into ``staging`` while hashing it; record what fails."""
    for f in manifest.files:
        rel = _safe_rel(f.path)
        if rel.parts[0] not in (DB_NAME, "artifacts"):
            raise _refuse(report, f"the backup manifest lists an unexpected file {f.path!r}",
                          "this is not a keepstep backup, or it was edited")
        if not src.exists(f.path):
            report.missing.append(f.path)
            continue
        dst = staging.joinpath(*rel.parts)
        with src.open(f.path) as fh:
            digest, size = _copy_hashed(fh, dst, limit=f.size)
        if digest != f.sha256 or size != f.size:
            report.tampered.append(f.path)


def _check_database(staging: Path, manifest: BackupManifest, hashes: dict[str, str],
                    report: RestoreReport) -> None:
    """Verify chains and heads on a throwaway copy; find the last verifiable baselines."""
    with tempfile.TemporaryDirectory(prefix="keepstep-restore-check-") as tmp:
        shutil.copyfile(staging / DB_NAME, Path(tmp) / DB_NAME)
        with _store(Path(tmp)) as store:
            listed = {(h.run_id, h.branch_id): h for h in manifest.heads}
            for run in store.runs():
                historical: set[str] = set()
                for e in store.manifest(run):
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
                    baseline = _baseline(store, run, branch, head.version, hashes)
                    report.baselines.append(baseline)
                    if baseline.units_to_redo:
                        report.units_to_redo[f"{run}/{branch}"] = baseline.units_to_redo
                    for cur in current_units(store.read_state(run, branch, UNIT_PREFIX)).values():
                        current_paths |= set(cur.outputs)
                report.historical_missing += sorted(historical - current_paths)


def _baseline(store: SQLiteStore, run: str, branch: str, head: int,
              hashes: dict[str, str]) -> Baseline:
    """Replay the unit records checkpoint by checkpoint; keep the last version at which
    every current unit's outputs are in the backup with the recorded hash."""
    bad: dict[str, list[str]] = {}  # unit -> its outputs that do not verify
    verified = -1
    for cp in store.list_checkpoints(run, branch):
        for key, value in cp.delta.items():
            if not key.startswith(UNIT_PREFIX):
                continue
            cur = current_unit(key, value)
            unit = key[len(UNIT_PREFIX):]
            if cur is None:
                bad.pop(unit, None)
                continue
            wrong = [p for p, sha in sorted(cur.outputs.items())
                     if hashes.get(f"artifacts/{p}") != sha]
            if wrong:
                bad[unit] = wrong
            else:
                bad.pop(unit, None)
        if not bad:
            verified = cp.version
    return Baseline(run_id=run, branch_id=branch, head_version=head,
                    verified_version=max(verified, 0), units_to_redo=sorted(bad),
                    problems=[f"{u}: {p} missing or changed" for u, ps in sorted(bad.items())
                              for p in ps])


def load_manifest(backup_path: Path) -> BackupManifest:
    """The manifest of a backup folder or zip (for listing; nothing is verified)."""
    src = _Source(Path(backup_path))
    try:
        return _load_manifest(src)
    finally:
        src.close()


__all__ = ["BackupFile", "BackupManifest", "BackupReport", "Baseline", "RestoreRefused",
           "RestoreReport", "RunHead", "SkippedArtifact", "backup", "load_manifest", "restore"]
