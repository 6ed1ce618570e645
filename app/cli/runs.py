"""Runs from the command line: ``status``, ``run``, ``resume``, ``retry``, ``replay``,
``restart``, ``branch`` and ``tui``.

Four actions, four commands (DESIGN §6): retry (same unit, new attempt), resume (continue
after a restart), replay (recorded calls, no model calls), restart (a new run id); a branch
forks a run at a checkpoint. Each long action runs the engine in a worker thread
(``drive``) so Ctrl-C stops at the next safe point.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
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
    here,
    open_project_dir,
    parse_approvals,
    run_id_of,
    unit_and_dir,
    who_or_login,
)

if TYPE_CHECKING:
    from keepstep.engine import Project

JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, max=64,
    help="Units in flight at once (default: max_parallel in keepstep.toml, 4; 1 = one at a "
         "time).")]


def status(
    root: DirArg = None,
    run: RunOpt = None,
    branch: BranchOpt = "main",
    all_runs: Annotated[bool, typer.Option("--all", help="List every run instead.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The run dashboard: units by phase, budget, what needs you, what runs now.

    Never loads a model client or the TUI. Without --run: keepstep.toml's default_run, else
    the newest run. `--json` gives the same facts, with current and superseded successes
    counted apart (counts.current, counts.superseded).

    \b
    Example:
      keepstep status --run ME-042
      keepstep status ~/packs/me042 --json
    """
    # Read, printed, and the process exits: no garbage collection meanwhile. A full
    # collection scans every object of the loaded plan (0.1–0.2 s each at 10,000 units), and
    # nothing status builds is a reference cycle worth reclaiming before the exit.
    from keepstep.engine import plan  # here: importing the CLI loads no engine

    with plan.gc_paused(), open_project_dir(root, read_only=True) as project:
        runs = project.runs()
        if not runs and run is not None:
            existing_run(project, run, branch)  # names the run and how to start it
        if not runs:
            if as_json:
                typer.echo(out.to_json({"runs": []}))
            else:
                typer.echo(f"no runs yet in {project.root}; start one with "
                           f"`keepstep run {here(project.root)}--run "
                           f"{project.default_run_id()}`")
            return
        if all_runs:
            statuses = [project.get_run(r).status() for r in runs]
            rows = [{k: s.model_dump(mode="json")[k] for k in (
                "run_id", "plan_version", "input_version", "head_version", "decision",
                "next_action")} for s in statuses]
            if as_json:
                typer.echo(out.to_json({"runs": rows}))
            else:
                typer.echo(out.runs_table(rows))
                typer.echo(f"show one with `keepstep status {here(project.root)}--run ID`")
            return
        the_run = existing_run(project, run, branch)
        st = the_run.status()
        if as_json:
            typer.echo(out.to_json(st.model_dump(mode="json")))
        else:
            typer.echo(dashboard(project, the_run, st))
            others = [r for r in runs if r != the_run.run_id]
            if others:
                typer.echo(f"\nother runs: {', '.join(others)} (`keepstep status --all`)")


def _start(root: Path | None, run: str | None, branch: str, answers: dict[str, str],
           max_units: int | None, quiet: bool, as_json: bool, jobs: int | None, *,
           create: bool, new: bool = False, left_out: dict[str, str] | None = None,
           foreign_sources: frozenset[str] = frozenset()) -> None:
    with open_project_dir(root) as project:
        run_id = run_id_of(project, run)
        runs = project.runs()
        exists = run_id in runs
        if not create and not exists:
            existing_run(project, run_id, branch)  # the error naming the known runs
        if create and not exists and runs and not new:
            # A mistyped --run must not start a new run that spends budget.
            close = difflib.get_close_matches(run_id, runs, n=1, cutoff=0.5)
            guess = f"did you mean {close[0]}? " if close else ""
            raise UsageProblem(
                f"no run {run_id!r} in {project.root} (runs: {', '.join(runs)})",
                f"{guess}continue one with `keepstep run {here(project.root)}--run "
                f"{close[0] if close else runs[-1]}`, or start {run_id} as a new run with "
                f"`keepstep run {here(project.root)}--run {run_id} --new`")
        check_gates(project.get_run(run_id, branch).plan if exists else project.files.plan,
                    answers)
        the_run = project.open_or_start(run_id, branch)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.run(cancel=cancel, on_event=on_event,
                                                 approve=answers, max_units=max_units,
                                                 jobs=jobs, left_out=left_out,
                                                 foreign_sources=foreign_sources),
            quiet=quiet, run=the_run, as_json=as_json)
        finish(project, the_run, result, cancelled, quiet, as_json)


NewOpt = Annotated[bool, typer.Option(
    "--new", help="Start --run as a new run when the project already has others (a run id "
                  "that is not there is refused without it, so a typo spends nothing).")]


def run_cmd(root: DirArg = None, run: RunOpt = None, approve: ApproveOpt = None,
            max_units: MaxUnitsOpt = None, branch: BranchOpt = "main", quiet: QuietOpt = False,
            as_json: JsonOpt = False, jobs: JobsOpt = None, new: NewOpt = False) -> None:
    """Start the run (or continue it) until done, blocked or cancelled (Ctrl-C).

    Shows live progress on a terminal (plain lines otherwise). Exit code: 0 done (or stopped
    by --max-units), 3 waiting for a person (approval, budget, unknown external outcome,
    held unit), 4 units failed, 2 usage error, 130 cancelled. With --json the final status
    is printed as JSON (with "exit_code").

    \b
    Example:
      keepstep run --run ME-042 --approve audience="product team"
      keepstep run my-pack --max-units 5
      keepstep run --run R2 --new
    """
    _start(root, run, branch, parse_approvals(approve), max_units, quiet, as_json, jobs,
           create=True, new=new)


