"""What every ``keepstep`` command module shares: exit codes, friendly errors, the common
arguments, opening a project and a run, and driving the engine in a worker thread.

Nothing here imports the engine at module level (only inside functions), so importing a
command module stays cheap and ``keepstep status`` never loads litellm or textual.
"""

from __future__ import annotations

import functools
import getpass
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.output import commands_for, find_project, here

if TYPE_CHECKING:
    from keepstep.engine import Project, Run
    from keepstep.engine.views import RunStatus

# Exit codes (documented in README and `keepstep --help`): run and resume end with
# EXIT_OK (done, or stopped where asked), EXIT_BLOCKED (waiting for a person: an approval,
# the budget, an unknown external outcome, a held unit) or EXIT_FAILED (units failed).
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_BLOCKED, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 2, 3, 4, 130
DEBUG_ENV = "KEEPSTEP_DEBUG"


# --- errors -------------------------------------------------------------------------------
class UsageProblem(Exception):
    """A mistake in how a command was called; exits with EXIT_USAGE."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  → {self.hint}" if self.hint else base


def describe_error(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, message) for an error a user can cause; None for a bug."""
    if isinstance(exc, UsageProblem):
        return EXIT_USAGE, str(exc)
    from keepstep.engine import (
        ApprovalError,
        BudgetDecisionError,
        ConfigError,
        KeepstepError,
        LeaseLost,
        NotFound,
        PlanValidationError,
        ProjectError,
        RunCancelled,
        SourceError,
        StorageError,
    )

    usage = (PlanValidationError, ProjectError, ConfigError, SourceError, ApprovalError,
             BudgetDecisionError)
    if isinstance(exc, (*usage, NotFound)):  # NotFound first: it is a KeepstepError too
        return EXIT_USAGE, str(exc)
    if isinstance(exc, KeepstepError | StorageError):
        return EXIT_RUNTIME, str(exc)
    if isinstance(exc, RunCancelled):
        return EXIT_CANCELLED, "cancelled at the next safe point"
    if isinstance(exc, PermissionError):
        return EXIT_RUNTIME, permission_message(exc)
    if isinstance(exc, LeaseLost):
        return EXIT_RUNTIME, ("this executor lost its lease to another one; its output is left "
                              "as an orphan\n  → check `keepstep status`, then resume")
    return None


def permission_message(exc: PermissionError) -> str:
    """Which permission is missing on which path, and the command that grants it (an
    unreadable state folder is the user's to fix, not a bug in keepstep)."""
    path = Path(exc.filename) if exc.filename else None
    if path is None:
        return f"permission denied ({exc.strerror or exc})\n  → check that your user may " \
               "read and write the project folder and its .keepstep state folder"
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    folder = probe if probe.is_dir() else probe.parent
    missing = [name for flag, name in ((os.R_OK, "read"), (os.W_OK, "write"))
               if not os.access(probe, flag)]
    if folder.is_dir() and not os.access(folder, os.X_OK):
        missing.append("enter (execute)")
    what = " and ".join(missing) or "read and write"
    return (f"permission denied: your user may not {what} {probe}\n  → give it back with "
            f"`chmod -R u+rwX {folder}` (or run keepstep as the folder's owner)")


def print_error(message: str) -> None:
    typer.echo(f"error: {message}", err=True)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a known error raised by a command into one message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            described = describe_error(exc)
            if described is None or os.environ.get(DEBUG_ENV):
                raise
            code, message = described
            print_error(message)
            raise typer.Exit(code) from None

    return wrapper


def short_help(fn: Callable[..., Any]) -> str:
    """The first paragraph of a command's docstring, whole (click would cut it with "...")."""
    doc = (fn.__doc__ or "").strip()
    return " ".join(doc.split("\n\n", 1)[0].split())


def add_command(target: typer.Typer, fn: Callable[..., Any], name: str | None = None,
                **kwargs: Any) -> None:
    """``target.command(name)(fn)`` with friendly error handling and a full short help."""
    kwargs.setdefault("short_help", short_help(fn))
    target.command(name, **kwargs)(friendly(fn))


