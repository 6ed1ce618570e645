"""``keepstep drill DIR --run ID [--seed N]``: kill a copy of the run twice, recover it, check it.

The drill works on a temporary copy (``keepstep.engine.drills.drill``): the project's own files and
runs are not changed. Without ``--seed`` a seed is drawn and printed, so a drill that failed
can be repeated exactly. Exit code 0 when every check passes, 1 when one fails (the copy is
then kept, and the report says where).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_RUNTIME,
    DirArg,
    JsonOpt,
    RunOpt,
    add_command,
    existing_run,
    open_project_dir,
)

SeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="Picks the two crash points; the same seed drills the same way.")]
KeepOpt = Annotated[bool, typer.Option("--keep", help="Keep the copy even when the drill "
                                       "passes.")]
WorkdirOpt = Annotated[Path | None, typer.Option(
    "--workdir", help="Where to make the temporary copy (default: the system temp folder).")]


def drill(root: DirArg = None, run: RunOpt = None, seed: SeedOpt = None, keep: KeepOpt = False,
          workdir: WorkdirOpt = None, as_json: JsonOpt = False) -> None:
    """Kill a copy of the run at two seeded commit-protocol boundaries, recover it with a
    third executor, and check: every unit current, only in-flight units redone, no duplicate
    commits, orphans never referenced, the checkpoint chain intact."""
    from keepstep.engine import drill as run_drill

    with open_project_dir(root) as project:
        root, run = project.root, existing_run(project, run).run_id
    chosen = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    if not as_json:
        typer.echo(f"drilling a copy of run {run} with seed {chosen} …")
    report = run_drill(root, run, seed=chosen, keep=keep, workdir=workdir)
    typer.echo(out.to_json(report.model_dump(mode="json") | {"passed": report.passed})
               if as_json else report.render())
    if not report.passed:
        raise typer.Exit(EXIT_RUNTIME)


def register(app: typer.Typer) -> None:
    add_command(app, drill, "drill")
