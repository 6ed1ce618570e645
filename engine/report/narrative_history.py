"""The narrative's account of a run's history, read from its events and checkpoints.

Each interruption becomes a claim (engine.narrative_claims): an orphan quarantined and its
unit redone, a budget block with its figures and the decision that lifted it, a plan or input
change with what it invalidated (and along which edges) and what it reused, approvals, and the
recoveries' own figures (count, successes, time to recover, units reused vs redone, tokens
saved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keepstep.engine.report.narrative_claims import (
    Claim,
    Line,
    attempt_no,
    counter_value,
    ids_text,
    number,
    plural,
)
from keepstep.engine.report.status import run_status
from keepstep.engine.run.approvals import describe_bound_object

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run
    from keepstep.storage.models import Checkpoint, Event

_HISTORY_KINDS = ("decision.", "approval.decided", "approval.revoked", "approval.superseded",
                  "recovery.orphan", "recovery.failed", "recovery.blocked", "unit.blocked",
                  "attempt.failed", "lease.owner_dead", "attempt.fenced")


@dataclass
class Facts:
    """Everything the narrative reads, loaded once from the run's store."""

    run: Any
    status: Any
    records: dict[str, Any]
    checkpoints: list[Checkpoint]
    events: list[Event]
    attempts: list[Any]
    calls: list[Any]
    baseline: Checkpoint | None
    verification: str

    def committed_after(self, unit: str, version: int) -> str | None:
        """The first attempt of ``unit`` committed in a checkpoint after ``version``."""
        return next((c.attempt for c in self.checkpoints if c.kind == "unit-success"
                     and c.unit == unit and c.version > version and c.attempt), None)

    def executed(self) -> dict[str, list[str]]:
        """unit -> attempts that did work (an attempt blocked before any call did none)."""
        called = {c.attempt_id for c in self.calls}
        out: dict[str, list[str]] = {}
        for a in self.attempts:
            if a.status != "blocked" or a.attempt_id in called:
                out.setdefault(a.unit, []).append(a.attempt_id)
        return out


def gather(run: Run) -> Facts:
    """Load the facts; the baseline is the head if it verifies, else the newest checkpoint
    before the first one that does not."""
    store = run.store
    status = run_status(run)
    checkpoints = store.list_checkpoints(run.run_id, run.branch_id)
    baseline, verification = None, "its link and state hash verify"
    report = store.verify_head(run.run_id, run.branch_id)
    if report.ok:
        baseline = store.get_checkpoint(run.run_id, status.head_version, run.branch_id)
    else:
        chain = store.verify_chain(run.run_id, run.branch_id)
        first_bad = min((p.version for p in chain.problems + report.problems), default=0)
        good = [c for c in checkpoints if c.version < first_bad]
        baseline = good[-1] if good else None
        verification = (f"checkpoint {first_bad} and later do not verify: "
                        + "; ".join(p.problem for p in report.problems + chain.problems[:3]))
    attempts = [a for a in store.attempts(run.run_id) if a.branch_id == run.branch_id]
    calls = [c for c in store.calls(run.run_id) if c.branch_id == run.branch_id]
    events = store.events(run.run_id, branch_id=run.branch_id)
    return Facts(run=run, status=status, records=run.facts_records(), checkpoints=checkpoints,
                  events=events, attempts=attempts, calls=calls, baseline=baseline,
                  verification=verification)