def command(target: typer.Typer, name: str | None = None, **kwargs: Any) -> Callable:
    """``@target.command(name)`` with friendly error handling (the decorator form of
    ``add_command``)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        add_command(target, fn, name, **kwargs)
        return fn

    return deco


def sub_app(help_text: str, *, default: str | None = None) -> typer.Typer:
    """A command group (``keepstep sources …``) styled like the main app. With ``default``,
    the group runs that command when no other is named (``keepstep effects`` lists), and the
    old DIR-first order (``keepstep sources DIR list``) still works, with a note."""
    if default is None:
        return typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                           help=help_text, short_help=help_text.split("\n")[0])
    return typer.Typer(no_args_is_help=False, add_completion=False, rich_markup_mode=None,
                       help=help_text, short_help=help_text.split("\n")[0],
                       cls=_default_group(default))


def _default_group(default: str) -> type:
    from typer.core import TyperGroup

    class DefaultGroup(TyperGroup):
        """A group that runs ``default`` when the first word names no command."""

        # ctx: the Context of the click TyperGroup is built on (typer >= 0.29 vendors its own
        # click, so click.Context is not it); only its info_name is read here.
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            if not args:
                args = [default]
            elif args[0] not in self.commands and args[0] not in ("--help", "-h"):
                if not args[0].startswith("-") and len(args) > 1 and args[1] in self.commands:
                    old = " ".join([ctx.info_name or "", args[0], args[1]])
                    new = " ".join([ctx.info_name or "", args[1], args[0]])
                    typer.echo(f"note: `keepstep {old}` is the old order; use "
                               f"`keepstep {new}` (DIR after the command, as everywhere)",
                               err=True)
                    args = [args[1], args[0], *args[2:]]
                else:
                    args = [default, *args]
            return super().parse_args(ctx, args)

    return DefaultGroup


# --- shared arguments ----------------------------------------------------------------------
DirArg = Annotated[Path | None, typer.Argument(
    metavar="[DIR]", show_default=False,
    help="The project folder (default: the one you are in, or the nearest one above it).")]
RunOpt = Annotated[str | None, typer.Option(
    "--run", "-r", show_default=False,
    help="The run id (default: keepstep.toml's default_run, else the newest run).")]
BranchOpt = Annotated[str, typer.Option("--branch", "-b", help="The branch of the run.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
ApproveOpt = Annotated[list[str] | None, typer.Option(
    "--approve", metavar="GATE=CHOICE",
    help="Answer an approval gate when the run reaches it (repeatable).")]
WhoOpt = Annotated[str | None, typer.Option("--who", help="Who decides (default: your login).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")]
MaxUnitsOpt = Annotated[int | None, typer.Option(
    "--max-units", min=1, help="Stop after this many units have been executed.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Record without asking.")]


# --- projects and runs -----------------------------------------------------------------------
def who_or_login(who: str | None) -> str:
    if who:
        return who
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return "user"


def check_dir(root: Path | None) -> Path:
    """``root`` when it is a keepstep project folder (None: the project found from the working
    directory upward); UsageProblem saying what to do otherwise."""
    if root is None:
        found = find_project()
        if found is None:
            raise UsageProblem(f"no keepstep project in {Path.cwd()} or any folder above it",
                               "cd into a project folder, pass its path, or create one with "
                               "`keepstep init my-project`")
        return found
    if not root.exists():
        raise UsageProblem(f"{root} does not exist",
                           "pass a project folder, or create one with `keepstep init DIR`")
    if not root.is_dir():
        raise UsageProblem(f"{root} is not a folder", "pass the project folder, not a file")
    if not (root / "keepstep.toml").is_file():
        raise UsageProblem(f"{root} is not a keepstep project (no keepstep.toml)",
                           "create one with `keepstep init DIR`, or pass the project folder")
    return root


def shift(root: Path | None, value: str | None) -> tuple[Path | None, str | None]:
    """DIR is optional before a command's other positional: when the first one given is not
    a project folder and the second slot is empty (``keepstep explain U07``), the word moves
    one place right and DIR is found from the working directory."""
    if root is None or (root / "keepstep.toml").is_file() or value is not None:
        return root, value
    return None, str(root)


def unit_and_dir(root: Path | None, unit: str | None) -> tuple[Path | None, str | None]:
    """``[DIR] UNIT`` in either order: ``keepstep retry U07 my-pack`` reads ``my-pack`` as
    the folder when it is a project folder and ``U07`` is not a folder; otherwise as
    ``shift``."""
    if (root is not None and unit is not None and not root.exists()
            and (Path(unit) / "keepstep.toml").is_file()):
        return Path(unit), str(root)
    shifted = shift(root, unit)
    return shifted[0], shifted[1]


@contextmanager
def open_project_dir(root: Path | None, *, validate: bool = True,
                     read_only: bool = False) -> Iterator[Project]:
    """The project at ``root`` (or found from the working directory), closed on exit.
    ``validate=False`` opens a project whose plan does not validate (for commands that only
    read or edit sources); ``read_only=True`` is for commands that only look (status,
    verify, explain, …): nothing is created, migrated or written, so they also work on a
    read-only ``.keepstep``."""
    from keepstep.engine import open_project

    root = check_dir(root)
    # Before the first run there is no database to look at: open it as before (it says "no
    # runs yet"; a lost database beside earlier work is refused there, not re-created).
    read_only = read_only and (root / ".keepstep" / "state.db").is_file()
    project = open_project(root, validate=validate, read_only=read_only)
    try:
        yield project
    finally:
        project.close()


def run_id_of(project: Project, run_id: str | None) -> str:
    """``--run`` when given, else keepstep.toml's default_run, else the newest run (else R1)."""
    return run_id or project.default_run_id()


