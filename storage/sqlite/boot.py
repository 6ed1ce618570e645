"""Which boot of the operating system this process runs in."""

from __future__ import annotations

import functools
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def boot_id() -> str | None:
    """This boot's id (Linux: a new random one each time the machine starts), or None where
    it cannot be read — then the SQLite store syncs every staged file, as it cannot tell a
    file a restart lost from one a person changed."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None
