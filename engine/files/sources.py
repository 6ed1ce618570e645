"""Adding and checking sources: the one path the CLI (`keepstep sources add`, `validate`), the
TUI's Sources screen and a run's start share.

A file inside the project is recorded where it is; a file outside is copied into
``sources/`` first, so the project folder holds every source it cites. A file is accepted
only when it converts to text (PDF, DOCX, XLSX, CSV, PPTX, HTML, TXT or MD, within
``max_source_mb``): the same check runs at add, at validate and before a run claims a unit,
so a source that cannot be read never reaches a unit.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from keepstep.engine.core.inputs import SourceEntry
from keepstep.engine.errors import ProjectError, SourceError
from keepstep.engine.files.convert import (
    DEFAULT_MAX_BYTES,
    ConversionCache,
    ConversionError,
    SourceInfo,
    check_file,
    detect_format,
    file_sha256,
    inspect_source,
    summarize,
)
from keepstep.engine.files.project import (
    SOURCES_FILE,
    ProjectFiles,
    conversion_cache,
    load_config,
    load_sources,
    save_sources,
)

SOURCES_DIR = "sources"
# Ids and groups are written into plan inputs as "source:ID" / "group:G": no spaces or colons.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_RULE = "letters, digits, '_', '-' or '.', starting with a letter or digit"


def max_source_bytes(root: Path) -> int:
    """The project's ``max_source_mb`` in bytes (the default when keepstep.toml is absent)."""
    if not (Path(root) / "keepstep.toml").is_file():
        return DEFAULT_MAX_BYTES
    try:
        return load_config(Path(root)).max_source_bytes
    except ProjectError:
        return DEFAULT_MAX_BYTES  # `validate` reports a broken keepstep.toml on its own


def inspect_file(root: Path, path: Path, *, cancel: threading.Event | None = None
                 ) -> SourceInfo:
    """What a person sees before approving the file at ``path`` for the project at ``root``:
    detected type, size, pages or sheets or slides, a text preview.

    Raises SourceError naming the file and what to do for a missing path or a folder, and a
    ConversionError subclass (a SourceError) for a file that yields no text, is over
    ``max_source_mb``, is of an unsupported type or is undecodable text. The conversion is
    cached, so the run that later reads the file does not convert it again.
    """
    path = Path(path)
    if not path.exists():
        raise SourceError(f"{path} does not exist", hint="give the path of the source document")
    if not path.is_file():
        raise SourceError(f"{path} is not a file", hint="give the path of the source document")
    try:
        sha = file_sha256(path, cancel)
    except OSError as exc:
        raise SourceError(f"{path} cannot be read: {exc.strerror or exc}",
                          hint="check the file's permissions") from exc
    return inspect_source(path, max_bytes=max_source_bytes(root), cancel=cancel,
                          cache=conversion_cache(root), sha256=sha)


def add_source(root: Path, path: Path, *, source_id: str, group: str, title: str = "",
               kind: str = "", approved: bool = False) -> SourceEntry:
    """Record the file at ``path`` in sources.toml as ``source_id`` and return the new entry.

    A relative ``path`` is taken as Python takes it (from the working directory). A file
    outside ``root`` is copied to ``sources/<name>``; an existing file there with the same
    bytes is reused, one with different bytes is never overwritten. ``title`` defaults to the
    file's stem. Raises SourceError (nothing written) for a bad or duplicate id, a bad group,
    a missing or non-file path, or a file ``inspect_file`` refuses (no text, too large,
    unsupported type, undecodable text).
    """
    root = Path(root)
    path = Path(path)
    _check_name("source id", source_id)
    if group:
        _check_name("group", group)
    sources = load_sources(root)
    if any(s.id == source_id for s in sources.sources):
        raise SourceError(f"source id {source_id!r} is already used in {root / SOURCES_FILE}",
                          hint="pick a new id, or approve the existing source")
    inspect_file(root, path)
    data = _read_document(path)

    real, project = path.resolve(), root.resolve()
    copied: Path | None = None
    if real.is_relative_to(project):
        rel = real.relative_to(project).as_posix()
    else:
        target = project / SOURCES_DIR / path.name
        if target.exists():
            if not target.is_file() or target.read_bytes() != data:
                raise SourceError(f"{target} already exists with different content",
                                  hint="rename the file, or add the copy that is already there")
        else:
            _write_new(target, data)
            copied = target
        rel = target.relative_to(project).as_posix()

    entry = SourceEntry(id=source_id, path=rel, group=group, title=title or path.stem,
                        kind=kind, approved=approved)
    sources.sources.append(entry)
    try:
        save_sources(root, sources)
    except BaseException:
        if copied is not None:  # leave the folder as it was: no orphan copy without an entry
            copied.unlink(missing_ok=True)
        raise
    return entry


