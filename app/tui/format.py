"""Plain-text helpers shared by the TUI screens: state symbols, figures, previews.

Everything here is a pure function of engine objects (RunStatus, Preview, …) so the
screens stay small and the wording is the same on every screen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from keepstep.engine.plan import compact_ids

# One symbol per state; colour is extra (component classes), never the only signal.
STATE_SYMBOLS = {
    "succeeded": "✓", "invalidated": "↺", "blocked": "◼", "failed": "✗",
    "running": "●", "pending": "·", "cancelled": "⊘",
}
STATE_WORDS = {"succeeded": "current"}
# Colour is extra to the symbol and the word (theme-independent rich styles).
STATE_STYLES = {
    "succeeded": "green", "invalidated": "yellow", "blocked": "bold red", "failed": "red",
    "running": "bold cyan", "pending": "dim", "cancelled": "dim",
}
DECISION_LABELS = {
    "claim": "▶ ready", "done": "✓ done", "blocked": "◼ blocked", "waiting": "… waiting",
}


def state_symbol(state: str) -> str:
    return STATE_SYMBOLS.get(state, "?")


def state_word(state: str) -> str:
    return STATE_WORDS.get(state, state)


def ids(units: Iterable[str]) -> str:
    """'U27–U30, U33' (or 'none')."""
    text = compact_ids(list(units))
    return text or "none"


def tokens(n: float) -> str:
    n = int(n)
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{round(n / 1000)}k" if n >= 1000 else str(n)


def figure(key: str, value: float) -> str:
    """A budget figure in its unit: $ for cost, minutes for wall time, k/M for tokens."""
    if key == "cost":
        return f"${value:.2f}"
    if key == "wall_time_s":
        return f"{int(value // 60)}m"
    if key in ("tokens", "storage_bytes"):
        return tokens(value)
    return f"{value:g}"


def parse_ts(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ago(value: str | float | None, now: float) -> str:
    """'12 seconds ago', '3 minutes ago', '4 days ago' (humanize), or 'never'."""
    import humanize

    ts = parse_ts(value)
    if ts is None:
        return "never"
    return humanize.naturaldelta(max(0.0, now - ts)) + " ago"


def estimate_text(estimate: Mapping[str, Any]) -> str:
    calls = estimate.get("calls", 0) or 0
    cost = estimate.get("cost", 0.0) or 0.0
    parts = [f"~{calls:g} calls"]
    if estimate.get("tokens"):
        parts.append(f"~{tokens(estimate['tokens'])} tokens")
    parts.append(f"~${cost:.2f}")
    return ", ".join(parts)


def option_line(option: Mapping[str, Any]) -> str:
    """'reuse 21 units · redo U27, U31, U35, U36 (~4 calls, ~$0.00)'."""
    reuse = len(option.get("reuse", []))
    redo = option.get("redo", [])
    text = f"reuse {reuse} units · "
    text += f"redo {ids(redo)} ({estimate_text(option.get('estimate', {}))})" if redo else \
        "redo nothing"
    return text


def binding_text(b: Any) -> str:
    """One bound value as a person reads it (a verdict names its failing checks)."""
    b = b if isinstance(b, Mapping) else b.model_dump()
    text = f"{b.get('ref')} {b.get('shown')}" if b.get("kind") == "artifact" \
        else str(b.get("shown"))
    return text + (" [changed since the last decision]" if b.get("changed") else "")


def bound_text(bound: Mapping[str, Any], expires_days: float | None,
               bindings: Sequence[Any] = ()) -> str:
    """What a decision binds: the request's typed ``bindings`` (each value and verdict now)
    when given, else the older bound object's plan version, contract and artifact hashes."""
    parts = [binding_text(b) for b in bindings]
    if parts:
        bound = {}
    if "plan_n" in bound:
        parts.append(f"plan-v{bound['plan_n']}")
    if bound.get("contract_hash"):
        parts.append(f"contract sha256:{str(bound['contract_hash'])[:8]}…")
    if bound.get("artifact_unit"):
        arts = bound.get("artifact") or []
        first = f" sha256:{str(arts[0])[:8]}…" if arts else ""
        parts.append(f"artifact of {bound['artifact_unit']}{first}")
    if expires_days is not None:
        parts.append(f"expires {expires_days:g} days after approval")
    return " · ".join(parts) or "nothing (no bound object)"


def plan_changes(saved: Any, edited: Any) -> list[str]:
    """What writing ``edited`` over ``saved`` changes, one line per unit or gate (and the
    [plan] table): the keys that differ, the tables added and removed. Both are engine Plans;
    the comparison is on their TOML form, as save_plan writes it."""
    old, new = saved.to_toml_dict(), edited.to_toml_dict()
    lines = []
    if old.get("plan") != new.get("plan"):
        keys = sorted(k for k in {*old.get("plan", {}), *new.get("plan", {})}
                      if old.get("plan", {}).get(k) != new.get("plan", {}).get(k))
        lines.append(f"  [plan] {', '.join(keys)}")
    for table in ("unit", "gate"):
        before = {str(t.get("id")): t for t in old.get(table, [])}
        after = {str(t.get("id")): t for t in new.get(table, [])}
        for tid, entry in after.items():
            if tid not in before:
                lines.append(f"  + {table} {tid} (new)")
                continue
            keys = sorted(k for k in {*entry, *before[tid]} if entry.get(k) != before[tid].get(k))
            if keys:
                shown = ", ".join(f"{k} {_short(before[tid].get(k))} → {_short(entry.get(k))}"
                                  for k in keys)
                lines.append(f"  ~ {table} {tid}: {shown}")
        lines.extend(f"  - {table} {tid} (removed)" for tid in before if tid not in after)
    return lines


