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
    UsageProblem,
    add_command,
    check_unit,
    existing_run,
    open_project_dir,
    shift,
)


def verify(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
           as_json: JsonOpt = False) -> None:
    """Verify the whole checkpoint chain of a run (links and state hashes); exit 1 if broken.

    \b
    Example:
      keepstep verify --run ME-042 --json
    """
    with open_project_dir(root) as project:
        report = existing_run(project, run, branch).verify()
        typer.echo(out.to_json(report.model_dump(mode="json")) if as_json
                   else out.chain_text(report))
        if not report.ok:
            raise typer.Exit(EXIT_RUNTIME)


def explain(root: DirArg = None,
            unit: Annotated[str | None, typer.Argument(metavar="UNIT", show_default=False,
                                                       help="The unit, e.g. U27.")] = None,
            run: RunOpt = None, branch: BranchOpt = "main", as_json: JsonOpt = False) -> None:
    """Why a unit is in its state: attempts, invalidation path, gate or budget figures, and
    the outputs its committed record holds (name, sha256, size).

    \b
    Example:
      keepstep explain U28 --run ME-042
    """
    root, unit = shift(root, unit)
    if unit is None:
        raise UsageProblem("name the unit to explain", "e.g. keepstep explain U07")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        check_unit(the_run, unit)
        result = the_run.explain(unit)
        outputs = the_run.outputs(unit)
        if as_json:
            typer.echo(out.to_json(result.model_dump(mode="json") | {
                "outputs": [o.model_dump(mode="json") for o in outputs]}))
        else:
            typer.echo(out.render_any(result))
            typer.echo(out.outputs_text(outputs, project.root))


def preview(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
            as_json: JsonOpt = False) -> None:
    """Dry run: what the project files' edits would reuse and invalidate, before resuming.

    \b
    Example:
      keepstep preview --run ME-042
    """
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        result = the_run.preview()
        typer.echo(out.to_json(result.model_dump(mode="json")) if as_json
                   else out.preview_text(result))


def register(app: typer.Typer) -> None:
    add_command(app, verify, "verify")
    add_command(app, explain, "explain")
    add_command(app, preview, "preview")
