"""``keepstep export``: the run's current deliverables where a person finds them.

Copies the committed outputs of the document units (report, tables, notes…) into a visible
folder — ``deliverables/<run>/`` in the project by default — with ``manifest.json`` listing
each file's sha256 (the engine re-hashes every file against its record before copying).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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


def export(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
           to: Annotated[Path | None, typer.Option(
               "--out", "-o", help="The folder (default: deliverables/RUN in the project).",
               show_default=False)] = None,
           as_json: JsonOpt = False) -> None:
    """Copy the run's current deliverables and their manifest (sha256 each) to a folder.

    An earlier export in that folder is replaced; anything else there is refused. A
    deliverable whose file no longer matches its committed hash stops the export (nothing is
    written): resume the run to redo it.

    \b
    Example:
      keepstep export --run ME-042
      keepstep export --out ~/Desktop/me042-deliverables
    """
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        result = the_run.export_deliverables(to)
    typer.echo(out.to_json(result.model_dump(mode="json")) if as_json else result.render())


def register(app: typer.Typer) -> None:
    add_command(app, export, "export")


__all__ = ["register"]
