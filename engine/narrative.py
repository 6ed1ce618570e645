"""The handover narrative: Markdown generated only from a run's stored state.

Deterministic: the same stored facts give the same text — no model, no clock. Every sentence
that states a figure is a ``Claim`` (a template plus its values), so ``check_narrative`` can
read the figures back out of any text and compare them with the state. A mismatch raises an
``alert.narrative_mismatch`` event and the state wins: ``narrative(run)`` is always rebuilt
from the facts, never from an earlier text.
"""

from __future__ import annotations

import datetime as dt
import re
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .explain import compact_ids

if TYPE_CHECKING:
    from keepstep.storage.models import Checkpoint, Event

    from .project import Run

NARRATIVE_VERSION = "narrative-1"
_KIND_WORDS = {"unit-success": ("unit success", "unit successes"),
               "plan-change": ("plan change", "plan changes"),
               "input-change": ("input change", "input changes"),
               "repair": ("repair", "repairs")}
_COUNTERS = (("calls", "Model calls"), ("tokens", "Tokens"), ("cost", "Cost"),
             ("recoveries", "Recoveries"))
_HISTORY_KINDS = ("decision.", "approval.decided", "approval.revoked", "approval.superseded",
                  "recovery.orphan", "recovery.failed", "recovery.blocked", "unit.blocked",
                  "attempt.failed", "lease.owner_dead", "attempt.fenced")


@dataclass(frozen=True)
class Claim:
    """One line of the narrative that states figures: ``template.format(**values)``."""

    key: str
    template: str
    values: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        return self.template.format(**self.values)


Line = str | Claim


class Mismatch(BaseModel):
    """A figure the narrative states differently from the stored state (the state wins)."""

    key: str
    field: str = ""
    narrative: str | None = None  # None: the claim is missing from the text
    state: str | None = None  # None: the text states something the state does not have

    def render(self) -> str:
        where = f"{self.key}.{self.field}" if self.field else self.key
        return f"{where}: the narrative says {self.narrative!r}, the state says {self.state!r}"


# -- formatting --------------------------------------------------------------------------------
def _n(value: float) -> str:
    value = float(value)
    return f"{int(value):,}" if value.is_integer() else f"{value:,.2f}"


def _fmt(counter: str, value: float) -> str:
    return f"${value:,.2f}" if counter == "cost" else _n(value)


def _when(iso: str) -> str:
    try:
        stamp = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(dt.UTC)
    except ValueError:
        return iso
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _ids(ids: Any) -> str:
    ids = list(ids)
    return compact_ids(ids) if ids else "none"


def _att_no(attempt_id: str) -> int:
    try:
        return int(attempt_id.rsplit("/a", 1)[1])
    except (IndexError, ValueError):
        return 0


# -- the facts -----------------------------------------------------------------------------
@dataclass
class _Facts:
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


def _gather(run: Run) -> _Facts:
    store = run.store
    status = run.status()
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
    return _Facts(run=run, status=status, records=run.facts_records(), checkpoints=checkpoints,
                  events=events, attempts=attempts, calls=calls, baseline=baseline,
                  verification=verification)


# -- the sections --------------------------------------------------------------------------
def _baseline(f: _Facts) -> list[Line]:
    st, cp = f.status, f.baseline
    out: list[Line] = ["## The last reliable baseline", ""]
    if cp is None:
        out.append(Claim("baseline.none", "- No checkpoint verifies: {why}.",
                         {"why": f.verification}))
    else:
        kind = cp.kind + (f" of {cp.attempt}" if cp.attempt else "")
        out += [Claim("baseline.checkpoint", "- Checkpoint {version} ({kind}), committed {when}.",
                      {"version": str(cp.version), "kind": kind, "when": _when(cp.created_at)}),
                Claim("baseline.hash", "- Checkpoint hash {hash}…, state hash {state}…; {check}.",
                      {"hash": cp.hash[:12], "state": cp.state_hash[:12],
                       "check": f.verification})]
    current = {u: r.attempt for u, r in f.records.items() if r.state.value == "succeeded"}
    successes = [c for c in f.checkpoints if c.kind == "unit-success"]
    kept = sum(1 for c in successes if current.get(c.unit or "") == c.attempt)
    parts = []
    for kind, n in sorted(st.commits_by_kind.items(), key=lambda kv: (kv[0] != "unit-success",
                                                                       kv[0])):
        one, many = _KIND_WORDS.get(kind, (kind, kind + "s"))
        text = _plural(n, one, many)
        if kind == "unit-success":
            text += f" ({kept} current, {n - kept} later superseded or invalidated)"
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