def _check_name(what: str, value: str) -> None:
    if not NAME_RE.fullmatch(value):
        shown = repr(value) if value else "(empty)"
        raise SourceError(f"{what} {shown} is not allowed", hint=f"use {NAME_RULE}")


def _read_document(path: Path) -> bytes:
    if not path.exists():
        raise SourceError(f"{path} does not exist", hint="give the path of the source document")
    if not path.is_file():
        raise SourceError(f"{path} is not a file", hint="give the path of the source document")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path} cannot be read: {exc.strerror or exc}",
                          hint="check the file's permissions") from exc


def _write_new(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


# --- checking the sources of a project --------------------------------------------------

class SourceCheck(BaseModel):
    """One listed source as the checks found it: its detected ``format`` and, when it was
    converted by this check, its ``info``; else the refusal (``problem`` names the source
    and the file, ``hint`` says what to do)."""

    source_id: str
    path: str
    approved: bool
    format: str = ""
    info: SourceInfo | None = None
    problem: str = ""
    hint: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def check_sources(files: ProjectFiles, *, approved_only: bool = True,
                  cancel: threading.Event | None = None,
                  progress: Callable[[str, str], None] | None = None) -> list[SourceCheck]:
    """Check every (approved) source the way a unit will read it, in sources.toml order: the
    file exists, is within ``max_source_mb``, is a supported type and converts to text.

    A source whose conversion is already cached (same bytes, same converter version) is not
    converted again; one that is not is converted now and cached, so the run after a check
    converts nothing. RunCancelled soon after ``cancel`` is set. ``progress(source_id,
    format)`` is called before each conversion the check has to make.
    """
    # Its own cache object keeping nothing in memory: a check holds no source text after it.
    cache = ConversionCache(conversion_cache(files.root).folder, memory_entries=0)
    limit = files.config.max_source_bytes
    checks = []
    for entry in files.sources.sources:
        if approved_only and not entry.approved:
            continue
        path = files.root / entry.path
        check = SourceCheck(source_id=entry.id, path=entry.path, approved=entry.approved)
        checks.append(check)
        if not path.is_file():
            check.problem = f"source {entry.id}: file {entry.path} is missing"
            check.hint = (f"restore the file, or revoke the source with `keepstep sources "
                          f"revoke {files.root} {entry.id}`")
            continue
        try:
            check_file(path, limit)
            check.format = detect_format(path)
            sha = file_sha256(path, cancel)
            if not cache.contains(sha, check.format):
                if progress is not None:
                    progress(entry.id, check.format)
                conv = cache.get_or_convert(path, sha, max_bytes=limit, cancel=cancel)
                check.info = summarize(path, conv)
        except ConversionError as exc:
            check.problem = f"source {entry.id}: {exc.message}"
            check.hint = exc.hint or ""
        except OSError as exc:
            check.problem = f"source {entry.id}: {path} cannot be read: {exc.strerror or exc}"
            check.hint = "check the file's permissions"
    return checks


def require_readable_sources(files: ProjectFiles, *, cancel: threading.Event | None = None,
                             progress: Callable[[str, str], None] | None = None
                             ) -> list[SourceCheck]:
    """``check_sources`` for the approved sources; raises one SourceError naming every source
    that cannot be read and what to do — what a run checks before it claims any unit."""
    checks = check_sources(files, cancel=cancel, progress=progress)
    bad = [c for c in checks if not c.ok]
    if bad:
        hints = list(dict.fromkeys(c.hint for c in bad if c.hint))
        hints.append(f"or revoke it with `keepstep sources revoke {files.root} ID`; nothing "
                     "was started")
        raise SourceError(
            f"{len(bad)} approved source(s) cannot be read: " + "; ".join(c.problem for c in bad),
            hint="; ".join(hints))
    return checks


__all__ = ["NAME_RULE", "SOURCES_DIR", "SourceCheck", "add_source", "check_sources",
           "inspect_file", "max_source_bytes", "require_readable_sources"]
