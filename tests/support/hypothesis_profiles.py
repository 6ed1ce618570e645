"""Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (registered by tests/conftest.py).

- unset: each property runs the number of examples its test asks for (``examples(n)`` = n);
- ``ci``: an eighth of that, at least 25 (the suite on 2 cores; what ``make test`` uses);
- ``bench``: five times as many (a thorough run, e.g. overnight or before a release).

A test asks with ``@settings(max_examples=examples(400), deadline=None)``.
"""

from __future__ import annotations

import os

from hypothesis import settings

SCALE = {"ci": 1 / 8, "bench": 5.0}
FLOOR = 25


def register() -> None:
    """Register the profiles and load the one HYPOTHESIS_PROFILE names (if any)."""
    settings.register_profile("ci", deadline=None, print_blob=True)
    settings.register_profile("bench", deadline=None)
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name:
        settings.load_profile(name)  # an unknown name fails loudly: hypothesis says which


def examples(n: int) -> int:
    """How many examples a property that asks for ``n`` runs under the current profile."""
    scale = SCALE.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 1.0)
    return n if scale == 1.0 else max(FLOOR, round(n * scale))


__all__ = ["examples", "register"]
