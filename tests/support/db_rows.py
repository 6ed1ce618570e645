"""What "the database did not change" means in a test: every row, not the file's bytes.

A connection closed later (by the garbage collector, or the last one to close) may
checkpoint the write-ahead log into state.db: bytes move, no row changes.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path


def rows_digest(db: Path) -> str:
    """The sha256 of every row of ``db`` (read through its WAL, read-only)."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return hashlib.sha256("\n".join(conn.iterdump()).encode()).hexdigest()
    finally:
        conn.close()


__all__ = ["rows_digest"]