def existing_run(project: Project, run_id: str | None, branch: str = "main") -> Run:
    run_id = run_id_of(project, run_id)
    if run_id not in project.runs():
        known = ", ".join(project.runs()) or "none yet"
        raise UsageProblem(f"no run {run_id!r} in {project.root} (runs: {known})",
                           f"start it with `keepstep run {here(project.root)}--run {run_id}`")
    return project.get_run(run_id, branch)


def check_unit(run: Run, unit: str) -> None:
    units = run.plan.unit_map()
    if unit not in units:
        raise UsageProblem(f"no unit {unit!r} in {run.plan_info.get('label', 'the plan')}",
                           "units: " + ", ".join(units))


def parse_approvals(values: list[str] | None) -> dict[str, str]:
    answers: dict[str, str] = {}
    for value in values or []:
        gate, sep, choice = value.partition("=")
        if not sep or not gate.strip() or not choice.strip():
            raise UsageProblem(f"--approve {value!r} is not GATE=CHOICE",
                               "e.g. --approve audience='product team'")
        answers[gate.strip()] = choice.strip()
    return answers


def check_gates(plan: Any, answers: dict[str, str]) -> None:
    gates = {g.id for g in plan.gates}
    unknown = sorted(set(answers) - gates)
    if unknown:
        raise UsageProblem(f"--approve names no gate of this plan: {', '.join(unknown)}",
                           "gates: " + (", ".join(sorted(gates)) or "none"))


# --- dashboards ------------------------------------------------------------------------------
def models_of(project: Project, run: Run | None = None) -> list[str]:
    cfg = project.files.config
    kinds = {u.kind.value for u in (run.plan if run else project.files.plan).units}
    return [cfg.models.get(k, cfg.default_model) for k in sorted(kinds)] or [cfg.default_model]


def dashboard(project: Project, run: Run, status: RunStatus) -> str:
    return commands_for(out.dashboard_text(status, project=project.files.config.name,
                                           models=models_of(project, run)), project.root)


def summary_line(status: RunStatus) -> str:
    c = status.counts
    return (f"run {status.run_id} ({status.branch}): {status.decision} · {c.get('current', 0)}/"
            f"{len(status.units)} units current · {c.get('superseded', 0)} superseded · "
            f"checkpoint {status.head_version} · {status.plan_version} · {status.input_version}")


def exit_code(status: RunStatus) -> int:
    """EXIT_OK when done or stopped as asked, EXIT_FAILED when a unit failed, EXIT_BLOCKED
    when the run waits for a person."""
    if status.decision == "done":
        return EXIT_OK
    if any(v.state == "failed" for v in status.units.values()):
        return EXIT_FAILED
    if status.decision == "blocked":
        return EXIT_BLOCKED
    return EXIT_OK  # ready to go on: stopped by --max-units or a stop_after


# --- driving the engine ------------------------------------------------------------------------
# Set by ``drive`` when a cancelled run left unit threads inside provider calls.
_ABANDONED_CALLS = 0


