"""What a run does before its first claim: litellm's background import waits for that claim.

Started before recovery, the import (CPU-bound Python, seconds) competed for the GIL with
recovery and the first claim; it now starts when the first unit is claimed, once per run call,
and a call that claims nothing never starts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.run.runtime import Run
from tests.support.dag_project import FakeGateway, make_dag_project, use_dag_kind


def _record_preloads(monkeypatch: pytest.MonkeyPatch, events: list[dict]) -> None:
    def preload(self: Run) -> None:
        events.append({"kind": "preload"})

    monkeypatch.setattr(Run, "preload_model_client", preload)


def test_the_model_client_import_starts_at_the_first_claim(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    events: list[dict] = []
    _record_preloads(monkeypatch, events)
    root = make_dag_project(tmp_path / "p", {"A": [], "B": ["A"], "C": ["B"]})
    with use_dag_kind(), open_project(root, gateway_factory=lambda ledger: FakeGateway(
            ledger)) as p:
        run = p.start_run("R")
        assert run.run(jobs=1, on_event=events.append).decision == "done"
        kinds = [e["kind"] for e in events]
        assert kinds.count("preload") == 1
        first_claim = kinds.index("claimed")
        assert kinds.index("preload") == first_claim - 1  # at the claim, before its event
        assert kinds.index("recovery.done") < first_claim
        # The caller still sees every event, the first claim included.
        assert kinds.count("claimed") == 3

        # Nothing left to claim: the run ends without importing anything.
        events.clear()
        assert run.run(jobs=1, on_event=events.append).decision == "done"
        assert "preload" not in [e["kind"] for e in events]
        assert "claimed" not in [e["kind"] for e in events]