def _standing(f: _Facts) -> list[Line]:
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


def _spent(f: _Facts) -> list[Line]:
    budget = f.status.budget
    out: list[Line] = ["", "## What was spent", ""]
    for counter, label in _COUNTERS:
        used = float(budget["used"].get(counter, 0))
        limit = budget["limits"].get(counter)
        figures = f"{_fmt(counter, used)} used" + (
            " (no limit)" if limit is None else
            f" of {_fmt(counter, limit)} ({_fmt(counter, float(limit) - used)} left)")
        out.append(Claim(f"spent.{counter}", f"- {label}: {{figures}}.", {"figures": figures}))
    current = {r.attempt for r in f.records.values() if r.state.value == "succeeded"}
    lost = [c for c in f.calls if c.attempt_id not in current and c.status == "settled"]
    attempts = sorted({c.attempt_id for c in lost})
    out.append(Claim("spent.discarded", "- Spent on attempts that are not current: {calls} "
                     "calls, {tokens} tokens ({attempts}).",
                     {"calls": _n(len(lost)),
                      "tokens": _n(sum(c.tokens_in + c.tokens_out for c in lost)),
                      "attempts": ", ".join(attempts) or "none"}))
    return out


def _unverified(f: _Facts) -> list[Line]:
    st = f.status
    invalid = [u for u, v in st.units.items() if v.state == "invalidated"]
    orphans = [o.attempt_id for o in f.run.store.orphaned_attempts(f.run.run_id)]
    quarantined = {a.attempt_id for a in f.attempts if a.status == "orphaned"}
    orphan_text = ", ".join(f"{o} ({'quarantined, never promoted' if o in quarantined else 'not yet quarantined: resume to audit'})"
                            for o in orphans) or "none"
    unknown = ", ".join(f"{e.get('unit', '?')} {e.get('action', '')} ({e.get('status', '')})"
                        for e in st.external_unknown) or "none"
    approvals = ", ".join(f"gate {a.get('gate')!r} for {a.get('unit', '?')}"
                          for a in st.pending_approvals) or "none"
    alerts = [e.kind.removeprefix("alert.") for e in f.events if e.kind.startswith("alert.")]
    return ["", "## What is unverified", "",
            Claim("unverified.invalidated", "- Invalidated units: {units}.", {"units": _ids(invalid)}),
            Claim("unverified.orphans", "- Orphans: {orphans}.", {"orphans": orphan_text}),
            Claim("unverified.unknowns", "- External unknowns: {unknowns}.", {"unknowns": unknown}),
            Claim("unverified.approvals", "- Pending approvals: {approvals}.",
                  {"approvals": approvals}),
            Claim("unverified.alerts", "- Alerts: {alerts}.",
                  {"alerts": (f"{len(alerts)} ({', '.join(sorted(set(alerts)))})" if alerts
                              else "none")})]


def _history(f: _Facts) -> list[Line]:
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
            plan_n = (p.get("bound_object") or {}).get("plan_n")
            out.append(Claim("history.approval", "- Approval: gate {gate} answered {choice} by "
                             "{who} (bound to {plan}).",
                             {"gate": repr(p.get("gate")), "choice": repr(p.get("choice")),
                              "who": str(p.get("who")), "plan": f"plan-v{plan_n}"}))
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


def _orphan_claim(f: _Facts, p: dict[str, Any], causes: dict[str, str]) -> Claim:
    attempt = str(p.get("attempt"))
    unit = attempt.split("/")[0]
    later = sorted((c for c in f.checkpoints if c.kind == "unit-success" and c.unit == unit
                    and _att_no(c.attempt or "") > _att_no(attempt)), key=lambda c: c.version)
    outcome = (f"{unit} ran again as {later[0].attempt}" if later else
               f"{unit} has not run again yet")
    return Claim("history.orphan", "- Orphan: {attempt} staged {files} file(s) that no commit "
                 "references ({cause}); recovery quarantined them (read-only, never promoted) "
                 "and {outcome}.",
                 {"attempt": attempt, "files": str(len(p.get("files", []))),
                  "cause": causes.get(attempt, "the commit never happened"),
                  "outcome": outcome})


