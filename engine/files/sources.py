"""Adding a source to a project: the one path the CLI (`keepstep sources add`) and the TUI's
Sources screen share.

A file inside the project is recorded where it is; a file outside is copied into
``sources/`` first, so the project folder holds every source it cites.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from keepstep.engine.core.inputs import SourceEntry
from keepstep.engine.errors import SourceError
from keepstep.engine.files.project import SOURCES_FILE, load_sources, save_sources

SOURCES_DIR = "sources"
# Ids and groups are written into plan inputs as "source:ID" / "group:G": no spaces or colons.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_RULE = "letters, digits, '_', '-' or '.', starting with a letter or digit"


def add_source(root: Path, path: Path, *, source_id: str, group: str, title: str = "",
               kind: str = "", approved: bool = False) -> SourceEntry:
    """Record the file at ``path`` in sources.toml as ``source_id`` and return the new entry.

    A relative ``path`` is taken as Python takes it (from the working directory). A file
    outside ``root`` is copied to ``sources/<name>``; an existing file there with the same
    bytes is reused, one with different bytes is never overwritten. ``title`` defaults to the
    file's stem. Raises SourceError (nothing written) for a bad or duplicate id, a bad group,
    or a missing, non-file or non-UTF-8 path.
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
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path} cannot be read: {exc.strerror or exc}",
                          hint="check the file's permissions") from exc
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Units read sources as UTF-8 text; a binary file would fail at run time instead.
        raise SourceError(f"{path} is not UTF-8 text",
                          hint="convert it to text (Markdown or plain) first") from exc
    return data


def _write_new(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


__all__ = ["NAME_RULE", "SOURCES_DIR", "add_source"]
