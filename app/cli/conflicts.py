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
    from keepstep.engine.views import conflicts_text, run_conflicts

    with open_project_dir(root) as project:
        found = run_conflicts(existing_run(project, run, branch))
    if as_json:
        typer.echo(out.to_json({"conflicts": [c.record() for c in found]}))
        return
    typer.echo(conflicts_text(found))


def register(app: typer.Typer) -> None:
    """Add ``conflicts`` to ``app``."""
    add_command(app, conflicts, "conflicts")


__all__ = ["register"]
