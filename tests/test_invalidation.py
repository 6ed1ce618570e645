"""Typed invalidation: what a change reaches, by which edges, and why (engine/invalidation.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.core.changes import (
    Change,
    ChangeKind,
    artifact_lost,
    unit_output_changed,
)
from keepstep.engine.core.invalidation import (
    PlanIndex,
    cutoff,
    cutoff_note,
    downstream_of,
    invalidate,
)
from keepstep.engine.core.plan import EdgeType, Plan, load_plan
from keepstep.engine.core.state import (
    Explanation,
    ExplanationStep,
    OutputRef,
    UnitRecord,
    UnitState,
)
from keepstep.engine.errors import ConfigError

REAL_PLAN = Path(__file__).resolve().parent.parent / "sample_projects/market-entry/plan.toml"
GROUPS = "ABCDEFGHIJKL"
UPSTREAM_KINDS = {"intake", "extract", "verify", "synthesize", "rank"}


# -- helpers -------------------------------------------------------------------------------

def U(n: int) -> str:
    return f"U{n:02d}"


def units(a: int, b: int) -> list[str]:
    return [U(n) for n in range(a, b + 1)]


def make_plan(specs: list[dict[str, Any]], gates: list[dict[str, Any]] | None = None) -> Plan:
    """A plan from short unit dicts: id, kind, inputs, deps ("U01" or ("U01", "presentation"))."""
    raw = []
    for s in specs:
        deps = [{"unit": d, "edge": "content"} if isinstance(d, str) else
                {"unit": d[0], "edge": d[1]} for d in s.get("deps", [])]
        raw.append({"id": s["id"], "title": s.get("title", s["id"]), "phase": s.get("phase", "p"),
                    "kind": s.get("kind", "synthesize"), "inputs": s.get("inputs", []),
                    "outputs": s.get("outputs", [f"{s['id'].lower()}.json"]),
                    "depends_on": deps, "max_rounds": s.get("max_rounds"),
                    "required_final": s.get("required_final", False)})
    return Plan.model_validate({"unit": raw, "gate": gates or []})


def built_me042() -> Plan:
    """A 36-unit plan matching ME-042.md (used when the sample plan.toml is not there)."""
    specs: list[dict[str, Any]] = [
        {"id": "U01", "kind": "intake", "inputs": [f"group:{g}" for g in GROUPS]},
        {"id": "U02", "kind": "intake", "inputs": ["contract:goal"],
         "deps": [("U01", "structure")]},
        {"id": "U03", "kind": "intake", "deps": ["U02"]},
        {"id": "U04", "kind": "intake", "deps": ["U03"]},
    ]
    for i, g in enumerate(GROUPS):  # U05–U16: extraction E01–E12, one per source group
        specs.append({"id": U(5 + i), "kind": "extract", "inputs": [f"group:{g}"],
                      "deps": ["U03", ("U04", "structure")]})
    verify_of = [(5, 6), (7, 8), (9,), (10,), (11,), (12,), (13, 14), (15, 16)]
    for i, ext in enumerate(verify_of):  # U17–U24: each waits only for its own extractions
        specs.append({"id": U(17 + i), "kind": "verify",
                      "deps": [U(e) for e in ext] + [("U04", "structure")]})
    aud = ["contract:audience"]
    specs += [
        {"id": "U25", "deps": ["U17", "U18"]},
        {"id": "U26", "deps": ["U19", "U20"]},
        {"id": "U27", "inputs": aud, "deps": ["U21", "U22", ("U02", "audience")]},
        {"id": "U28", "kind": "rank", "max_rounds": 3, "inputs": aud,
         "deps": ["U25", "U26", "U27", ("U02", "audience")]},
        {"id": "U29", "inputs": aud, "deps": ["U23", "U24", ("U02", "audience")]},
        {"id": "U30", "inputs": aud, "deps": ["U28", "U29", ("U02", "audience")]},
        {"id": "U31", "kind": "render", "inputs": ["template:report"], "deps": units(25, 30)},
        {"id": "U32", "kind": "render", "inputs": ["template:evidence-table"],
         "deps": units(17, 24)},
        {"id": "U33", "kind": "render", "inputs": ["template:brief"], "deps": ["U28", "U30"]},
        {"id": "U34", "kind": "render", "inputs": ["template:appendix"],
         "deps": units(17, 24) + [("U28", "presentation")]},
        {"id": "U35", "kind": "audit", "deps": units(31, 34), "required_final": True},
        {"id": "U36", "kind": "notes", "deps": ["U35"], "required_final": True},
    ]
    gate = {"id": "G1", "unit": "U27", "question": "Confirm the audience?"}
    return make_plan(specs, [gate])


def me042(which: str) -> Plan:
    if which == "real":
        if not REAL_PLAN.is_file():
            pytest.skip("sample_projects/market-entry/plan.toml is not there yet")
        return load_plan(REAL_PLAN)
    return built_me042()


def out_hash(uid: str, version: int = 1) -> str:
    return f"{uid.lower()}-v{version}".ljust(64, "0")


def succeeded(plan: Plan, ids: list[str] | None = None) -> dict[str, UnitRecord]:
    """Records as if ``ids`` (default: every unit) had succeeded once, consuming their deps."""
    ids = [u.id for u in plan.units] if ids is None else ids
    umap = plan.unit_map()
    return {uid: UnitRecord(
        state=UnitState.succeeded, attempt=f"{uid}/a1",
        outputs={"out.json": OutputRef(sha256=out_hash(uid), path=f"R/{uid}/a1/out.json")},
        consumed={d.unit: {"out.json": out_hash(d.unit)} for d in umap[uid].depends_on},
    ) for uid in ids}


def kinds_of(plan: Plan, ids: Any) -> set[str]:
    umap = plan.unit_map()
    return {umap[u].kind.value for u in ids}


def readers(plan: Plan, ref: str) -> list[str]:
    return [u.id for u in plan.units if ref in u.inputs]


def assert_explained(uid: str, exps: list[Explanation], change: Change) -> None:
    """Every explanation names the origin and a connected path that ends at the unit."""
    for e in exps:
        assert e.origin == change.origin and e.change_kind == change.kind.value
        rendered = e.render()
        assert rendered.startswith(f"{change.kind.value}: {change.origin}")
        if not e.path:  # the changed unit itself
            assert change.origin == f"unit:{uid}"
            continue
        assert e.path[0].source == change.origin
        for a, b in zip(e.path, e.path[1:], strict=False):
            assert a.target == b.source
        assert e.path[-1].target == f"unit:{uid}"
        assert all(f"[{s.edge}] {s.target.removeprefix('unit:')}" in rendered for s in e.path)


AUDIENCE = Change(kind=ChangeKind.contract_audience, origin="contract:audience",
                  detail="audience changed to 'investment committee'")
APPENDIX = Change(kind=ChangeKind.template, origin="template:appendix",
                  detail="template 'appendix' changed (typo fixed)")


# -- over-invalidation ----------------------------------------------------------------------

def test_appendix_template_typo_rerenders_only_the_appendix_and_its_audit() -> None:
    """A typo fixed in the appendix template redoes the appendix, the audit of it and the notes."""
    plan = built_me042()
    result = invalidate(plan, [APPENDIX], succeeded(plan))
    assert list(result.affected) == ["U34", "U35", "U36"]
    assert result.affected["U34"][0].render() == (
        "template: template:appendix → [template] U34 (template 'appendix' changed (typo fixed))")
    assert len(result.reused) == 33
    for uid, exps in result.affected.items():
        assert_explained(uid, exps, APPENDIX)


@pytest.mark.parametrize("which", ["built", "real"])
def test_appendix_template_change_touches_no_evidence_or_synthesis_unit(which: str) -> None:
    """On the ME-042 plan, the appendix template reaches no intake/evidence/synthesis unit and
    only one document."""
    plan = me042(which)
    appendix_units = readers(plan, "template:appendix")
    assert appendix_units, "some unit must read template:appendix"
    result = invalidate(plan, [APPENDIX], succeeded(plan))
    assert set(appendix_units) <= set(result.affected)
    assert not kinds_of(plan, result.affected) & UPSTREAM_KINDS
    renders = [u for u in result.affected if plan.unit_map()[u].kind.value == "render"]
    assert renders == appendix_units


def test_presentation_change_to_synthesis_rerenders_its_documents_nothing_upstream() -> None:
    """A format-only change to U28 re-renders the document that re-formats it (U34), which
    then emits a presentation change: the audit, which uses U34 by content, is kept, and so
    are the documents that cite U28 by content and everything upstream."""
    plan = built_me042()
    change = unit_output_changed("U28", EdgeType.presentation, "ranking table re-formatted")
    result = invalidate(plan, [change], succeeded(plan))
    assert list(result.affected) == ["U34"]
    assert [s.edge for s in result.affected["U34"][0].path] == ["presentation"]
    assert "U28" not in result.affected  # the origin's output is the change, not redone
    assert not set(result.affected) & ({"U31", "U33"} | set(units(1, 30)))


@pytest.mark.parametrize("which", ["built", "real"])
def test_claim_set_change_in_shared_synthesis_reaches_both_citing_documents_and_audit(
        which: str) -> None:
    """A content change to U28's (S04's) claims reaches A01 (U31) and A03 (U33), which cite it,
    and the cross-file audit F01 (U35) — nothing upstream, not U28 itself."""
    plan = me042(which)
    change = unit_output_changed("U28", EdgeType.content, "claim set changed")
    result = invalidate(plan, [change], succeeded(plan))
    assert {"U31", "U33", "U35"} <= set(result.affected)
    assert set(result.affected) <= downstream_of(plan, ["U28"])
    assert any(e.render().startswith("unit_output: unit:U28 → [content] U31")
               for e in result.affected["U31"])
    for uid, exps in result.affected.items():
        assert_explained(uid, exps, change)
    if which == "built":  # the appendix re-formats U28's ranking, so it re-renders too
        assert set(result.affected) == {"U30", "U31", "U33", "U34", "U35", "U36"}


@pytest.mark.parametrize("which", ["built", "real"])
def test_presentation_change_reaches_only_reformatting_documents(which: str) -> None:
    """On the ME-042 plan, a format-only change to any unit with a re-formatting dependent
    reaches those dependents and, since they emit presentation in turn, only what
    re-formats them: no content-only dependent, nothing upstream, not the unit itself."""
    plan = me042(which)
    g = plan.graph()
    by_presentation = {u.id: [d.unit for d in u.depends_on if d.edge == EdgeType.presentation]
                       for u in plan.units}
    origins = sorted({p for deps in by_presentation.values() for p in deps})
    assert origins
    for origin in origins:
        expected: set[str] = set()
        frontier = [origin]
        while frontier:
            here = frontier.pop()
            for u, deps in by_presentation.items():
                if here in deps and u not in expected:
                    expected.add(u)
                    frontier.append(u)
        result = invalidate(plan, [unit_output_changed(origin, EdgeType.presentation, "f")],
                            succeeded(plan))
        assert set(result.affected) == expected
        assert not set(result.affected) & (set(g.predecessors(origin)) | {origin})


def test_small_plan_presentation_vs_content_edges() -> None:
    """A document that re-formats a synthesis depends by presentation, one that cites it by
    content; each change type reaches only its own."""
    plan = make_plan([
        {"id": "S", "inputs": ["source:X"]},
        {"id": "Cite", "kind": "render", "deps": ["S"]},
        {"id": "Fmt", "kind": "render", "deps": [("S", "presentation")]},
        {"id": "Audit", "kind": "audit", "deps": ["Cite", "Fmt"]},
    ])
    recs = succeeded(plan)
    fmt = invalidate(plan, [unit_output_changed("S", EdgeType.presentation, "f")], recs)
    claims = invalidate(plan, [unit_output_changed("S", EdgeType.content, "c")], recs)
    src = invalidate(plan, [Change(kind=ChangeKind.source_content, origin="source:X",
                                   detail="x")], recs)
    assert list(fmt.affected) == ["Fmt"]  # Fmt emits presentation; Audit uses it by content
    assert list(claims.affected) == ["Cite", "Fmt", "Audit"]
    assert list(src.affected) == ["S", "Cite", "Fmt", "Audit"]  # a redone S changes everything


# -- under-invalidation ---------------------------------------------------------------------

@pytest.mark.parametrize("which", ["built", "real"])
def test_audience_change_after_u30_invalidates_exactly_u27_to_u30(which: str) -> None:
    """ME-042 interruption 3: with U01–U30 current, the audience edit invalidates exactly
    U27–U30 through audience edges; U01–U26 are reused; U31–U36 will run under the new plan."""
    plan = me042(which)
    result = invalidate(plan, [AUDIENCE], succeeded(plan, units(1, 30)))
    assert list(result.affected) == units(27, 30)
    assert result.reused == units(1, 26)
    assert set(result.pending_affected) <= set(units(31, 36))
    assert set(units(31, 35)) & set(result.pending_affected)
    for uid in units(27, 30):
        assert any(e.path and e.path[0].edge == "audience" for e in result.affected[uid])
        assert_explained(uid, result.affected[uid], AUDIENCE)


def test_audience_change_reaches_rankings_and_their_content_consumers() -> None:
    """With every unit current, an audience change reaches the risk ranking (U28) and every
    document and audit built on the audience-typed units — no report keeps an old ranking."""
    plan = built_me042()
    result = invalidate(plan, [AUDIENCE], succeeded(plan))
    assert set(readers(plan, "contract:audience")) <= set(result.affected)
    assert plan.unit_map()["U28"].kind.value == "rank" and "U28" in result.affected
    assert set(result.affected) == set(units(27, 31) + units(33, 36))
    assert "U32" not in result.affected  # the evidence table uses no audience-typed unit
    (exp,) = result.affected["U31"]  # one per change; the note names every other way in
    assert exp.render() == (
        "contract_audience: contract:audience → [audience] U27 → [content] U31 (audience "
        "changed to 'investment committee'; also via U28 [content], U29 [content], "
        "U30 [content])")


@pytest.mark.parametrize("which", ["built", "real"])
def test_source_group_change_reaches_its_extraction_and_true_downstream_only(which: str) -> None:
    """A3's content change reaches group A's extraction and what depends on it, never the
    extraction of another group."""
    plan = me042(which)
    change = Change(kind=ChangeKind.source_content, origin="source:A3", groups=["A"],
                    detail="source A3 content changed")
    result = invalidate(plan, [change], succeeded(plan))
    extractors = {u.id: u for u in plan.units if u.kind.value == "extract"}
    hit = [u for u in result.affected if u in extractors]
    assert hit and all({"group:A", "source:A3"} & set(extractors[u].inputs) for u in hit)
    g = plan.graph()
    for other in set(extractors) - set(hit):
        assert other not in result.affected
        only_theirs = set(g.successors(other)) - set().union(*(g.successors(h) for h in hit))
        assert not only_theirs & set(result.affected)
    for uid, exps in result.affected.items():
        assert_explained(uid, exps, change)


def test_source_change_exact_downstream_on_the_built_plan() -> None:
    """On the built ME-042 plan, A3 reaches U01's inventory, E01 and exactly its downstream."""
    plan = built_me042()
    change = Change(kind=ChangeKind.source_content, origin="source:A3", detail="A3")
    result = invalidate(plan, [change], succeeded(plan), source_groups={"A3": "A"})
    assert list(result.affected) == ["U01", "U05", "U17", "U25", "U28", "U30", "U31", "U32",
                                     "U33", "U34", "U35", "U36"]
    assert result.affected["U05"][0].render() == "source_content: source:A3 → [content] U05 (A3)"


