"""The ``keepstep`` command line: a thin face over ``keepstep.engine``.

This module holds the typer app, the entry point and the wiring; the commands live in
modules named for what they act on — ``project`` (init, validate, sources), ``runs``
(status, run, resume, retry, replay, restart, branch, tui), ``records`` (calls, events,
effects, budget, approvals, approve, revoke, keys), ``inspect`` (verify, explain, preview),
``takeover``, ``deliverables`` (export), ``maintenance`` (backup, restore, gc), ``drill``,
``conflicts`` and ``handover``. Each has a ``register(app)``. None of them touches SQL or storage
internals, and none imports the engine, litellm or textual at module level, so ``keepstep
status`` starts fast and never loads a model client or the TUI.

DIR is optional everywhere: the project is the folder you are in, or the nearest one above
it holding keepstep.toml (DIR is still accepted first). --run defaults to keepstep.toml's
``default_run``, else the newest run.

Exit codes: 0 success (run/resume: done, or stopped where asked), 1 a runtime problem (a
corrupt database, a refused keyring, a broken chain), 2 a usage or validation problem (a
missing folder, an invalid plan, an unknown run, gate or unit), 3 the run waits for a person
(an approval, the budget, an unknown external outcome, a held unit), 4 units failed, 130
cancelled with Ctrl-C. A user-caused failure prints one message and what to do next, never a
traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument

from keepstep.app.cli import completion as cli_completion
from keepstep.app.cli import conflicts as cli_conflicts
from keepstep.app.cli import deliverables as cli_deliverables
from keepstep.app.cli import drill as cli_drill
from keepstep.app.cli import handover as cli_handover
from keepstep.app.cli import inspect as cli_inspect
from keepstep.app.cli import maintenance as cli_maintenance
from keepstep.app.cli import project as cli_project
from keepstep.app.cli import records as cli_records
from keepstep.app.cli import runs as cli_runs
from keepstep.app.cli import takeover as cli_takeover
from keepstep.app.cli import team as cli_team
from keepstep.app.cli.common import (  # re-exported for the command modules and tests
    DEBUG_ENV,
    EXIT_BLOCKED,
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    UsageProblem,
    WhoOpt,
    add_command,
    check_dir,
    command,
    describe_error,
    drive,
    existing_run,
    find_project,
    friendly,
    open_project_dir,
    print_error,
    who_or_login,
)


def _usage_name(self: Any) -> str:
    """Typer marks a required argument {LIKE_THIS} on usage lines; keepstep's metavars say
    themselves whether they are optional ("[DIR]"), so they are shown as written."""
    name = self.display_name_raw
    return name + ("..." if self.nargs != 1 else "")


if hasattr(TyperArgument, "_usage_display_name"):
    TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]

app = typer.Typer(
    name="keepstep", no_args_is_help=False, add_completion=False,
    pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Durable, explainable long-running AI research runs.\n\n"
    "Run `keepstep` with no arguments inside a project folder to open the TUI. DIR is "
    "optional: the project is the folder you are in, or the nearest one above it. --run "
    "defaults to keepstep.toml's default_run, else the newest run.\n\n"
    "\b\nExit codes: 0 done · 1 runtime problem · 2 usage error\n"
    "            3 waiting for a person · 4 units failed · 130 cancelled\n\n"
    "\b\nA first session:\n"
    "  keepstep init my-pack && cd my-pack\n"
    "  keepstep validate\n"
    "  keepstep run            # live progress; exit 3 if it stops for you\n"
    "  keepstep status\n"
    "  keepstep export         # the deliverables, with their sha256, in deliverables/R1/",
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"keepstep {version('keepstep')}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context, _show_version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version.")] = False,
          ) -> None:
    if ctx.invoked_subcommand is not None:
        return
    found = find_project()
    if found is not None:
        friendly(cli_runs.launch_tui)(found)
        return
    here = Path.cwd()
    typer.echo(ctx.get_help())
    print_error(f"no keepstep.toml in {here} or any folder above it")
    typer.echo("  → cd into a project folder, or create one with `keepstep init DIR`", err=True)
    raise typer.Exit(EXIT_USAGE)


def _register_all(target: typer.Typer) -> None:
    # Each command module stays cheap to import: the engine loads inside the commands.
    for module in (cli_project, cli_runs, cli_records, cli_inspect, cli_takeover,
                   cli_deliverables, cli_maintenance, cli_drill, cli_handover,
                   cli_conflicts, cli_completion, cli_team):
        module.register(target)


_register_all(app)


# --- entry point -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """The console script. Known errors are printed as one message; a bug keeps its
    traceback only when KEEPSTEP_DEBUG is set."""
    try:
        app(args=argv, prog_name="keepstep")
    except SystemExit:
        raise
    except BaseException as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        described = describe_error(exc)
        if described is None:
            if isinstance(exc, KeyboardInterrupt):
                print_error("interrupted")
                sys.exit(EXIT_CANCELLED)
            print_error(f"internal error: {type(exc).__name__}: {exc}")
            typer.echo(f"  → this is a bug in keepstep; set {DEBUG_ENV}=1 to see the traceback",
                       err=True)
            sys.exit(EXIT_RUNTIME)
        code, message = described
        print_error(message)
        sys.exit(code)


__all__ = [
    "EXIT_BLOCKED", "EXIT_CANCELLED", "EXIT_FAILED", "EXIT_OK", "EXIT_RUNTIME", "EXIT_USAGE",
    "BranchOpt", "DirArg", "JsonOpt", "RunOpt", "UsageProblem", "WhoOpt", "add_command", "app",
    "check_dir", "command", "describe_error", "drive", "existing_run", "find_project",
    "friendly", "main", "open_project_dir", "who_or_login",
]

if __name__ == "__main__":
    main()
