"""decide() is a pure function of loaded facts: property tests over random plans and states."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from keepstep.engine.core.decide import DecisionKind, decide, ready_units
from keepstep.engine.core.plan import Dependency, Gate, Plan, PlanHeader, Unit, UnitKind
from keepstep.engine.core.state import RunFacts, UnitRecord, UnitState
from keepstep.storage.models import Budget, Lease, UnitStatus
from tests.support.hypothesis_profiles import examples

NOW = 1_000_000.0


@st.composite
def plans_and_facts(draw):
    n = draw(st.integers(min_value=1, max_value=12))
    ids = [f"U{i:02d}" for i in range(1, n + 1)]
    units = []
    for i, uid in enumerate(ids):
        deps = draw(st.lists(st.sampled_from(ids[:i]), unique=True, max_size=3)) if i else []
        kind = draw(st.sampled_from([UnitKind.audit, UnitKind.extract]))
        units.append(Unit(id=uid, title=uid, phase="p", kind=kind,
                          depends_on=[Dependency(unit=d) for d in deps],
                          required_final=draw(st.booleans()) or i == n - 1))
    gated = draw(st.lists(st.sampled_from(ids), unique=True, max_size=2))
    plan = Plan(plan=PlanHeader(), units=units,
                gates=[Gate(id=f"g{u}", unit=u, question="ok?") for u in gated])
    records, statuses, leases, gates_open = {}, {}, {}, {}
    for uid in ids:
        kind = draw(st.sampled_from(["none", "succeeded", "invalidated", "blocked", "failed",
                                     "leased", "expired_lease"]))
        if kind in ("succeeded", "invalidated"):
            records[uid] = UnitRecord(state=UnitState(kind), attempt=f"{uid}/a1",
                                      validators_passed=draw(st.booleans()) or kind != "succeeded")
        elif kind in ("blocked", "failed"):
            details = {"kind": draw(st.sampled_from(["budget", "quota", "error"]))}
            statuses[uid] = UnitStatus(unit=uid, status=kind, reason="r", details=details,
                                       updated_at="t")
        elif kind in ("leased", "expired_lease"):
            exp = NOW + 30 if kind == "leased" else NOW - 1
            leases[uid] = Lease(run_id="R", branch_id="main", unit=uid, attempt_id=f"{uid}/a1",
                                owner="x", fencing_token=1, expires_at=exp, renewed_at=NOW,
                                progress=None, progress_at=NOW)
    for uid in gated:
        gates_open[uid] = draw(st.booleans())
    used = draw(st.integers(min_value=0, max_value=12))
    facts = RunFacts(run_id="R", branch_id="main", head_version=3, plan_info={}, inputs_info={},
                     records=records, statuses=statuses, leases=leases,
                     budget=Budget(limits={"calls": 10}, used={"calls": used}), now=NOW,
                     gates_open=gates_open)
    return plan, facts


@settings(max_examples=examples(400), deadline=None)
@given(plans_and_facts())
def test_claimed_unit_has_all_dependencies_current(pf):
    """A claimed unit's dependencies are all current (succeeded, not invalidated)."""
    plan, facts = pf
    d = decide(plan, facts)
    if d.kind == DecisionKind.claim:
        unit = plan.unit_map()[d.unit]
        assert all(facts.is_current(dep.unit) for dep in unit.depends_on)


@settings(max_examples=examples(400), deadline=None)
@given(plans_and_facts())
def test_never_claims_blocked_failed_leased_or_current(pf):
    """A blocked, failed, live-leased or already-current unit is never picked."""
    plan, facts = pf
    for uid in ready_units(plan, facts):
        assert uid not in facts.statuses
        lease = facts.leases.get(uid)
        assert lease is None or lease.expires_at <= facts.now
        assert not facts.is_current(uid)


@settings(max_examples=examples(400), deadline=None)
@given(plans_and_facts())
def test_never_claims_a_gated_unit_without_an_applying_approval(pf):
    """A unit behind a gate is ready only when its approval applies."""
    plan, facts = pf
    for uid in ready_units(plan, facts):
        if plan.gate_for(uid) is not None:
            assert facts.gates_open.get(uid) is True


@settings(max_examples=examples(400), deadline=None)
@given(plans_and_facts())
def test_done_exactly_when_every_required_unit_is_current_and_passed(pf):
    """'done' is said exactly when all required finals are current with passing validators
    (and nothing is left to claim)."""
    plan, facts = pf
    d = decide(plan, facts)
    all_final = all(facts.is_current(u) and facts.records[u].validators_passed
                    for u in plan.required_units())
    if d.kind == DecisionKind.done:
        assert all_final
    elif all_final:
        assert d.kind == DecisionKind.claim  # only more (non-required) work may come first


@settings(max_examples=examples(400), deadline=None)
@given(plans_and_facts())
def test_never_claims_a_model_unit_while_a_unit_is_blocked_on_budget(pf):
    """While any unit is blocked by the budget, no unit of a model-calling kind is ready."""
    plan, facts = pf
    if any(s.status == "blocked" and s.details["kind"] == "budget"
           for s in facts.statuses.values()):
        units = plan.unit_map()
        assert all(units[u].kind != UnitKind.extract for u in ready_units(plan, facts))


@settings(max_examples=examples(200), deadline=None)
@given(plans_and_facts())
def test_decide_is_deterministic(pf):
    """The same facts always give the same decision."""
    plan, facts = pf
    assert decide(plan, facts) == decide(plan, facts)


def test_blocked_reasons_name_the_unit_and_why():
    """A blocked decision lists each blocked unit with its stored reason."""
    plan = Plan(units=[Unit(id="U01", title="a", phase="p", kind=UnitKind.audit,
                            required_final=True)])
    facts = RunFacts(run_id="R", branch_id="main", head_version=0, plan_info={}, inputs_info={},
                     records={}, statuses={"U01": UnitStatus(unit="U01", status="blocked",
                                                             reason="budget: calls 10/10",
                                                             updated_at="t")},
                     leases={}, budget=Budget(), now=NOW)
    d = decide(plan, facts)
    assert d.kind == DecisionKind.blocked
    assert d.reasons == ["U01 blocked: budget: calls 10/10"]
