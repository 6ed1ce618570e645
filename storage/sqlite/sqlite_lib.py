"""sqlite-utils, imported once for the whole backend, without numpy and pandas.

``sqlite_utils.db`` imports numpy and pandas when they are installed (numpy is, with
matplotlib), only to map their scalar types to column types when it creates a table from
Python values. This backend's schema is SQL in its migrations and it never stores a numpy or
pandas value; numpy's import alone cost 60-100 ms of every command's start (``keepstep
status`` included). So while sqlite-utils loads, both names are hidden (``import numpy``
raises ImportError there) unless the process has already imported them, and the names are
restored right after: anything imported later gets them as usual. The one consequence: a
process that imports keepstep before numpy and then uses sqlite-utils itself to create a
table from numpy values gets sqlite-utils' plain type mapping.
"""

from __future__ import annotations

import sys


def _import_without(hidden: tuple[str, ...]) -> None:
    absent = [name for name in hidden if name not in sys.modules]
    for name in absent:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import sqlite_utils.db  # noqa: F401
    finally:
        for name in absent:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]


_import_without(("numpy", "pandas"))

from sqlite_utils import Database, Migrations  # noqa: E402  (after the import above)

__all__ = ["Database", "Migrations"]
