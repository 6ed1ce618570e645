"""engine.takeover: every takeover choice is a recorded decision, never a hand edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine import KeepstepError, open_project
from keepstep.engine.run.takeover import (
    EXPERT_REASON,
    OUT_OF_SCOPE_REASON,
    mark_for_expert,
    narrow_scope,
    out_of_scope,
    record_takeover,
    scope_of,
)
from tests.support.tui_support import RUN_ID, copy_of, gate_template


@pytest.fixture
def run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path):
    root = copy_of(gate_template(tmp_path_factory), tmp_path / "market-entry")
    with open_project(root) as project:
        yield project.get_run(RUN_ID)


def _takeovers(run) -> list:
    return run.events(kinds=["decision.takeover"])


def test_record_takeover_appends_one_decision_event(run) -> None:
    """record_takeover writes a decision.takeover event with the action and who chose it."""
    record_takeover(run, "cancel", who="ana", note="client paused the work")
    event = _takeovers(run)[-1]
    assert event.payload == {"action": "cancel", "who": "ana", "note": "client paused the work"}


def test_record_takeover_refuses_an_unknown_action(run) -> None:
    """An action outside TAKEOVER_ACTIONS is an error naming the allowed ones."""
    with pytest.raises(KeepstepError, match="unknown takeover action"):
        record_takeover(run, "delete_everything")


def test_scope_of_keeps_a_unit_and_everything_it_needs(run) -> None:
    """A narrowed scope is the named units plus their ancestors in the DAG."""
    keep = scope_of(run.plan, ["U03"])
    assert keep == {"U01", "U02", "U03"}


def test_narrow_scope_holds_back_pending_units_outside_the_scope(run) -> None:
    """Units outside the scope that are not current are blocked with the scope reason."""
    expected = out_of_scope(run, ["U31"])
    assert "U36" in expected and "U27" not in expected  # U31 needs U27
    held = narrow_scope(run, ["U31"], who="ana")
    assert held == expected
    status = run.status()
    assert all(status.units[u].state == "blocked" and status.units[u].reason ==
               OUT_OF_SCOPE_REASON for u in held)
    assert _takeovers(run)[-1].payload["action"] == "narrow_scope"


def test_mark_for_expert_blocks_the_unit_until_a_retry(run) -> None:
    """A unit marked for an expert is blocked with the reason; its event names the note."""
    mark_for_expert(run, "U27", "check the audience wording", who="ana")
    status = run.status()
    assert status.units["U27"].state == "blocked"
    assert status.units["U27"].reason == EXPERT_REASON
    event = _takeovers(run)[-1]
    assert event.unit == "U27" and event.payload["note"] == "check the audience wording"


def test_an_unknown_unit_is_refused(run) -> None:
    """Naming a unit the plan does not have is an error listing the plan's units."""
    with pytest.raises(KeepstepError, match="no unit U99"):
        mark_for_expert(run, "U99")
