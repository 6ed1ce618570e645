"""A picture of a plan's DAG as hand-written SVG, each unit coloured by its state.

Layered layout, no graphviz: one band per phase (in plan order), and inside a band one column
per depth of the dependencies between the band's own units; units keep plan order inside a
column. Edges are drawn by type (content solid, structure dashed, audience orange, …). The
output is deterministic and self-contained (no fonts, scripts or external references).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import TYPE_CHECKING

from keepstep.engine.core.html import STATE_COLORS
from keepstep.engine.core.plan import Plan
from keepstep.engine.report.status import run_status

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run

# state -> (fill, stroke)
# edge type -> (colour, dash pattern)
EDGE_STYLES: dict[str, tuple[str, str]] = {
    "content": ("#9e9e9e", ""),
    "structure": ("#6d4c41", "6 3"),
    "audience": ("#ef6c00", ""),
    "presentation": ("#7b1fa2", "2 3"),
    "policy": ("#00838f", "8 3 2 3"),
    "template": ("#5c6bc0", "4 2"),
}
FONTS = "DejaVu Sans, Helvetica, Arial, sans-serif"
NODE_W, NODE_H, COL_GAP, ROW_GAP, MARGIN, HEADER = 118, 40, 40, 10, 40, 40
TITLE_CHARS = 21  # what fits NODE_W at the 9 px title font


def _columns(plan: Plan) -> tuple[list[tuple[str, int, int]], dict[str, int]]:
    """([(phase, first column, column count)], unit -> column)."""
    units = plan.unit_map()
    phases: list[str] = []
    for u in plan.units:
        if u.phase not in phases:
            phases.append(u.phase)
    depth: dict[str, int] = {}

    def local_depth(uid: str, seen: frozenset[str] = frozenset()) -> int:
        if uid not in depth:
            unit = units[uid]
            inner = [d.unit for d in unit.depends_on if d.unit in units
                     and units[d.unit].phase == unit.phase and d.unit not in seen]
            depth[uid] = 1 + max((local_depth(d, seen | {uid}) for d in inner), default=-1)
        return depth[uid]

    bands, column, start = [], {}, 0
    for phase in phases:
        members = [u.id for u in plan.units if u.phase == phase]
        width = 1 + max(local_depth(uid) for uid in members)
        bands.append((phase, start, width))
        for uid in members:
            column[uid] = start + depth[uid]
        start += width
    return bands, column


def dag_svg(plan: Plan, states: Mapping[str, str], *, attempts: Mapping[str, str] | None = None,
            orphans: Iterable[str] = (), title: str = "") -> str:
    """The DAG of ``plan`` as an SVG document; ``states`` maps unit -> state name,
    ``attempts`` unit -> current attempt id, ``orphans`` lists orphaned attempt ids."""
    attempts = attempts or {}
    orphan_units: dict[str, list[str]] = {}
    for att in orphans:
        orphan_units.setdefault(att.split("/")[0], []).append(att)
    bands, column = _columns(plan)
    per_col: dict[int, list[str]] = {}
    for u in plan.units:
        per_col.setdefault(column[u.id], []).append(u.id)
    rows = max((len(v) for v in per_col.values()), default=1)
    body_h = rows * (NODE_H + ROW_GAP) - ROW_GAP
    n_cols = sum(b[2] for b in bands) or 1
    width = 2 * MARGIN + n_cols * NODE_W + (n_cols - 1) * COL_GAP
    legend_y = MARGIN + HEADER + body_h + 28
    height = legend_y + 44
    pos: dict[str, tuple[float, float]] = {}
    for col, members in per_col.items():
        offset = (body_h - (len(members) * (NODE_H + ROW_GAP) - ROW_GAP)) / 2
        for i, uid in enumerate(members):
            pos[uid] = (MARGIN + col * (NODE_W + COL_GAP),
                        MARGIN + HEADER + offset + i * (NODE_H + ROW_GAP))
    gates = {g.unit: g for g in plan.gates}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="{FONTS}" font-size="11" '
           f'role="img" aria-label="{escape(title or "plan DAG")}">',
           f"<title>{escape(title or 'plan DAG')}</title>",
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    for i, (phase, first, count) in enumerate(bands):
        x = MARGIN + first * (NODE_W + COL_GAP) - COL_GAP / 2
        w = count * (NODE_W + COL_GAP)
        if i % 2 == 0:
            out.append(f'<rect x="{x:.1f}" y="{MARGIN / 2}" width="{w:.1f}" '
                       f'height="{MARGIN / 2 + HEADER + body_h + 8}" fill="#f5f7fa" rx="6"/>')
        out.append(f'<text x="{x + w / 2:.1f}" y="{MARGIN + 12}" text-anchor="middle" '
                   f'font-weight="bold" fill="#37474f">{escape(phase)}</text>')
    for u in plan.units:
        x2, y2 = pos[u.id]
        for dep in u.depends_on:
            if dep.unit not in pos:
                continue
            x1, y1 = pos[dep.unit]
            colour, dash = EDGE_STYLES.get(dep.edge.value, ("#9e9e9e", ""))
            sx, sy, ex, ey = x1 + NODE_W, y1 + NODE_H / 2, x2, y2 + NODE_H / 2
            bend = max(20.0, (ex - sx) / 2)
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<path d="M{sx:.1f},{sy:.1f} C{sx + bend:.1f},{sy:.1f} '
                       f'{ex - bend:.1f},{ey:.1f} {ex:.1f},{ey:.1f}" fill="none" '
                       f'stroke="{colour}" stroke-width="1.1"{dash_attr} opacity="0.8">'
                       f"<title>{escape(dep.unit)} → {escape(u.id)} ({dep.edge.value})"
                       "</title></path>")
    for u in plan.units:
        x, y = pos[u.id]
        state = states.get(u.id, "pending")
        fill, stroke = STATE_COLORS.get(state, STATE_COLORS["pending"])
        tip = f"{u.id} — {u.title}: {state}"
        if attempts.get(u.id):
            tip += f" ({attempts[u.id]})"
        if u.id in gates:
            tip += f"; gate {gates[u.id].id}: {gates[u.id].question}"
        if u.id in orphan_units:
            tip += "; orphan(s): " + ", ".join(orphan_units[u.id])
        out.append(f'<g class="unit state-{escape(state)}"><title>{escape(tip)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" rx="5" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
                   f'<text x="{x + NODE_W / 2:.1f}" y="{y + 15:.1f}" text-anchor="middle" '
                   f'font-weight="bold" fill="#212121">{escape(u.id)} · '
                   f'{escape(attempts.get(u.id, "").rpartition("/")[2] or state[:4])}</text>'
                   f'<text x="{x + NODE_W / 2:.1f}" y="{y + 30:.1f}" text-anchor="middle" '
                   f'font-size="9" fill="#424242">{escape(_short_title(u.title))}</text>')
        if u.id in gates:
            gx, gy = x + NODE_W - 6, y + 6
            out.append(f'<path d="M{gx:.1f},{gy - 5:.1f} L{gx + 5:.1f},{gy:.1f} '
                       f'L{gx:.1f},{gy + 5:.1f} L{gx - 5:.1f},{gy:.1f} Z" fill="#6a1b9a"/>')
        if u.id in orphan_units:
            out.append(f'<circle cx="{x + 6:.1f}" cy="{y + 6:.1f}" r="4" fill="#d32f2f"/>')
        out.append("</g>")
    out += _legend(legend_y, width)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _short_title(title: str) -> str:
    return title if len(title) <= TITLE_CHARS else title[:TITLE_CHARS - 1].rstrip() + "…"


def _legend(y: float, width: float) -> list[str]:
    out, x = [], float(MARGIN)
    for state, (fill, stroke) in STATE_COLORS.items():
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" rx="2" fill="{fill}" '
                   f'stroke="{stroke}"/><text x="{x + 16:.1f}" y="{y + 10:.1f}">{state}</text>')
        x += 22 + 6.5 * len(state)
    out.append(f'<path d="M{x + 4:.1f},{y + 1:.1f} l5,5 l-5,5 l-5,-5 Z" fill="#6a1b9a"/>'
               f'<text x="{x + 12:.1f}" y="{y + 10:.1f}">approval gate</text>')
    x += 100
    out.append(f'<circle cx="{x + 4:.1f}" cy="{y + 6:.1f}" r="4" fill="#d32f2f"/>'
               f'<text x="{x + 12:.1f}" y="{y + 10:.1f}">orphan</text>')
    x, y = float(MARGIN), y + 22
    for edge, (colour, dash) in EDGE_STYLES.items():
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{x:.1f}" y1="{y + 6:.1f}" x2="{x + 24:.1f}" y2="{y + 6:.1f}" '
                   f'stroke="{colour}" stroke-width="1.5"{dash_attr}/>'
                   f'<text x="{x + 28:.1f}" y="{y + 10:.1f}">{edge}</text>')
        x += 40 + 6.5 * len(edge)
        if x > width - 60:
            break
    return out


def run_dag_svg(run: Run) -> str:
    """The DAG of the plan the run is at, coloured by each unit's state now."""
    status = run_status(run)
    orphans = [o.attempt_id for o in run.store.orphaned_attempts(run.run_id)]
    title = (f"run {run.run_id} · {status.plan_version} · checkpoint {status.head_version} · "
             f"{status.decision}")
    return dag_svg(run.plan, {u: v.state for u, v in status.units.items()},
                   attempts={u: v.current_attempt for u, v in status.units.items()
                             if v.current_attempt},
                   orphans=orphans, title=title)


__all__ = ["EDGE_STYLES", "STATE_COLORS", "dag_svg", "run_dag_svg"]
