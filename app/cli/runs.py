"""Runs from the command line: ``status``, ``run``, ``resume``, ``retry``, ``replay``,
``restart``, ``branch`` and ``tui``.

Four actions, four commands (DESIGN §6): retry (same unit, new attempt), resume (continue
after a restart), replay (recorded calls, no model calls), restart (a new run id); a branch
forks a run at a checkpoint. Each long action runs the engine in a worker thread
(``drive``) so Ctrl-C stops at the next safe point.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_RUNTIME,
    ApproveOpt,
    BranchOpt,
    DirArg,
    JsonOpt,
    MaxUnitsOpt,
    QuietOpt,
    RunOpt,
    UsageProblem,
    WhoOpt,
    add_command,
    check_dir,
    check_gates,
    check_unit,
    dashboard,
    drive,
    existing_run,
    finish,
    open_project_dir,
    parse_approvals,
    print_error,
    who_or_login,
)

if TYPE_CHECKING:
    from keepstep.engine import Project

JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, max=64,
    help="Units in flight at once (default: max_parallel in keepstep.toml, 4; 1 = one at a "
         "time).")]


def status(
    root: DirArg,
    run: Annotated[str | None, typer.Option("--run", "-r", help="The run (optional when the "
                                            "project has only one).")] = None,
    branch: BranchOpt = "main",
    as_json: JsonOpt = False,
) -> None:
    """The run dashboard (or the list of runs). Never loads a model client or the TUI."""
    with open_project_dir(root) as project:
        runs = project.runs()
        if run is None and len(runs) != 1:
            if not runs:
                if as_json:
                    typer.echo(out.to_json({"runs": []}))
                else:
                    typer.echo(f"no runs yet in {project.root}; start one with "
                               f"`keepstep run {root} --run R1`")
                return
            statuses = [project.get_run(r).status() for r in runs]
            rows = [{k: s.model_dump(mode="json")[k] for k in (
                "run_id", "plan_version", "input_version", "head_version", "decision",
                "next_action")} for s in statuses]
            if as_json:
                typer.echo(out.to_json({"runs": rows}))
            else:
                typer.echo(out.runs_table(rows))
                typer.echo(f"show one with `keepstep status {root} --run ID`")
            return
        the_run = existing_run(project, run or runs[0], branch)
        st = the_run.status()
        if as_json:
            typer.echo(out.to_json(st.model_dump(mode="json")))
        else:
            typer.echo(dashboard(project, the_run, st))


def run_cmd(root: DirArg, run: RunOpt, approve: ApproveOpt = None, max_units: MaxUnitsOpt = None,
            branch: BranchOpt = "main", quiet: QuietOpt = False, jobs: JobsOpt = None) -> None:
    """Start the run (or continue it) until done, blocked or cancelled (Ctrl-C)."""
    answers = parse_approvals(approve)
    with open_project_dir(root) as project:
        exists = run in project.runs()
        check_gates(project.get_run(run, branch).plan if exists else project.files.plan, answers)
        the_run = project.open_or_start(run, branch)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.run(cancel=cancel, on_event=on_event,
                                                 approve=answers, max_units=max_units,
                                                 jobs=jobs),
            quiet=quiet)
        finish(project, the_run, result, cancelled, quiet)


def resume(root: DirArg, run: RunOpt, approve: ApproveOpt = None, max_units: MaxUnitsOpt = None,
           branch: BranchOpt = "main", quiet: QuietOpt = False, jobs: JobsOpt = None) -> None:
    """Continue a run after a restart or interruption (recovery first)."""
    answers = parse_approvals(approve)
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        check_gates(the_run.plan, answers)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.resume(cancel=cancel, on_event=on_event,
                                                    approve=answers, max_units=max_units,
                                                    jobs=jobs),
            quiet=quiet)
        finish(project, the_run, result, cancelled, quiet)


def retry(root: DirArg, run: RunOpt,
          unit: Annotated[str, typer.Argument(help="The unit to try again, e.g. U07.")],
          branch: BranchOpt = "main", who: WhoOpt = None, quiet: QuietOpt = False) -> None:
    """Same unit, new attempt (a recorded decision), then continue the run."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        check_unit(the_run, unit)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.retry(unit, who=who_or_login(who), cancel=cancel,
                                                   on_event=on_event),
            quiet=quiet)
        finish(project, the_run, result, cancelled, quiet)