def test_unit_definition_change_follows_structure_edges_then_content() -> None:
    """Redefining the evidence schema (U04) redoes it, every unit using its structure and their
    content downstream — but nothing upstream of it."""
    plan = built_me042()
    change = Change(kind=ChangeKind.unit_definition, origin="unit:U04",
                    detail="unit U04 changed: params")
    result = invalidate(plan, [change], succeeded(plan))
    assert list(result.affected) == units(4, 36)
    assert result.affected["U04"][0].path == []
    assert result.affected["U05"][0].path[0].edge == "structure"
    assert_explained("U04", result.affected["U04"], change)


def test_content_change_does_not_follow_structure_edges() -> None:
    """A source change that redoes the inventory does not reach what only uses its structure."""
    plan = built_me042()
    change = Change(kind=ChangeKind.source_content, origin="source:B1", groups=["B"], detail="b")
    result = invalidate(plan, [change], succeeded(plan))
    assert "U01" in result.affected and "U02" not in result.affected


def test_artifact_lost_redoes_the_unit_and_its_content_downstream() -> None:
    """A lost artifact of U17 redoes U17 and what consumes it; its siblings are reused."""
    plan = built_me042()
    result = invalidate(plan, [artifact_lost("U17", "out.json missing")], succeeded(plan))
    assert list(result.affected)[:3] == ["U17", "U25", "U28"]
    assert "U18" not in result.affected and "U05" not in result.affected


