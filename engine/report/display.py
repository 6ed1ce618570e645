"""HTML for notebooks (``_repr_html_``) and the handover's index page.

Plain tables with inline styles: no scripts, no external assets, every value escaped. The
functions take the engine's models (RunStatus, Preview, UnitExplanation) and return a string;
they read nothing from storage, so a notebook shows exactly what the model holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from itertools import islice
from typing import Any

from keepstep.engine.report.dag_svg import STATE_COLORS

TABLE = ('style="border-collapse:collapse;margin:4px 0 10px 0;font-size:12px;'
         'text-align:left"')
CELL = 'style="border:1px solid #d0d7de;padding:3px 8px;vertical-align:top;text-align:left"'
HEAD = ('style="border:1px solid #d0d7de;padding:3px 8px;background:#f6f8fa;'
        'text-align:left"')
MAX_ROWS = 200  # a preview of a change reaching thousands of units stays readable
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


def _more(total: int, width: int) -> list[list[Any]]:
    """A last row saying how many rows a long table leaves out."""
    if total <= MAX_ROWS:
        return []
    return [[Raw(f"<i>… {total - MAX_ROWS:,} more</i>")] + [""] * (width - 1)]


def preview_html(preview: Any) -> str:
    """A dry run (engine.explain.Preview) as HTML: changes, invalidated units with their
    explanation paths, what runs and what is reused, and the estimated cost per unit."""
    parts = [f"<p><b>Preview</b> (nothing is committed): {escape(preview.summary)}</p>"]
    if preview.changes:
        parts.append(table(["change", "origin", "edge", "detail"],
                           [[c.kind, c.origin, getattr(c.edge, "value", c.edge), c.detail]
                            for c in preview.changes], caption="Changes"))
    if preview.invalidated:
        shown = list(islice(preview.invalidated.items(), MAX_ROWS))
        parts.append(table(["unit", "why (origin → edges → unit)"],
                           [[uid, Raw("<br>".join(escape(e.render()) for e in exps))]
                            for uid, exps in shown] + _more(len(preview.invalidated), 2),
                           caption=f"Invalidated ({len(preview.invalidated)})"))
    parts.append(key_values([("will run", ", ".join(preview.will_run) or "nothing"),
                             (f"reused ({len(preview.reused)})",
                              ", ".join(preview.reused) or "nothing")]))
    est = preview.estimate
    rows = [[u.unit, u.calls, u.tokens, f"${u.cost:.2f}", u.basis]
            for u in islice(est.units, MAX_ROWS)] + _more(len(est.units), 5)
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


# -- the handover page ------------------------------------------------------------------------
def _link(href: str, text: str | None = None) -> Raw:
    return Raw(f'<a href="{escape(href)}">{escape(text or href)}</a>')


def handover_index_html(*, title: str, run_label: str, facts: Mapping[str, Any],
                        deliverables: Sequence[Mapping[str, Any]], svg: str, story: str,
                        contract_current: bool, files: Sequence[Mapping[str, Any]]) -> str:
    """The handover bundle's index.html: one self-contained page (inline CSS and SVG, links
    to the bundle's own files only) over the facts engine.handover collected."""
    from markdown_it import MarkdownIt

    st, base = facts["status"], facts["baseline"]
    summary = key_values([
        ("run", run_label),
        ("plan · inputs", f"{st.plan_version} · {st.input_version} "
         f"({len(facts['inputs'].get('sources', {}))} approved sources)"),
        ("baseline checkpoint", "none verifies: " + base["verification"]
         if base["version"] is None else
         f"{base['version']} ({base['kind']}) · hash {base['hash'][:16]}… · state "
         f"{base['state_hash'][:16]}… · {base['created_at']} · {base['verification']}"),
        ("decision", Raw(f"<b>{escape(st.decision)}</b> — {escape('; '.join(st.reasons))}")),
        ("suggested next step", Raw(f"<b>{escape(st.next_action)}</b>")),
        ("contract", _link("contract.md") if contract_current else Raw(
            f"{_link('contract.md')} — edited since {escape(st.plan_version)}: the run has not "
            "seen this edit yet")),
        ("plan", _link("plan.toml")),
        ("narrative", _link("narrative.md")),
    ])
    sections = [("Summary", summary),
                ("Narrative", '<div class="narrative">'
                 + MarkdownIt("commonmark", {"html": False}).render(story) + "</div>"),
                ("DAG", f'<p>{_link("dag.svg")}</p>' + svg)]
    units = facts["units"]
    sections.append(("Units", table(
        ["unit", "phase", "title", "state", "attempts", "current attempt", "reason / why"],
        [[u, v["phase"], v["title"], state_badge(v["state"]), v["attempts"],
          v["current_attempt"], v["reason"] or "; ".join((v["record"] or {}).get(
              "explanations", []))] for u, v in units.items()])))
    inv = facts["invalidations"]
    sections.append(("Invalidations", table(
        ["when", "change", "invalidated", "why", "reused"],
        [[h["ts"], "; ".join(c.get("detail", "") for c in h.get("changes", [])),
          ", ".join(sorted(h.get("invalidated", {}))),
          Raw("<br>".join(escape(t) for ts in h.get("invalidated", {}).values() for t in ts)),
          f"{len(h.get('reused', []))} units"] for h in inv["history"]])
        + ("" if not inv["current"] else table(
            ["unit", "invalidated now because"],
            [[u, Raw("<br>".join(escape(e["text"]) for e in es))]
             for u, es in inv["current"].items()]))))
    sections.append(("Orphans", table(
        ["attempt", "files (quarantined, never promoted)"],
        [[o["attempt_id"], ", ".join(o["files"])] for o in facts["orphans"]])))
    sections.append(("Pending approvals", table(
        ["gate", "unit", "question"],
        [[a.get("gate"), a.get("unit"), a.get("question")]
         for a in facts["approvals"]["pending"]])))
    sections.append(("Budget", table(["counter", "used", "limit", "left"],
                                     budget_rows(st.budget))))
    sections.append(("External unknowns", table(
        ["unit", "action", "status", "key"],
        [[e.get("unit"), e.get("action"), e.get("status"), e.get("idem_key")]
         for e in st.external_unknown])))
    sections.append(("Recent errors", table(
        ["when", "event", "unit", "attempt", "class", "message"],
        [[e["ts"], e["kind"], e["unit"], e["attempt"], e["class"], e["message"]]
         for e in facts["errors"]])))
    sections.append(("Deliverables", table(
        ["unit", "file", "sha256", "matches the manifest"],
        [[d["unit"], _link(d["bundle_path"], d["name"]), d["sha256"][:16] + "…",
          "yes" if d["matches"] else "NO"] for d in deliverables])))
    sections.append(("Files", "<p>Every file's sha256 is in "
                     f"{_link('manifest.json')}; check them with "
                     "<code>keepstep verify-bundle PATH</code>.</p>" + table(
                         ["file", "size", "sha256"],
                         [[_link(f["path"]), f["size"], f["sha256"][:16] + "…"] for f in files])))
    body = "".join(f'<h2 id="{escape(name.lower().replace(" ", "-"))}">{escape(name)}</h2>'
                   f"{html}" for name, html in sections)
    nav = " · ".join(f'<a href="#{escape(n.lower().replace(" ", "-"))}">{escape(n)}</a>'
                     for n, _ in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>"
            "body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px;color:#1f2328}"
            "h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}"
            ".narrative{background:#f6f8fa;padding:4px 16px;border-radius:6px}"
            "svg{max-width:100%;height:auto}code{background:#f6f8fa}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{nav}</p>{body}"
            "<p><small>Generated by keepstep from the run's stored state. No model responses, "
            "source texts or keys are included.</small></p></body></html>\n")


__all__ = ["Raw", "budget_rows", "explanation_html", "handover_index_html", "key_values",
           "preview_html", "state_badge", "status_html", "table"]
