"""Reading a text file in chunks with incremental decoding and universal newlines.

Memory stays at about one chunk plus what the caller keeps; the cancel event is checked per
chunk; a decoding failure names the encoding tried and the byte offset, never a raw
UnicodeDecodeError.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Iterator
from pathlib import Path

from keepstep.engine.errors import RunCancelled
from keepstep.engine.files.convert.errors import UndecodableTextError, UnreadableSourceError

CHUNK_BYTES = 1 << 20
_BOMS = ((codecs.BOM_UTF8, "utf-8", 3), (codecs.BOM_UTF16_LE, "utf-16", 0),
         (codecs.BOM_UTF16_BE, "utf-16", 0))


def iter_text(path: Path, *, encoding: str = "utf-8", cancel: threading.Event | None = None,
              fmt: str = "txt", chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """Yield the decoded text of ``path`` in chunks, with ``\\r\\n`` and ``\\r`` as ``\\n``.

    A byte-order mark wins over ``encoding`` (UTF-8 or UTF-16); a NUL character means a binary
    file and raises UndecodableTextError like bad bytes do.
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed in the finally below
    except OSError as exc:
        raise UnreadableSourceError(path, fmt, exc.strerror or str(exc)) from None
    try:
        first = fh.read(chunk_bytes)
        skip = 0
        for bom, name, drop in _BOMS:
            if first.startswith(bom):
                encoding, skip = name, drop
                break
        label = "UTF-16" if encoding == "utf-16" else encoding.upper()
        try:
            decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        except LookupError:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
            label = "UTF-8"
        consumed = skip
        data = first[skip:]
        pending_cr = False
        while True:
            if cancel is not None and cancel.is_set():
                raise RunCancelled(f"reading {path} cancelled")
            final = not data
            try:
                text = decoder.decode(data, final=final)
            except UnicodeDecodeError as exc:
                raise UndecodableTextError(path, label, max(consumed + exc.start, 0)) from None
            if "\x00" in text:
                raise UndecodableTextError(path, label, consumed + text.index("\x00"))
            consumed += len(data)
            if pending_cr:
                text = "\r" + text
                pending_cr = False
            if text.endswith("\r") and not final:
                text, pending_cr = text[:-1], True
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if text:
                yield text
            if final:
                return
            data = fh.read(chunk_bytes)
    finally:
        fh.close()


__all__ = ["CHUNK_BYTES", "iter_text"]
