"""audit (F01) and notes (U36): cross-file checks and change notes, no model.

The audit reads the four deliverables its dependencies rendered and checks that they
agree with each other: every evidence id cited in the report and the brief is in the
evidence table, every cited source is in the inventory, the appendix lists every tabled
source. The change notes are written from the run's decision events, oldest first.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from keepstep.engine.core.explain import compact_ids
from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.timefmt import parse_iso, readable_utc
from keepstep.engine.kinds.common import (
    JSON,
    MARKDOWN,
    cited_evidence_ids,
    cited_source_ids,
    dep_units,
    dep_with_param,
    dump_json,
    natural_key,
    result,
)
from keepstep.engine.kinds.context import (
    KindOutcome,
    KindSpec,
    UnitContext,
    ValidatorResult,
    register,
)
from keepstep.engine.kinds.render import DOCUMENT_OUTPUTS
from keepstep.storage.hashing import sha256_hex

AUDIT = KindSpec(
    name="audit",
    uses_model=False,
    validators=["final"],
    default_outputs=["audit.json"],
    description="Cross-file audit of the four deliverables: citations, sources, completeness.",
)
NOTES = KindSpec(
    name="notes",
    uses_model=False,
    validators=["structure"],
    default_outputs=["change-notes.md"],
    description="Change notes written from the run's decision events, oldest first.",
)
_SHOWN = 8
_SUMMARY_CHARS = 200


def _check(name: str, problems: list[str], ok: str) -> dict[str, Any]:
    shown = "; ".join(problems[:_SHOWN]) + (f" (+{len(problems) - _SHOWN} more)"
                                           if len(problems) > _SHOWN else "")
    return {"name": name, "passed": not problems, "detail": shown if problems else ok}


def _ids(ids: set[str]) -> list[str]:
    return sorted(ids, key=natural_key)


@register(AUDIT)
def run_audit(ctx: UnitContext) -> KindOutcome:
    docs: dict[str, bytes] = {}
    for unit in dep_units(ctx, UnitKind.render):
        document = str(unit.params.get("document", ""))
        if document in DOCUMENT_OUTPUTS:
            docs[document] = ctx.dep_bytes(unit.id, DOCUMENT_OUTPUTS[document])
    text = {k: v.decode("utf-8") for k, v in docs.items()}
    inv_unit = dep_with_param(ctx, UnitKind.intake, "step", "inventory")
    inventory = ({s["id"] for s in ctx.dep_json(inv_unit.id, "inventory.json").get("sources", [])}
                 if inv_unit else None)

    missing = [f"{d} ({DOCUMENT_OUTPUTS[d]}) is missing" for d in DOCUMENT_OUTPUTS if d not in docs]
    missing += [f"{d} is empty" for d, t in text.items() if not t.strip()]
    rows = list(csv.DictReader(io.StringIO(text.get("evidence-table", ""))))
    tabled = {r.get("id", "") for r in rows}
    tabled_sources = {r.get("source_id", "") for r in rows if r.get("source_id")}

    prose = {d: text[d] for d in ("report", "decision-brief") if d in text}
    unknown_ids = [f"{d} cites {i}, not in the evidence table"
                   for d, t in prose.items() for i in _ids(cited_evidence_ids(t) - tabled)]
    uncited = [f"{d} cites no evidence" for d, t in prose.items() if not cited_evidence_ids(t)]
    all_cited: set[str] = set().union(*(cited_evidence_ids(t) for t in prose.values()))
    cited_sources = set(tabled_sources)
    for t in prose.values():
        cited_sources |= cited_source_ids(t)
    checks = [
        _check("all_deliverables_present", missing, "report, evidence table, decision brief "
               "and appendix present"),
        _check("cited_evidence_in_table", unknown_ids + uncited,
               f"{len(all_cited)} cited id(s), all among {len(tabled)} table row(s)"),
    ]
    if inventory is not None:
        unknown_sources = [f"source {s} is cited but not in the inventory"
                           for s in _ids(cited_sources - inventory)]
        checks.append(_check("cited_sources_in_inventory", unknown_sources,
                             f"{len(cited_sources)} cited source(s), all in the inventory"))
    if "appendix" in text:
        unlisted = [f"appendix does not list tabled source {s}" for s in _ids(tabled_sources)
                    if f"| {s} |" not in text["appendix"]]
        checks.append(_check("appendix_lists_tabled_sources", unlisted,
                             f"all {len(tabled_sources)} tabled source(s) listed"))
    passed = all(c["passed"] for c in checks)
    doc = {"passed": passed, "checks": checks,
           "documents": {DOCUMENT_OUTPUTS[d]: sha256_hex(b) for d, b in sorted(docs.items())}}
    ctx.write("audit.json", dump_json(doc), media_type=JSON)
    failed = [c["name"] for c in checks if not c["passed"]]
    return KindOutcome(
        validators=[ValidatorResult(
            name="final", passed=passed,
            detail=f"{len(checks)} check(s) passed" if passed else "failed: " + ", ".join(failed))],
        facts={"passed": passed, "checks": len(checks), "failed": failed},
    )


# --- notes -----------------------------------------------------------------------------
# The change notes are read by a person: what changed, when, why, who decided and what was
# redone because of it — one paragraph per decision, in the words of the decision.


def _when(ts: str) -> str:
    try:
        return readable_utc(parse_iso(ts), seconds=False)
    except ValueError:
        return ts


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in sorted(value.items())
                         if v not in (None, "", [], {}))
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    # Hashes are noise to a reader; their first 12 characters still identify them.
    text = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{52}\b", r"\1…", text)
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _by(p: dict[str, Any]) -> str:
    return f" by {p['who']}" if p.get("who") else ""


def _redone(units: Any) -> str:
    ids = sorted(units or [], key=natural_key)
    return compact_ids(ids) if ids else ""


def _note(kind: str, unit: str | None, p: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(headline, detail lines) for one decision event; None when it changed nothing."""
    if kind in ("decision.plan_change", "decision.input_change"):
        what = "; ".join(str(c.get("detail") or c.get("kind")) for c in p.get("changes", []))
        label = p.get("plan") or p.get("inputs") or ""
        head = f"{'Plan' if kind.endswith('plan_change') else 'Inputs'} changed" + (
            f" ({label})" if label else "") + f": {what or 'the project files changed'}"
        lines = []
        origins = sorted({str(c.get("origin")) for c in p.get("changes", []) if c.get("origin")})
        if origins:
            lines.append(f"Why: {', '.join(origins)} changed in the project files.")
        redo = _redone(p.get("invalidated"))
        lines.append(f"Redone: {redo} (each depends on what changed)." if redo else
                     "Redone: nothing (no current unit depended on it).")
        if p.get("reused"):
            lines.append(f"Reused: {len(p['reused'])} units.")
        return head, lines
    if kind == "decision.budget_raise":
        old, new = p.get("old", {}), p.get("new", {})
        moves = ", ".join(f"{k} {_plain(old[k]) if k in old else 'no limit'} → "
                          f"{_plain(new[k])}" for k in sorted(new))
        return (f"Budget raised{_by(p)}: {moves}",
                [f"Why: {p.get('reason') or 'no reason given'}.",
                 f"Used at the time: {_plain(p.get('used', {})) or 'nothing'}."])
    if kind == "approval.decided":
        gate = p.get("gate") or p.get("gate_id") or unit
        bound = p.get("bound_object") or {}
        plan = f" for plan-v{bound['plan_n']}" if "plan_n" in bound else ""
        return (f"Approval: gate {gate} answered {p.get('choice')!r}{_by(p)}",
                [f"Applies{plan} while the contract is unchanged"
                 + (f" (via {p['via']})." if p.get("via") not in (None, "direct") else ".")])
    if kind == "approval.revoked":
        return (f"Approval revoked: gate {p.get('gate') or p.get('gate_id') or unit}{_by(p)}",
                [f"Why: {p.get('reason') or 'no reason given'}."])
    if kind == "decision.takeover":
        action = str(p.get("action", "takeover")).replace("_", " ")
        lines = [f"Note: {p['note']}."] if p.get("note") else []
        redo = _redone(p.get("invalidated"))
        if redo:
            lines.append(f"Redone: {redo}.")
        return f"Takeover: {action}" + (f" {unit}" if unit else "") + _by(p), lines
    if kind == "recovery.done":
        if not p.get("did_work"):
            return None
        lines = []
        if p.get("orphans"):
            lost = sorted({str(a).split("/")[0] for a in p["orphans"]}, key=natural_key)
            lines.append(f"Lost in an interruption and redone: {compact_ids(lost)} (unfinished "
                         f"attempt(s) {', '.join(map(str, p['orphans']))} set aside, never used).")
        if p.get("invalidated"):
            lines.append(f"Redone: {_redone(p['invalidated'])}.")
        if p.get("reused") is not None:
            lines.append(f"Reused: {p['reused']} units.")
        return "Recovered after an interruption", lines
    if kind == "decision.recovery_reset":
        return (f"Recovery reset{_by(p)}", [f"Why: {p.get('reason') or 'no reason given'}."])
    details = _plain({k: v for k, v in p.items() if k != "who"})
    return (kind.removeprefix("decision.").replace("_", " ").capitalize()
            + (f" ({unit})" if unit else "") + _by(p), [details] if details else [])


