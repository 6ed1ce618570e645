"""The dry-run preview and per-unit explanations (engine/explain.py)."""

from __future__ import annotations

from typing import Any

import pytest

from keepstep.engine.core.changes import Change, ChangeKind
from keepstep.engine.core.estimates import estimate_costs, expected_calls
from keepstep.engine.core.explain import compact_ids, explain_unit, preview
from keepstep.engine.core.invalidation import invalidate, released_by_change
from keepstep.engine.core.plan import Plan
from keepstep.engine.core.state import RunFacts, UnitRecord, UnitState
from keepstep.storage.models import Budget, Lease, ModelCall, UnitStatus
from tests.test_invalidation import AUDIENCE, built_me042, make_plan, me042, succeeded, units


def call(unit: str, attempt: str, n: int, *, tokens: tuple[int, int] = (900, 300),
         cost: float = 0.0, latency_ms: int = 250, status: str = "settled") -> ModelCall:
    return ModelCall(call_id=f"{attempt}#{n}", run_id="ME-042", branch_id="main", unit=unit,
                     attempt_id=attempt, round=n, model="local/keepstep-offline",
                     request_hash=f"h{attempt}{n}", status=status, tokens_in=tokens[0],
                     tokens_out=tokens[1], cost=cost, latency_ms=latency_ms,
                     reserved_at="2025-01-01T00:00:00Z")


def facts(plan: Any, records: dict[str, UnitRecord], **kw: Any) -> RunFacts:
    return RunFacts(run_id="ME-042", branch_id="main", head_version=31, plan_info={"n": 1},
                    inputs_info={"n": 1}, records=records, statuses=kw.pop("statuses", {}),
                    leases=kw.pop("leases", {}), budget=Budget(), now=1000.0, **kw)


def status(unit: str, state: str, reason: str, **details: Any) -> UnitStatus:
    return UnitStatus(unit=unit, status=state, reason=reason, details=details,
                      updated_at="2025-01-01T00:00:00Z")


# -- preview --------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["built", "real"])
def test_preview_of_the_audience_change_matches_the_ledger(which: str) -> None:
    """ME-042 step 3: the preview reuses U01–U26, redoes U27–U30 with figures equal to the
    ledger sums of their latest committed attempts (older attempts and reserved calls left
    out), and says U31–U36 will run under the new plan."""
    plan = me042(which)
    records = succeeded(plan, units(1, 30))
    records["U28"] = records["U28"].model_copy(update={"attempt": "U28/a2"})
    calls = [call(u, f"{u}/a1", n, cost=0.001) for u in units(1, 30) for n in range(2)]
    calls += [call("U28", "U28/a2", n, tokens=(5000, 1000), cost=0.01) for n in range(3)]
    calls += [call("U27", "U27/a1", 9, status="reserved")]
    p = preview(plan, [AUDIENCE], records, calls)
    assert list(p.invalidated) == units(27, 30) and p.reused == units(1, 26)
    counted = [c for c in calls if c.unit in units(27, 30) and c.status == "settled"
               and c.attempt_id == records[c.unit].attempt]
    assert p.estimate.redo.calls == len(counted) == 9
    assert p.estimate.redo.tokens == sum(c.tokens_in + c.tokens_out for c in counted)
    assert p.estimate.redo.cost == pytest.approx(sum(c.cost for c in counted))
    assert p.estimate.redo.seconds == pytest.approx(sum(c.latency_ms for c in counted) / 1000)
    assert [u.unit for u in p.estimate.units[:4]] == units(27, 30)
    assert set(p.will_run) <= set(units(31, 36))
    assert p.summary.startswith("audience changed to 'investment committee': reuse 26 units · "
                                f"redo U27–U30 (~9 calls, ~{round(p.estimate.redo.tokens / 1000)}k"
                                " tokens, $0.04) · then run ")
    assert "under the new plan" in p.summary
    # Issue 23: a first-run unit that calls the model (the sample plan's render units that
    # write prose) is estimated at its kind's steps, never "~0 calls".
    least = sum(expected_calls(plan.unit_map()[u]) for u in p.will_run)
    if least:
        assert f"under the new plan (~{least} calls, " in p.summary
    else:
        assert p.summary.endswith(
            "under the new plan (no figures yet: no unit of their kinds has run).")