def _block_claim(f: _Facts, ev: Event) -> Claim:
    p = ev.payload
    calls = sum(1 for c in f.calls if c.attempt_id == ev.attempt_id)
    figures = "; ".join(
        f"{k} {_fmt(k, v.get('used', 0))} of {_fmt(k, v.get('limit', 0))} used, "
        f"{_fmt(k, v.get('requested', 0))} requested" if isinstance(v, dict) else f"{k} {v}"
        for k, v in sorted((p.get("figures") or {}).items())) or str(p.get("reason"))
    return Claim("history.blocked", "- Blocked ({kind}): {attempt} stopped {when}: {figures}. "
                 "Blocked, not failed: nothing was retried while it was blocked.",
                 {"kind": str(p.get("kind") or "needs a person"), "attempt": str(ev.attempt_id),
                  "when": ("before its model call" if calls == 0 else
                           f"after {_plural(calls, 'model call')}"),
                  "figures": figures})


def _raise_claim(f: _Facts, ev: Event) -> Claim:
    p = ev.payload
    old, new, used = p.get("old") or {}, p.get("new") or {}, p.get("used") or {}
    changes = ", ".join(f"{k} {_fmt(k, old[k]) if old.get(k) is not None else 'unlimited'} → "
                        f"{_fmt(k, v)}" for k, v in sorted(new.items()))
    kept = ", ".join(f"{k} used {_fmt(k, v)}" for k, v in sorted(used.items())) or "nothing used"
    blocked = [e for e in f.events if e.kind == "unit.blocked" and e.seq < ev.seq
               and (e.payload or {}).get("kind") == "budget"]
    prior = [e.seq for e in f.events if e.kind == "decision.budget_raise" and e.seq < ev.seq]
    blocked = [e for e in blocked if not prior or e.seq > max(prior)]
    ran = [f"{e.unit} then ran as {_after(f, e)}" for e in blocked]
    return Claim("history.budget_raise", "- Budget decision by {who}: {changes} ({reason}); "
                 "the counters were kept ({kept}); {outcome}.",
                 {"who": str(p.get("who")), "changes": changes, "reason": repr(p.get("reason")),
                  "kept": kept, "outcome": "; ".join(ran) or "no unit was waiting on it"})


def _after(f: _Facts, ev: Event) -> str:
    nxt = sorted((a for a in f.attempts if a.unit == ev.unit and a.status == "committed"
                  and _att_no(a.attempt_id) > _att_no(ev.attempt_id or "")),
                 key=lambda a: a.attempt_no)
    return nxt[0].attempt_id if nxt else "nothing yet (it has not run again)"


def _change_claims(f: _Facts, kind: str, p: dict[str, Any], cp: Checkpoint | None) -> list[Line]:
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
              {"invalidated": _ids(invalidated), "n_inv": _plural(len(invalidated), "unit"),
               "edges": ", ".join(sorted(e for e in edges if e)) or "no",
               "reused": _ids(reused), "n_reused": _plural(len(reused), "unit")})]
    for uid in invalidated:
        for text in p["invalidated"][uid]:
            out.append(Claim("history.why", "  - Why {unit}: {path}", {"unit": uid, "path": text}))
    if invalidated and cp is not None:
        again = [f.committed_after(u, cp.version) or f"{u} not yet" for u in invalidated]
        out.append(Claim("history.redone", "  - Ran again under the new version: {attempts}.",
                         {"attempts": ", ".join(again)}))
    return out


