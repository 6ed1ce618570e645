"""HTML for notebooks (``_repr_html_``) and the handover's index page.

Plain tables with inline styles: no scripts, no external assets, every value escaped. The
functions take the engine's models (RunStatus, Preview, UnitExplanation) and return a string;
they read nothing from storage, so a notebook shows exactly what the model holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from keepstep.engine.core.html import (
    Raw,
    explanation_html,
    key_values,
    preview_html,
    state_badge,
    table,
)

BUDGET_ORDER = ("calls", "tokens", "cost", "tool_calls", "retries", "recoveries", "wall_time_s",
                "storage_bytes")


def budget_rows(budget: Mapping[str, Mapping[str, float]]) -> list[list[Any]]:
    from keepstep.engine.report.progress import fmt_duration

    used, limits = budget.get("used", {}), budget.get("limits", {})
    names = [k for k in BUDGET_ORDER if k in used or k in limits]
    names += sorted(k for k in set(used) | set(limits) if k not in names)
    rows = []
    for k in names:
        u = float(used.get(k, 0))
        lim = limits.get(k)

        def fmt(v: float | None, k: str = k) -> Any:
            if v is None:
                return "no limit"
            if k == "wall_time_s":  # seconds as a duration a person reads
                return fmt_duration(float(v))
            if k == "cost":
                return f"${v:,.2f}"
            return round(v, 1) if not float(v).is_integer() else v

        label = "wall time" if k == "wall_time_s" else k
        rows.append([label, fmt(u), fmt(lim), fmt(None if lim is None else float(lim) - u)])
    return rows


def status_html(status: Any) -> str:
    """The run dashboard (engine.status.RunStatus) as HTML tables."""
    c = status.counts
    head = key_values([
        ("run", f"{status.run_id} ({status.branch})"),
        ("versions", f"{status.plan_version} · {status.input_version}"),
        ("model", model_text(getattr(status, "models", []))),
        ("latest checkpoint", f"{status.head_version} ({status.checkpoint_commits} commits: "
         + ", ".join(f"{n} {k}" for k, n in sorted(status.commits_by_kind.items())) + ")"),
        ("decision", Raw(f"<b>{escape(status.decision)}</b> — "
                         f"{escape('; '.join(status.reasons))}")),
        ("next action", status.next_action),
        ("last commit", status.last_commit_at or "no commit yet"),
        ("progress", f"{status.progress_pct:g}% current ({status.view_version})"),
    ], caption=f"keepstep run {status.run_id}")
    names = ("current", "superseded", "invalidated", "orphans", "ready", "running", "blocked",
             "failed", "pending")
    counts = table(list(names), [[c.get(k, 0) for k in names]], caption="Counts")
    budget = table(["counter", "used", "limit", "left"], budget_rows(status.budget),
                   caption="Budget")
    units = table(["unit", "title", "state", "attempts", "current attempt", "reason"],
                  [[uid, getattr(v, "title", ""), state_badge(v.state), v.attempts,
                    v.current_attempt, v.reason] for uid, v in status.units.items()],
                  caption="Units")
    parts = [head, counts, budget]
    needs = getattr(status, "needs", [])
    if needs:
        parts.append(table(["needs you", "what", "what to do", "command"],
                           [[n.kind, n.message, n.action, n.command] for n in needs],
                           caption="Needs you"))
    flights = getattr(status, "in_flight", [])
    if flights:
        parts.append(table(["unit", "title", "attempt", "step", "since", "executor"],
                           [[f.unit, f.title, f.attempt, f.step, f.started_at, f.owner]
                            for f in flights], caption="In flight"))
    if status.pending_approvals:
        parts.append(table(["gate", "unit", "question", "options"],
                           [[a.gate, a.unit, a.question, ", ".join(o.label for o in a.options)]
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


OFFLINE_MODEL = "local/keepstep-offline"


def model_text(models: Sequence[str]) -> str:
    """The model(s) that produced the work, saying plainly when it is the offline heuristic."""
    names = sorted(set(models))
    if not names:
        return "no model configured"
    text = ", ".join(names)
    if OFFLINE_MODEL in names:
        text += (" — keepstep's offline heuristic: deterministic rules over the sources, no "
                 "language model")
    return text


# -- the handover page ------------------------------------------------------------------------
def _link(href: str, text: str | None = None) -> Raw:
    return Raw(f'<a href="{escape(href)}">{escape(text or href)}</a>')


def conclusions_html(found: Mapping[str, Any], md: Any) -> str:
    """The page's first section: the recommendation, the top risks with their evidence, and
    the open disagreements between sources."""
    rec = found.get("recommendation") or ""
    parts = ["<h3>Recommendation</h3>",
             md.render(rec) if rec else "<p>No deliverable states a recommendation yet.</p>"]
    risks = found.get("risks") or []
    parts.append("<h3>Top risks</h3>")
    parts.append(table(["risk", "title", "score", "evidence"],
                       [[r.get("id"), r.get("title"), r.get("score"),
                         "[" + ", ".join(str(i) for i in r.get("evidence_ids") or []) + "]"]
                        for r in risks]) if risks else "<p>No ranked risks.</p>")
    open_ones = found.get("disagreements") or []
    parts.append("<h3>Open disagreements</h3>")
    parts.append(table(["quantity", "values", "evidence", "why they differ"],
                       [[c.get("metric"), " vs ".join(str(v) for v in c.get("values") or []),
                         "[" + ", ".join(str(i) for i in c.get("ids") or []) + "]",
                         c.get("reason")] for c in open_ones])
                 if open_ones else "<p>None: no open conflict between sources.</p>")
    return '<div class="conclusions">' + "".join(parts) + "</div>"


def deliverables_html(export: Any) -> str:
    """An export_deliverables result for a notebook: where, each file linked, what is
    missing."""
    from pathlib import Path

    folder = Path(export.folder)
    head = key_values([
        ("run", f"{export.run_id} ({export.branch}, {export.plan_version})"),
        ("folder", Raw(f'<a href="{escape(folder.as_uri())}">{escape(str(folder))}</a>')),
        ("exported at", export.exported_at),
        ("not current yet", ", ".join(export.missing) or "none"),
    ], caption=f"{len(export.files)} deliverable(s) exported")
    files = table(["file", "unit", "size", "sha256"],
                  [[Raw(f'<a href="{escape((folder / f.file).as_uri())}">{escape(f.file)}</a>'),
                    f.unit, f"{f.size:,} bytes", f.sha256[:16] + "…"] for f in export.files])
    return head + files


def handover_index_html(*, title: str, run_label: str, facts: Mapping[str, Any],
                        deliverables: Sequence[Mapping[str, Any]], svg: str, story: str,
                        contract_current: bool, files: Sequence[Mapping[str, Any]],
                        conclusions: Mapping[str, Any] | None = None) -> str:
    """The handover bundle's index.html: one self-contained page (inline CSS and SVG, links
    to the bundle's own files only) over the facts engine.handover collected, opening with
    the conclusions (recommendation, top risks, open disagreements)."""
    from markdown_it import MarkdownIt

    st, base = facts["status"], facts["baseline"]
    done = st.decision == "done"
    # On a done run the next step is the deliverables: never "export the handover" to the
    # reader of that very handover.
    next_step = ("done: read the deliverables below (deliverables/ in this bundle)" if done
                 else st.next_action)
    summary = key_values([
        ("run", run_label),
        ("plan · inputs", f"{st.plan_version} · {st.input_version} "
         f"({len(facts['inputs'].get('sources', {}))} approved sources)"),
        ("baseline checkpoint", "none verifies: " + base["verification"]
         if base["version"] is None else
         f"{base['version']} ({base['kind']}) · hash {base['hash'][:16]}… · state "
         f"{base['state_hash'][:16]}… · {base['created_at']} · {base['verification']}"),
        ("model", model_text(facts.get("models") or st.models)),
        ("decision", Raw(f"<b>{escape(st.decision)}</b> — {escape('; '.join(st.reasons))}")),
        ("suggested next step", Raw(f"<b>{escape(next_step)}</b>")),
        ("contract", _link("contract.md") if contract_current else Raw(
            f"{_link('contract.md')} — edited since {escape(st.plan_version)}: the run has not "
            "seen this edit yet")),
        ("plan", _link("plan.toml")),
        ("narrative", _link("narrative.md")),
    ])
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    sections = [("Conclusions", conclusions_html(conclusions or {}, md))] if conclusions \
        else []
    sections += [("Summary", summary),
                ("Narrative", '<div class="narrative">'
                 + md.render(story) + "</div>"),
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
        ["attempt", "files (left by an attempt that did not commit; never promoted)"],
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
    groups = facts.get("error_groups", [])
    open_groups = [g for g in groups if not g.get("resolved")]
    resolved = [g for g in groups if g.get("resolved")]
    earlier = "" if not resolved else (
        f"<p>Earlier errors, all resolved ({sum(g['count'] for g in resolved)} events): "
        + escape("; ".join(f"{g['cause']} on {', '.join(g['units'])}" for g in resolved))
        + ".</p>")
    sections.append(("Errors by cause", table(
        ["cause", "times", "units", "latest message", "last seen", "what to do"],
        [[g["cause"], g["count"], ", ".join(g["units"]) or "-", g["message"], g["last"],
          g["action"]] for g in open_groups])
        + earlier
        + "<p><small>Every error event is in <code>state/recent_errors.json</code>.</small></p>"))
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
            ".conclusions{background:#eef6ff;padding:4px 16px;border-radius:6px}"
            "svg{max-width:100%;height:auto}code{background:#f6f8fa}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{nav}</p>{body}"
            "<p><small>Generated by keepstep from the run's stored state. No model responses, "
            "source texts or keys are included.</small></p></body></html>\n")


__all__ = ["OFFLINE_MODEL", "Raw", "budget_rows", "conclusions_html", "deliverables_html",
           "explanation_html", "handover_index_html", "key_values", "model_text", "preview_html",
           "state_badge", "status_html", "table"]