def test_preview_estimates_first_runs_from_units_of_the_same_kind() -> None:
    """A never-run unit is estimated from the mean of its kind; with no unit of its kind run,
    it is counted as 0 and listed as unknown."""
    plan = make_plan([{"id": "S1", "inputs": ["source:X"]}, {"id": "S2", "inputs": ["source:X"]},
                      {"id": "S3", "deps": ["S1"]}, {"id": "R1", "kind": "render", "deps": ["S3"]}])
    records = succeeded(plan, ["S1", "S2"])
    calls = [call("S1", "S1/a1", 0, tokens=(100, 0)), call("S2", "S2/a1", 0, tokens=(300, 0)),
             call("S2", "S2/a1", 1, tokens=(300, 0))]
    change = Change(kind=ChangeKind.source_content, origin="source:X", detail="X changed")
    p = preview(plan, [change], records, calls)
    by_unit = {u.unit: u for u in p.estimate.units}
    assert (by_unit["S3"].calls, by_unit["S3"].tokens) == (2, 350)
    assert by_unit["S3"].basis == "mean of 2 synthesize units"
    assert by_unit["R1"].basis == "unknown" and p.estimate.unknown == ["R1"]
    assert p.estimate.total.calls == 1 + 2 + 2


def test_preview_with_nothing_reached() -> None:
    """A cosmetic change previews as "redo nothing" and reuses everything."""
    plan = built_me042()
    cosmetic = AUDIENCE.model_copy(update={"cosmetic": True})
    p = preview(plan, [cosmetic], succeeded(plan), [])
    assert p.invalidated == {} and len(p.reused) == 36
    assert p.summary == "no change reaches any unit: reuse 36 units · redo nothing."


def test_compact_ids_makes_ranges() -> None:
    """Runs of three or more consecutive ids become a range; others are listed."""
    assert compact_ids(["U30", "U27", "U28", "U29", "U33", "U35", "U36", "F1", "intake"]) == \
        "F1, U27–U30, U33, U35, U36, intake"
    assert compact_ids([]) == ""


# -- explain_unit ---------------------------------------------------------------------------

def test_explain_a_current_unit() -> None:
    """A current unit names its committed attempt, plan version and outputs."""
    plan = built_me042()
    f = facts(plan, succeeded(plan, ["U01"]))
    ex = explain_unit(plan, f, "U01", calls=[call("U01", "U01/a1", 0)])
    assert ex.state == UnitState.succeeded
    assert ex.why == "current since attempt U01/a1 was committed under plan-v1"
    assert ex.attempts == 1 and ex.ledger is not None and ex.ledger.calls == 1
    text = ex.render()
    assert text.startswith("U01 — U01 [intake] · succeeded")
    assert "output out.json: sha256 u01-v1000000" in text and "ledger: 1 calls" in text


def test_explain_an_invalidated_unit_renders_every_path() -> None:
    """An invalidated unit lists each stored explanation: origin, path and every other edge
    the change came in by."""
    plan = built_me042()
    records = succeeded(plan, units(1, 36))
    result = invalidate(plan, [AUDIENCE], records)
    for uid, exps in result.affected.items():
        records[uid] = records[uid].model_copy(update={"state": UnitState.invalidated,
                                                       "explanations": exps})
    ex = explain_unit(plan, facts(plan, records), "U31")
    assert ex.state == UnitState.invalidated and len(ex.explanations) == 1
    text = ex.render()
    assert "invalidated: its last success (U31/a1, plan-v1) is kept but stale, because:" in text
    assert ("- contract_audience: contract:audience → [audience] U27 → [content] U31 "
            "(audience changed to 'investment committee'; also via U28 [content], "
            "U29 [content], U30 [content])") in text
    assert "next: waits for dependencies that are not current: U27 (invalidated)" in text


