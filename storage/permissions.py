"""Private file modes for everything keepstep writes, set explicitly (whatever the umask).

State folders are 0700, state files 0600, committed (sealed) files 0400: a project's
state holds model responses and source excerpts that other local users must not read.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
SEALED_MODE = 0o400


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a folder's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dir(path: str | os.PathLike[str]) -> list[str]:
    """Create ``path`` and any missing parents as 0700 folders.

    Returns the folders created, outermost first (empty when ``path`` existed). The
    mode is set with chmod after mkdir, so a permissive umask cannot widen it.
    """
    missing: list[str] = []
    d = os.path.abspath(path)
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    created = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, DIR_MODE)
        created.append(folder)
    return created


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` for a new state file, its mode forced to 0600."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tighten(path: Path, mode: int) -> None:
    """Reduce an existing file's or folder's mode to ``mode`` when it is wider; a file owned
    by someone else is left alone (nothing to do about it here)."""
    try:
        current = path.stat().st_mode & 0o777
        if current & ~mode:
            path.chmod(current & mode)
    except (FileNotFoundError, PermissionError):
        pass