@register(NOTES)
def run_notes(ctx: UnitContext) -> KindOutcome:
    events = sorted(ctx.decision_events(), key=lambda e: e.seq)
    audit_units = dep_units(ctx, UnitKind.audit)
    lines = [f"# Change notes — run {ctx.run_id}", ""]
    for unit in audit_units:
        audit = ctx.dep_json(unit.id, "audit.json")
        verdict = "passed" if audit.get("passed") else "FAILED"
        lines.append(f"Final audit {unit.id}: {verdict} ({len(audit.get('checks', []))} checks).")
    if audit_units:
        lines.append("")
    notes = [(e, n) for e in events if (n := _note(e.kind, e.unit, e.payload)) is not None]
    if not notes:
        lines.append("No decisions recorded: the run went ahead on its original plan, approvals "
                     "and budget.")
    else:
        lines += [f"What changed during the run, oldest first ({len(notes)}):", ""]
        for number, (e, (head, details)) in enumerate(notes, start=1):
            lines.append(f"{number}. **{_when(e.ts)} — {head}**")
            lines += [f"   {d}" for d in details]
    text = "\n".join(lines) + "\n"
    ctx.write("change-notes.md", text, media_type=MARKDOWN)
    return KindOutcome(validators=[result("structure", [], f"{len(events)} decision(s) noted")],
                       facts={"decisions": len(events)})
