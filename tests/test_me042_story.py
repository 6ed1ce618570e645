"""The ME-042 acceptance story: three real interruptions, then the end state of ME-042.md."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def story(me042_story):
    return me042_story


@pytest.mark.parametrize("name", [
    "41 checkpoint commits",
    "36 current unit successes",
    "4 invalidated successes (U27–U30 under the old plan)",
    "1 plan change",
    "1 orphan (U07/a1)",
    "the orphan is never referenced downstream",
    "exactly U07, U27–U30 executed more than once (call ledger)",
    "U21's first attempt made no model call",
    "F01 passed",
    "5 deliverables present with hashes matching the manifest",
    "run is done",
])
def test_end_state(story, name):
    """Each end-state fact of ME-042.md holds after the real interruptions."""
    result, _ = story
    check = next(c for c in result.checks if c.name == name)
    assert check.passed, check.detail


def test_story_explains_each_interruption(story):
    """The printed story names the kill, the orphan, the budget block, the preview and the gate."""
    _, lines = story
    text = "\n".join(lines)
    assert "killed by SIGKILL" in text
    assert "U07/a1" in text and "quarantined" in text
    assert "U21/a1: blocked — budget" in text
    assert "redo U27–U30" in text and "reuse 26 units" in text
    assert "answer the approval for gate 'audience'" in text
