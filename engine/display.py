"""HTML for notebooks (``_repr_html_``) and the handover's index page.

Plain tables with inline styles: no scripts, no external assets, every value escaped. The
functions take the engine's models (RunStatus, Preview, UnitExplanation) and return a string;
they read nothing from storage, so a notebook shows exactly what the model holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from .dag_svg import STATE_COLORS

TABLE = ('style="border-collapse:collapse;margin:4px 0 10px 0;font-size:12px;'
         'text-align:left"')
CELL = 'style="border:1px solid #d0d7de;padding:3px 8px;vertical-align:top;text-align:left"'
HEAD = ('style="border:1px solid #d0d7de;padding:3px 8px;background:#f6f8fa;'
        'text-align:left"')
BUDGET_ORDER = ("calls", "tokens", "cost", "tool_calls", "retries", "recoveries", "wall_time_s",
                "storage_bytes")


class Raw(str):
    """A cell value that is already HTML (built by this module, escaped where needed)."""


def cell(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return escape(f"{value:,.2f}" if not value.is_integer() else f"{int(value):,}")
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return escape(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, caption: str = "") -> str:
    """An HTML table; cells are escaped unless they are ``Raw``."""
    out = [f"<table {TABLE}>"]
    if caption:
        out.append(f'<caption style="text-align:left;font-weight:bold;padding:2px 0">'
                   f"{escape(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th {HEAD}>{escape(h)}</th>" for h in headers)
               + "</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td {CELL}>{cell(v)}</td>" for v in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def state_badge(state: str) -> Raw:
    fill, stroke = STATE_COLORS.get(state, STATE_COLORS["pending"])
    return Raw(f'<span style="background:{fill};border:1px solid {stroke};border-radius:3px;'
               f'padding:0 5px;white-space:nowrap">{escape(state)}</span>')


def key_values(pairs: Iterable[tuple[str, Any]], *, caption: str = "") -> str:
    return table(["", ""], pairs, caption=caption).replace(
        f"<thead><tr><th {HEAD}></th><th {HEAD}></th></tr></thead>", "")


def budget_rows(budget: Mapping[str, Mapping[str, float]]) -> list[list[Any]]:
    used, limits = budget.get("used", {}), budget.get("limits", {})
    names = [k for k in BUDGET_ORDER if k in used or k in limits]
    names += sorted(k for k in set(used) | set(limits) if k not in names)
    rows = []
    for k in names:
        u = float(used.get(k, 0))
        lim = limits.get(k)
        money = k == "cost"

        def fmt(v: float | None, money: bool = money) -> Any:
            if v is None:
                return "no limit"
            return f"${v:,.2f}" if money else (round(v, 1) if not float(v).is_integer() else v)

        rows.append([k, fmt(u), fmt(lim), fmt(None if lim is None else float(lim) - u)])
    return rows


def status_html(status: Any) -> str:
    """The run dashboard (engine.status.RunStatus) as HTML tables."""
    c = status.counts
    head = key_values([
        ("run", f"{status.run_id} ({status.branch})"),
        ("versions", f"{status.plan_version} · {status.input_version}"),
        ("latest checkpoint", f"{status.head_version} ({status.checkpoint_commits} commits: "
         + ", ".join(f"{n} {k}" for k, n in sorted(status.commits_by_kind.items())) + ")"),
        ("decision", Raw(f"<b>{escape(status.decision)}</b> — "
                         f"{escape('; '.join(status.reasons))}")),
        ("next action", status.next_action),
        ("last commit", status.last_commit_at or "no commit yet"),
        ("progress", f"{status.progress_pct:g}% current ({status.view_version})"),
    ], caption=f"keepstep run {status.run_id}")
    counts = table(["current", "invalidated", "orphans", "ready", "running", "blocked",
                    "failed", "pending"],
                   [[c.get(k, 0) for k in ("current", "invalidated", "orphans", "ready",
                                           "running", "blocked", "failed", "pending")]],
                   caption="Counts")
    budget = table(["counter", "used", "limit", "left"], budget_rows(status.budget),
                   caption="Budget")
    units = table(["unit", "state", "attempts", "current attempt", "reason"],
                  [[uid, state_badge(v.state), v.attempts, v.current_attempt, v.reason]
                   for uid, v in status.units.items()], caption="Units")
    parts = [head, counts, budget]
    if status.pending_approvals:
        parts.append(table(["gate", "unit", "question", "options"],
                           [[a.get("gate") or a.get("gate_id"), a.get("unit"), a.get("question"),
                             ", ".join(str(o.get("label", o)) if isinstance(o, Mapping) else str(o)
                                       for o in a.get("options", []))]
                            for a in status.pending_approvals], caption="Pending approvals"))
    if status.external_unknown:
        parts.append(table(["unit", "action", "status", "key"],
                           [[e.get("unit"), e.get("action"), e.get("status"), e.get("idem_key")]
                            for e in status.external_unknown], caption="External unknowns"))
    if status.leases:
        parts.append(table(["attempt", "owner", "token", "expired"],
                           [[x.get("attempt"), x.get("owner"), x.get("token"), x.get("expired")]
                            for x in status.leases], caption="Leases"))
    if status.alerts:
        parts.append(table(["alert", "unit", "message"],
                           [[a.get("kind"), a.get("unit"), a.get("message", "")]
                            for a in status.alerts], caption="Alerts"))
    parts.append(units)
    return '<div class="keepstep-status">' + "".join(parts) + "</div>"


def preview_html(preview: Any) -> str:
    """A dry run (engine.explain.Preview) as HTML: changes, invalidated units with their
    explanation paths, what runs and what is reused, and the estimated cost per unit."""
    parts = [f"<p><b>Preview</b> (nothing is committed): {escape(preview.summary)}</p>"]
    if preview.changes:
        parts.append(table(["change", "origin", "edge", "detail"],
                           [[c.kind, c.origin, getattr(c.edge, "value", c.edge), c.detail]
                            for c in preview.changes], caption="Changes"))
    if preview.invalidated:
        parts.append(table(["unit", "why (origin → edges → unit)"],
                           [[uid, Raw("<br>".join(escape(e.render()) for e in exps))]
                            for uid, exps in preview.invalidated.items()],
                           caption=f"Invalidated ({len(preview.invalidated)})"))
    parts.append(key_values([("will run", ", ".join(preview.will_run) or "nothing"),
                             (f"reused ({len(preview.reused)})",
                              ", ".join(preview.reused) or "nothing")]))
    est = preview.estimate
    rows = [[u.unit, u.calls, u.tokens, f"${u.cost:.2f}", u.basis] for u in est.units]
    rows.append([Raw("<b>total</b>"), est.total.calls, est.total.tokens, f"${est.total.cost:.2f}",
                 ""])
    parts.append(table(["unit", "calls", "tokens", "cost", "basis"], rows,
                       caption="Estimated cost"))
    return '<div class="keepstep-preview">' + "".join(parts) + "</div>"


def explanation_html(explanation: Any) -> str:
    """Why a unit is in its state (engine.explain.UnitExplanation) as an HTML table."""
    e = explanation
    rows: list[tuple[str, Any]] = [
        ("unit", f"{e.unit} — {e.title} [{e.kind}]"),
        ("state", state_badge(getattr(e.state, "value", str(e.state)))),
        ("why", e.why),
    ]
    if e.explanations:
        rows.append(("invalidated by", Raw("<br>".join(escape(x.render())
                                                       for x in e.explanations))))
    if e.details:
        rows.append(("details", Raw("<br>".join(escape(d) for d in e.details))))
    rows.append(("attempts", e.attempts))
    if e.ledger is not None:
        rows.append(("call ledger", f"{e.ledger.calls} calls, {e.ledger.tokens:,} tokens, "
                     f"${e.ledger.cost:.2f}"))
    return '<div class="keepstep-explanation">' + key_values(rows) + "</div>"


__all__ = ["Raw", "budget_rows", "explanation_html", "key_values", "preview_html",
           "state_badge", "status_html", "table"]
