"""The handover narrative: generated from stored state only, and every figure checked back."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tomllib
from pathlib import Path

import pytest
import tomli_w

from keepstep.engine import open_project
from keepstep.engine.report.narrative import Claim, check_narrative, compare, narrative, render

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"


@pytest.fixture
def run(story_dir):
    project = open_project(story_dir)
    yield project.get_run("ME-042")
    project.close()


@pytest.fixture
def copy_run(story_dir, tmp_path):
    """The finished story copied, for tests that add events."""
    target = tmp_path / "me042"
    shutil.copytree(story_dir, target)
    project = open_project(target)
    yield project.get_run("ME-042")
    project.close()


def _line(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_narrative_tells_the_me042_story(run):
    """The narrative names the baseline, the orphan, the budget block, the audience change and
    the reuse, with the figures of the stored state."""
    text = narrative(run)
    st = run.status()
    head = run.store.get_checkpoint("ME-042", st.head_version)
    assert f"- Checkpoint {st.head_version} (" in text and f"hash {head.hash[:12]}…" in text
    assert "- 41 checkpoint commits: 40 unit successes (36 current, 4 later invalidated), " \
        "1 plan change." in text
    orphan = _line(text, "- Orphan: ")
    assert "U07/a1" in orphan and "quarantined" in orphan and "U07 ran again as U07/a2" in orphan
    blocked = next(e for e in run.events(kinds=["unit.blocked"]) if e.unit == "U21")
    limit = int(blocked.payload["figures"]["calls"]["limit"])
    block = _line(text, "- Blocked (budget): ")
    assert "U21/a1 stopped before its model call" in block
    assert f"calls {limit} of {limit} used, 1 requested" in block
    raise_line = _line(text, "- Budget decision by consultant: ")
    assert f"calls {limit} → 200" in raise_line and "U21 then ran as U21/a2" in raise_line
    change = _line(text, "- Plan change ")
    assert "plan-v1 → plan-v2" in change and "audience changed to 'investment committee'" in change
    assert "- Invalidated U27–U30 (4 units) through audience edges; reused U01–U26 (26 units)." \
        in text
    for uid in ("U27", "U28", "U29", "U30"):
        assert f"- Why {uid}: contract_audience: contract:audience → [audience] {uid}" in text
    assert "Ran again under the new version: U27/a2, U28/a2, U29/a2, U30/a2." in text
    used, limits = st.budget["used"], st.budget["limits"]
    assert (f"- Model calls: {int(used['calls'])} used of {int(limits['calls'])} "
            f"({int(limits['calls'] - used['calls'])} left).") in text
    assert f"- Tokens: {int(used['tokens']):,} used of" in text
    assert "- Cost: $" in text
    assert "- Units redone: U07, U27–U30 (5 units); units that ran once: 31." in text
    assert "- Orphans: U07/a1 (quarantined, never promoted)." in text
    assert "- Decision: done — " in text
    assert f"- Next: {st.next_action}" in text
    # The gate binds contract:audience (not a plan version): each approval says so.
    approvals = [line for line in text.splitlines() if line.startswith("- Approval: gate")]
    assert approvals and all("(bound to contract:audience " in a for a in approvals)
    assert "plan-vNone" not in text


def test_narrative_reports_recoveries(run):
    """Recovery count, success, time to recover and tokens saved come from recovery.* events."""
    text = narrative(run)
    done = run.events(kinds=["recovery.done"])
    assert f"- {len(done)} recoveries: {len(done)} succeeded, 0 failed, 0 blocked; 2 found work" \
        in text
    saved = sum(int(e.payload["tokens_saved"]) for e in done)
    assert f"- Tokens saved by reuse: {saved:,} " in text
    assert "- Recovery at checkpoint 6: fenced U07/a1; quarantined U07/a1; reused 6 " in text
    assert "- Time to recover: " in text


def test_narrative_is_deterministic(run, story_dir):
    """The same stored state gives the same text, also from a freshly opened project."""
    first = narrative(run)
    assert narrative(run) == first
    with open_project(story_dir) as again:
        assert narrative(again.get_run("ME-042")) == first


def test_untouched_narrative_passes_the_check(copy_run):
    """A narrative generated from the state has no mismatch and raises no alert."""
    before = len(copy_run.events(kind_prefix="alert."))
    assert check_narrative(copy_run, narrative(copy_run)) == []
    assert len(copy_run.events(kind_prefix="alert.")) == before


@pytest.mark.parametrize(("old", "new", "key"), [
    ("- 41 checkpoint commits", "- 42 checkpoint commits", "baseline.commits"),
    ("- Invalidated U27–U30 (4 units)", "- Invalidated U27–U31 (4 units)",
     "history.change_reach"),
    ("reused U01–U26 (26 units)", "reused U01–U25 (26 units)", "history.change_reach"),
    ("- Orphan: U07/a1", "- Orphan: U08/a1", "history.orphan"),
    ("Plan change plan-v1 → plan-v2", "Plan change plan-v1 → plan-v3", "history.plan-change"),
    ("- Units redone: U07, U27–U30 (5 units)", "- Units redone: U27–U30 (4 units)",
     "recovery.redone"),
])
def test_a_changed_figure_is_detected_and_the_state_wins(copy_run, old, new, key):
    """Changing one figure yields a mismatch naming the claim, records an alert event, and
    the narrative rebuilt from the state keeps the stored figure."""
    text = narrative(copy_run)
    assert old in text
    mismatches = check_narrative(copy_run, text.replace(old, new, 1))
    assert mismatches and {m.key for m in mismatches} == {key}
    alerts = copy_run.events(kinds=["alert.narrative_mismatch"])
    assert len(alerts) == 1 and "the state wins" in alerts[0].payload["message"]
    assert any(a["kind"] == "narrative_mismatch" for a in copy_run.status().alerts)
    assert old in narrative(copy_run)


def test_a_budget_figure_change_is_detected(copy_run):
    """The spent-budget figures are compared too."""
    text = narrative(copy_run)
    line = _line(text, "- Model calls: ")
    used = line.split(": ", 1)[1].split(" used", 1)[0]
    tampered = text.replace(line, line.replace(f": {used} used", f": {int(used) - 1} used"))
    [m] = check_narrative(copy_run, tampered)
    assert m.key == "spent.calls" and m.state is not None and used in m.state


def test_added_and_removed_figures_are_reported(copy_run):
    """A new line stating a figure, or a dropped claim, is a mismatch too."""
    text = narrative(copy_run)
    added = text.replace("## Recoveries\n", "## Recoveries\n\n- 3 units were skipped.\n")
    assert [m.key for m in check_narrative(copy_run, added)] == ["unexpected"]
    text = narrative(copy_run)  # now with the alert the first check recorded
    line = _line(text, "- Tokens: ")
    [missing] = check_narrative(copy_run, text.replace(line + "\n", ""))
    assert missing.key == "spent.tokens" and missing.narrative is None


def test_prose_without_figures_may_be_edited(copy_run):
    """Rewording a sentence that states no figure is not a mismatch."""
    text = narrative(copy_run)
    edited = text.replace("## What is unverified", "## Still to check")
    assert check_narrative(copy_run, edited) == []


def test_compare_reads_figures_back_from_templates():
    """compare() pairs repeated claims in order and reports each differing field."""
    expected = ["# t", Claim("why", "- Why {unit}: {path}", {"unit": "U27", "path": "a → b"}),
                Claim("why", "- Why {unit}: {path}", {"unit": "U28", "path": "a → c"}),
                Claim("n", "- {n} things ({kind}).", {"n": "3", "kind": "x"})]
    text = render(expected)
    assert compare(expected, text) == []
    [m] = compare(expected, text.replace("a → c", "a → d"))
    assert (m.key, m.field, m.narrative, m.state) == ("why", "path", "a → d", "a → c")
    [m] = compare(expected, text.replace("- 3 things", "- 4 things"))
    assert (m.field, m.narrative, m.state) == ("n", "4", "3")


def test_narrative_of_a_run_stopped_by_the_budget(tmp_path):
    """A run blocked by the budget: the narrative says where it stopped, with the figures,
    and that the first step is a budget decision."""
    work = tmp_path / "pack"
    shutil.copytree(PACK, work, ignore=shutil.ignore_patterns(".keepstep", "*.ipynb"))
    cfg = tomllib.loads((work / "keepstep.toml").read_text())
    cfg["budget"]["calls"] = 10
    (work / "keepstep.toml").write_text(tomli_w.dumps(cfg))
    with open_project(work) as project:
        run = project.start_run("ME-042")
        st = run.run(approve={"audience": "product team"})
        assert st.decision == "blocked"
        text = narrative(run)
        assert "- Decision: blocked — " in text
        blocked = [u for u, v in st.units.items() if v.state == "blocked"]
        assert blocked and f"- Unit {blocked[0]} is blocked: budget" in text
        assert "- Model calls: 10 used of 10 (0 left)." in text
        assert "- Next: raise the budget" in text
        assert "- Blocked (budget): " in text and "calls 10 of 10 used" in text
        assert check_narrative(run, text) == []


def test_a_head_that_does_not_verify_is_not_the_baseline(copy_run, tmp_path):
    """A hand-edited head checkpoint: the narrative and the bundle name the checkpoint before it
    as the last reliable baseline, and say why."""
    from keepstep.engine.report.handover import export_handover

    conn = sqlite3.connect(copy_run.store.db_path, isolation_level=None)
    try:
        conn.execute("UPDATE checkpoints SET delta = '{}' WHERE run_id = 'ME-042' AND version = 41")
    finally:
        conn.close()
    text = narrative(copy_run)
    assert "- Checkpoint 40 (unit-success of U35/a1), committed " in text
    assert "checkpoint 41 and later do not verify: " in _line(text, "- Checkpoint hash ")
    bundle = export_handover(copy_run, tmp_path / "bundle")
    base = json.loads((bundle / "state" / "baseline.json").read_text())
    assert (base["version"], base["head_version"], base["verified"]) == (40, 41, False)