def resume(root: DirArg = None, run: RunOpt = None, approve: ApproveOpt = None,
           max_units: MaxUnitsOpt = None, branch: BranchOpt = "main", quiet: QuietOpt = False,
           as_json: JsonOpt = False, jobs: JobsOpt = None) -> None:
    """Continue a run after a restart or interruption (recovery first).

    Same progress, exit codes and --json as `keepstep run`.

    \b
    Example:
      keepstep resume --run ME-042
    """
    _start(root, run, branch, parse_approvals(approve), max_units, quiet, as_json, jobs,
           create=False)



def retry(root: DirArg = None,
          unit: Annotated[str | None, typer.Argument(metavar="UNIT", show_default=False,
                                                     help="The unit to try again, e.g. U07.")]
          = None,
          run: RunOpt = None, branch: BranchOpt = "main", who: WhoOpt = None,
          quiet: QuietOpt = False, as_json: JsonOpt = False) -> None:
    """Same unit, new attempt (a recorded decision), then continue the run.

    \b
    Example:
      keepstep retry U07 --run ME-042
      keepstep retry my-pack U07    (or: keepstep retry U07 my-pack)

    A unit that is current but whose final validator did not pass is rerun (it and what
    uses its content are invalidated); a current unit that passed makes no new attempt.
    """
    root, unit = unit_and_dir(root, unit)
    if unit is None:
        raise UsageProblem("name the unit to retry", "e.g. keepstep retry U07")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        check_unit(the_run, unit)
        if the_run.final_check_failed(unit):
            typer.echo(f"{unit} is current but its final validator did not pass: it is rerun "
                       "(it and what uses its content are invalidated, a recorded decision)",
                       err=True)
        elif the_run.is_current_and_passed(unit):
            typer.echo(f"{unit} is current and its checks passed: a retry makes no new "
                       f"attempt; to run it again anyway use `keepstep takeover rerun "
                       f"{unit}`", err=True)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.retry(unit, who=who_or_login(who), cancel=cancel,
                                                   on_event=on_event),
            quiet=quiet, run=the_run, as_json=as_json)
        finish(project, the_run, result, cancelled, quiet, as_json)


def new_run_id(project: Project, new_id: str) -> str:
    if new_id in project.runs():
        raise UsageProblem(f"run {new_id!r} already exists", "choose a new run id with --as")
    return new_id


def replay(root: DirArg = None, run: RunOpt = None,
           as_: Annotated[str | None, typer.Option("--as", help="The new run id "
                                                   "(default RUN-replay).")] = None,
           quiet: QuietOpt = False) -> None:
    """Re-execute a run into a new run from its recorded responses (no model calls)."""
    with open_project_dir(root) as project:
        source = existing_run(project, run)
        new_id = new_run_id(project, as_ or f"{source.run_id}-replay")
        result, cancelled = drive(
            lambda cancel, on_event: source.replay(new_id, cancel=cancel, on_event=on_event),
            quiet=quiet)
        new_run = result if result is not None else project.get_run(new_id)
        finish(project, new_run, None, cancelled, quiet)


def restart(root: DirArg = None, run: RunOpt = None,
            as_: Annotated[str, typer.Option("--as", help="The new run id.")] = "") -> None:
    """A new business task: a new run id from the current files (the old run is kept)."""
    if not as_:
        raise UsageProblem("name the new run", "pass --as NEW_ID")
    with open_project_dir(root) as project:
        old = existing_run(project, run)
        new = project.restart(old.run_id, new_run_id(project, as_))
        typer.echo(f"started run {new.run_id} from the current project files "
                   f"(run {old.run_id} is kept, with a decision.restart event)")
        typer.echo(f"run it with `keepstep run {here(project.root)}--run {new.run_id}`")


AtOpt = Annotated[int, typer.Option("--at", min=0, help="The checkpoint version.")]
AsBranchOpt = Annotated[str, typer.Option("--as", help="The new branch id.")]


def branch_cmd(root: DirArg = None, run: RunOpt = None, at: AtOpt = -1, as_: AsBranchOpt = "",
               branch: Annotated[str, typer.Option("--from", help="The branch to fork.")]
               = "main") -> None:
    """Fork a run at a checkpoint under its own branch id and head."""
    if at < 0 or not as_:
        raise UsageProblem("`branch` needs --at VERSION and --as NAME",
                           "e.g. keepstep branch --at 28 --as try-board")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        head = the_run.head().version
        if at > head:
            raise UsageProblem(f"checkpoint {at} is past the head of {the_run.run_id}/{branch} "
                               f"({head})", f"pick a version from 0 to {head}")
        new = the_run.branch(at, as_)
        typer.echo(f"branch {as_} of run {the_run.run_id} forked at checkpoint {at}")
        typer.echo(f"continue it with `keepstep resume {here(project.root)}--run "
                   f"{the_run.run_id} --branch {new.branch_id}`")


# --- TUI -------------------------------------------------------------------------------------
def launch_tui(root: Path | None, run_id: str | None = None) -> None:
    """Open the TUI on ``root`` (and ``run_id``, default keepstep.toml's default_run, else the
    newest run); textual is imported only here."""
    from keepstep.app.tui import make_app

    root = check_dir(root)
    # A plan.toml repaired in the raw view (it was not TOML) reopens the project as usual.
    while make_app(root, run_id).run() == "reopen":
        pass


def tui(root: DirArg = None, run: RunOpt = None) -> None:
    """Open the TUI on a project (also: `keepstep` with no arguments inside one).

    \b
    Example:
      keepstep tui ~/packs/me042 --run ME-042
    """
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
