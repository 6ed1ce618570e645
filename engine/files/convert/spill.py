"""Converted text too large to hold as one ``str``: kept in a UTF-8 file and read by window.

A 50 MB Word file or workbook can hold 130–260 M characters of text. Held as one string, it
costs that many bytes (more for non-Latin-1 text), and building that string from the pieces a
converter emits costs as much again. Past ``SPILL_CHARS`` the converter writes its pieces to a
file as it goes (``SpillWriter``) and hands back a ``TextFile``: ``len()``, slicing, ``find``
and ``count`` by character offsets, as on the string it stands for, reading only the blocks a
call touches (a few recent blocks are kept decoded). Offsets are ``str`` offsets: the file
records, for each block it wrote, the character and byte offset where the block starts.

What a caller may rely on: ``text[a:b]`` equals the string's slice; ``find``/``count`` agree
with ``str.find``/``str.count`` for a needle shorter than a block (a newline, a quote);
``windows()`` covers ``[start, end)`` in pieces that overlap by ``overlap`` characters, so
a search for anything shorter than the overlap finds every occurrence in some piece.
"""

from __future__ import annotations

import os
import tempfile
import threading
import weakref
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

# Text past this size is written to a file as it is converted (about 8–32 MB as a string).
SPILL_CHARS = 8 << 20
# Where a conversion in this context spills (the conversion cache's folder, so that the cache
# takes the file over by renaming it); None: the system's temporary folder.
SPILL_FOLDER: ContextVar[Path | None] = ContextVar("keepstep_spill_folder", default=None)
_KEEP_BLOCKS = 3  # decoded blocks kept per file (a block is about 1 M characters)


