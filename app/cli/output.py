"""Plain-text rendering for the CLI: tables, the dashboard, the live progress line.

Pure functions of the values they are given (plus an optional ``now``), so they are
easy to test and reuse from the demo. Nothing here imports the engine at module level:
the CLI's start-up must stay light.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from keepstep.app.cli.json_text import indented_json

# `keepstep VERB` or `keepstep GROUP SUB` as the engine writes them (see commands_for).
COMMAND_WORDS = re.compile(r"`keepstep (?:(?:budget|recovery|effects|sources|keys) "
                           r"[a-z][a-z-]*|[a-z][a-z-]*)")
_DIR_WORD = re.compile(r"(`keepstep (?:(?:budget|recovery|effects|sources|keys) [a-z][a-z-]*|"
                       r"[a-z][a-z-]*)) DIR(?= )")
OFFLINE_MODEL = "local/keepstep-offline"
OFFLINE_NOTE = "the offline heuristic: deterministic rules, no language model, no network"

_UNICODE_SYMBOLS = {
    "succeeded": "✓", "pending": "·", "running": "▶", "blocked": "◼", "failed": "✗",
    "invalidated": "↺", "cancelled": "⊘", "orphan": "⚠", "bar_full": "█", "bar_empty": "░",
    "arrow": "→", "dot": "·",
}
_ASCII_SYMBOLS = {
    "succeeded": "+", "pending": ".", "running": ">", "blocked": "#", "failed": "x",
    "invalidated": "~", "cancelled": "-", "orphan": "!", "bar_full": "#", "bar_empty": "-",
    "arrow": "->", "dot": "|",
}


def symbols(stream: Any = None) -> dict[str, str]:
    """Unicode symbols when the output stream can encode them, ASCII otherwise."""
    encoding = getattr(stream or sys.stdout, "encoding", None) or "ascii"
    try:
        "".join(_UNICODE_SYMBOLS.values()).encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return dict(_ASCII_SYMBOLS)
    return dict(_UNICODE_SYMBOLS)


def find_project(start: Path | None = None) -> Path | None:
    """The nearest folder holding keepstep.toml: ``start`` (default: the working directory)
    or one of its parents — the way git finds its repository."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "keepstep.toml").is_file():
            return folder
    return None


def here(root: Path) -> str:
    """``"DIR "`` for a command a person types now, or ``""`` when they are inside it."""
    found = find_project()
    if found is not None and found == Path(root).resolve():
        return ""
    return f"{shlex.quote(str(root))} "


def commands_for(text: str, root: Path) -> str:
    """The engine writes commands as they run inside the project (``keepstep resume --run
    R``); outside it, put the project path in (``keepstep resume /path/to/proj --run R``)."""
    # Some engine texts hold a literal DIR placeholder (`keepstep budget raise DIR --run R`):
    # it goes, and the real path goes in below when the person is elsewhere.
    text = _DIR_WORD.sub(lambda m: m.group(1), text)
    prefix = here(root)
    if not prefix:
        return text
    return COMMAND_WORDS.sub(lambda m: f"{m.group(0)} {prefix.rstrip()}", text)