def history(f: Facts) -> list[Line]:
    out: list[Line] = ["", "## What happened, and why units were reused or redone", ""]
    change_cps = {k: [c for c in f.checkpoints if c.kind == k]
                  for k in ("plan-change", "input-change", "repair")}
    seen = {k: 0 for k in change_cps}
    causes: dict[str, str] = {}
    for ev in f.events:
        if not ev.kind.startswith(_HISTORY_KINDS):
            continue
        p = ev.payload
        if ev.kind in ("lease.owner_dead", "attempt.fenced"):
            causes[ev.attempt_id or ""] = ("its executor process died before the commit"
                                           if ev.kind == "lease.owner_dead"
                                           else "another executor took its lease over")
        elif ev.kind == "decision.start":
            out.append(Claim("history.start", "- Started under {plan} with input snapshot "
                             "{inputs}, audience {audience}.",
                             {"plan": str(p.get("plan")), "inputs": str(p.get("inputs")),
                              "audience": repr(p.get("audience", ""))}))
        elif ev.kind == "recovery.orphan":
            out.append(_orphan_claim(f, p, causes))
        elif ev.kind == "unit.blocked":
            out.append(_block_claim(f, ev))
        elif ev.kind == "decision.budget_raise":
            out.append(_raise_claim(f, ev))
        elif ev.kind in ("decision.plan_change", "decision.input_change", "decision.repair"):
            kind = ev.kind.removeprefix("decision.").replace("_", "-")
            cps = change_cps[kind]
            cp = cps[seen[kind]] if seen[kind] < len(cps) else None
            seen[kind] += 1
            out += _change_claims(f, kind, p, cp)
        elif ev.kind == "approval.decided":
            out.append(Claim("history.approval", "- Approval: gate {gate} answered {choice} by "
                             "{who} (bound to {bound}).",
                             {"gate": repr(p.get("gate")), "choice": repr(p.get("choice")),
                              "who": str(p.get("who")),
                              "bound": describe_bound_object(p.get("bound_object") or {})}))
        elif ev.kind in ("approval.superseded", "approval.revoked"):
            why = ("its object changed, so the gate asked again" if ev.kind.endswith("superseded")
                   else f"revoked by {p.get('who')}: {p.get('reason')}")
            out.append(Claim("history.approval_ended", "- Approval of gate {gate} no longer "
                             "applies: {why}.", {"gate": repr(p.get("gate")), "why": why}))
        elif ev.kind == "attempt.failed":
            out.append(Claim("history.failed", "- Failed attempt {attempt}: {error}; retried as "
                             "a new attempt.", {"attempt": str(ev.attempt_id),
                                                "error": f"{p.get('error_class')}: "
                                                         f"{p.get('message', '')}"}))
        elif ev.kind in ("recovery.failed", "recovery.blocked"):
            out.append(Claim("history.recovery_stopped", "- Recovery {what}: {reason}.",
                             {"what": ev.kind.removeprefix("recovery."),
                              "reason": str(p.get("reason"))}))
        elif ev.kind.startswith("decision."):
            detail = ", ".join(f"{k} {v}" for k, v in sorted(p.items()) if not isinstance(
                v, dict | list)) or "no details"
            out.append(Claim("history.decision", "- Decision {kind}{unit}: {detail}.",
                             {"kind": ev.kind.removeprefix("decision."),
                              "unit": f" on {ev.unit}" if ev.unit else "", "detail": detail}))
    if len(out) == 3:
        out.append("- Nothing was interrupted, changed or redone.")
    return out


def _orphan_claim(f: Facts, p: dict[str, Any], causes: dict[str, str]) -> Claim:
    attempt = str(p.get("attempt"))
    unit = attempt.split("/")[0]
    later = sorted((c for c in f.checkpoints if c.kind == "unit-success" and c.unit == unit
                    and attempt_no(c.attempt or "") > attempt_no(attempt)), key=lambda c: c.version)
    outcome = (f"{unit} ran again as {later[0].attempt}" if later else
               f"{unit} has not run again yet")
    return Claim("history.orphan", "- Orphan: {attempt} staged {files} file(s) that no commit "
                 "references ({cause}); recovery quarantined them (read-only, never promoted) "
                 "and {outcome}.",
                 {"attempt": attempt, "files": str(len(p.get("files", []))),
                  "cause": causes.get(attempt, "the commit never happened"),
                  "outcome": outcome})


def _figure(counter: str, value: Any) -> str:
    if not isinstance(value, dict):
        return f"{counter} {value}"
    used, limit = (counter_value(counter, value.get(k, 0)) for k in ("used", "limit"))
    return (f"{counter} {used} of {limit} used, "
            f"{counter_value(counter, value.get('requested', 0))} requested")


def _block_claim(f: Facts, ev: Event) -> Claim:
    p = ev.payload
    calls = sum(1 for c in f.calls if c.attempt_id == ev.attempt_id)
    figures = "; ".join(_figure(k, v) for k, v in sorted((p.get("figures") or {}).items())) \
        or str(p.get("reason"))
    return Claim("history.blocked", "- Blocked ({kind}): {attempt} stopped {when}: {figures}. "
                 "Blocked, not failed: nothing was retried while it was blocked.",
                 {"kind": str(p.get("kind") or "needs a person"), "attempt": str(ev.attempt_id),
                  "when": ("before its model call" if calls == 0 else
                           f"after {plural(calls, 'model call')}"),
                  "figures": figures})


def _raise_claim(f: Facts, ev: Event) -> Claim:
    p = ev.payload
    old, new, used = p.get("old") or {}, p.get("new") or {}, p.get("used") or {}
    changes = ", ".join(
        f"{k} {'unlimited' if old.get(k) is None else counter_value(k, old[k])} → "
        f"{counter_value(k, v)}" for k, v in sorted(new.items()))
    kept = ", ".join(f"{k} used {counter_value(k, v)}"
                     for k, v in sorted(used.items())) or "nothing used"
    blocked = [e for e in f.events if e.kind == "unit.blocked" and e.seq < ev.seq
               and (e.payload or {}).get("kind") == "budget"]
    prior = [e.seq for e in f.events if e.kind == "decision.budget_raise" and e.seq < ev.seq]
    blocked = [e for e in blocked if not prior or e.seq > max(prior)]
    ran = [f"{e.unit} then ran as {_after(f, e)}" for e in blocked]
    return Claim("history.budget_raise", "- Budget decision by {who}: {changes} ({reason}); "
                 "the counters were kept ({kept}); {outcome}.",
                 {"who": str(p.get("who")), "changes": changes, "reason": repr(p.get("reason")),
                  "kept": kept, "outcome": "; ".join(ran) or "no unit was waiting on it"})