def test_version_change_reaches_units_that_declare_it() -> None:
    """version:policy reaches the units with a policy:policy input over a policy edge."""
    plan = make_plan([{"id": "A", "inputs": ["policy:policy"]}, {"id": "B", "deps": ["A"]},
                      {"id": "C", "inputs": ["policy:model"]}])
    change = Change(kind=ChangeKind.version, origin="version:policy", detail="policy-1 → policy-2")
    result = invalidate(plan, [change], succeeded(plan))
    assert change.edge == EdgeType.policy
    assert list(result.affected) == ["A", "B"]
    assert result.affected["A"][0].path[0].edge == "policy"


def test_cosmetic_and_removed_unit_changes_reach_nothing() -> None:
    """A title-only change and a removed unit are recorded but invalidate nothing."""
    plan = built_me042()
    cosmetic = Change(kind=ChangeKind.unit_definition, origin="unit:U07", cosmetic=True,
                      detail="unit U07 changed: title")
    removed = Change(kind=ChangeKind.unit_definition, origin="unit:U99", detail="unit U99 removed")
    result = invalidate(plan, [cosmetic, removed], succeeded(plan))
    assert result.affected == {} and result.pending_affected == {}
    assert len(result.reused) == 36 and result.changes == [cosmetic, removed]


# -- states ---------------------------------------------------------------------------------

