"""A team's keepstep from the command line: ``worker`` (join a run as an extra executor,
e.g. on another machine sharing a PostgreSQL store) and ``store migrate`` / ``store status``
(move a project between the embedded SQLite file and a PostgreSQL server). See docs/team.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    DirArg,
    JsonOpt,
    QuietOpt,
    RunOpt,
    UsageProblem,
    add_command,
    check_dir,
    sub_app,
)

JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, max=64,
    help="Units this worker runs at once (default: max_parallel in keepstep.toml).")]
ToOpt = Annotated[str, typer.Option(
    "--to", help="postgresql://user@host:5432/db (no password: PGPASSWORD, ~/.pgpass or "
                 "`keepstep keys set postgres`), or `sqlite` to take the project home.")]


def worker(root: DirArg = None, run: RunOpt = None, jobs: JobsOpt = None,
           quiet: QuietOpt = False, as_json: JsonOpt = False) -> None:
    """Join a run as an extra executor: claim ready units until the run is done, blocked or
    cancelled (Ctrl-C). On another machine, point its project folder (a checkout with the
    same sources) at the team's PostgreSQL store; every executor shows in `keepstep status`.

    Same progress, exit codes and --json as `keepstep resume`.

    \b
    Example:
      KEEPSTEP_STORE_URL=postgresql://keepstep@db.internal/team keepstep worker --run ME-042 -j 4
    """
    from keepstep.app.cli.common import open_project_dir, run_id_of
    from keepstep.app.cli.runs import _start
    from keepstep.engine.store import source_mismatches

    with open_project_dir(root, read_only=True) as project:
        folder, run_id = project.root, run_id_of(project, run)
        known = run_id in project.runs()
    if known:
        # A host whose sources differ from the approved bytes runs none of the units that
        # read them, and never records its copy as the team's input change.
        bad = source_mismatches(folder, run_id)
        if bad:
            lines = [f"{m.path} (source {m.source_id}) {m.problem} from the approved sha256 "
                     f"the run recorded; units that read it: {', '.join(m.units) or 'none'}"
                     for m in bad]
            raise UsageProblem(
                "this host's sources do not match the run's:\n  " + "\n  ".join(lines),
                "bring the project folder up to date (git pull, or sync it) and start the "
                "worker again; to record a real source change, use `keepstep resume` where "
                "the new file was approved")
    _start(root, run, "main", {}, None, quiet, as_json, jobs, create=False)


def store_status(root: DirArg = None, as_json: JsonOpt = False) -> None:
    """Which store the project uses (KEEPSTEP_STORE_URL wins over keepstep.toml's [store] url)
    and where its password comes from (never the password)."""
    from keepstep.engine.store import store_summary

    summary = store_summary(check_dir(root))
    if as_json:
        typer.echo(out.to_json(summary.model_dump(mode="json")))
        return
    typer.echo(f"store: {summary.where}")
    if summary.backend != "sqlite":
        typer.echo(f"password: {summary.password_from}")


def store_migrate(to: ToOpt, root: DirArg = None, as_json: JsonOpt = False) -> None:
    """Copy the project's whole state (every run, every chain verified before and after,
    the committed files) into another store and point keepstep.toml at it. The target must
    be empty; the old SQLite file is kept beside, renamed.

    \b
    Example:
      keepstep store migrate --to postgresql://keepstep@db.internal:5432/team
      keepstep store migrate --to sqlite      # take the project home again
    """
    from keepstep.engine.store import move_store

    report = move_store(check_dir(root), to)
    if as_json:
        typer.echo(out.to_json(report.model_dump(mode="json")))
        return
    rows = sum(report.rows.values())
    typer.echo(f"moved {len(report.runs)} run(s) ({', '.join(report.runs) or 'none'}): "
               f"{rows} rows, {report.checked_versions} checkpoints verified in the copy")
    typer.echo(f"  from {report.source}\n  to   {report.target}")
    if report.blobs:
        typer.echo(f"  {report.blobs} committed file(s) stored on the server")
    if report.files:
        typer.echo(f"  {report.files} committed file(s) fetched into this folder")
    if report.old_state:
        typer.echo(f"  the old SQLite file is kept as {report.old_state}")
    if report.env_note:
        typer.echo(f"  note: {report.env_note}")


def register(app: typer.Typer) -> None:
    add_command(app, worker, "worker")
    store_app = sub_app("Where the run state lives: the embedded SQLite file or a team's "
                        "PostgreSQL server (docs/team.md).")
    add_command(store_app, store_status, "status")
    add_command(store_app, store_migrate, "migrate")
    app.add_typer(store_app, name="store")