def test_explain_a_blocked_unit_gives_reason_and_figures() -> None:
    """A budget-blocked unit says why, shows the figures and what to do; not a failure."""
    plan = built_me042()
    st = status("U21", "blocked", "budget: calls limit reached", kind="budget",
                figures={"calls": {"used": 40, "limit": 40}})
    ex = explain_unit(plan, facts(plan, succeeded(plan, units(1, 20)), statuses={"U21": st}),
                      "U21")
    assert ex.state == UnitState.blocked
    assert ex.why == ("blocked (budget): budget: calls limit reached; retrying cannot help")
    assert "figures: calls used 40, limit 40" in ex.render()
    assert "record a budget decision to raise the limit" in ex.render()


def test_explain_a_pending_unit_names_what_it_waits_for() -> None:
    """A pending unit names dependencies that are not current, or the gate that waits."""
    plan = built_me042()
    ex = explain_unit(plan, facts(plan, succeeded(plan, units(1, 20))), "U27")
    assert ex.why == ("pending (never succeeded): waits for dependencies that are not current: "
                      "U21 (pending), U22 (pending)")
    f = facts(plan, succeeded(plan, units(1, 26)))
    approvals = [{"gate": "G1", "choice": "product team", "applies": False}]
    ex = explain_unit(plan, f, "U27", approvals=approvals)
    assert ex.why == ("pending (never succeeded): every dependency is current; waits for "
                      "approval of gate G1 ('Confirm the audience?')")
    assert ex.details == ["approval of G1: 'product team' — no longer applies (its object changed)"]
    f.gates_open["U27"] = True
    assert explain_unit(plan, f, "U27").why.endswith("ready: every dependency is current and "
                                                     "gate G1 is approved")


def test_explain_failed_running_and_cancelled_units() -> None:
    """Failed gives the error class and message; running names the lease; cancelled the
    reason."""
    plan = built_me042()
    failed = status("U07", "failed", "invalid_output: no citations", kind="invalid_output",
                    attempts=3)
    lease = Lease(run_id="ME-042", branch_id="main", unit="U08", attempt_id="U08/a1",
                  owner="laptop:42:ab", fencing_token=7, expires_at=1020.0, renewed_at=995.0,
                  progress="round 2", progress_at=995.0)
    cancelled = status("U09", "cancelled", "cancelled by the user")
    f = facts(plan, {}, statuses={"U07": failed, "U09": cancelled}, leases={"U08": lease},
              attempts_count={"U07": 3})
    ex = explain_unit(plan, f, "U07")
    assert ex.why == ("failed after 3 attempt(s): error class invalid_output: invalid_output: "
                      "no citations") and ex.attempts == 3
    run = explain_unit(plan, f, "U08")
    assert run.why == ("running as U08/a1 on laptop:42:ab (fencing token 7); its lease expires "
                       "in 20 s") and "progress: round 2" in run.render()
    assert explain_unit(plan, f, "U09").why == "cancelled: cancelled by the user"


def test_explain_a_unit_kept_by_cutoff() -> None:
    """A unit kept current by early cut-off says so."""
    plan = built_me042()
    records = succeeded(plan, ["U31"])
    records["U31"] = records["U31"].model_copy(update={
        "cutoff_note": "kept current: U28's output is byte-identical to what it consumed"})
    assert explain_unit(plan, facts(plan, records), "U31").why.endswith(
        "; kept current: U28's output is byte-identical to what it consumed")


