"""Helpers shared by the Store contract tests (written against the Protocol only)."""

from __future__ import annotations

from keepstep.storage import ArtifactEntry, Store

RUN = "ME-042"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def stage(store: Store, attempt_id: str, name: str = "out.json",
          data: bytes = b"{}") -> ArtifactEntry:
    """Stage one file of ``attempt_id`` in the run RUN."""
    return store.artifacts.stage(RUN, attempt_id, name, data, media_type="application/json",
                                 producer_version="test", created_at="2024-01-01T00:00:00+00:00")