def _short(value: Any, width: int = 40) -> str:
    text = "(none)" if value in (None, [], {}, "") else repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def preview_lines(preview: Any, *, limit: int = 40) -> list[str]:
    """The preview as lines: summary, each invalidated unit with its path, reuse, estimate."""
    lines = [preview.summary, ""]
    if preview.invalidated:
        lines.append(f"Invalidated ({len(preview.invalidated)}):")
        # Explanations are built on first read: touch only the ones shown.
        for n, uid in enumerate(sorted(preview.invalidated)):
            if n >= limit:
                lines.append(f"  … and {len(preview.invalidated) - limit} more")
                break
            explanations = preview.invalidated[uid]
            why = explanations[0].render() if explanations else "(no explanation recorded)"
            lines.append(f"  ↺ {uid}  {why}")
    else:
        lines.append("Invalidated: none")
    lines.append(f"Reused ({len(preview.reused)}): {ids(preview.reused)}")
    if preview.will_run:
        lines.append(f"Will run ({len(preview.will_run)}): {ids(preview.will_run)}")
    total = preview.estimate.total
    lines.append(f"Estimated cost: ~{total.calls} calls, ~{tokens(total.tokens)} tokens, "
                 f"${total.cost:.2f}")
    return lines


def takeover_lines(preview: Any, *, who: str = "") -> list[str]:
    """An engine TakeoverPreview as lines: summary, invalidated with paths, held, waiting,
    to run, reused, estimate, notes, and what confirming records."""
    lines = [preview.summary, ""]
    if preview.invalidated:
        lines.append(f"Invalidated ({len(preview.invalidated)}):")
        for uid, explanations in preview.invalidated.items():
            why = explanations[0].render() if explanations else "(no explanation recorded)"
            lines.append(f"  ↺ {uid}  {why}")
    else:
        lines.append("Invalidated: none")
    for label, units in (("Held back", preview.held), ("Waiting behind it", preview.waiting),
                         ("To run", preview.to_run)):
        if units:
            lines.append(f"{label} ({len(units)}): {ids(units)}")
    lines.append(f"Reused ({len(preview.reused)}): {ids(preview.reused)}")
    est = preview.estimate
    lines.append(f"Estimated cost: ~{est.calls} calls, ~{tokens(est.tokens)} tokens, "
                 f"${est.cost:.2f}")
    lines += [f"· {note}" for note in preview.notes]
    lines += ["", f"Recorded: {preview.records}" + (f" (by {who})" if who else "")]
    return lines


def progress_text(event: Mapping[str, Any]) -> str:
    """One line for an engine on_event callback that is not a claim or an attempt."""
    kind = event.get("kind", "")
    if kind == "decision":
        unit = event.get("unit")
        reasons = "; ".join(event.get("reasons") or [])
        return f"decided: claim {unit}" if event.get("decision") == "claim" and unit else \
            f"decided: {event.get('decision')}" + (f" ({reasons})" if reasons else "")
    if kind.startswith("recovery."):
        return f"recovery {kind.removeprefix('recovery.')}"
    return kind


def error_text(exc: BaseException) -> tuple[str, str]:
    """(message, hint) of an engine or storage error, without the hint repeated."""
    hint = str(getattr(exc, "hint", "") or "")
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    if not message:
        message = type(exc).__name__
    return message, hint


__all__ = ["DECISION_LABELS", "STATE_STYLES", "STATE_SYMBOLS", "STATE_WORDS", "ago", "bound_text",
           "error_text", "estimate_text", "event_line", "figure", "ids",
           "option_line", "parse_ts", "plan_changes", "preview_lines", "progress_text",
           "state_symbol", "state_word", "takeover_lines", "tokens"]


def event_line(event: Any) -> str:
    """One line of the recent-events tail: time, what happened, to what."""
    ts = str(getattr(event, "ts", ""))[11:19]
    kind = str(getattr(event, "kind", ""))
    who = getattr(event, "attempt_id", None) or getattr(event, "unit", None) or ""
    payload = getattr(event, "payload", {}) or {}
    words = {
        "checkpoint.committed": "committed", "unit.claimed": "started",
        "unit.succeeded": "succeeded", "lease.fenced": "lease fenced",
        "attempt.failed": "failed", "unit.blocked": "blocked", "approval.requested": "asks",
        "approval.decided": "answered", "decision.budget_raise": "budget raised",
        "decision.plan_change": "plan changed", "recovery.done": "recovered",
        "run.done": "run done", "run.blocked": "run blocked",
    }
    text = words.get(kind, kind)
    extra = ""
    if kind == "approval.decided":
        extra = f" {payload.get('choice')!r}"
    elif kind in ("attempt.failed", "unit.blocked"):
        extra = f": {payload.get('message') or payload.get('reason') or ''}"
    return f"{ts} {who} {text}{extra}".replace("  ", " ").strip()
