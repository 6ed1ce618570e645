"""Backup of a project's state: the database, its committed artifacts, a manifest.

A backup is a folder, or a ``.zip`` of the same tree::

    state.db                a consistent copy (SQLite's online backup API)
    artifacts/<run>/...     every file a committed manifest row references, and the
                            plan snapshots under ``<run>/_plan/``
    manifest.json           sha256 and size of every file above, the head of every
                            run/branch, and any committed file that could not be copied

A backup is refused when a checkpoint chain does not verify (restoring one: see
storage/restores.py). Backups are private: folders 0700, files 0600. Project files
(keepstep.toml, plan.toml, sources) are not part of a backup.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from pydantic import BaseModel, Field

from keepstep.storage.errors import ChainBroken, NotFound, StorageError
from keepstep.storage.permissions import fsync_dir, make_private_dir, open_private
from keepstep.storage.sqlite import SQLiteStore
from keepstep.storage.sqlite.schema import SCHEMA_VERSION

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


def _utc(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds")


def copy_hashed(src: IO[bytes], dst_path: Path, *, limit: int | None = None) -> tuple[str, int]:
    """Stream ``src`` into a new file, fsynced; return (sha256, size). Stops past ``limit``."""
    h = hashlib.sha256()
    size = 0
    make_private_dir(dst_path.parent)
    with os.fdopen(open_private(dst_path, os.O_WRONLY | os.O_EXCL), "wb") as out:
        while block := src.read(_CHUNK):
            size += len(block)
            if limit is not None and size > limit:
                break
            h.update(block)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest(), size


def fsync_tree(root: Path) -> None:
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync_dir(d)
    fsync_dir(root)


def safe_rel(path: str) -> PurePosixPath:
    p = PurePosixPath(path)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts) \
            or "\\" in path:
        raise StorageError(f"unsafe path {path!r} in a backup manifest",
                           hint="this is not a keepstep backup, or it was edited")
    return p


@contextmanager
def open_store(root: Path) -> Iterator[SQLiteStore]:
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

    ChainBroken (nothing written at ``out_path``) when a checkpoint chain of the copy
    does not verify; the message names the run, branch and version.
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
        make_private_dir(tree / "db")
        if store is None:
            with open_store(state) as own:
                own.backup_to(tree / "db" / DB_NAME)
        else:
            store.backup_to(tree / "db" / DB_NAME)
        # Read what to copy from the copy, so the files match the database saved.
        with open_store(tree / "db") as snap:
            _refuse_broken_chains(snap)
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
                digest, size = copy_hashed(fh, dst)
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
            fsync_tree(tree)
            if out.exists():
                out.rmdir()
            os.replace(tree, out)
        fsync_dir(out.parent)
    return BackupReport(out=str(out), kind="zip" if as_zip else "folder", files=len(files),
                        bytes=sum(f.size for f in files), heads=heads, skipped=skipped)


def _refuse_broken_chains(store: SQLiteStore) -> None:
    for run in store.runs():
        for b in store.branches(run):
            report = store.verify_chain(run, b["branch_id"])
            if report.ok:
                continue
            first = min(report.problems, key=lambda p: p.version)
            more = len(report.problems) - 1
            raise ChainBroken(
                f"run {run}/{b['branch_id']}: checkpoint {first.version} does not verify "
                f"({first.problem}){f' and {more} more problem(s)' if more else ''}; "
                "no backup was written",
                hint=f"run `keepstep verify DIR --run {run}` to see every problem; restore "
                "from an earlier backup, or keep a copy of .keepstep as it is for inspection")


def _described(tree: Path, rel: str) -> BackupFile:
    h = hashlib.sha256()
    size = 0
    with open(tree / rel, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
            size += len(block)
    return BackupFile(path=rel, sha256=h.hexdigest(), size=size)


def _write_manifest(tree: Path, manifest: BackupManifest) -> None:
    with os.fdopen(open_private(tree / MANIFEST, os.O_WRONLY | os.O_TRUNC), "w",
                   encoding="utf-8") as fh:
        fh.write(json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True))
        fh.flush()
        os.fsync(fh.fileno())


def _zip_tree(tree: Path, files: list[BackupFile], target: Path) -> None:
    os.close(open_private(target, os.O_WRONLY | os.O_EXCL))
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(tree / MANIFEST, MANIFEST)
        for f in files:
            zf.write(tree / f.path, f.path)
    with open(target, "rb+") as fh:
        os.fsync(fh.fileno())


__all__ = ["BackupFile", "BackupManifest", "BackupReport", "RunHead", "SkippedArtifact",
           "backup"]
