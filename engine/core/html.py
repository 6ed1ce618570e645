"""HTML tables for the core's results (a preview, a unit's explanation) and the helpers the
report pages share: plain tables with inline styles, no scripts, every value escaped.

Pure string building over the models it is given, so ``Preview._repr_html_`` and
``UnitExplanation._repr_html_`` can live with their models in the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from itertools import islice
from typing import Any

# unit state -> (fill, stroke), shared by the HTML badges and the DAG picture
STATE_COLORS: dict[str, tuple[str, str]] = {
    "succeeded": ("#c8e6c9", "#2e7d32"),
    "invalidated": ("#fff3c4", "#b28704"),
    "blocked": ("#ffcdd2", "#c62828"),
    "failed": ("#ef9a9a", "#8e0000"),
    "running": ("#bbdefb", "#1565c0"),
    "pending": ("#eeeeee", "#757575"),
    "cancelled": ("#e0e0e0", "#424242"),
}
TABLE = ('style="border-collapse:collapse;margin:4px 0 10px 0;font-size:12px;'
         'text-align:left"')
CELL = 'style="border:1px solid #d0d7de;padding:3px 8px;vertical-align:top;text-align:left"'
HEAD = ('style="border:1px solid #d0d7de;padding:3px 8px;background:#f6f8fa;'
        'text-align:left"')
MAX_ROWS = 200  # a preview of a change reaching thousands of units stays readable


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