class TextFile:
    """The converted text of one source, in a UTF-8 file (see the module docstring).

    ``starts[k]``/``offsets[k]``: character and byte offset where block ``k`` begins; the
    last entries are the text's length and the file's size. ``delete=True`` removes the file
    when this object is collected (a spill no cache took over).
    """

    def __init__(self, path: Path, starts: array, offsets: array, *,
                 delete: bool = False) -> None:
        self.path = Path(path)
        self.starts = starts
        self.offsets = offsets
        self._blocks: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _unlink, str(self.path)) if delete else None

    # --- what a str offers --------------------------------------------------------------
    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, key: slice) -> str:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a TextFile is read by contiguous slices, text[start:end]")
        start, end, _ = key.indices(len(self))
        if start >= end:
            return ""
        first = self._block_of(start)
        last = self._block_of(end - 1)
        pieces = [self._block(k) for k in range(first, last + 1)]
        base = self.starts[first]
        if len(pieces) == 1:
            return pieces[0][start - base:end - base]
        return "".join(pieces)[start - base:end - base]

    def find(self, sub: str, start: int = 0, end: int | None = None) -> int:
        """``str.find`` over the file, block by block, without copying the blocks (``sub``
        shorter than a block)."""
        end = len(self) if end is None else min(max(end, 0), len(self))
        start = max(start, 0)
        if not sub:
            return start if start <= end else -1
        tail = ""  # the last len(sub) - 1 characters before the current block
        for base, block, a, b in self._spans(start, end):
            if tail:  # an occurrence across the boundary with the previous block
                joint = tail + block[a:min(b, a + len(sub) - 1)]
                found = joint.find(sub)
                if found >= 0:
                    return base + a - len(tail) + found
            found = block.find(sub, a, b)
            if found >= 0:
                return base + found
            if len(sub) > 1:  # a block shorter than that keeps some of the previous tail
                tail = (tail + block[max(a, b - (len(sub) - 1)):b])[-(len(sub) - 1):]
        return -1

    def count(self, sub: str, start: int = 0, end: int | None = None) -> int:
        """``str.count`` of a one-character ``sub`` (a newline) over ``[start, end)``."""
        if len(sub) != 1:
            raise ValueError("TextFile.count counts one character")
        end = len(self) if end is None else min(max(end, 0), len(self))
        return sum(block.count(sub, a, b) for _, block, a, b in self._spans(max(start, 0), end))

    def _spans(self, start: int, end: int) -> Iterator[tuple[int, str, int, int]]:
        """(block start, block, a, b): ``block[a:b]`` is the part of ``[start, end)`` in it."""
        if start >= end:
            return
        for k in range(self._block_of(start), self._block_of(end - 1) + 1):
            base = self.starts[k]
            block = self._block(k)
            yield base, block, max(start - base, 0), min(end - base, len(block))

    def read(self) -> str:
        """The whole text as one string (it costs the whole text in memory)."""
        return self[0:len(self)]

    # --- pieces ---------------------------------------------------------------------------
    def windows(self, start: int = 0, end: int | None = None, *, overlap: int = 0,
                lines: bool = False) -> Iterator[tuple[int, str]]:
        """(offset, text[offset:offset + len(piece)]) pieces covering ``[start, end)``, about
        a block each, each overlapping the previous one by ``overlap`` characters. With
        ``lines=True`` a piece ends after a newline (or at ``end``), so no line is split
        between pieces; ``overlap`` is then ignored."""
        size = len(self)
        end = size if end is None else min(end, size)
        pos = max(start, 0)
        while pos < end:
            k = self._block_of(pos)
            stop = min(max(self.starts[k + 1], pos + 1), end)
            if lines and stop < end:
                piece = self[pos:stop]
                cut = piece.rfind("\n") + 1
                if cut == 0:  # a line longer than a block: read on to its end
                    nl = self.find("\n", stop, end)
                    stop = end if nl < 0 else nl + 1
                    piece = self[pos:stop]
                else:
                    piece, stop = piece[:cut], pos + cut
                yield pos, piece
                pos = stop
                continue
            reach = min(stop + overlap, end)
            yield pos, self[pos:reach]
            pos = stop

    def _block_of(self, offset: int) -> int:
        return min(bisect_right(self.starts, offset) - 1, len(self.starts) - 2)

    def _block(self, k: int) -> str:
        with self._lock:
            hit = self._blocks.get(k)
            if hit is not None:
                self._blocks.move_to_end(k)
                return hit
        with open(self.path, "rb") as fh:
            fh.seek(self.offsets[k])
            data = fh.read(self.offsets[k + 1] - self.offsets[k])
        text = data.decode("utf-8")
        if len(text) != self.starts[k + 1] - self.starts[k]:
            raise OSError(f"converted text {self.path} changed on disk")
        with self._lock:
            self._blocks[k] = text
            while len(self._blocks) > _KEEP_BLOCKS:
                self._blocks.popitem(last=False)
        return text

    # --- ownership --------------------------------------------------------------------------
    def adopt(self, path: Path) -> None:
        """The file now lives at ``path`` and belongs to someone else (a cache entry)."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self.path = Path(path)

    def owned(self) -> bool:
        """Whether the file is removed with this object (a spill no cache took over)."""
        return self._finalizer is not None and self._finalizer.alive


def line_pieces(text: str | TextFile) -> Iterator[tuple[int, str]]:
    """(offset, piece) covering the text in whole lines: a string is one piece, a TextFile
    comes in pieces of about a block that each end after a newline."""
    if isinstance(text, str):
        yield 0, text
    else:
        yield from text.windows(lines=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class SpillWriter:
    """Appends pieces of text to a private temporary file, recording block offsets."""

    def __init__(self, folder: Path | None = None) -> None:
        folder = SPILL_FOLDER.get() if folder is None else folder
        if folder is not None:
            Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".spill-", suffix=".md",
                                    dir=None if folder is None else str(folder))
        self.path = Path(name)
        self._fh = os.fdopen(fd, "wb")  # mkstemp: 0600
        self.starts = array("q", [0])
        self.offsets = array("q", [0])
        # A conversion that fails or is cancelled drops its writer: the file goes with it.
        self._finalizer = weakref.finalize(self, _close_and_unlink, self._fh, str(self.path))

    def write(self, piece: str) -> None:
        if not piece:
            return
        data = piece.encode("utf-8")
        self._fh.write(data)
        self.starts.append(self.starts[-1] + len(piece))
        self.offsets.append(self.offsets[-1] + len(data))

    def finish(self, length: int) -> TextFile:
        """Cut the file to its first ``length`` characters (all that follows them must be
        one-byte characters: the trailing newlines a converter leaves), then a TextFile."""
        cut = self.starts[-1] - length
        if cut < 0:
            raise ValueError("finish() past the end of what was written")
        size = self.offsets[-1] - cut
        self._fh.flush()
        self._fh.truncate(size)
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._finalizer.detach()
        while len(self.starts) > 1 and self.starts[-2] >= length:
            self.starts.pop()
            self.offsets.pop()
        self.starts[-1], self.offsets[-1] = length, size
        return TextFile(self.path, self.starts, self.offsets, delete=True)

    def discard(self) -> None:
        self._finalizer()


def _close_and_unlink(fh, path: str) -> None:
    fh.close()
    _unlink(path)


__all__ = ["SPILL_CHARS", "SPILL_FOLDER", "SpillWriter", "TextFile", "line_pieces"]