def test_a_unit_that_calls_the_model_is_never_estimated_at_zero_calls() -> None:
    """Issue 23: with no ledger figures of its own or of its kind, a model unit is estimated
    at its kind's steps (an extract one call per source it reads, a rank a ranking and a
    check, a render one per section a model writes); its own earlier attempts come first;
    a unit that makes no calls stays 0 ("unknown")."""
    plan = Plan.model_validate({"unit": [
        {"id": "E1", "title": "E1", "phase": "p", "kind": "extract", "inputs": ["group:A"],
         "outputs": ["evidence.json"]},
        {"id": "V1", "title": "V1", "phase": "p", "kind": "verify", "outputs": ["verified.json"],
         "depends_on": [{"unit": "E1"}]},
        {"id": "K1", "title": "K1", "phase": "p", "kind": "rank", "outputs": ["ranking.json"],
         "depends_on": [{"unit": "V1"}]},
        {"id": "R1", "title": "R1", "phase": "p", "kind": "render",
         "inputs": ["template:report"], "outputs": ["report.md"], "depends_on": [{"unit": "K1"}],
         "params": {"document": "report", "template": "report", "prose": "summary"}},
        {"id": "A1", "title": "A1", "phase": "p", "kind": "audit", "outputs": ["audit.json"],
         "depends_on": [{"unit": "R1"}]},
    ]})
    groups = {"S1": "A", "S2": "A", "S3": "A", "T1": "B"}
    ids = ["E1", "V1", "K1", "R1", "A1"]
    rows = {c.unit: c for c in estimate_costs(plan, ids, {}, [], source_groups=groups)}
    assert [rows[u].calls for u in ids] == [3, 1, 2, 1, 0]
    assert rows["E1"].basis == "its kind's steps: 3 calls"
    assert rows["A1"].basis == "unknown"
    offline = {c.unit: c for c in estimate_costs(plan, ["R1"], {}, [], writers=[])}
    assert offline["R1"].calls == 0  # its model fills the template: no written section
    # The rank unit failed twice, two calls each: its own mean comes first.
    earlier = [call("K1", f"K1/a{a}", n, tokens=(400, 100)) for a in (1, 2) for n in range(2)]
    own = estimate_costs(plan, ["K1"], {}, earlier)[0]
    assert (own.calls, own.tokens, own.basis) == (2, 1000, "mean of its 2 earlier attempts")
    # A committed attempt whose calls were all reused settled none: still its kind's two.
    reused = estimate_costs(plan, ["K1"], succeeded(plan, ["K1"]), [])[0]
    assert reused.calls == 2 and reused.basis == "ledger K1/a1, at least its kind's 2"
    p = preview(plan, [Change(kind=ChangeKind.source_content, origin="source:S1",
                              detail="S1 changed")], {}, [], source_groups=groups)
    assert "~0 calls" not in p.summary and p.estimate.first_run.calls == 3 + 1 + 2 + 1


def test_a_change_that_reaches_a_failed_unit_releases_it_and_the_preview_says_so() -> None:
    """Issue 23: the preview and a resume follow one rule (released_by_change): a failed unit
    the change reaches runs again; a blocked one stays held and is not in will_run."""
    plan = make_plan([{"id": "S1", "inputs": ["source:X"]}, {"id": "S2", "inputs": ["source:X"]},
                      {"id": "S3", "inputs": ["source:Y"]}])
    change = Change(kind=ChangeKind.source_content, origin="source:X", detail="X changed")
    statuses = {"S1": status("S1", "failed", "validators failed: structure"),
                "S2": status("S2", "blocked", "budget: calls 3/3"),
                "S3": status("S3", "failed", "validators failed: structure")}
    result = invalidate(plan, [change], {})
    assert released_by_change(result, statuses) == ["S1"]  # S3: the change does not reach it
    p = preview(plan, [change], {}, [], statuses=statuses)
    assert p.will_run == ["S1"]
    assert "S1 failed before; the change reaches it, so it runs again." in p.summary
    assert "S2 stays blocked until that is settled (budget: calls 3/3)." in p.summary


def test_explain_a_cost_block_shows_money_with_a_dollar_sign() -> None:
    """Issue 23: cost figures are money: `$` and four decimals, never a bare 0.00595185."""
    plan = built_me042()
    st = status("U21", "blocked", "budget: cost", kind="budget",
                figures={"cost": {"used": 0.00595185, "limit": 0.006, "requested": 0.0004}})
    ex = explain_unit(plan, facts(plan, succeeded(plan, units(1, 20)), statuses={"U21": st}),
                      "U21")
    assert "figures: cost used $0.0060, limit $0.0060, requested $0.0004" in ex.render()
