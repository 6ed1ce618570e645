"""The artifact store: attempt directories, durable staging, sealing, checks.

Layout: ``<root>/<run>/<unit>/<attempt>/<name>``, where an attempt id
``U07/a2`` maps to ``<unit>=U07``, ``<attempt>=a2``. A staged file is written
to a temporary name, renamed into place and then fsynced (one sync for its bytes
and its name; no folder fsync), so after a process crash a file is either whole
or absent (a leftover ``.tmp`` marks an interrupted write). Files are never
overwritten. Folders are created 0700 and files 0600; sealing makes a file 0400.

``prepare_units`` creates a run's unit folders up front with one fsync, so that
staging a unit's first attempt creates one folder, not two.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from keepstep.storage.errors import ArtifactImmutable, UnsafeArtifactName
from keepstep.storage.hashing import file_sha256, sha256_hex
from keepstep.storage.models import ArtifactEntry, ArtifactProblem
from keepstep.storage.permissions import (
    DIR_MODE,
    SEALED_MODE,
    make_private_dir,
    open_private,
)
from keepstep.storage.permissions import (
    fsync_dir as fsync_dir,  # re-exported: the file adapter syncs its folder with it
)

_SAFE_PART = re.compile(r"^[A-Za-z0-9._@+=-]+$")
_ID_PART = re.compile(r"^[A-Za-z0-9._-]+$")


def safe_name(name: str) -> PurePosixPath:
    """Validate an artifact name: relative, no '..', no odd characters."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        raise UnsafeArtifactName(f"unsafe artifact name {name!r}")
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("", ".", "..") for part in p.parts):
        raise UnsafeArtifactName(f"unsafe artifact name {name!r}")
    if any(not _SAFE_PART.match(part) or part.endswith(".tmp") for part in p.parts):
        raise UnsafeArtifactName(f"unsafe artifact name {name!r}")
    return p


def _check_id(value: str, what: str) -> None:
    if not _ID_PART.match(value) or value in (".", ".."):
        raise UnsafeArtifactName(f"unsafe {what} {value!r} for an artifact path")


