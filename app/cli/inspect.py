"""Looking into a run from the command line: ``verify`` (the checkpoint chain), ``explain``
(why a unit is in its state), ``preview`` (what the project files' edits would reuse and
invalidate) and ``backup`` (a consistent copy of the database).

All of them read; none changes a state.
"""

from __future__ import annotations

from typing import Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_RUNTIME,
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    add_command,
    check_unit,
    existing_run,
    open_project_dir,
)


def verify(root: DirArg, run: RunOpt, branch: BranchOpt = "main") -> None:
    """Verify the whole checkpoint chain of a run (links and state hashes)."""

    with open_project_dir(root) as project:
        report = existing_run(project, run, branch).verify()
        typer.echo(out.chain_text(report))
        if not report.ok:
            raise typer.Exit(EXIT_RUNTIME)


def explain(root: DirArg, run: RunOpt,
            unit: Annotated[str, typer.Argument(help="The unit, e.g. U27.")],
            branch: BranchOpt = "main", as_json: JsonOpt = False) -> None:
    """Why a unit is in its state: attempts, invalidation path, gate or budget figures."""

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        check_unit(the_run, unit)
        result = the_run.explain(unit)
        typer.echo(out.to_json(result.model_dump(mode="json")) if as_json
                   else out.render_any(result))


def preview(root: DirArg, run: RunOpt, branch: BranchOpt = "main",
            as_json: JsonOpt = False) -> None:
    """Dry run: what the project files' edits would reuse and invalidate, before resuming."""

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        result = the_run.preview()
        typer.echo(out.to_json(result.model_dump(mode="json")) if as_json
                   else out.preview_text(result))


def register(app: typer.Typer) -> None:
    add_command(app, verify, "verify")
    add_command(app, explain, "explain")
    add_command(app, preview, "preview")
