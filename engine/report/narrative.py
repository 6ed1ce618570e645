"""The handover narrative: Markdown generated only from a run's stored state.

Deterministic: the same stored facts give the same text — no model, no clock. Every sentence
that states a figure is a ``Claim`` (a template plus its values), so ``check_narrative`` can
read the figures back out of any text and compare them with the state. A mismatch raises an
``alert.narrative_mismatch`` event and the state wins: ``narrative(run)`` is always rebuilt
from the facts, never from an earlier text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine.gateway.redaction import redact
from keepstep.engine.report.narrative_claims import (
    Claim,
    Line,
    Mismatch,
    compare,
    counter_value,
    ids_text,
    number,
    plural,
    render,
    when,
)
from keepstep.engine.report.narrative_history import Facts, gather, history, recoveries

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run

NARRATIVE_VERSION = "narrative-1"
_KIND_WORDS = {"unit-success": ("unit success", "unit successes"),
               "plan-change": ("plan change", "plan changes"),
               "input-change": ("input change", "input changes"),
               "repair": ("repair", "repairs")}
_COUNTERS = (("calls", "Model calls"), ("tokens", "Tokens"), ("cost", "Cost"),
             ("recoveries", "Recoveries"))


# -- the sections --------------------------------------------------------------------------
def _baseline(f: Facts) -> list[Line]:
    st, cp = f.status, f.baseline
    out: list[Line] = ["## The last reliable baseline", ""]
    if cp is None:
        out.append(Claim("baseline.none", "- No checkpoint verifies: {why}.",
                         {"why": f.verification}))
    else:
        kind = cp.kind + (f" of {cp.attempt}" if cp.attempt else "")
        out += [Claim("baseline.checkpoint", "- Checkpoint {version} ({kind}), committed {when}.",
                      {"version": str(cp.version), "kind": kind, "when": when(cp.created_at)}),
                Claim("baseline.hash", "- Checkpoint hash {hash}…, state hash {state}…; {check}.",
                      {"hash": cp.hash[:12], "state": cp.state_hash[:12],
                       "check": f.verification})]
    current = {u: r.attempt for u, r in f.records.items() if r.state.value == "succeeded"}
    invalidated = {(k[5:], v.get("attempt")) for c in f.checkpoints if c.kind != "unit-success"
                   for k, v in c.delta.items()
                   if k.startswith("unit:") and v and v.get("state") == "invalidated"}
    successes = [c for c in f.checkpoints if c.kind == "unit-success"]
    kept = sum(1 for c in successes if current.get(c.unit or "") == c.attempt)
    stale = sum(1 for c in successes if current.get(c.unit or "") != c.attempt
                and (c.unit, c.attempt) in invalidated)
    parts = []
    for kind, n in sorted(st.commits_by_kind.items(), key=lambda kv: (kv[0] != "unit-success",
                                                                       kv[0])):
        one, many = _KIND_WORDS.get(kind, (kind, kind + "s"))
        text = plural(n, one, many)
        if kind == "unit-success":
            other = n - kept - stale
            text += " (all current)" if kept == n else (
                f" ({kept} current, {stale} later invalidated"
                + (f", {other} superseded)" if other else ")"))
        parts.append(text)
    inputs = f.run.store.read_key(f.run.run_id, "inputs", f.run.branch_id) or {}
    out += [Claim("baseline.commits", "- {commits} checkpoint commits: {breakdown}.",
                  {"commits": str(st.checkpoint_commits), "breakdown": ", ".join(parts) or "none"}),
            Claim("baseline.versions", "- Plan {plan} · input snapshot {inputs} ({sources} "
                  "approved sources, ids and sha256 only) · audience {audience}.",
                  {"plan": st.plan_version, "inputs": st.input_version,
                   "sources": str(len(inputs.get("sources", {}))),
                   "audience": repr(f.run.plan_info.get("audience", ""))})]
    return out


def _standing(f: Facts) -> list[Line]:
    st, c = f.status, f.status.counts
    out: list[Line] = ["", "## Where the run stands", "",
                       Claim("stands.decision", "- Decision: {decision} — {reasons}.",
                             {"decision": st.decision,
                              "reasons": "; ".join(st.reasons) or "no reason recorded"}),
                       Claim("stands.units", "- Units: {current} of {total} current · "
                             "{invalidated} invalidated · {blocked} blocked · {failed} failed · "
                             "{pending} pending · {running} running.",
                             {"current": str(c.get("current", 0)), "total": str(len(st.units)),
                              **{k: str(c.get(k, 0)) for k in
                                 ("invalidated", "blocked", "failed", "pending", "running")}})]
    for uid, view in st.units.items():
        if view.state in ("blocked", "failed", "cancelled"):
            out.append(Claim("stands.unit", "- Unit {unit} is {state}: {reason}.",
                             {"unit": uid, "state": view.state, "reason": view.reason or "?"}))
    return out


def _spent(f: Facts) -> list[Line]:
    budget = f.status.budget
    out: list[Line] = ["", "## What was spent", ""]
    for counter, label in _COUNTERS:
        used = float(budget["used"].get(counter, 0))
        limit = budget["limits"].get(counter)
        figures = f"{counter_value(counter, used)} used"
        if limit is None:
            figures += " (no limit)"
        else:
            left = counter_value(counter, float(limit) - used)
            figures += f" of {counter_value(counter, limit)} ({left} left)"
        out.append(Claim(f"spent.{counter}", f"- {label}: {{figures}}.", {"figures": figures}))
    current = {r.attempt for r in f.records.values() if r.state.value == "succeeded"}
    lost = [c for c in f.calls if c.attempt_id not in current and c.status == "settled"]
    attempts = sorted({c.attempt_id for c in lost})
    out.append(Claim("spent.discarded", "- Spent on attempts that are not current: {calls} "
                     "calls, {tokens} tokens ({attempts}).",
                     {"calls": number(len(lost)),
                      "tokens": number(sum(c.tokens_in + c.tokens_out for c in lost)),
                      "attempts": ", ".join(attempts) or "none"}))
    return out


def _unverified(f: Facts) -> list[Line]:
    st = f.status
    invalid = [u for u, v in st.units.items() if v.state == "invalidated"]
    orphans = [o.attempt_id for o in f.run.store.orphaned_attempts(f.run.run_id)]
    quarantined = {a.attempt_id for a in f.attempts if a.status == "orphaned"}
    orphan_text = ", ".join(
        f"{o} (quarantined, never promoted)" if o in quarantined else
        f"{o} (never promoted)" if st.decision == "done" else
        f"{o} (not yet quarantined: the next resume audits it)" for o in orphans) or "none"
    unknown = ", ".join(f"{e.get('unit', '?')} {e.get('action', '')} ({e.get('status', '')})"
                        for e in st.external_unknown) or "none"
    approvals = ", ".join(f"gate {a.gate!r} for {a.unit or '?'}"
                          for a in st.pending_approvals) or "none"
    alerts = [e.kind.removeprefix("alert.") for e in f.events if e.kind.startswith("alert.")]
    return ["", "## What is unverified", "",
            Claim("unverified.invalidated", "- Invalidated units: {units}.",
                  {"units": ids_text(invalid)}),
            Claim("unverified.orphans", "- Orphans: {orphans}.", {"orphans": orphan_text}),
            Claim("unverified.unknowns", "- External unknowns: {unknowns}.",
                  {"unknowns": unknown}),
            Claim("unverified.approvals", "- Pending approvals: {approvals}.",
                  {"approvals": approvals}),
            Claim("unverified.alerts", "- Alerts: {alerts}.",
                  {"alerts": (f"{len(alerts)} ({', '.join(sorted(set(alerts)))})" if alerts
                              else "none")})]


def narrative_lines(run: Run) -> list[Line]:
    """The narrative as lines: plain strings and figure-bearing ``Claim``s."""
    f = gather(run)
    title = run.plan.plan.title or run.project.files.config.name
    branch = "" if run.branch_id == "main" else f" (branch {run.branch_id})"
    lines: list[Line] = [
        Claim("title", "# Handover: run {run} — {title}", {"run": run.run_id + branch,
                                                           "title": title}),
        "",
        f"Generated from the run's stored state by keepstep ({NARRATIVE_VERSION}); no model "
        "wrote it. Where it and the state disagree, the state wins.",
        "",
    ]
    lines += _baseline(f) + _standing(f) + _spent(f) + _unverified(f)
    lines += ["", "## The first step after resuming", "",
              Claim("next", "- Next: {action}", {"action": f.status.next_action})]
    lines += history(f) + recoveries(f)
    return lines


def narrative(run: Run) -> str:
    """The handover narrative (Markdown) for ``run``, from its stored state only."""
    return render(narrative_lines(run))


def check_narrative(run: Run, text: str) -> list[Mismatch]:
    """Compare every figure in ``text`` with the run's state. Any mismatch is recorded as an
    ``alert.narrative_mismatch`` event; the state wins (``narrative(run)`` gives its text)."""
    mismatches = compare(narrative_lines(run), text)
    if mismatches:
        run.store.append_event(run.run_id, "alert.narrative_mismatch", branch_id=run.branch_id,
                               payload={
                                   "message": f"the narrative disagrees with the stored state in "
                                   f"{plural(len(mismatches), 'place')}; the state wins",
                                   "mismatches": [redact(m.render())[:240]
                                                  for m in mismatches[:20]]})
    return mismatches


__all__ = ["Claim", "Mismatch", "NARRATIVE_VERSION", "check_narrative", "compare", "narrative",
           "narrative_lines", "render"]
