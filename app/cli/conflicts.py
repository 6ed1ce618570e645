"""``keepstep conflicts``: the disagreements between sources that the verify units recorded.

Each is listed with its class (definition, superseded, outdated, unexplained,
not-a-conflict), the value the documents use and why, and every side: its evidence id,
source id, locator and value as written. ``--json`` prints the typed records.
"""

from __future__ import annotations

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    add_command,
    existing_run,
    open_project_dir,
)


def conflicts(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
              as_json: JsonOpt = False) -> None:
    """List the disagreements between sources the run found, with the value used and why.

    \b
    Example:
      keepstep conflicts --run ME-042
      keepstep conflicts --json
    """
    from keepstep.engine import run_conflicts

    with open_project_dir(root) as project:
        found = run_conflicts(existing_run(project, run, branch))
    if as_json:
        typer.echo(out.to_json({"conflicts": [c.record() for c in found]}))
        return
    typer.echo(render(found))


def render(found: list) -> str:  # list[Conflict]
    """The text listing: one block per disagreement."""
    if not found:
        return "No disagreements between sources were recorded (no verify unit found one)."
    real = [c for c in found if c.cls != "not-a-conflict"]
    lines = [f"{len(real)} disagreement(s) between sources"
             + (f", {len(found) - len(real)} apparent one(s) closed" if len(real) < len(found)
                else "") + ":"]
    for c in found:
        what = " · ".join(x for x in (c.metric, c.entity, c.period) if x)
        used = f"uses {c.holds}" if c.holds else "no value holds (open)"
        lines += ["", f"{c.id} ({c.verify_unit})  {c.cls}: {what} — {used}"]
        for side in c.sides:
            where = f", {side.locator}" if side.locator else ""
            dated = f" [{side.source_date}]" if side.source_date else ""
            mark = "*" if side.evidence_id in c.holds_ids else " "
            lines.append(f"  {mark} {side.value:<14} {side.evidence_id} "
                         f"({side.source_id}{where}){dated}")
        lines.append(f"    why: {c.reason}")
        if c.applies:
            lines.append(f"    applies: {c.applies}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``conflicts`` to ``app``."""
    add_command(app, conflicts, "conflicts")


__all__ = ["register", "render"]