class ArtifactStore:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable

    # -- paths ---------------------------------------------------------------
    @staticmethod
    def _attempt_parts(run_id: str, attempt_id: str) -> tuple[str, str, str]:
        unit, _, attempt = attempt_id.partition("/")
        for value, what in ((run_id, "run id"), (unit, "unit id"), (attempt, "attempt")):
            _check_id(value, what)
        return run_id, unit, attempt

    def attempt_dir(self, run_id: str, attempt_id: str) -> Path:
        return self.root.joinpath(*self._attempt_parts(run_id, attempt_id))

    def relpath(self, run_id: str, attempt_id: str, name: str) -> str:
        return str(PurePosixPath(run_id, *attempt_id.split("/"), *safe_name(name).parts))

    def path_of(self, entry: ArtifactEntry) -> Path:
        return self.root / entry.path

    # -- writing -------------------------------------------------------------
    @staticmethod
    def _mkdirs(directory: str) -> list[str]:
        """Create ``directory`` and any missing parents (0700); return the folders whose
        entries changed (each created folder's parent), deepest first."""
        try:  # the common case: only the last level is missing
            os.mkdir(directory, DIR_MODE)
            os.chmod(directory, DIR_MODE)
            return [os.path.dirname(directory)]
        except FileExistsError:
            return []
        except FileNotFoundError:
            pass
        created = make_private_dir(directory)
        return [os.path.dirname(c) for c in reversed(created)]

    def _sync_dirs(self, dirs: Iterable[str | Path]) -> None:
        if self.durable:
            for d in dirs:
                fsync_dir(d)

    def prepare_units(self, run_id: str, unit_ids: Iterable[str]) -> list[str]:
        """Create the run folder and every missing unit folder, durably, in one go.

        One fsync of the run folder covers all new unit folders (plus the fsyncs
        needed if the run folder itself is new). Idempotent; returns the unit ids
        whose folders were created. Staging works without it (it creates a
        missing unit folder itself); this only takes that cost off each unit.
        """
        _check_id(run_id, "run id")
        units = list(dict.fromkeys(unit_ids))
        for unit in units:
            _check_id(unit, "unit id")
        run_dir = self.root / run_id
        self._sync_dirs(self._mkdirs(str(run_dir)))
        created = []
        for unit in units:
            try:
                os.mkdir(run_dir / unit, DIR_MODE)
            except FileExistsError:
                continue
            os.chmod(run_dir / unit, DIR_MODE)
            created.append(unit)
        if created:
            self._sync_dirs([run_dir])
        return created

    def set_aside(self, run_id: str, attempt_id: str, tag: str) -> str | None:
        """Move an existing folder of a just-claimed attempt id out of its way.

        A claim is committed without a sync of its own; a power cut before the next durable
        commit can lose it after its attempt staged files, and the next claim of the unit
        then gets the same attempt id. Its leftover folder is renamed to
        ``<attempt>.lost-<tag>`` (a folder with no attempt row: recovery's orphan scan lists
        and quarantines it), so the new attempt starts empty and no file is overwritten.
        Returns the new folder's attempt id, or None when there was nothing to move.
        """
        try:
            directory = self.attempt_dir(run_id, attempt_id)
        except UnsafeArtifactName:
            return None
        if not os.path.lexists(directory):
            return None
        _check_id(tag, "tag")
        aside = directory.with_name(f"{directory.name}.lost-{tag}")
        os.rename(directory, aside)
        return f"{attempt_id}.lost-{tag}"

    def stage(
        self,
        run_id: str,
        attempt_id: str,
        name: str,
        data: bytes,
        *,
        media_type: str,
        producer_version: str,
        created_at: str,
        source_ids: Iterable[str] = (),
        validators: dict[str, Any] | None = None,
        schema_version: int = 1,
    ) -> ArtifactEntry:
        """Write one file durably into the attempt directory and describe it.

        When this returns (with ``durable``), the file's bytes and its name in its folder
        are on disk: a manifest row committed afterwards never names a lost file.
        """
        rel = safe_name(name)
        relpath = "/".join((*self._attempt_parts(run_id, attempt_id), *rel.parts))
        target = os.path.join(self.root, relpath)
        directory = os.path.dirname(target)
        new_entries = self._mkdirs(directory)
        # A folder created just now holds nothing, so only an existing one needs the check.
        if not new_entries and os.path.lexists(target):
            raise ArtifactImmutable(f"{target} already exists")
        tmp = target + ".tmp"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            # The rename comes before the sync: a process killed before it leaves a .tmp
            # (never a torn file under the final name), and the one fsync below makes both
            # the bytes and the file's name durable before the commit whose manifest names
            # it. A rename stamps the file's inode (its ctime), so ext4, xfs and btrfs commit
            # the rename, the folder it landed in (created earlier: an attempt or calls/
            # folder) and the data together when that inode is fsynced; no folder fsync.
            # A power cut before the fsync returns can leave a partial file under its final
            # name, but only in an attempt that never committed (an orphan). Should a file
            # system not keep the name, the commit names a file recovery does not find: its
            # audit of current artifacts (every resume, every current unit) invalidates and
            # redoes the unit — a redo, never a wrong result.
            os.rename(tmp, target)
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        return ArtifactEntry(
            unit=attempt_id.partition("/")[0],
            attempt_id=attempt_id,
            name=str(rel),
            path=relpath,
            media_type=media_type,
            size=len(data),
            sha256=sha256_hex(data),
            schema_version=schema_version,
            source_ids=sorted(source_ids),
            validators=validators or {},
            producer_version=producer_version,
            created_at=created_at,
        )

    def seal(self, entries: Iterable[ArtifactEntry]) -> None:
        """Make committed files read-only (a guard against accidental edits)."""
        for entry in entries:
            p = self.path_of(entry)
            if p.exists():
                p.chmod(SEALED_MODE)

    def seal_dir(self, directory: str | Path) -> None:
        """Quarantine an attempt directory in place: every file read-only."""
        for f in Path(directory).rglob("*"):
            if f.is_file():
                f.chmod(SEALED_MODE)

    def read(self, entry: ArtifactEntry) -> bytes:
        return self.path_of(entry).read_bytes()

    # -- checking ------------------------------------------------------------
    def verify(self, entries: Iterable[ArtifactEntry]) -> list[ArtifactProblem]:
        problems = []
        for e in entries:
            p = self.path_of(e)
            if not p.is_file():
                problems.append(
                    ArtifactProblem(path=e.path, unit=e.unit, attempt_id=e.attempt_id,
                                    problem="missing", expected_sha256=e.sha256)
                )
                continue
            actual = file_sha256(str(p))
            if actual != e.sha256:
                problems.append(
                    ArtifactProblem(path=e.path, unit=e.unit, attempt_id=e.attempt_id,
                                    problem="changed", expected_sha256=e.sha256,
                                    actual_sha256=actual)
                )
        return problems

    @staticmethod
    def files_in(directory: Path) -> list[str]:
        """Every file under ``directory``, as sorted "/"-separated relative paths."""
        return sorted(f.relative_to(directory).as_posix() for f in directory.rglob("*")
                      if f.is_file())

    def attempt_folders(self, run_id: str, *,
                        limit: int | None = None) -> Iterator[tuple[str, str, Path]]:
        """(unit, attempt_id, directory) for the attempt folders of a run, in (unit, folder)
        order, at most ``limit`` of them; files are not listed (cheap per folder)."""
        run_root = self.root / run_id
        if not run_root.is_dir():
            return
        seen = 0
        # Names starting with "_" hold run-level files (plan snapshots), not attempts.
        for unit_dir in sorted(p for p in run_root.iterdir()
                               if p.is_dir() and not p.name.startswith("_")):
            for att_dir in sorted(p for p in unit_dir.iterdir() if p.is_dir()):
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield unit_dir.name, f"{unit_dir.name}/{att_dir.name}", att_dir

    def folder_names(self, run_id: str) -> dict[str, list[str]]:
        """unit folder -> the names in it, for every unit folder of a run (one listdir per
        unit folder; nothing below it is read)."""
        run_root = self.root / run_id
        out: dict[str, list[str]] = {}
        try:
            units = [e for e in os.scandir(run_root)
                     if e.is_dir() and not e.name.startswith("_")]
        except FileNotFoundError:
            return out
        for entry in units:
            try:
                out[entry.name] = os.listdir(entry.path)
            except (FileNotFoundError, NotADirectoryError):
                continue
        return out

    def attempt_dirs(self, run_id: str) -> Iterator[tuple[str, str, Path, list[str]]]:
        """(unit, attempt_id, directory, files) for every attempt directory of a run."""
        for unit, attempt_id, directory in self.attempt_folders(run_id):
            yield unit, attempt_id, directory, self.files_in(directory)

    def attempt_files(self, run_id: str, attempt_id: str) -> tuple[Path, list[str]] | None:
        """(directory, files) of one attempt, or None when it has no folder (or its id
        cannot name one)."""
        try:
            directory = self.attempt_dir(run_id, attempt_id)
        except UnsafeArtifactName:
            return None
        if not directory.is_dir():
            return None
        return directory, self.files_in(directory)
