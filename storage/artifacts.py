"""The artifact store: attempt directories, durable staging, sealing, checks.

Layout: ``<root>/<run>/<unit>/<attempt>/<name>``, where an attempt id
``U07/a2`` maps to ``<unit>=U07``, ``<attempt>=a2``. A staged file is written
to a temporary name, renamed into place, and never overwritten. Folders are
created 0700 and files 0600; sealing makes a file 0400.

Durability comes one of two ways. A file larger than ``kept_max`` is fsynced,
renamed, and its folder fsynced before ``stage`` returns, so after a power cut it
is whole or absent (a leftover ``.tmp`` marks an interrupted write). A file of at
most ``kept_max`` bytes is not synced at all: the store that commits it keeps its
bytes in the commit's own transaction (SQLiteStore: the ``blobs`` table), so the
commit's one sync covers it, and ``restore_committed`` rewrites it from there if
a restart of the machine (a power cut, a kernel crash) tore or lost it. A process
crash (SIGKILL) loses neither kind: the operating system still writes what it was
given.

``prepare_units`` creates a run's unit folders up front with one fsync, so that
staging a unit's first attempt creates one folder, not two.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
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


# Files up to this size ride in the commit's transaction instead of two fsyncs each
# (file + folder) at staging: a unit's outputs and recorded model answers are this small;
# reports and converted sources above it keep the fsyncs and stay out of the database.
KEPT_MAX = 64 * 1024


class ArtifactStore:
    """``kept_max``: files up to this many bytes are staged without syncs, because the store
    keeps their bytes in the commit (0: every file is synced at staging). ``kept``: the
    kept bytes of a sha256 when a restart of the machine since their commit may have lost
    the file, else None (what ``restore_committed`` rewrites from)."""

    def __init__(self, root: Path, *, durable: bool = True, kept_max: int = 0,
                 kept: Callable[[str], bytes | None] | None = None) -> None:
        self.root = Path(root)
        self.durable = durable
        self.kept_max = kept_max
        self.kept = kept

    def synced_at_staging(self, size: int) -> bool:
        """Whether a staged file of ``size`` bytes is fsynced by ``stage`` (else the commit
        that names it keeps its bytes)."""
        return self.durable and size > self.kept_max

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
        """Write one file into the attempt directory and describe it.

        When this returns (with ``durable``) a file larger than ``kept_max`` is on disk,
        bytes and name, so a manifest row committed afterwards never names a lost file; a
        smaller one is made durable by the commit that names it (its bytes go into the
        commit's transaction), and only a process crash is survived before that.
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
        synced = self.synced_at_staging(len(data))
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if synced:
                # Needed: the bytes are on disk before the name points at them, so a crash
                # leaves a whole file or a .tmp, never a torn file under the final name.
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, target)
        # Needed (for a synced file): the rename (the file's name in its folder) is durable
        # before the commit whose manifest names it. Not synced any more: the parents of
        # folders created on the way (a new attempt folder in its unit folder, a calls/
        # folder). A journaling file system (ext4, xfs, btrfs, apfs) commits a folder's
        # creation with the first fsync inside it; should one not, the commit names a file
        # recovery cannot find, and its hash audit of current artifacts redoes the unit — a
        # redo, never a wrong result. That saves one fsync per unit and one per first call.
        if synced:
            self._sync_dirs([directory])
        return self._entry(attempt_id, rel, relpath, data, media_type, producer_version,
                           created_at, source_ids, validators, schema_version)

    @staticmethod
    def _entry(attempt_id: str, rel: PurePosixPath, relpath: str, data: bytes,
               media_type: str, producer_version: str, created_at: str,
               source_ids: Iterable[str], validators: dict[str, Any] | None,
               schema_version: int) -> ArtifactEntry:
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

    def restore_committed(self, path: str, sha256: str) -> bool:
        """Rewrite the committed file at ``path`` (relative to the root) from the bytes the
        store kept for ``sha256``, durably and sealed, when a restart of the machine since
        their commit may have lost the file. False otherwise (nothing kept, what was kept
        does not match, or no restart since: then the damage is someone's change, for the
        caller to report)."""
        data = self.kept(sha256) if self.kept is not None else None
        if data is None or sha256_hex(data) != sha256:
            return False
        parts = PurePosixPath(path).parts
        if len(parts) < 4:
            raise UnsafeArtifactName(f"{path!r} is not a path inside an attempt folder")
        self._attempt_parts(parts[0], f"{parts[1]}/{parts[2]}")
        target = os.path.join(self.root, parts[0], parts[1], parts[2],
                              *safe_name("/".join(parts[3:])).parts)
        directory = os.path.dirname(target)
        make_private_dir(directory)
        tmp = target + ".tmp"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)  # rare (after a power cut): restored files are synced right away
        finally:
            os.close(fd)
        os.chmod(tmp, SEALED_MODE)
        os.replace(tmp, target)
        fsync_dir(directory)
        return True

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
