"""Issue 22 item 6: an unknown delivery outcome whose adapter can answer is looked up during
recovery (bounded, never a send) and settled by ``resume`` alone; only real unknowns wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine import open_project
from keepstep.engine.run.effects import settle_waiting
from tests.support.effects_support import blocked_on_unknown_webhook
from tests.support.engine_harness import RUN
from tests.support.webhook_server import WebhookServer


@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


def test_resume_alone_settles_an_unknown_delivery_the_receiver_can_answer(
        tmp_path: Path, server: WebhookServer) -> None:
    """The POST was applied, its answer lost, the lookup was down: blocked. Once the receiver
    answers lookups again, a plain resume finds the key, records it sent (by lookup, a
    decision.effect event) and finishes without sending it twice."""
    root, key = blocked_on_unknown_webhook(tmp_path / "p", server.url)
    assert server.applied[key] == 1
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.resume().decision == "done"
        row = next(e for e in run.effects() if e.key == key)
        assert row.status == "committed" and not row.needs_person
        [event] = run.events(kinds=["decision.effect"])
        assert event.payload["by"] == "lookup" and event.payload["who"] == "recovery"
    assert server.applied[key] == 1


def test_a_real_unknown_still_waits_for_a_person(tmp_path: Path,
                                                 server: WebhookServer) -> None:
    """The receiver is down: the resume's lookup cannot tell, so the unit stays blocked and
    nothing is recorded or sent."""
    root, key = blocked_on_unknown_webhook(tmp_path / "p", server.url)
    server.stop()
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.resume().decision == "blocked"
        row = next(e for e in run.effects() if e.key == key)
        assert row.needs_person and row.status == "unknown"
        assert not run.events(kinds=["decision.effect"])


def test_the_lookups_are_bounded(tmp_path: Path, server: WebhookServer) -> None:
    """With no lookups allowed (or the time budget spent), nothing is asked or settled."""
    root, key = blocked_on_unknown_webhook(tmp_path / "p", server.url)
    with open_project(root) as p:
        run = p.get_run(RUN)
        adapters = p.effect_adapters
        assert settle_waiting(run.store, adapters, RUN, max_lookups=0) == []
        ticks = iter([0.0, 100.0, 100.0])
        assert settle_waiting(run.store, adapters, RUN, budget_s=1.0,
                              clock=lambda: next(ticks)) == []
        assert next(e for e in run.effects() if e.key == key).needs_person
