"""Pins the unit kinds (engine/kinds) on a fake context: small synthetic inputs and the ME-042
pack."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from typing import Any

import networkx as nx
import pytest

from keepstep.engine.core.inputs import Contract, InputSnapshot, SourceEntry
from keepstep.engine.core.plan import Dependency, UnitKind, parse_plan
from keepstep.engine.errors import PlanValidationError
from keepstep.engine.gateway.offline_model import respond
from keepstep.engine.kinds import REGISTRY, expected_outputs, get_kind
from tests.support.fake_context import (
    PACK,
    FakeContext,
    PackRunner,
    decision_event,
    with_audience,
    with_unit,
)

EXTRACT_UNITS = [f"U{n:02d}" for n in range(5, 17)]
VERIFY_UNITS = [f"U{n:02d}" for n in range(17, 25)]
AUDIENCE_UNITS = ["U27", "U28", "U29", "U30"]


@pytest.fixture(scope="module")
def pack() -> PackRunner:
    runner = PackRunner()
    runner.run_all()
    return runner


def _failed(outcome: Any) -> dict[str, str]:
    return {v.name: v.detail for v in outcome.validators if not v.passed}


# --- a tiny synthetic project ----------------------------------------------------------
TEXT_X1 = (
    "# Notes\n\nThe pilot ran for 9 months in 2024. Readings arrived on time for\n"
    "97% of meters. Nothing else was measured.\n"
)
TEXT_X2 = "# More\n\nThe tender covers 40,000 meters. The city council has not voted yet.\n"
TEXT_Y1 = "# Other\n\nThe warehouse holds 300 pallets.\n"
TINY_PLAN = """
[[unit]]
id = "X1"
title = "Extract group X"
phase = "extraction"
kind = "extract"
inputs = ["group:X"]
outputs = ["evidence.json"]

[[unit]]
id = "X2"
title = "Verify group X"
phase = "verification"
kind = "verify"
inputs = ["group:X"]
outputs = ["verified.json"]
depends_on = ["X1"]