# --- generic ----------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "") -> str:
    """A left-aligned text table with a header row and a rule under it."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return (indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()

    out = [line(cells[0]), indent + "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def to_json(data: Any) -> str:
    """``json.dumps(data, indent=2, ensure_ascii=False, default=str)``, encoded faster."""
    return indented_json(data)


def _num(value: float) -> str:
    value = float(value)
    if abs(value) >= 10_000_000:
        return f"{value / 1_000_000:.0f}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    return str(int(value)) if value.is_integer() else f"{value:.2f}"


def _money(value: float) -> str:
    return f"${value:.2f}"


def bar(used: float, limit: float, *, width: int = 16, sym: Mapping[str, str] | None = None) -> str:
    sym = sym or symbols()
    frac = 0.0 if limit <= 0 else min(1.0, max(0.0, used / limit))
    full = round(frac * width)
    return sym["bar_full"] * full + sym["bar_empty"] * (width - full)


def model_line(models: Iterable[str]) -> str:
    """One line naming the model(s); says plainly when it is the offline heuristic."""
    names = sorted(set(models))
    if names == [OFFLINE_MODEL]:
        return f"model: {OFFLINE_MODEL} — {OFFLINE_NOTE}"
    return "model: " + ", ".join(names)


# --- dashboard --------------------------------------------------------------------------
def _ago(seconds: float) -> str:
    import humanize

    return humanize.naturaldelta(max(0.0, seconds))


def _since(iso: str | None, now: float) -> str:
    if not iso:
        return "no commit yet"
    import datetime as dt

    try:
        ts = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return iso
    return f"{iso[:19].replace('T', ' ')} UTC ({_ago(now - ts)} ago)"


def unit_rows(status: Any, phases: Mapping[str, str] | None,
              sym: Mapping[str, str]) -> list[str]:
    """Units grouped by phase (plan order), each with its state symbol."""
    groups: dict[str, list[str]] = {}
    for uid, view in status.units.items():
        phase = (phases or {}).get(uid) or getattr(view, "phase", "") or "units"
        groups.setdefault(phase, []).append(f"{uid} {sym.get(view.state, '?')}")
    width = max((len(p) for p in groups), default=5)
    lines = []
    for phase, cells in groups.items():
        # Wrap long phases so a 36-unit plan still fits 100 columns.
        for i in range(0, len(cells), 10):
            label = phase if i == 0 else ""
            lines.append(f"  {label.ljust(width)}  " + " ".join(cells[i:i + 10]))
    return lines


def budget_lines(budget: Mapping[str, Any], sym: Mapping[str, str]) -> list[str]:
    used: Mapping[str, float] = budget.get("used", {})
    limits: Mapping[str, float] = budget.get("limits", {})
    names = [k for k in ("calls", "tokens", "cost", "tool_calls", "retries", "recoveries",
                         "wall_time_s", "storage_bytes") if k in used or k in limits]
    names += sorted(k for k in set(used) | set(limits) if k not in names)
    lines = []
    for k in names:
        fmt = _money if k == "cost" else wall_time if k == "wall_time_s" else _num
        label = "wall time" if k == "wall_time_s" else k
        u = float(used.get(k, 0))
        if k in limits:
            lim = float(limits[k])
            lines.append(f"  {label:<11}{fmt(u):>8} / {fmt(lim):<8} {bar(u, lim, sym=sym)}"
                         f"  left {fmt(lim - u)}")
        else:
            lines.append(f"  {label:<11}{fmt(u):>8}   (no limit)")
    return lines or ["  nothing used yet, no limits set"]


def wall_time(seconds: float) -> str:
    """Seconds as a person reads a duration: '21 s', '3 min 20 s', '2 h 5 min'."""
    import humanize

    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    text = humanize.precisedelta(seconds, minimum_unit="seconds" if seconds < 3600
                                 else "minutes", format="%0.0f")
    return (text.replace(" hours", " h").replace(" hour", " h").replace(" minutes", " min")
            .replace(" minute", " min").replace(" seconds", " s").replace(" second", " s")
            .replace(" and ", " ").replace(",", ""))


def needs_lines(status: Any, sym: Mapping[str, str]) -> list[str]:
    """What only a person can settle, each with what to do (nothing else)."""
    lines = []
    for need in getattr(status, "needs", []):
        mark = {"approval": "?", "budget": sym["blocked"], "failed": sym["failed"],
                "effect": "!", "expert": sym["blocked"]}.get(need.kind, "!")
        lines.append(f"  {mark} {need.message}")
        lines.append(f"      {sym['arrow']} {need.action}"
                     + (f": {need.command}" if need.command else ""))
    return lines or ["  nothing: the run needs no decision from you"]


def in_flight_lines(status: Any, now: float, sym: Mapping[str, str]) -> list[str]:
    from keepstep.engine.views import fmt_duration

    lines = []
    for f in getattr(status, "in_flight", []):
        since = f" · {fmt_duration(now - f.started_ts)}" if f.started_ts else ""
        left = f.expires_at - now
        when = "lease expired" if f.expired or left <= 0 else f"lease {fmt_duration(left)} left"
        lines.append(f"  {sym['running']} {f.unit} {f.title[:40]} · {f.step or 'started'}"
                     f"{since} · {f.owner} · {when}")
    return lines


def dashboard_text(status: Any, *, project: str = "", phases: Mapping[str, str] | None = None,
                   models: Iterable[str] = (), now: float | None = None,
                   sym: Mapping[str, str] | None = None) -> str:
    """The run dashboard as plain text (the TUI's dashboard, without the boxes)."""
    sym = sym or symbols()
    now = time.time() if now is None else now
    c = status.counts
    title = " · ".join(x for x in ("keepstep", project, f"run {status.run_id} ({status.branch})")
                       if x)
    lines = [
        title,
        f"{status.plan_version} {sym['dot']} {status.input_version} {sym['dot']} checkpoint "
        f"{status.head_version} ({status.checkpoint_commits} commits) {sym['dot']} "
        f"{status.decision}",
    ]
    models = list(models) or list(getattr(status, "models", []))
    if models:
        lines.append(model_line(models))
    lines += ["", "Units", *unit_rows(status, phases, sym)]
    lines.append(
        f"  {sym['succeeded']} current {c.get('current', 0)}  "
        f"superseded {c.get('superseded', 0)}  "
        f"{sym['invalidated']} invalidated {c.get('invalidated', 0)}  "
        f"{sym['blocked']} blocked {c.get('blocked', 0)}  "
        f"{sym['failed']} failed {c.get('failed', 0)}  "
        f"{sym['orphan']} orphans {c.get('orphans', 0)}  "
        f"ready {c.get('ready', 0)}  running {c.get('running', 0)}  "
        f"({status.progress_pct:g}% current)"
    )
    lines += ["", "Budget", *budget_lines(status.budget, sym)]
    lines += ["", "Needs you", *needs_lines(status, sym)]
    lines += ["", "Now", *in_flight_lines(status, now, sym)]
    lines.append(f"  last commit  {_since(status.last_commit_at, now)}")
    executors = getattr(status, "executors", [])
    if executors:
        lines += ["", "Executors"]
        lines += [f"  {e['host']}  {e['executor']}  leases {e['leases']} ({e['live']} live)  "
                  f"last heartbeat {e['heartbeat_age_s']:g} s ago" for e in executors]
    lines.append(f"  next   {status.next_action}")
    alerts = [a for a in status.alerts if a.get("kind") not in ("nothing_ready",)]
    if alerts:
        lines += ["", "Alerts"]
        lines += [f"  {sym['orphan']} {a.get('kind', 'alert')}: {a.get('message', '')}".rstrip(": ")
                  for a in alerts]
    return "\n".join(lines)


def outputs_text(outputs: Sequence[Any], root: Any = None) -> str:
    """A unit's committed outputs: name, size, sha256 prefix, whether the file still matches."""
    import humanize

    if not outputs:
        return "  outputs: none committed yet"
    lines = [f"  outputs ({'current' if outputs[0].current else 'invalidated'} record "
             f"{outputs[0].attempt}):"]
    for o in outputs:
        size = humanize.naturalsize(o.size) if o.size is not None else "missing"
        state = "matches its record" if o.matches else "DOES NOT match its record"
        lines.append(f"    {o.name:<24} {size:>9}  sha256 {o.sha256[:16]}…  {state}")
    lines.append("  read one with `keepstep export` (deliverables) or, in Python, "
                 "run.output(unit, name)")
    return "\n".join(lines)


def runs_table(rows: Iterable[Mapping[str, Any]]) -> str:
    return table(["run", "plan", "inputs", "checkpoint", "state", "next"],
                 [[r["run_id"], r.get("plan_version", ""), r.get("input_version", ""),
                   r.get("head_version", ""), r.get("decision", ""), r.get("next_action", "")]
                  for r in rows])


# --- live progress ------------------------------------------------------------------------
def _short(payload: Mapping[str, Any], limit: int = 90) -> str:
    parts = []
    for k, v in payload.items():
        if v in (None, [], {}, ""):
            continue
        shown = v if isinstance(v, str | int | float) else json.dumps(v, default=str)
        parts.append(f"{k}={shown}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def progress_line(event: Mapping[str, Any], sym: Mapping[str, str] | None = None) -> str | None:
    """One line for a run event (``on_event`` payload), or None when it adds nothing."""
    sym = sym or symbols()
    kind = str(event.get("kind", ""))
    rest = {k: v for k, v in event.items() if k != "kind"}
    if kind == "claimed":
        return f"{sym['running']} {event.get('unit')} started (attempt {event.get('attempt')}, " \
               f"token {event.get('token')})"
    if kind == "attempt":
        outcome = str(event.get("outcome", ""))
        mark = {"committed": sym["succeeded"], "blocked": sym["blocked"], "failed": sym["failed"],
                "orphaned": sym["orphan"], "cancelled": sym["cancelled"]}.get(outcome, "·")
        detail = f": {event['detail']}" if event.get("detail") else ""
        return f"{mark} {event.get('attempt')} {outcome}{detail}"
    if kind == "decision":
        decision = event.get("decision")
        if decision == "claim":
            return None
        reasons = "; ".join(event.get("reasons") or [])
        return f"{sym['arrow']} {decision}" + (f": {reasons}" if reasons else "")
    if kind.startswith("recovery."):
        step = kind.removeprefix("recovery.")
        return f"  recovery {step}" + (f" {_short(rest)}" if rest else "")
    return f"  {kind}" + (f" {_short(rest)}" if rest else "")


# --- ledgers and lists --------------------------------------------------------------------
CALL_FIELDS = ("unit", "attempt", "round", "model", "tokens_in", "tokens_out", "cost", "outcome")


def call_row(call: Any) -> dict[str, Any]:
    """One model call as the stable JSON shape of ``keepstep calls --json``."""
    return {"unit": call.unit, "attempt": call.attempt_id, "round": call.round,
            "model": call.model, "tokens_in": call.tokens_in, "tokens_out": call.tokens_out,
            "cost": call.cost, "outcome": call.outcome or call.status}


def calls_text(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "no model calls recorded"
    body = table(CALL_FIELDS, [[r[k] if k != "cost" else f"{r[k]:.4f}" for k in CALL_FIELDS]
                               for r in rows])
    tokens = sum(r["tokens_in"] + r["tokens_out"] for r in rows)
    cost = sum(r["cost"] for r in rows)
    return f"{body}\n{len(rows)} call(s), {tokens} tokens, {_money(cost)}"


def events_text(events: Sequence[Any]) -> str:
    if not events:
        return "no events"
    return table(["seq", "time", "kind", "unit", "details"],
                 [[e.seq, e.ts, e.kind, e.attempt_id or e.unit or "", _short(e.payload, 70)]
                  for e in events])


def approvals_text(requests: Sequence[Mapping[str, Any]], run_id: str, root: str) -> str:
    if not requests:
        return "no pending approvals"
    out = []
    for req in requests:
        gate = req.get("gate") or req.get("gate_id") or "?"
        out.append(f"gate {gate}" + (f" (unit {req['unit']})" if req.get("unit") else ""))
        if req.get("question"):
            out.append(f"  {req['question']}")
        for opt in req.get("options") or []:
            if isinstance(opt, Mapping):
                est = opt.get("estimate") or {}
                redo = opt.get("redo") or []
                line = (f"  - {opt.get('label')}: reuse {len(opt.get('reuse') or [])} unit(s), "
                        f"redo {len(redo)}" + (f" ({', '.join(redo)})" if redo else "")
                        + (f", ~{float(est.get('calls', 0)):g} call(s)" if est else ""))
                if opt.get("note"):
                    line += f" — {opt['note']}"
                if not opt.get("available", True):
                    line += " [not accepted now]"
                out.append(line)
            else:
                out.append(f"  - {opt}")
        bindings = [b for b in req.get("bindings") or [] if isinstance(b, Mapping)]
        for b in bindings:
            line = f"  binds {b.get('ref')}: {b.get('shown')}"
            out.append(line + (" (changed since the last decision)" if b.get("changed") else ""))
        binds = req.get("bound_object")
        if binds and not bindings:
            out.append(f"  binds: {_short(binds, 80)}")
        first = next((o.get("label") for o in req.get("options") or []
                      if isinstance(o, Mapping) and o.get("available", True)), None)
        where = f"{root} " if root else ""
        out.append(f"  answer: keepstep approve {where}{gate} --run {run_id} --choice "
                   f"{shlex.quote(str(first or '...'))}")
    return "\n".join(out)


def chain_text(report: Any) -> str:
    if report.ok:
        return f"chain OK: {report.checked} checkpoint(s) verified (links and state hashes)"
    lines = [f"chain BROKEN: {len(report.problems)} problem(s) in {report.checked} checkpoint(s)"]
    lines += [f"  - v{p.version} ({p.branch_id}): {p.problem}" for p in report.problems]
    return "\n".join(lines)


def render_any(value: Any) -> str:
    """Text for an engine result of a shape this module does not know yet."""
    if isinstance(value, str):
        return value
    if hasattr(value, "render") and callable(value.render):
        return str(value.render())
    if hasattr(value, "model_dump"):
        return to_json(value.model_dump(mode="json"))
    return to_json(value)


def preview_text(preview: Any) -> str:
    """A dry run (engine.explain.Preview) as text: changes, invalidated with paths, reused."""
    lines = [preview.summary, ""]
    if not preview.changes:
        lines.append("no changes against the run's baseline: a resume reuses everything")
        return "\n".join(lines).strip()
    lines.append("Changes")
    lines += [f"  - {c.kind}: {c.detail}" for c in preview.changes]
    if preview.invalidated:
        lines += ["", "Invalidated"]
        for uid, explanations in preview.invalidated.items():
            lines.append(f"  {uid}")
            lines += [f"    {e.render()}" for e in explanations]
    if preview.will_run:
        lines += ["", "Will run: " + ", ".join(preview.will_run)]
    if preview.reused:
        lines += ["", f"Reused ({len(preview.reused)}): " + ", ".join(preview.reused)]
    est = preview.estimate.total
    lines += ["", f"Estimated re-do: {est.calls} call(s), {est.tokens} tokens, "
                  f"{_money(est.cost)}"]
    return "\n".join(lines)