def new_run_id(project: Project, new_id: str) -> str:
    if new_id in project.runs():
        raise UsageProblem(f"run {new_id!r} already exists", "choose a new run id with --as")
    return new_id


def replay(root: DirArg, run: RunOpt,
           as_: Annotated[str | None, typer.Option("--as", help="The new run id "
                                                   "(default RUN-replay).")] = None,
           quiet: QuietOpt = False) -> None:
    """Re-execute a run into a new run from its recorded responses (no model calls)."""
    with open_project_dir(root) as project:
        source = existing_run(project, run)
        new_id = new_run_id(project, as_ or f"{run}-replay")
        result, cancelled = drive(
            lambda cancel, on_event: source.replay(new_id, cancel=cancel, on_event=on_event),
            quiet=quiet)
        new_run = result if result is not None else project.get_run(new_id)
        finish(project, new_run, None, cancelled, quiet)


def restart(root: DirArg, run: RunOpt,
            as_: Annotated[str, typer.Option("--as", help="The new run id.")]) -> None:
    """A new business task: a new run id from the current files (the old run is kept)."""
    with open_project_dir(root) as project:
        existing_run(project, run)
        new = project.restart(run, new_run_id(project, as_))
        typer.echo(f"started run {new.run_id} from the current project files "
                   f"(run {run} is kept, with a decision.restart event)")
        typer.echo(f"run it with `keepstep run {root} --run {new.run_id}`")


AtOpt = Annotated[int, typer.Option("--at", min=0, help="The checkpoint version.")]
AsBranchOpt = Annotated[str, typer.Option("--as", help="The new branch id.")]


def branch_cmd(root: DirArg, run: RunOpt, at: AtOpt, as_: AsBranchOpt,
               branch: Annotated[str, typer.Option("--from", help="The branch to fork.")]
               = "main") -> None:
    """Fork a run at a checkpoint under its own branch id and head."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        head = the_run.head().version
        if at > head:
            raise UsageProblem(f"checkpoint {at} is past the head of {run}/{branch} ({head})",
                               f"pick a version from 0 to {head}")
        new = the_run.branch(at, as_)
        typer.echo(f"branch {as_} of run {run} forked at checkpoint {at}")
        typer.echo(f"continue it with `keepstep resume {root} --run {run} --branch "
                   f"{new.branch_id}`")


# --- TUI -------------------------------------------------------------------------------------
def launch_tui(root: Path, run_id: str | None = None) -> None:
    """Open the TUI on ``root`` (and ``run_id``, default the newest run); textual is imported
    only here."""
    check_dir(root)
    make_app = None
    if importlib.util.find_spec("keepstep.app.tui") is not None:
        try:
            from keepstep.app.tui import make_app
        except ImportError:  # the package is there but not finished (no make_app yet)
            make_app = None
    if make_app is None:
        print_error("the TUI is not available in this build yet")
        typer.echo(f"use the commands instead, e.g. `keepstep status {root}` "
                   "(see `keepstep --help`)", err=True)
        raise typer.Exit(EXIT_RUNTIME)
    make_app(root, run_id).run()


def tui(root: Annotated[Path, typer.Argument(help="The project folder.")] = Path("."),
        run: Annotated[str | None, typer.Option("--run", "-r", help="The run to show "
                                                "(default: the newest).")] = None) -> None:
    """Open the TUI on a project."""
    launch_tui(root, run)


def register(app: typer.Typer) -> None:
    add_command(app, status, "status")
    add_command(app, run_cmd, "run")
    add_command(app, resume, "resume")
    add_command(app, retry, "retry")
    add_command(app, replay, "replay")
    add_command(app, restart, "restart")
    add_command(app, branch_cmd, "branch")
    add_command(app, tui, "tui")
