"""ConversionCache: converted text stored once per (source sha256, converter, version).

The engine keeps it under ``.keepstep/converted/``. Each entry is two files named by a digest
of the key: ``<digest>.md`` (the text) and ``<digest>.json`` (the key, locators and counts);
both are written to a temporary file, fsynced and renamed, the JSON last, so a crash leaves
either a whole entry or none. Directories are 0700, files 0600. A different converter version
is a different key: an upgrade converts again and leaves the old entry until pruned.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from array import array
from collections import OrderedDict
from pathlib import Path

from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert import spill
from keepstep.engine.files.convert.conversion import (
    convert,
    converter_name,
    converter_version,
)
from keepstep.engine.files.convert.detect import detect_format
from keepstep.engine.files.convert.model import DEFAULT_MAX_BYTES, ConvertedSource, Segment
from keepstep.engine.files.convert.spill import TextFile

_WRITE_CHARS = 1 << 20
_SCHEMA = 2  # 2: a large entry's block offsets ("blocks"), read by window, never whole
# Text kept in memory across entries (the newest entry is kept whatever its size), so a run
# over several large sources holds about one of them, not four.
_MEMORY_CHARS = 32 << 20
_STALE_SECONDS = 15 * 60


def file_sha256(path: Path, cancel: threading.Event | None = None) -> str:
    """The sha256 of a file's bytes (the source's identity), read in 1 MB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            if cancel is not None and cancel.is_set():
                raise RunCancelled(f"hashing {path} cancelled")
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(target: Path, chunks) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ConversionCache:
    """Converted sources on disk under ``folder``, plus the last few in memory.

    ``get_or_convert`` returns the same object for the same key while it stays in memory
    (``memory_entries`` most recent), an equal one read from disk after that, and converts
    (then stores) only when neither has it.
    """

    def __init__(self, folder: Path, *, memory_entries: int = 4,
                 memory_chars: int = _MEMORY_CHARS) -> None:
        self.folder = Path(folder)
        self._memory: OrderedDict[tuple[str, str, str], ConvertedSource] = OrderedDict()
        self._memory_entries = memory_entries
        self._memory_chars = memory_chars
        self._lock = threading.Lock()

    @staticmethod
    def key_digest(sha256: str, converter: str, version: str) -> str:
        """The file-name stem of an entry: a digest of the whole key."""
        return hashlib.sha256(f"{sha256}\0{converter}\0{version}".encode()).hexdigest()[:40]

    def _paths(self, key: tuple[str, str, str]) -> tuple[Path, Path]:
        stem = self.key_digest(*key)
        return self.folder / f"{stem}.json", self.folder / f"{stem}.md"

    def get(self, sha256: str, fmt: str) -> ConvertedSource | None:
        """The cached conversion of these bytes by the current converter for ``fmt``."""
        key = (sha256, converter_name(fmt), converter_version(fmt))
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._memory.move_to_end(key)
                return hit
        conv = self._load(key)
        if conv is not None:
            self._remember(key, conv)
        return conv

    def contains(self, sha256: str, fmt: str) -> bool:
        """Whether a conversion of these bytes by the current converter for ``fmt`` is stored
        (without reading it: a check that the source converted once already)."""
        key = (sha256, converter_name(fmt), converter_version(fmt))
        with self._lock:
            if key in self._memory:
                return True
        meta, text = self._paths(key)
        return meta.is_file() and text.is_file()

    def get_or_convert(self, path: Path, sha256: str | None = None, *,
                       max_bytes: int = DEFAULT_MAX_BYTES,
                       cancel: threading.Event | None = None) -> ConvertedSource:
        """The conversion of the file at ``path`` whose bytes hash to ``sha256``.

        The caller vouches that ``sha256`` is the file's (the engine has it from the input
        snapshot); None computes it. Errors are those of ``convert``; nothing is stored for a
        file that fails.
        """
        path = Path(path)
        if sha256 is None:
            sha256 = file_sha256(path, cancel)
        fmt = detect_format(path)
        hit = self.get(sha256, fmt)
        if hit is not None:
            return hit
        # A large text spills into this folder as it is converted: storing it is a rename.
        folder = self._spill_folder()
        token = spill.SPILL_FOLDER.set(folder)
        try:
            conv = convert(path, max_bytes=max_bytes, cancel=cancel)
        finally:
            spill.SPILL_FOLDER.reset(token)
        key = (sha256, conv.converter, conv.converter_version)
        if folder is not None:
            try:
                self._store(key, conv)
            except OSError:
                pass  # a full disk: the cache is an optimisation, the text is right
        self._remember(key, conv)
        return conv

    def _remember(self, key: tuple[str, str, str], conv: ConvertedSource) -> None:
        with self._lock:
            self._memory[key] = conv
            self._memory.move_to_end(key)
            total = sum(c.in_memory() for c in self._memory.values())
            while self._memory and (len(self._memory) > self._memory_entries or (
                    total > self._memory_chars and len(self._memory) > 1)):
                _, dropped = self._memory.popitem(last=False)
                total -= dropped.in_memory()

    def _spill_folder(self) -> Path | None:
        """This folder, made private and swept; None (the system's temporary folder) when it
        cannot be made: the cache is an optimisation, a read-only disk still converts."""
        try:
            self._make_private()
            self._sweep()
        except OSError:
            return None
        return self.folder

    def _sweep(self) -> None:
        """Remove what a killed process left half-written (a spill, a temporary file): the
        ones nobody has written to for ``_STALE_SECONDS`` (a conversion in progress, maybe
        another executor's, writes to its file all the time)."""
        cutoff = time.time() - _STALE_SECONDS
        for path in self.folder.glob(".*"):
            try:
                if (path.name.startswith(".spill-") or path.name.endswith(".tmp")) and \
                        path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue

    def _make_private(self) -> None:
        # Every folder made on the way is private (the state folder may not exist yet).
        missing = [d for d in (self.folder, *self.folder.parents) if not d.exists()]
        for d in reversed(missing):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
        os.chmod(self.folder, 0o700)

    def _store(self, key: tuple[str, str, str], conv: ConvertedSource) -> None:
        """Write an entry (the folder is made by ``_spill_folder`` first)."""
        meta_path, text_path = self._paths(key)
        text = conv.text
        blocks = None
        if isinstance(text, TextFile):
            blocks = [list(text.starts), list(text.offsets)]
            if text.owned() and text.path.parent == self.folder:
                os.replace(text.path, text_path)  # written and fsynced by the converter
                text.adopt(text_path)
            else:
                _write_atomic(text_path, (block for _, block in text.windows()))
        else:
            _write_atomic(text_path, (text[i:i + _WRITE_CHARS]
                                      for i in range(0, len(text), _WRITE_CHARS)))
        meta = {
            "schema": _SCHEMA, "sha256": key[0], "converter": key[1], "converter_version": key[2],
            "format": conv.format, "chars": len(text), "blocks": blocks, "pages": conv.pages,
            "sheets": conv.sheets, "slides": conv.slides, "warnings": conv.warnings,
            "segments": [[s.locator, s.kind, s.start, s.end, s.line_locator, s.first_number]
                         for s in conv.segments],
        }
        _write_atomic(meta_path, [json.dumps(meta, ensure_ascii=False)])
        _fsync_dir(self.folder)

    def _load(self, key: tuple[str, str, str]) -> ConvertedSource | None:
        meta_path, text_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if (meta.get("schema"), meta.get("sha256"), meta.get("converter"),
                    meta.get("converter_version")) != (_SCHEMA, *key):
                return None
            text: str | TextFile
            blocks = meta.get("blocks")
            if blocks:  # a large text: read by window from the entry's file, never whole
                starts, offsets = (array("q", b) for b in blocks)
                if text_path.stat().st_size != offsets[-1]:
                    return None
                text = TextFile(text_path, starts, offsets)
            else:
                with open(text_path, encoding="utf-8", newline="") as fh:
                    text = fh.read()
        except (OSError, ValueError, TypeError):
            return None  # a missing or damaged entry is converted again
        if len(text) != meta.get("chars"):
            return None
        segments = [Segment.model_construct(locator=loc, kind=kind, start=start, end=end,
                                            line_locator=line, first_number=first)
                    for loc, kind, start, end, line, first in meta["segments"]]
        return ConvertedSource.model_construct(
            text=text, format=meta["format"], converter=key[1], converter_version=key[2],
            segments=segments, pages=meta.get("pages"), sheets=meta.get("sheets") or [],
            slides=meta.get("slides"), warnings=meta.get("warnings") or [])


__all__ = ["ConversionCache", "file_sha256"]
