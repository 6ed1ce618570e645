"""Named crash points for fault-injection tests.

Set ``KEEPSTEP_CRASH_AT=<point>`` (optionally ``<point>@<n>`` to crash on the
n-th time the point is reached, counting from 1) and the process kills itself
with SIGKILL at that point: no cleanup, no atexit, exactly like a power cut
from the program's point of view. Unset, a crash point costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

_ENV = "KEEPSTEP_CRASH_AT"
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    spec = os.environ.get(_ENV)
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
