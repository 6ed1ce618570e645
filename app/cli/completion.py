"""``keepstep completion install|show [SHELL]``: shell completion of commands and options.

Click (under typer) completes through the ``_KEEPSTEP_COMPLETE`` variable; typer's helper
writes the script for bash, zsh, fish or PowerShell where that shell reads it and says
which file it touched. ``show`` prints the script instead, for a person who keeps their own
dotfiles.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from keepstep.app.cli.common import UsageProblem, add_command, sub_app

SHELLS = ("bash", "zsh", "fish", "pwsh", "powershell")
PROG, VAR = "keepstep", "_KEEPSTEP_COMPLETE"

ShellArg = Annotated[str | None, typer.Argument(
    metavar="[SHELL]", show_default=False,
    help="bash, zsh, fish or pwsh (default: the shell you are in, from $SHELL).")]


def _shell(shell: str | None) -> str:
    name = shell or os.path.basename(os.environ.get("SHELL", ""))
    if name not in SHELLS:
        raise UsageProblem(f"cannot tell which shell to complete for ({name or 'no $SHELL'})",
                           f"name it: keepstep completion install {'|'.join(SHELLS[:4])}")
    return name


def install(shell: ShellArg = None) -> None:
    """Install completion for your shell (a new shell picks it up).

    \b
    Example:
      keepstep completion install
      keepstep completion install zsh
    """
    from typer._completion_shared import install as typer_install

    name = _shell(shell)
    shown, path = typer_install(shell=name, prog_name=PROG, complete_var=VAR)
    typer.echo(f"{shown} completion installed in {path}")
    typer.echo("open a new shell (or source that file) to use it")


def show(shell: ShellArg = None) -> None:
    """Print the completion script for your shell.

    \b
    Example:
      keepstep completion show bash >> ~/.bashrc
    """
    from typer._completion_shared import get_completion_script

    typer.echo(get_completion_script(prog_name=PROG, complete_var=VAR, shell=_shell(shell)))


def register(app: typer.Typer) -> None:
    # typer's shell classes answer the _KEEPSTEP_COMPLETE requests the scripts make
    # (typer registers them itself only with add_completion, which adds other options).
    from typer._completion_classes import completion_init

    completion_init()
    group = sub_app("Shell completion of keepstep's commands and options.")
    add_command(group, install, "install")
    add_command(group, show, "show")
    app.add_typer(group, name="completion")


__all__ = ["register"]
