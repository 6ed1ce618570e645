"""The SQLite backend of the Store (the only package that talks to sqlite3 and sqlite-utils).

One module per capability of storage/store.py; ``SQLiteStore`` composes them.
"""

from keepstep.storage.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
