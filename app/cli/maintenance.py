"""``keepstep backup / restore / gc``: the maintenance commands, added by ``register(app)``.

Kept apart from cli.py so the command set can be wired in one line; everything goes
through ``keepstep.engine.run.maintenance``, which returns pydantic reports.
"""

# No ``from __future__ import annotations``: Typer reads the parameter annotations, and
# they name cli.py's types, imported inside register() to avoid an import cycle.
from pathlib import Path
from typing import Annotated, Any

import typer


def _size(n: int) -> str:
    import humanize

    return humanize.naturalsize(n, binary=True)


def backup_text(report: Any) -> str:
    heads = ", ".join(f"{h.run_id}/{h.branch_id} at v{h.version}" for h in report.heads)
    lines = [f"backup written to {report.out} ({report.kind}, {report.files} files, "
             f"{_size(report.bytes)})", f"  heads: {heads or 'no runs yet'}"]
    for s in report.skipped:
        lines.append(f"  not copied: {s.path} ({s.problem} in the project) — a restore will "
                     f"redo {s.unit}")
    return "\n".join(lines)


def restore_text(report: Any, into: Path) -> str:
    lines = [report.message]
    if report.replaced:
        lines.append(f"  the previous state folder was moved to {report.replaced}")
    for b in report.baselines:
        lines.append(f"  {b.run_id}/{b.branch_id}: head v{b.head_version}, verified up to "
                     f"v{b.verified_version}"
                     + (f", redo {', '.join(b.units_to_redo)}" if b.units_to_redo else ""))
    if report.historical_missing:
        lines.append(f"  {len(report.historical_missing)} older (no longer current) artifact(s) "
                     "are not in the backup; nothing needs them")
    if not (into / "keepstep.toml").is_file():
        lines.append(f"  {into} has no project files: copy keepstep.toml, plan.toml, contract.md, "
                     "sources and templates into it (backups hold only the run state)")
    runs = sorted({b.run_id for b in report.baselines})
    if runs:
        lines.append(f"  → resume with `keepstep run {into} --run {runs[0]}`")
    return "\n".join(lines)


def gc_text(report: Any) -> str:
    lines = [f"deleted {len(report.deleted)} attempt folder(s), {_size(report.bytes_freed)}; "
             f"kept {len(report.kept)}; stripped {report.events_stripped} event payload(s) "
             f"older than {report.older_than_days:g} day(s)"]
    for item in report.deleted:
        lines.append(f"  deleted {item.directory} ({item.age_days:.1f} days) — {item.reason}")
    for item in report.kept:
        if not item.reason.startswith("current"):
            lines.append(f"  kept    {item.directory} — {item.reason}")
    current = sum(1 for i in report.kept if i.reason.startswith("current"))
    if current:
        lines.append(f"  kept    {current} current attempt folder(s)")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``backup``, ``restore`` and ``gc`` to the keepstep Typer app."""
    from keepstep.app.cli import common as cli
    from keepstep.app.cli import output as out

    @cli.command(app, "backup")
    def backup(
        to: Annotated[Path, typer.Option(
            "--out", "--to", help="A new folder, or a file ending .zip.", show_default=False)],
        root: cli.DirArg = None,
        as_json: cli.JsonOpt = False,
    ) -> None:
        """Back up the run state: database, committed artifacts and a manifest of hashes."""
        from keepstep.engine.store import backup_project

        with cli.open_project_dir(root) as project:
            report = backup_project(project, to)
        typer.echo(out.to_json(report.model_dump(mode="json")) if as_json
                   else backup_text(report))

    @cli.command(app, "restore")
    def restore(
        path: Annotated[Path, typer.Argument(metavar="PATH", help="A backup folder or .zip.")],
        into: Annotated[Path, typer.Option(
            "--into", help="The project folder to restore the state into.", show_default=False)],
        force: Annotated[bool, typer.Option(
            "--force", help="Replace an existing state folder (it is moved aside).")] = False,
        as_json: cli.JsonOpt = False,
    ) -> None:
        """Verify a backup completely, then restore it into DIR/.keepstep."""
        from keepstep.engine.store import restore_project

        if not path.exists():
            raise cli.UsageProblem(f"{path} does not exist", "pass a backup folder or .zip")
        report = restore_project(path, into, force=force)
        typer.echo(out.to_json(report.model_dump(mode="json")) if as_json
                   else restore_text(report, into))

    @cli.command(app, "gc")
    def gc(
        older_than: Annotated[float, typer.Option(
            "--older-than", metavar="DAYS", min=0,
            help="Only delete what is older than this many days.", show_default=False)],
        root: cli.DirArg = None,
        as_json: cli.JsonOpt = False,
    ) -> None:
        """Delete attempt folders nothing needs any more; strip old event payloads."""
        from keepstep.engine.store import gc_project

        with cli.open_project_dir(root) as project:
            report = gc_project(project, older_than)
        typer.echo(out.to_json(report.model_dump(mode="json")) if as_json
                   else gc_text(report))


__all__ = ["backup_text", "gc_text", "register", "restore_text"]