def _after(f: Facts, ev: Event) -> str:
    nxt = sorted((a for a in f.attempts if a.unit == ev.unit and a.status == "committed"
                  and attempt_no(a.attempt_id) > attempt_no(ev.attempt_id or "")),
                 key=lambda a: a.attempt_no)
    return nxt[0].attempt_id if nxt else "nothing yet (it has not run again)"


def _change_claims(f: Facts, kind: str, p: dict[str, Any], cp: Checkpoint | None) -> list[Line]:
    label = p.get("plan") if kind == "plan-change" else p.get("inputs")
    prev = "?"
    if label and "-v" in str(label):
        stem, n = str(label).rsplit("-v", 1)
        prev = f"{stem}-v{int(n) - 1}" if n.isdigit() else "?"
    what = (f"{prev} → {label}" if label else "no version change")
    details = "; ".join(c.get("detail", c.get("kind", "")) for c in p.get("changes", [])) or "?"
    invalidated = sorted(p.get("invalidated", {}))
    reused = list(p.get("reused", []))
    edges: set[str] = set()
    for uid in invalidated:
        rec = (cp.delta.get(f"unit:{uid}") if cp else None) or {}
        for exp in rec.get("explanations", []):
            edges.update(step.get("edge", "") for step in exp.get("path", []))
    version = str(cp.version) if cp else "?"
    out: list[Line] = [
        Claim(f"history.{kind}", "- " + kind.replace("-", " ").capitalize()
              + " {what} at checkpoint {version}: {details}.",
              {"what": what, "version": version, "details": details}),
        Claim("history.change_reach", "  - Invalidated {invalidated} ({n_inv}) through {edges} "
              "edges; reused {reused} ({n_reused}).",
              {"invalidated": ids_text(invalidated), "n_inv": plural(len(invalidated), "unit"),
               "edges": ", ".join(sorted(e for e in edges if e)) or "no",
               "reused": ids_text(reused), "n_reused": plural(len(reused), "unit")})]
    for uid in invalidated:
        for text in p["invalidated"][uid]:
            out.append(Claim("history.why", "  - Why {unit}: {path}", {"unit": uid, "path": text}))
    if invalidated and cp is not None:
        again = [f.committed_after(u, cp.version) or f"{u} not yet" for u in invalidated]
        out.append(Claim("history.redone", "  - Ran again under the new version: {attempts}.",
                         {"attempts": ", ".join(again)}))
    return out


def recoveries(f: Facts) -> list[Line]:
    out: list[Line] = ["", "## Recoveries", ""]
    started = [e for e in f.events if e.kind == "recovery.started"]
    done = [e for e in f.events if e.kind == "recovery.done"]
    failed = sum(1 for e in f.events if e.kind == "recovery.failed")
    blocked = sum(1 for e in f.events if e.kind == "recovery.blocked")
    worked = [e for e in done if e.payload.get("did_work")]
    durations = [float(e.payload.get("duration_s", 0)) for e in done]
    out += [Claim("recovery.count", "- {n}: {done} succeeded, {failed} failed, {blocked} "
                  "blocked; {worked} found work to do.",
                  {"n": plural(len(started), "recovery", "recoveries"), "done": str(len(done)),
                   "failed": str(failed), "blocked": str(blocked), "worked": str(len(worked))}),
            Claim("recovery.time", "- Time to recover: {total} s in total, {most} s at most.",
                  {"total": f"{sum(durations):.3f}", "most": f"{max(durations, default=0):.3f}"})]
    head = "?"
    for ev in f.events:
        if ev.kind == "recovery.audited":
            head = str(ev.payload.get("head", "?"))
        if ev not in worked:
            continue
        p = ev.payload
        did = [f"{label} {ids_text(p[k])}" for k, label in
               (("fenced", "fenced"), ("orphans", "quarantined"), ("invalidated", "invalidated"))
               if p.get(k)]
        did += [f"applied {c}" for c in p.get("changes", [])]
        out.append(Claim("recovery.one", "- Recovery at checkpoint {head}: {did}; reused "
                         "{reused} current units, {tokens} tokens not spent again ({secs} s).",
                         {"head": head, "did": "; ".join(did) or "reconciled",
                          "reused": str(p.get("reused", 0)),
                          "tokens": number(p.get("tokens_saved", 0)),
                          "secs": f"{float(p.get('duration_s', 0)):.3f}"}))
    executed = f.executed()
    redone = sorted(u for u, atts in executed.items() if len(atts) > 1)
    once = sum(1 for atts in executed.values() if len(atts) == 1)
    out += [Claim("recovery.redone", "- Units redone: {redone} ({n}); units that ran once: "
                  "{once}.", {"redone": ids_text(redone), "n": plural(len(redone), "unit"),
                              "once": str(once)}),
            Claim("recovery.saved", "- Tokens saved by reuse: {tokens} (tokens of the current "
                  "units each recovery kept instead of redoing).",
                  {"tokens": number(sum(float(e.payload.get("tokens_saved", 0)) for e in done))})]
    return out


__all__ = ["Facts", "gather", "history", "recoveries"]
