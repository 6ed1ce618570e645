"""The one timestamp format keepstep writes: ISO 8601 UTC to the second (``...Z``).

Pure: callers pass the time, read from the injected clock (``Project.clock``), never
``time.time()`` directly, so tests that fix the clock get fixed timestamps.
"""

from __future__ import annotations

import datetime as dt


def iso_utc(ts: float) -> str:
    """``2026-12-01T09:48:42Z`` for a POSIX timestamp."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> float:
    """The POSIX timestamp of an ISO 8601 string (``Z`` or an offset; naive means UTC)."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def readable_utc(ts: float, *, seconds: bool = True) -> str:
    """``2026-12-01 09:48:42 UTC`` (or without the seconds), for text a person reads."""
    fmt = "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime(fmt)


__all__ = ["iso_utc", "parse_iso", "readable_utc"]
