"""Charts of a run's findings, for the exported deliverables: where a reader would rather
look than read.

- ``risk-matrix``: each ranked risk on a likelihood x impact grid (1-5 each). A risk that
  gives its likelihood and impact is placed by them. Else, with a score (likelihood x
  impact) the likelihood is read as the number of statements that show the risk (at most 5,
  the offline model's rule) and the impact as score / likelihood, so the dot lands on the
  score's cell. A risk with neither (a ranking that only orders) is placed by its rank, the
  top one highest, drawn hollow and labelled "derived from rank".
- ``evidence-by-group``: verified statements per source group.
- ``price-ladder``: the figures of the statements that talk about a price or cost, from the
  lowest to the highest, each labelled with its evidence id.

``make_charts(data, folder)`` writes each chart that has something to show as SVG and PNG
and returns them. matplotlib is imported here only, lazily, with the Agg backend (no
display, no GUI toolkit).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PRICE_WORDS = ("price", "priced", "cost", "charge", "fee", "per unit", "rent", "pln", "eur",
               "usd", "gbp", "€", "$", "£")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_MAX_RUNGS = 12


class Chart(BaseModel):
    """One chart written: its name, title, what it shows and its files (relative names)."""

    name: str
    title: str
    caption: str
    svg: str
    png: str


class ChartData(BaseModel):
    """What the charts are drawn from: the ranked risks and the verified evidence."""

    risks: list[dict[str, Any]] = []
    evidence: list[dict[str, Any]] = []


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, folder: Path, name: str) -> tuple[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    svg, png = folder / f"{name}.svg", folder / f"{name}.png"
    # A fixed hash salt and no date keep the SVG the same for the same data.
    fig.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None})
    fig.savefig(png, format="png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    return svg.name, png.name


def likelihood_impact(risk: dict[str, Any]) -> tuple[int, int]:
    """(likelihood, impact), each 1-5, of a ranked risk from its score and statements (see
    the module doc)."""
    likelihood = max(1, min(5, len(risk.get("evidence_ids") or [])))
    score = round(_score(risk.get("score")) or 1)
    impact = max(1, min(5, round(score / likelihood)))
    return likelihood, impact


def _one_to_five(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if 1 <= number <= 5 else None


def _score(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 else None


def placement(risk: dict[str, Any], position: int, count: int) -> tuple[int, int, str]:
    """(likelihood, impact, how) of the ``position``-th (0: top) of ``count`` ranked risks:
    ``how`` is "given", "derived from score" or "derived from rank" (see the module doc)."""
    likelihood, impact = _one_to_five(risk.get("likelihood")), _one_to_five(risk.get("impact"))
    if likelihood is not None and impact is not None:
        return likelihood, impact, "given"
    if _score(risk.get("score")) is not None:
        return (*likelihood_impact(risk), "derived from score")
    level = 5 - (4 * position) // max(1, count - 1) if count > 1 else 5
    return level, level, "derived from rank"


def risk_matrix(plt: Any, risks: list[dict[str, Any]], folder: Path) -> Chart | None:
    if not risks:
        return None
    placed_at = [placement(r, i, len(risks)) for i, r in enumerate(risks)]
    fig, ax = plt.subplots(figsize=(6, 5))
    for x in range(1, 6):
        for y in range(1, 6):
            level = x * y
            colour = "#d9534f" if level >= 15 else "#f0ad4e" if level >= 6 else "#5cb85c"
            ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, color=colour, alpha=0.25))
    placed: Counter[tuple[int, int]] = Counter()
    for risk, (x, y, how) in zip(risks, placed_at, strict=True):
        k = placed[(x, y)]
        placed[(x, y)] += 1
        hollow = how == "derived from rank"
        ax.plot(x, y + 0.25 - 0.2 * k, "o", color="#333333",
                markerfacecolor="none" if hollow else "#333333")
        ax.annotate(str(risk.get("id", "")), (x, y + 0.25 - 0.2 * k), xytext=(6, -3),
                    textcoords="offset points", fontsize=8)
    ax.set_xlim(0.5, 5.5)
    ax.set_ylim(0.5, 5.5)
    ax.set_xticks(range(1, 6))
    ax.set_yticks(range(1, 6))
    hows = {how for _, _, how in placed_at}
    ax.set_xlabel("likelihood (statements that show it)" if hows == {"derived from score"}
                  else "likelihood")
    ax.set_ylabel("impact")
    ax.set_title("Risk matrix: likelihood × impact")
    if "derived from rank" in hows:
        ax.text(0.5, -0.18, "hollow: derived from rank (the ranking gives no likelihood, "
                "impact or score)", transform=ax.transAxes, ha="center", fontsize=8)
    svg, png = _save(plt, fig, folder, "risk-matrix")
    legend = "; ".join(
        f"{r.get('id')}: {r.get('title')} ("
        + (f"score {r.get('score')}" if how == "derived from score" else
           f"likelihood {x}, impact {y}" + (", derived from rank" if how != "given" else ""))
        + ")" for r, (x, y, how) in zip(risks, placed_at, strict=True))
    return Chart(name="risk-matrix", title="Risk matrix (likelihood × impact)",
                 caption=legend, svg=svg, png=png)


def evidence_by_group(plt: Any, evidence: list[dict[str, Any]], folder: Path) -> Chart | None:
    counts = Counter(str(e.get("group") or "-") for e in evidence)
    if not counts:
        return None
    groups = sorted(counts)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(groups, [counts[g] for g in groups], color="#4a7ab7")
    for i, g in enumerate(groups):
        ax.annotate(str(counts[g]), (i, counts[g]), ha="center", va="bottom", fontsize=9)
    ax.set_xlabel("source group")
    ax.set_ylabel("verified statements")
    ax.set_title("Evidence per source group")
    svg, png = _save(plt, fig, folder, "evidence-by-group")
    caption = ", ".join(f"group {g}: {counts[g]}" for g in groups)
    return Chart(name="evidence-by-group", title="Evidence per source group", caption=caption,
                 svg=svg, png=png)


def _price_in(quote: str) -> float | None:
    """The figure a price word leads to: the first number after the first price word (else
    before it), years left out."""
    low = quote.lower()
    at = min((low.find(w) for w in PRICE_WORDS if w in low), default=-1)
    if at < 0:
        return None
    numbers = [(m.start(), m.group()) for m in _NUMBER.finditer(quote)]
    numbers = [(pos, raw) for pos, raw in numbers
               if not (raw.isdigit() and len(raw) == 4 and 1900 <= int(raw) <= 2100)]
    after = [raw for pos, raw in numbers if pos >= at]
    raw = after[0] if after else numbers[-1][1] if numbers else None
    return float(raw.replace(",", "")) if raw else None


def price_points(evidence: list[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(value, evidence id, quote) for each statement about a price or cost with a figure,
    lowest first; figures more than ten times off the median are left out (a rent beside
    unit prices would flatten the ladder)."""
    points = []
    for e in evidence:
        quote = str(e.get("quote") or "")
        value = _price_in(quote)
        if value is not None and value > 0:
            points.append((value, str(e.get("id", "")), quote))
    if not points:
        return []
    median = sorted(v for v, _, _ in points)[len(points) // 2]
    points = [p for p in points if median / 10 <= p[0] <= median * 10]
    return sorted(points)[:_MAX_RUNGS]


def price_ladder(plt: Any, evidence: list[dict[str, Any]], folder: Path) -> Chart | None:
    points = price_points(evidence)
    if len(points) < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(points) + 1.2))
    labels = [f"{eid}" for _, eid, _ in points]
    values = [v for v, _, _ in points]
    ax.barh(range(len(points)), values, color="#7a5195")
    ax.set_yticks(range(len(points)), labels)
    for i, v in enumerate(values):
        ax.annotate(f"{v:,.2f}".rstrip("0").rstrip("."), (v, i), xytext=(4, -3),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel("figure as stated")
    ax.set_title("Price ladder: the stated prices and costs")
    svg, png = _save(plt, fig, folder, "price-ladder")
    caption = "; ".join(f"{eid}: {q[:80]}" for _, eid, q in points)
    return Chart(name="price-ladder", title="Price ladder", caption=caption, svg=svg, png=png)


def make_charts(data: ChartData, folder: Path) -> list[Chart]:
    """Every chart with something to show, written into ``folder`` (SVG and PNG)."""
    if not data.risks and not data.evidence:
        return []
    plt = _pyplot()
    made = [risk_matrix(plt, data.risks, folder), evidence_by_group(plt, data.evidence, folder),
            price_ladder(plt, data.evidence, folder)]
    return [c for c in made if c is not None]


def charts_markdown(charts: list[Chart], prefix: str = "charts/") -> str:
    """A Markdown page showing the charts (SVG, with the PNG linked)."""
    lines = ["# Charts", ""]
    for c in charts:
        lines += [f"## {c.title}", "", f"![{c.title}]({prefix}{c.svg})", "",
                  f"_{c.caption}_ ([PNG]({prefix}{c.png}))", ""]
    return "\n".join(lines)


__all__ = ["Chart", "ChartData", "charts_markdown", "likelihood_impact", "make_charts",
           "placement", "price_points"]