def _recoveries(f: _Facts) -> list[Line]:
    out: list[Line] = ["", "## Recoveries", ""]
    started = [e for e in f.events if e.kind == "recovery.started"]
    done = [e for e in f.events if e.kind == "recovery.done"]
    failed = sum(1 for e in f.events if e.kind == "recovery.failed")
    blocked = sum(1 for e in f.events if e.kind == "recovery.blocked")
    worked = [e for e in done if e.payload.get("did_work")]
    durations = [float(e.payload.get("duration_s", 0)) for e in done]
    out += [Claim("recovery.count", "- {n}: {done} succeeded, {failed} failed, {blocked} "
                  "blocked; {worked} found work to do.",
                  {"n": _plural(len(started), "recovery", "recoveries"), "done": str(len(done)),
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
        did = [f"{label} {', '.join(p[k])}" for k, label in
               (("fenced", "fenced"), ("orphans", "quarantined"), ("invalidated", "invalidated"))
               if p.get(k)]
        did += [f"applied {c}" for c in p.get("changes", [])]
        out.append(Claim("recovery.one", "- Recovery at checkpoint {head}: {did}; reused "
                         "{reused} current units, {tokens} tokens not spent again ({secs} s).",
                         {"head": head, "did": "; ".join(did) or "reconciled",
                          "reused": str(p.get("reused", 0)),
                          "tokens": _n(p.get("tokens_saved", 0)),
                          "secs": f"{float(p.get('duration_s', 0)):.3f}"}))
    executed = f.executed()
    redone = sorted(u for u, atts in executed.items() if len(atts) > 1)
    once = sum(1 for atts in executed.values() if len(atts) == 1)
    out += [Claim("recovery.redone", "- Units redone: {redone} ({n}); units that ran once: "
                  "{once}.", {"redone": _ids(redone), "n": _plural(len(redone), "unit"),
                              "once": str(once)}),
            Claim("recovery.saved", "- Tokens saved by reuse: {tokens} (tokens of the current "
                  "units each recovery kept instead of redoing).",
                  {"tokens": _n(sum(float(e.payload.get("tokens_saved", 0)) for e in done))})]
    return out


def narrative_lines(run: Run) -> list[Line]:
    """The narrative as lines: plain strings and figure-bearing ``Claim``s."""
    f = _gather(run)
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
    lines += _history(f) + _recoveries(f)
    return lines


def render(lines: list[Line]) -> str:
    return "\n".join(x.render() if isinstance(x, Claim) else x for x in lines) + "\n"


def narrative(run: Run) -> str:
    """The handover narrative (Markdown) for ``run``, from its stored state only."""
    return render(narrative_lines(run))


# -- the figure check ------------------------------------------------------------------------
def _pattern(template: str) -> tuple[re.Pattern[str], list[str]]:
    parts, names = [], []
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<g{len(names)}>.+?)")
            names.append(name)
    return re.compile("".join(parts)), names


def compare(expected: list[Line], text: str) -> list[Mismatch]:
    """Every claim of ``expected`` must appear in ``text`` with the same figures, and every
    other line of ``text`` holding a digit must be one of ``expected``'s fixed lines."""
    lines = [line.rstrip() for line in text.splitlines()]
    used: set[int] = set()
    out: list[Mismatch] = []
    groups: dict[str, list[Claim]] = {}
    for line in expected:
        if isinstance(line, Claim):
            groups.setdefault(line.template, []).append(line)
    # Longer literal prefixes first, so a general template never takes a specific line.
    for template in sorted(groups, key=lambda t: -len(t.split("{", 1)[0])):
        claims = groups[template]
        rx, names = _pattern(template)
        hits = [(i, m) for i, line in enumerate(lines) if i not in used
                and (m := rx.fullmatch(line))]
        for k, claim in enumerate(claims):
            if k >= len(hits):
                out.append(Mismatch(key=claim.key, state=claim.render()))
                continue
            i, m = hits[k]
            used.add(i)
            for j, name in enumerate(names):
                got, want = m.group(f"g{j}").strip(), claim.values[name].strip()
                if got != want:
                    out.append(Mismatch(key=claim.key, field=name, narrative=got, state=want))
        for i, _m in hits[len(claims):]:
            used.add(i)
            out.append(Mismatch(key=claims[0].key, narrative=lines[i]))
    fixed = {line for line in expected if isinstance(line, str)}
    for i, line in enumerate(lines):
        if i not in used and line not in fixed and re.search(r"\d", line):
            out.append(Mismatch(key="unexpected", narrative=line))
    return out


def check_narrative(run: Run, text: str) -> list[Mismatch]:
    """Compare every figure in ``text`` with the run's state. Any mismatch is recorded as an
    ``alert.narrative_mismatch`` event; the state wins (``narrative(run)`` gives its text)."""
    mismatches = compare(narrative_lines(run), text)
    if mismatches:
        from .handover import redact

        run.store.append_event(run.run_id, "alert.narrative_mismatch", branch_id=run.branch_id,
                               payload={
                                   "message": f"the narrative disagrees with the stored state in "
                                   f"{_plural(len(mismatches), 'place')}; the state wins",
                                   "mismatches": [redact(m.render())[:240]
                                                  for m in mismatches[:20]]})
    return mismatches


__all__ = ["Claim", "Mismatch", "NARRATIVE_VERSION", "check_narrative", "compare", "narrative",
           "narrative_lines", "render"]
