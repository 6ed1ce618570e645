"""A source file opened so that every read checks the run's cancel event.

A reader library that parses a large structure before handing back its first page, sheet or
slide gives the converter no point at which to notice a Ctrl-C: openpyxl scans a whole sheet
that lacks a ``<dimension>`` element (35 s for 50 MB), pypdf reads a long PDF's cross-reference
table and page tree (5 s for 50 MB). They all read through the file object, a few bytes or KB
at a time, so a file whose ``read`` raises ``RunCancelled`` once the event is set stops them
there; ``RunCancelled`` is a ``BaseException``, which their ``except Exception`` handlers let
pass.
"""

from __future__ import annotations

import threading
from typing import Any

from keepstep.engine.errors import RunCancelled


class CancelOnRead:
    """``fh`` (a binary file) whose ``read``/``readinto``/``readline`` raise RunCancelled
    after ``cancel`` is set; every other attribute is the file's own."""

    def __init__(self, fh: Any, cancel: threading.Event | None, what: str) -> None:
        self._fh, self._cancel, self._what = fh, cancel, what

    def _check(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise RunCancelled(f"{self._what} cancelled")

    def read(self, n: int = -1) -> bytes:
        self._check()
        return self._fh.read(n)

    def readinto(self, buffer: Any) -> int:
        self._check()
        return self._fh.readinto(buffer)

    def readline(self, limit: int = -1) -> bytes:
        self._check()
        return self._fh.readline(limit)

    def __getattr__(self, name: str) -> Any:  # seek, tell, seekable, mode, close…
        return getattr(self._fh, name)


def cancellable(fh: Any, cancel: threading.Event | None, path: Any) -> Any:
    """``fh`` wrapped so that its reads stop a conversion of ``path`` once ``cancel`` is set,
    typed as the binary file the reader libraries take (it quacks like one)."""
    return CancelOnRead(fh, cancel, f"converting {path}")


__all__ = ["CancelOnRead", "cancellable"]