def test_pending_units_are_listed_as_will_run_not_invalidated() -> None:
    """Only succeeded units become invalidated; reached units without a success are listed
    separately, with explanations; already-invalidated ones are not re-invalidated."""
    plan = built_me042()
    recs = succeeded(plan, units(1, 28))
    recs["U28"] = recs["U28"].model_copy(update={"state": UnitState.invalidated})
    result = invalidate(plan, [AUDIENCE], recs)
    assert list(result.affected) == ["U27"]
    assert list(result.pending_affected)[:3] == ["U28", "U29", "U30"]
    assert all(result.pending_affected.values())
    assert "U28" not in result.reused


def test_invalidation_is_deterministic() -> None:
    """The same inputs give the same result, key order and explanation order included."""
    plan = built_me042()
    changes = [AUDIENCE, APPENDIX, Change(kind=ChangeKind.source_content, origin="source:C2",
                                          groups=["C"], detail="c2")]
    runs = [invalidate(plan, changes, succeeded(plan)).model_dump(mode="json") for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert list(runs[0]["affected"]) == sorted(runs[0]["affected"])
    fresh = invalidate(plan, changes, succeeded(plan), index=PlanIndex(plan))
    assert fresh.model_dump(mode="json") == runs[0]


# -- high-risk rules ------------------------------------------------------------------------

def test_also_rule_widens_with_an_explanation() -> None:
    """A rule {when contract_audience, also U32} adds U32 and says it was widened by the rule."""
    plan = built_me042()
    rules = [{"when": "contract_audience", "also": ["U32"]}]
    result = invalidate(plan, [AUDIENCE], succeeded(plan), high_risk_rules=rules)
    assert "U32" in result.affected
    (exp,) = result.affected["U32"]
    assert exp.note == "widened by rule 1 (when contract_audience; also U32)"
    assert exp.render() == ("contract_audience: contract:audience → [rule] U32 "
                            "(widened by rule 1 (when contract_audience; also U32))")


def test_widen_to_all_edges_reaches_structure_dependents() -> None:
    """widen_to downstream_all_edges follows structure edges a content change would skip."""
    plan = built_me042()
    change = Change(kind=ChangeKind.source_content, origin="source:B1", groups=["B"], detail="b")
    rules = [{"when": "source_content", "widen_to": "downstream_all_edges"}]
    result = invalidate(plan, [change], succeeded(plan), high_risk_rules=rules)
    assert "U02" in result.affected
    assert result.affected["U02"][0].note.startswith("widened by rule 1")
    assert result.affected["U02"][0].path[-1].edge == "structure"


def test_rules_widen_and_never_narrow() -> None:
    """For random changes and rules, the default result is kept intact and only grows."""
    plan = built_me042()
    rng = random.Random(42)
    ids = [u.id for u in plan.units]
    kinds = ["*", "contract_audience", "template", "source_content", "content", "structure"]
    pool = [AUDIENCE, APPENDIX, artifact_lost("U09", "x"),
            Change(kind=ChangeKind.source_content, origin="source:D1", groups=["D"], detail="d"),
            unit_output_changed("U28", EdgeType.presentation, "p")]
    for _ in range(60):
        changes = rng.sample(pool, rng.randint(1, 3))
        rules: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 3)):
            rule: dict[str, Any] = {"when": rng.choice(kinds)}
            if rng.random() < 0.5:
                rule["also"] = rng.sample(ids, 2)
            else:
                rule["widen_to"] = "downstream_all_edges"
            rules.append(rule)
        recs = succeeded(plan, rng.sample(ids, 30))
        base = invalidate(plan, changes, recs)
        wide = invalidate(plan, changes, recs, high_risk_rules=rules)
        assert set(base.affected) <= set(wide.affected)
        assert set(base.pending_affected) <= set(wide.pending_affected)
        for uid, exps in base.affected.items():
            assert wide.affected[uid][:len(exps)] == exps
        for uid in set(wide.affected) - set(base.affected):
            assert all(e.note.startswith("widened by rule") for e in wide.affected[uid])