[[unit]]
id = "X3"
title = "What the pilot showed"
phase = "synthesis"
kind = "synthesize"
outputs = ["synthesis.json", "synthesis.md"]
depends_on = ["X2"]
"""


def _tiny_ctx(unit_id: str, **kw: Any) -> FakeContext:
    plan = parse_plan(TINY_PLAN)
    sources = {
        "X1": SourceEntry(id="X1", path="x1.md", group="X", approved=True),
        "X2": SourceEntry(id="X2", path="x2.md", group="X", approved=True),
        "Y1": SourceEntry(id="Y1", path="y1.md", group="Y", approved=True),
    }
    snapshot = InputSnapshot(sources={"X1": "a" * 64, "X2": "b" * 64, "Y1": "c" * 64},
                             groups={"X1": "X", "X2": "X", "Y1": "Y"})
    contract = Contract(fields={"audience": "product team", "goal": "Decide"}, body="Body\n")
    return FakeContext(unit=plan.unit_map()[unit_id], plan=plan, contract=contract,
                       snapshot=snapshot, sources=sources,
                       texts={"X1": TEXT_X1, "X2": TEXT_X2, "Y1": TEXT_Y1}, **kw)


def _run(ctx: FakeContext) -> Any:
    return get_kind(ctx.unit.kind.value)[1](ctx)


# --- registry and plan -----------------------------------------------------------------
def test_registry_holds_every_unit_kind() -> None:
    """Importing engine.kinds registers one kind per UnitKind, under its own name."""
    assert set(REGISTRY) == {k.value for k in UnitKind}
    assert all(spec.name == name for name, (spec, _) in REGISTRY.items())
    with pytest.raises(PlanValidationError):
        get_kind("summon")


def test_pack_plan_outputs_and_validators_match_the_kinds() -> None:
    """Every unit of plan.toml declares exactly the outputs and validators its kind produces."""
    plan = PackRunner().plan
    assert len(plan.units) == 36
    for unit in plan.units:
        spec, _ = get_kind(unit.kind.value)
        assert sorted(unit.outputs) == expected_outputs(unit), unit.id
        assert unit.validators == spec.validators, unit.id


def test_pack_plan_has_the_me042_shape() -> None:
    """Phases, one group per extraction, verifications wait only for their own extractions."""
    plan = PackRunner().plan
    units = plan.unit_map()
    phases = [u.phase for u in plan.units]
    assert phases == (["intake"] * 4 + ["extraction"] * 12 + ["verification"] * 8
                      + ["synthesis"] * 6 + ["deliverables"] * 4 + ["audit"] * 2)
    assert [units[u].input_refs("group") for u in EXTRACT_UNITS] == [[g] for g in "ABCDEFGHIJKL"]
    covered: list[str] = []
    for vid in VERIFY_UNITS:
        deps = [d.unit for d in units[vid].depends_on]
        assert all(units[d].kind == UnitKind.extract for d in deps), vid
        groups = [g for d in deps for g in units[d].input_refs("group")]
        assert units[vid].input_refs("group") == groups, vid
        covered += groups
    assert sorted(covered) == list("ABCDEFGHIJKL")
    assert units["U28"].kind == UnitKind.rank and units["U28"].max_rounds == 3
    assert {"U28"} <= {d.unit for d in units["U31"].depends_on}
    assert {"U28"} <= {d.unit for d in units["U33"].depends_on}
    assert {"U31", "U32", "U33", "U34"} <= {d.unit for d in units["U35"].depends_on}
    assert plan.required_units() == {"U35", "U36"}
    assert Dependency(unit="U32", edge="presentation") in units["U34"].depends_on
    gate = plan.gate_for("U27")
    assert gate is not None and gate.options == ["product team", "investment committee"]
    assert len(plan.plan.deliverables) == 5


def test_audience_reaches_exactly_u27_to_u30() -> None:
    """Only U27-U30 read contract:audience, and no unit before them depends on them."""
    plan = PackRunner().plan
    readers = [u.id for u in plan.units if "audience" in u.input_refs("contract")]
    assert readers == AUDIENCE_UNITS
    downstream = set().union(*(nx.descendants(plan.graph(), u) for u in readers))
    assert downstream == {"U31", "U33", "U35", "U36"}


# --- intake ----------------------------------------------------------------------------
def test_intake_inventory_holds_hashes_never_text(pack: PackRunner) -> None:
    """U01 lists 48 approved sources with their snapshot sha256 and no source text."""
    raw = pack.artifacts["U01"]["inventory.json"]
    inventory = json.loads(raw)
    assert inventory["count"] == 48 and len(inventory["groups"]) == 12
    assert all(s["sha256"] == pack.snapshot.sources[s["id"]] for s in inventory["sources"])
    assert b"1.9 million metered water connections" not in raw


def test_intake_contract_leaves_the_audience_out() -> None:
    """U02 writes its declared fields only, byte-identical whatever the audience."""
    first = PackRunner()
    first.run("U02")
    other = PackRunner(contract=with_audience(first.contract, "investment committee"))
    other.run("U02")
    doc = json.loads(first.artifacts["U02"]["contract.json"])
    assert set(doc["fields"]) == {"title", "client", "goal", "scope"}
    assert first.artifacts["U02"] == other.artifacts["U02"]
    assert b"product team" not in first.artifacts["U02"]["contract.json"]


def test_intake_questions_and_schema(pack: PackRunner) -> None:
    """U03 frames one overall question plus one per group; U04 publishes required fields."""
    questions = json.loads(pack.artifacts["U03"]["questions.json"])["questions"]
    assert [q["id"] for q in questions] == ["Q0"] + [f"Q-{g}" for g in "ABCDEFGHIJKL"]
    assert "Brightwell" in questions[0]["question"]
    schema = json.loads(pack.artifacts["U04"]["evidence-schema.json"])
    assert schema["required"] == ["id", "source_id", "quote", "figures"]


def test_intake_unknown_step_fails_structure() -> None:
    """An intake unit with an unknown params.step fails its structure validator."""
    runner = PackRunner(plan=with_unit(PackRunner().plan, "U04", params={"step": "guess"}))
    _, outcome = runner.run("U04")
    assert "structure" in _failed(outcome)


# --- extract ---------------------------------------------------------------------------
def test_extract_synthetic_sources_one_call_each() -> None:
    """Each source is converted after a safe point, then gets one extract call after a safe
    point; quotes are verbatim."""
    ctx = _tiny_ctx("X1")
    outcome = _run(ctx)
    assert outcome.passed, _failed(outcome)
    assert [c["payload"]["source_id"] for c in ctx.calls] == ["X1", "X2"]
    assert ctx.log == ["safe_point", "safe_point", "safe_point", "call", "safe_point", "call"]
    assert ctx.safe_points[:2] == ["convert X1 (1/2)", "convert X2 (2/2)"]
    evidence = ctx.json_output("evidence.json")["evidence"]
    assert [e["id"] for e in evidence] == ["X1-e1", "X1-e2", "X2-e1"]
    assert evidence[1]["quote"] == "Readings arrived on time for 97% of meters."
    assert all(e["group"] == "X" for e in evidence)


def test_extract_flags_a_quote_not_in_its_source() -> None:
    """The citations rule fails when the model returns a quote the source does not contain."""
    def altered(payload: dict[str, Any]) -> dict[str, Any]:
        out = respond(payload)
        out["evidence"][0]["quote"] = "The pilot ran for 12 months in 2024."
        return out

    outcome = _run(_tiny_ctx("X1", responder=altered))
    assert "not found verbatim" in _failed(outcome)["citations"]


def test_extract_flags_a_source_outside_the_unit() -> None:
    """The citations rule fails when an item cites a source the unit was not given."""
    def misattributed(payload: dict[str, Any]) -> dict[str, Any]:
        out = respond(payload)
        out["evidence"][0]["source_id"] = "Y1"
        return out

    outcome = _run(_tiny_ctx("X1", responder=misattributed))
    assert "not a source of X1" in _failed(outcome)["citations"]


def test_extract_whole_pack_finds_160_statements(pack: PackRunner) -> None:
    """The 12 extraction units find 163 statements (160 sentences, 3 table rows) with 4 calls
    each (one per source)."""
    counts = [len(json.loads(pack.artifacts[u]["evidence.json"])["evidence"])
              for u in EXTRACT_UNITS]
    assert sum(counts) == 163
    assert all(len(pack.contexts[u].calls) == 4 for u in EXTRACT_UNITS)
    assert all(pack.outcomes[u].passed for u in EXTRACT_UNITS)


# --- verify ----------------------------------------------------------------------------
def _tiny_verify(evidence: list[dict[str, Any]], **kw: Any) -> FakeContext:
    ctx = _tiny_ctx("X2", **kw)
    ctx.artifacts["X1"] = {"evidence.json": json.dumps({"evidence": evidence}).encode()}
    return ctx


def test_verify_rules_reject_before_one_model_call_and_keep_passages_out() -> None:
    """Rule failures never reach the model; one call checks the rest, each claim with only
    its own passage (the paragraph that holds its quote); no passage is stored."""
    good = respond({"task": "extract", "source_id": "X1", "text": TEXT_X1})["evidence"]
    invented = {**good[0], "id": "X1-e9", "quote": "The pilot ran for 12 months."}
    foreign = {"id": "Y1-e1", "source_id": "Y1", "quote": "The warehouse holds 300 pallets.",
               "figures": ["300"]}
    ctx = _tiny_verify(good + [invented, foreign])
    outcome = _run(ctx)
    assert len(ctx.calls) == 1
    assert [c["id"] for c in ctx.calls[0]["payload"]["claims"]] == ["X1-e1", "X1-e2"]
    sent = ctx.calls[0]["payload"]
    # Each passage is sent once, by id (issue 20: the claims of one paragraph share it).
    assert sent["passages"][sent["claims"][0]["passage"]] == TEXT_X1.split("\n\n")[1].strip()
    doc = ctx.json_output("verified.json")
    assert [e["id"] for e in doc["evidence"]] == ["X1-e1", "X1-e2"]
    assert {r["id"]: r["stage"] for r in doc["rejected"]} == {"X1-e9": "rule", "Y1-e1": "rule"}
    assert b"Nothing else was measured" not in ctx.outputs["verified.json"]
    assert outcome.facts["supported_fraction"] == 0.5 and outcome.passed


def test_verify_claim_check_fails_below_the_minimum() -> None:
    """When the model supports too few claims, claim_check fails and the fraction is recorded."""
    def doubtful(payload: dict[str, Any]) -> dict[str, Any]:
        out = respond(payload)
        for r in out["results"]:
            r["supported"], r["reason"] = False, "figure(s) not in passage: 9"
        return out

    good = respond({"task": "extract", "source_id": "X1", "text": TEXT_X1})["evidence"]
    outcome = _run(_tiny_verify(good, responder=doubtful))
    assert "claim_check" in _failed(outcome)
    assert outcome.facts["supported_fraction"] == 0.0


def test_verify_pack_units_make_one_call_each(pack: PackRunner) -> None:
    """Each of U17-U24 makes exactly one model call; together they verify all 163 statements."""
    assert [len(pack.contexts[u].calls) for u in VERIFY_UNITS] == [1] * 8
    assert sum(pack.outcomes[u].facts["supported"] for u in VERIFY_UNITS) == 163


# --- synthesize and rank ---------------------------------------------------------------
def test_synthesize_audience_changes_only_audience_units() -> None:
    """U27 (audience input) changes with the audience; U25 (none) is byte-identical."""
    product = PackRunner()
    product.run_all(until="U30")
    committee = PackRunner(contract=with_audience(product.contract, "investment committee"))
    committee.run_all(until="U30")
    assert product.artifacts["U25"] == committee.artifacts["U25"]
    for uid in AUDIENCE_UNITS:
        assert product.artifacts[uid] != committee.artifacts[uid], uid
    assert json.loads(committee.artifacts["U27"]["synthesis.json"])["audience"] == \
        "investment committee"
    assert product.contexts["U27"].calls[0]["payload"]["audience"] == "product team"
    assert product.contexts["U25"].calls[0]["payload"]["audience"] == "general"


def test_synthesize_flags_an_unknown_evidence_id() -> None:
    """A claim citing an id that was not in the given evidence fails the citations check."""
    def inventive(payload: dict[str, Any]) -> dict[str, Any]:
        # A model that invents the id again whatever the feedback says (the heuristic would
        # act on the revise round's feedback, so it does not see it here).
        out = respond({k: v for k, v in payload.items() if k != "revise"})
        out["claims"][0]["evidence_ids"].append("Q7-e1")
        return out

    ctx = _tiny_verify(respond({"task": "extract", "source_id": "X1", "text": TEXT_X1})["evidence"])
    _run(ctx)
    synth = _tiny_ctx("X3", responder=inventive)
    synth.artifacts["X2"] = ctx.outputs
    outcome = _run(synth)
    assert "Q7-e1" in _failed(outcome)["citations"]
    assert "[Q7-e1, X1-e1" in synth.outputs["synthesis.md"].decode()


def test_rank_loop_stops_at_round_two_with_facts(pack: PackRunner) -> None:
    """S04 ranks, checks, revises once (dropping the uncited risk) and stops at round 2."""
    ctx, outcome = pack.contexts["U28"], pack.outcomes["U28"]
    assert outcome.passed and outcome.rounds == 2
    assert outcome.facts == {"rounds": 2, "stop": "checks passed", "risks": 10}
    assert [(c["task"], c["round"]) for c in ctx.calls] == [
        ("rank", 1), ("check", 1), ("rank", 2), ("check", 2)]
    assert ctx.calls[2]["payload"]["feedback"] == ["claim R6 cites no evidence"]
    ranking = json.loads(pack.artifacts["U28"]["ranking.json"])
    assert all(r["evidence_ids"] for r in ranking["risks"])


def test_rank_max_rounds_one_fails_claim_check() -> None:
    """With max_rounds = 1 the loop stops with problems left and claim_check fails."""
    runner = PackRunner(plan=with_unit(PackRunner().plan, "U28", max_rounds=1))
    runner.run_all(until="U28")
    outcome = runner.outcomes["U28"]
    assert "max_rounds = 1" in _failed(outcome)["claim_check"]
    assert outcome.facts["stop"] == "max_rounds reached" and outcome.rounds == 1
    assert len(runner.contexts["U28"].calls) == 2
    assert "ranking.json" in runner.artifacts["U28"]


def test_an_unconverged_loop_goes_forward_flagged_when_the_plan_says_so() -> None:
    """The same max_rounds = 1 stop with on_last_round = "unconverged": the unit passes, its
    ranking says converged false with the open problems, and the stop names the round."""
    plan = with_unit(PackRunner().plan, "U28", max_rounds=1, on_last_round="unconverged")
    runner = PackRunner(plan=plan)
    runner.run_all(until="U28")
    outcome = runner.outcomes["U28"]
    assert outcome.passed and outcome.rounds == 1, _failed(outcome)
    ranking = json.loads(runner.artifacts["U28"]["ranking.json"])
    assert ranking["converged"] is False
    assert ranking["open_problems"] == ["claim R6 cites no evidence"]
    assert "not converged after max_rounds = 1" in ranking["stop"]


# --- render ----------------------------------------------------------------------------
def test_render_evidence_table_has_a_row_per_verified_statement(pack: PackRunner) -> None:
    """A02 is CSV with the template's header (and the models column every CSV gets) and 163
    rows carrying locator, group and figures (A1 is a PDF: its first statement is on a page)."""
    text = pack.artifacts["U32"]["evidence-table.csv"].decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["id", "source_id", "locator", "group", "topic", "figures", "quote",
                       "models"]
    assert len(rows) == 164
    first = dict(zip(rows[0], rows[1], strict=True))
    assert first["id"] == "A1-e1" and first["group"] == "A" and "22%" in first["figures"]
    assert first["locator"].startswith("p. ")


def test_render_evidence_table_follows_the_template_columns() -> None:
    """The evidence-table template's list items choose the CSV columns (the models column
    follows them); unknown ones fail."""
    runner = PackRunner()
    runner.templates["evidence-table"] = "# Columns\n\n- quote\n- `id`\n"
    outcome = runner.run_all(until="U32")["U32"]
    assert outcome.passed
    assert runner.artifacts["U32"]["evidence-table.csv"].decode().splitlines()[0] == \
        "quote,id,models"
    runner.templates["evidence-table"] += "- margin\n"
    _, outcome = runner.run("U32")
    assert "margin" in _failed(outcome)["structure"]


def test_render_report_cites_evidence_and_sources(pack: PackRunner) -> None:
    """A01 names the audience, cites verified ids with where in their sources they are, and
    carries the ranking."""
    report = pack.artifacts["U31"]["report.md"].decode()
    assert "Prepared for: **product team**" in report
    assert re.search(r"\] \([A-L]\d, [^;)]+[;)]", report)  # "[A1-e1] (A1, p. 1)"
    assert "| 1 | Battery life below tender requirement" in report
    tabled = {r["id"] for r in csv.DictReader(io.StringIO(
        pack.artifacts["U32"]["evidence-table.csv"].decode()))}
    cited = set(re.findall(r"\b[A-L]\d-e\d+\b", report))
    assert cited and cited <= tabled
    assert "offline heuristic model" in report and "{{" not in report


def test_render_brief_recommendation_follows_the_audience() -> None:
    """The decision brief's rule-based recommendation changes with the audience's ranking."""
    product = PackRunner()
    product.run_all(until="U33")
    committee = PackRunner(contract=with_audience(product.contract, "investment committee"))
    committee.run_all(until="U33")
    assert "staged entry" in product.artifacts["U33"]["decision-brief.md"].decode()
    assert "Run a pilot first" in committee.artifacts["U33"]["decision-brief.md"].decode()


def test_render_unknown_placeholder_fails_structure() -> None:
    """A template placeholder the renderer does not know fails the structure validator."""
    runner = PackRunner()
    runner.templates["report"] += "\n{{ margin_forecast }}\n"
    outcome = runner.run_all(until="U31")["U31"]
    assert "margin_forecast" in _failed(outcome)["structure"]


def test_render_appendix_lists_inventory_and_notice(pack: PackRunner) -> None:
    """A04 lists every source with a sha256 prefix, the verification counts and the notice."""
    appendix = pack.artifacts["U34"]["appendix.md"].decode()
    assert f"| A1 | A | market report | Norvania water metering market overview | " \
           f"`{pack.snapshot.sources['A1'][:12]}` |" in appendix
    assert "| U21 | U11 | 13 | 13 | 0 |" in appendix
    assert "offline heuristic model" in appendix and "- `quote`:" in appendix


# --- audit and notes -------------------------------------------------------------------
def test_audit_passes_on_consistent_documents(pack: PackRunner) -> None:
    """F01 passes when the four deliverables agree; its validator `final` says so."""
    outcome = pack.outcomes["U35"]
    assert outcome.passed and outcome.validators[0].name == "final"
    assert json.loads(pack.artifacts["U35"]["audit.json"])["passed"] is True


def test_audit_fails_when_the_report_cites_an_unknown_id() -> None:
    """F01 fails when the report cites an evidence id missing from the evidence table."""
    runner = PackRunner()
    runner.run_all(until="U34")
    runner.artifacts["U31"]["report.md"] += b"\nAlso: [Z9-e1] (sources: Z9)\n"
    _, outcome = runner.run("U35")
    assert not outcome.passed
    checks = {c["name"]: c for c in json.loads(runner.artifacts["U35"]["audit.json"])["checks"]}
    assert "Z9-e1" in checks["cited_evidence_in_table"]["detail"]
    assert not checks["cited_sources_in_inventory"]["passed"]


def test_audit_fails_when_a_deliverable_is_missing() -> None:
    """F01 fails when one of the four deliverables is not among its dependencies."""
    plan = PackRunner().plan
    deps = [d for d in plan.unit_map()["U35"].depends_on if d.unit != "U34"]
    runner = PackRunner(plan=with_unit(plan, "U35", depends_on=deps))
    runner.run_all(until="U35")
    assert "all_deliverables_present" in runner.outcomes["U35"].validators[0].detail


def test_notes_list_decision_events_in_order() -> None:
    """U36 writes each decision for a person, oldest first: the date, what changed, why,
    who decided and what was redone."""
    events = [
        decision_event(7, "decision.plan_change", None, plan="plan-v2",
                       changes=[{"detail": "audience changed to 'board'",
                                 "origin": "contract:audience"}],
                       invalidated={"U27": [], "U28": [], "U29": [], "U30": []},
                       reused=["U01"] * 26),
        decision_event(3, "decision.budget_raise", None, old={"calls": 56.0},
                       new={"calls": 200.0}, reason="client approved", used={"calls": 56.0},
                       who="consultant"),
        decision_event(5, "recovery.done", None, did_work=False, reused=20),
    ]
    runner = PackRunner(events=events)
    runner.run_all()
    notes = runner.artifacts["U36"]["change-notes.md"].decode()
    assert notes.index("Budget raised") < notes.index("Plan changed")
    assert ("1. **2025-03-01 10:03 UTC — Budget raised by consultant: calls 56 → 200**"
            in notes)
    assert "Why: client approved." in notes
    assert "Plan changed (plan-v2): audience changed to 'board'" in notes
    assert "Redone: U27–U30" in notes and "Reused: 26 units." in notes
    assert "Recovered" not in notes  # a recovery that did nothing is not a change
    assert "Final audit U35: passed" in notes and runner.outcomes["U36"].facts["decisions"] == 3


def test_notes_say_when_no_decisions_were_recorded(pack: PackRunner) -> None:
    """With no decision events the change notes say so plainly."""
    assert "No decisions recorded" in pack.artifacts["U36"]["change-notes.md"].decode()


# --- whole pack ------------------------------------------------------------------------
def test_pack_runs_clean_and_writes_declared_outputs(pack: PackRunner) -> None:
    """All 36 units pass their validators and write exactly their declared outputs."""
    assert {u: _failed(o) for u, o in pack.outcomes.items() if not o.passed} == {}
    for unit in pack.plan.units:
        assert set(pack.artifacts[unit.id]) == set(unit.outputs), unit.id


def test_pack_model_calls_per_unit(pack: PackRunner) -> None:
    """Offline, the pack makes 70 calls: 4 per extraction, 1 per verify, 2 per synthesis (the
    synthesis and its support check, asked of the heuristic too), 4 for S04."""
    calls = pack.calls_per_unit()
    expected = {u.id: 0 for u in pack.plan.units}
    expected |= {u: 4 for u in EXTRACT_UNITS} | {u: 1 for u in VERIFY_UNITS}
    expected |= {"U25": 2, "U26": 2, "U27": 2, "U28": 4, "U29": 2, "U30": 2}
    assert calls == expected
    assert sum(calls.values()) == 70
    assert sum(calls[f"U{n:02d}"] for n in range(1, 21)) == 52  # spent before U21's call


def test_every_model_call_follows_a_safe_point(pack: PackRunner) -> None:
    """Model-using kinds pass a safe point immediately before each call."""
    for uid, ctx in pack.contexts.items():
        for n, entry in enumerate(ctx.log):
            if entry == "call":
                assert n > 0 and ctx.log[n - 1] == "safe_point", uid


def test_pack_run_is_byte_identical_twice(pack: PackRunner) -> None:
    """Running every kind again over the same inputs yields byte-identical outputs."""
    again = PackRunner()
    again.run_all()
    assert again.artifacts == pack.artifacts


def test_kinds_load_neither_litellm_nor_textual() -> None:
    """Importing the kinds pulls in no model client and no UI; kinds use storage for hashing
    only."""
    code = ("import sys, keepstep.engine.kinds; "
            "print([m for m in ('litellm', 'textual') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACK)
    assert out.stdout.strip() == "[]"
    kinds_dir = PACK.parent.parent / "engine" / "kinds"
    for path in kinds_dir.glob("*.py"):
        imports = [line for line in path.read_text().splitlines()
                   if line.startswith(("import ", "from ")) and "storage" in line]
        assert all("keepstep.storage.hashing" in line for line in imports), path.name


def test_verify_records_conflicting_figures_between_sources() -> None:
    """Two sources giving one quantity different values: verified.json lists the conflict
    with both ids, the values, the reason and its status; the claims stay verified."""
    ctx = _tiny_ctx("X2")
    ctx.texts.update({"X1": "# A\n\nAquilon holds 46% of installed smart meters.\n",
                      "X2": "# B\n\nAquilon holds 41% of installed smart meters, a revised "
                      "figure.\n"})
    ctx.artifacts["X1"] = {"evidence.json": json.dumps({"evidence": [
        {"id": "X1-e1", "source_id": "X1", "quote": "Aquilon holds 46% of installed smart "
         "meters.", "figures": ["46%"]},
        {"id": "X2-e1", "source_id": "X2", "quote": "Aquilon holds 41% of installed smart "
         "meters, a revised figure.", "figures": ["41%"]}]}).encode()}
    outcome = _run(ctx)
    assert outcome.passed, _failed(outcome)
    [conflict] = ctx.json_output("verified.json")["conflicts"]
    assert conflict["ids"] == ["X1-e1", "X2-e1"] and conflict["values"] == ["46%", "41%"]
    assert conflict["status"] == "conflict-resolved" and conflict["reason"]
    assert outcome.facts["conflicts"] == 1


TABLE_X1 = ("# Customers\n\nReference customers by site count.\n\n"
            "| Customer | Sites | Users |\n|---|---|---|\n| Aldermere | 17 | 240 |\n"
            "| Brook | 4 | 60 |\n")


def test_a_table_row_keeps_its_header_through_verify_synthesis_and_the_support_check(
        ) -> None:
    """A row quoted on its own ("Aldermere | 17 | 240") says nothing of what its cells count:
    verify stores its table's header row with it, and the synthesis and the support check
    send the header beside the row (what a real model behind the relay could not read)."""
    extract = _tiny_ctx("X1")
    extract.texts["X1"] = TABLE_X1
    _run(extract)
    verify = _tiny_ctx("X2")
    verify.texts["X1"] = TABLE_X1
    verify.artifacts["X1"] = extract.outputs
    assert _run(verify).passed
    evidence = verify.json_output("verified.json")["evidence"]
    rows = {e["quote"]: e for e in evidence}
    assert rows["Aldermere | 17 | 240"]["table_header"] == "Customer | Sites | Users"
    assert "table_header" not in rows["The tender covers 40,000 meters."]

    synth = _tiny_ctx("X3")
    synth.artifacts["X2"] = verify.outputs
    assert _run(synth).passed
    sent = {e["id"]: e for e in synth.calls[0]["payload"]["evidence"]}
    row_id = rows["Aldermere | 17 | 240"]["id"]
    assert sent[row_id]["table_header"] == "Customer | Sites | Users"
    support = next(c["payload"] for c in synth.calls if c["task"] == "support")
    quoted = [q for c in support["claims"] for q in c["quotes"] if q["id"] == row_id]
    assert quoted and all(q["table_header"] == "Customer | Sites | Users" for q in quoted)


def test_the_checks_ask_for_a_reviewers_reading_of_a_models_own_work() -> None:
    """The remarks of a model checking its own extractions and claims: the verify and support
    prompts tell it to judge as a reviewer who did not write them, and to read a table row
    under its header."""
    from keepstep.engine.gateway.prompts import load_prompt

    for name in ("verify", "support"):
        prompt = load_prompt(name)
        assert "a reviewer who did not" in prompt.system, name
        assert "table_header" in prompt.system, name