def drive(action: Callable[[threading.Event, Callable[[dict[str, Any]], None]], Any], *,
          quiet: bool = False, run: Run | None = None, as_json: bool = False) -> tuple[Any, bool]:
    """Run ``action(cancel, on_event)`` in a worker thread; Ctrl-C sets ``cancel``.

    Progress: a live display (units done of total, the units in flight with their step and
    elapsed time, calls, tokens, cost, ETA) on a terminal when ``run`` is given; plain lines
    otherwise — on stderr with ``--json``, so stdout stays one JSON document; nothing with
    ``quiet``. Returns (the action's result or None, whether it was cancelled). The engine
    stops at its next safe point; a second Ctrl-C quits at once (the unit in flight is then
    an orphan that the next resume finds and redoes — committed work is never lost).
    """
    from keepstep.app.cli.progress import progress_display

    cancel = threading.Event()
    display = progress_display(run, quiet=quiet, as_json=as_json)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = action(cancel, display.on_event)
        except BaseException as exc:  # handed back to the main thread
            box["error"] = exc

    presses = 0

    def on_sigint(_signum: int, _frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            cancel.set()
            display.say("cancel requested: stopping at the next safe point "
                        "(Ctrl-C again to quit now)")
        else:
            typer.echo("quitting now; the unit in flight is left as an orphan and redone on "
                       "resume", err=True)
            os._exit(EXIT_CANCELLED)

    worker = threading.Thread(target=work, name="keepstep-run", daemon=True)
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a service manager, `kill`) stops the run like Ctrl-C does.
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_sigint)
    try:
        with display:
            worker.start()
            while worker.is_alive():
                worker.join(0.2)
                display.tick()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    error = box.get("error")
    if error is not None:
        from keepstep.engine import RunCancelled

        if isinstance(error, RunCancelled):
            global _ABANDONED_CALLS
            _ABANDONED_CALLS = int(getattr(error, "abandoned_calls", 0) or 0)
            return None, True
        raise error
    return box.get("result"), cancel.is_set()


def show_tokens(run: Run, status: RunStatus | None = None) -> None:
    """Print each resume token this run's loop issued for a gate still waiting (shown once:
    only its hash is kept); a gate answered on the way (``--approve``) needs none."""
    waiting = None if status is None else {getattr(a, "gate", None)
                                           for a in status.pending_approvals}
    for gate, token in run.resume_tokens.items():
        if waiting is not None and gate not in waiting:
            continue
        typer.echo(f"resume token for gate {gate} (shown once, valid 24 h, single use): "
                   f"{token}")
        typer.echo("  someone without access to this project can answer with "
                   f"`keepstep approve --run {run.run_id} {gate} --choice ... --token {token}`; "
                   "here, a plain `keepstep approve` needs no token")


def finish(project: Project, run: Run, status: RunStatus | None, cancelled: bool,
           quiet: bool, as_json: bool = False) -> None:
    """Print where a run stopped (dashboard, one line with --quiet, or the status as JSON),
    then exit with the code for it (see EXIT_*)."""
    status = status if status is not None else run.status()
    if as_json:
        typer.echo(out.to_json(status.model_dump(mode="json") | {
            "exit_code": EXIT_CANCELLED if cancelled else exit_code(status),
            "resume_tokens": {g: t for g, t in run.resume_tokens.items()
                              if g in {getattr(a, "gate", None)
                                       for a in status.pending_approvals}}}))
    elif quiet:
        typer.echo(summary_line(status))
        typer.echo(f"next: {commands_for(status.next_action, project.root)}")
        show_tokens(run, status)
    else:
        typer.echo("")
        typer.echo(dashboard(project, run, status))
        show_tokens(run, status)
    if cancelled:
        typer.echo(f"cancelled at the next safe point; continue with "
                   f"`keepstep resume {here(project.root)}--run {run.run_id}`", err=True)
        if _ABANDONED_CALLS:
            # A unit thread is still inside a provider call (its attempt is cancelled and its
            # lease released): the interpreter's shutdown would wait seconds for it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_CANCELLED)
        raise typer.Exit(EXIT_CANCELLED)
    code = exit_code(status)
    if code:
        raise typer.Exit(code)


def on_terminal() -> bool:
    """True when a person can answer a question on stdin."""
    import sys

    return sys.stdin is not None and sys.stdin.isatty()


def confirmed(question: str, yes: bool) -> bool:
    """True with --yes; else ask when stdin is a terminal; else False (nothing is recorded)."""
    if yes:
        return True
    if not on_terminal():
        typer.echo("not recorded: this is a preview (pass --yes to record it without asking)")
        return False
    if typer.confirm(question, default=False):
        return True
    typer.echo("not recorded")
    return False