def test_bad_rules_are_refused_with_what_to_fix() -> None:
    """A rule with an unknown kind, unknown unit or nothing to widen raises ConfigError."""
    plan = built_me042()
    for bad in ({"when": "weather", "also": ["U01"]}, {"when": "template", "also": ["U99"]},
                {"when": "template"}, {"when": "template", "narrow_to": "x"}):
        with pytest.raises(ConfigError, match="high_risk_rules: rule 1"):
            invalidate(plan, [APPENDIX], {}, high_risk_rules=[bad])


# -- early cut-off --------------------------------------------------------------------------

def _invalidated_by(recs: dict[str, UnitRecord], uid: str, via: list[str]) -> None:
    exps = [Explanation(change_kind="contract_audience", origin="contract:audience", path=[
        ExplanationStep(source="contract:audience", target=f"unit:{v}", edge="audience"),
        ExplanationStep(source=f"unit:{v}", target=f"unit:{uid}", edge="content")]) for v in via]
    recs[uid] = recs[uid].model_copy(update={"state": UnitState.invalidated, "explanations": exps})


def test_cutoff_keeps_dependents_when_output_is_byte_identical() -> None:
    """U31 and U33 stay current when U28 is re-executed to the same bytes; a changed output
    keeps nobody."""
    plan = built_me042()
    recs = succeeded(plan)
    for uid in ("U31", "U33"):
        _invalidated_by(recs, uid, ["U28"])
    same = {"out.json": out_hash("U28")}
    assert cutoff(plan, "U28", same, recs) == ["U30", "U31", "U33", "U34"]
    assert cutoff(plan, "U28", {"out.json": out_hash("U28", 2)}, recs) == []
    assert cutoff(plan, "U28", {**same, "extra.json": "f" * 64}, recs) == []
    assert cutoff_note("U28") == "kept current: U28's output is byte-identical to what it consumed"


