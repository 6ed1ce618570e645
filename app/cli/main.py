"""The ``keepstep`` command line: a thin face over ``keepstep.engine``.

This module holds the typer app, the entry point and the wiring; the commands live in
modules named for what they act on — ``cli_project`` (init, validate, sources),
``cli_runs`` (status, run, resume, retry, replay, restart, branch, tui), ``cli_records``
(calls, events, effects, budget, approvals, approve, revoke, keys), ``cli_inspect``
(verify, explain, preview), ``cli_takeover`` (takeover) — plus, when installed,
``cli_maintenance`` (backup, restore, gc), ``cli_drill`` and ``cli_handover``. Each has a
``register(app)``. None of them touches SQL or storage internals, and none imports the
engine, litellm or textual at module level, so ``keepstep status`` starts fast and never
loads a model client or the TUI.

Exit codes: 0 success, 1 a runtime problem (a corrupt database, a refused keyring,
a broken chain), 2 a usage or validation problem (a missing folder, an invalid plan,
an unknown run, gate or unit), 130 cancelled with Ctrl-C. A user-caused failure
prints one message and what to do next, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from keepstep.app.cli import drill as cli_drill
from keepstep.app.cli import handover as cli_handover
from keepstep.app.cli import inspect as cli_inspect
from keepstep.app.cli import maintenance as cli_maintenance
from keepstep.app.cli import project as cli_project
from keepstep.app.cli import records as cli_records
from keepstep.app.cli import runs as cli_runs
from keepstep.app.cli import takeover as cli_takeover
from keepstep.app.cli.common import (  # re-exported for the command modules and tests
    DEBUG_ENV,
    EXIT_CANCELLED,
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
    friendly,
    open_project_dir,
    print_error,
    who_or_login,
)

app = typer.Typer(
    name="keepstep", no_args_is_help=False, add_completion=False,
    pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Durable, explainable long-running AI research runs.\n\n"
    "Run `keepstep` with no arguments inside a project folder to open the TUI.",
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
    here = Path.cwd()
    if (here / "keepstep.toml").is_file():
        friendly(cli_runs.launch_tui)(here)
        return
    typer.echo(ctx.get_help())
    print_error(f"no keepstep.toml in {here}")
    typer.echo("  → cd into a project folder, or create one with `keepstep init DIR`", err=True)
    raise typer.Exit(EXIT_USAGE)


def _register_all(target: typer.Typer) -> None:
    # Each command module stays cheap to import: the engine loads inside the commands.
    for module in (cli_project, cli_runs, cli_records, cli_inspect, cli_takeover,
                   cli_maintenance, cli_drill, cli_handover):
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
    "EXIT_CANCELLED", "EXIT_RUNTIME", "EXIT_USAGE", "BranchOpt", "DirArg", "JsonOpt", "RunOpt",
    "UsageProblem", "WhoOpt", "add_command", "app", "check_dir", "command", "describe_error",
    "drive",
    "existing_run", "friendly", "main", "open_project_dir", "who_or_login",
]

if __name__ == "__main__":
    main()
