"""What a run does before its first claim: litellm's background import starts with the run.

A run that will call a real model starts importing the model client (litellm and the
tokenizers: seconds) in a background thread as soon as ``run()`` begins, before the source
check and recovery, so the first request waits only for what is left of the import. A run
whose models are all the offline heuristic, whose model units are all done, or whose gateway
is injected starts no thread at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway import client
from keepstep.engine.run.runtime import Run
from tests.support.dag_project import FakeGateway, make_dag_project, use_dag_kind
from tests.support.small_project import make_small_project, write_config

REAL_MODEL = "openai/gpt-4o-mini"


def _record_preloads(monkeypatch: pytest.MonkeyPatch, events: list[dict]) -> None:
    def preload(self: Run) -> None:
        events.append({"kind": "preload"})

    monkeypatch.setattr(Run, "preload_model_client", preload)


def test_the_model_client_import_starts_before_recovery(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Once per run() call, first: before recovery and the first claim."""
    events: list[dict] = []
    _record_preloads(monkeypatch, events)
    root = make_dag_project(tmp_path / "p", {"A": [], "B": ["A"], "C": ["B"]})
    with use_dag_kind(), open_project(root, gateway_factory=lambda ledger: FakeGateway(
            ledger)) as p:
        run = p.start_run("R")
        assert run.run(jobs=1, on_event=events.append).decision == "done"
        kinds = [e["kind"] for e in events]
        assert kinds.count("preload") == 1
        assert kinds.index("preload") == 0
        assert kinds.index("recovery.done") < kinds.index("claimed")
        # The caller still sees every event, the first claim included.
        assert kinds.count("claimed") == 3


def test_only_a_run_that_calls_a_real_model_preloads(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline default starts no thread; a real model warms that model's client up in
    the background; an injected gateway needs nothing."""
    warmed: list[list[str]] = []
    monkeypatch.setattr(client, "warm_up", lambda models: warmed.append(list(models)))
    root = make_small_project(tmp_path / "p")
    with open_project(root) as p:
        assert p.start_run("R").preload_model_client() is None
    assert warmed == []

    write_config(root, default_model=REAL_MODEL)
    with open_project(root) as p:
        thread = p.get_run("R").preload_model_client()
        assert thread is not None
        thread.join(30)
    assert warmed == [[REAL_MODEL]]

    with open_project(root, gateway_factory=lambda ledger: FakeGateway(ledger)) as p:
        assert p.get_run("R").preload_model_client() is None


def test_a_run_whose_model_units_are_all_done_preloads_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model unit current: nothing left will call the model, so even with a real model
    configured no client is imported."""
    warmed: list[list[str]] = []
    monkeypatch.setattr(client, "warm_up", lambda models: warmed.append(list(models)))
    root = make_small_project(tmp_path / "p")
    with open_project(root) as p:
        assert p.start_run("R").run(jobs=1).decision == "done"
    write_config(root, default_model=REAL_MODEL)
    with open_project(root) as p:
        assert p.get_run("R").preload_model_client() is None
    assert warmed == []