def test_cutoff_needs_everything_consumed_to_be_current() -> None:
    """A dependent with another dependency that is not current, or reached directly by an
    input change or a widening rule, does not stay current."""
    plan = built_me042()
    recs = succeeded(plan)
    _invalidated_by(recs, "U31", ["U28", "U27"])
    recs["U27"] = recs["U27"].model_copy(update={"state": UnitState.invalidated})
    recs["U30"] = recs["U30"].model_copy(update={"state": UnitState.invalidated, "explanations": [
        Explanation(change_kind="contract_audience", origin="contract:audience", path=[
            ExplanationStep(source="contract:audience", target="unit:U30", edge="audience")])]})
    recs["U34"] = recs["U34"].model_copy(update={"state": UnitState.invalidated, "explanations": [
        Explanation(change_kind="contract_audience", origin="contract:audience", path=[
            ExplanationStep(source="contract:audience", target="unit:U34", edge="rule")])]})
    same = {"out.json": out_hash("U28")}
    # U31 waits for U27, U30 was hit by the audience itself, U33 waits for U30, U34 by a rule
    assert cutoff(plan, "U28", same, recs) == []
    for uid in ("U27", "U30"):  # once they are current again, U31 and U33 can stay
        recs[uid] = recs[uid].model_copy(update={"state": UnitState.succeeded})
    assert cutoff(plan, "U28", same, recs) == ["U31", "U33"]


def test_downstream_of_follows_every_edge() -> None:
    """downstream_of lists every unit below the given ones over any edge type."""
    plan = built_me042()
    assert downstream_of(plan, ["U28"]) == {"U30", "U31", "U33", "U34", "U35", "U36"}
    assert downstream_of(plan, ["U36"]) == set()
