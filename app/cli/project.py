"""Project files from the command line: ``init``, ``validate`` and ``sources``.

``sources`` reads and edits sources.toml and works on a project whose plan does not
validate (revoking a source a unit cites makes the plan invalid until the unit is edited).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_USAGE,
    DirArg,
    JsonOpt,
    UsageProblem,
    add_command,
    check_dir,
    friendly,
    open_project_dir,
    sub_app,
)


# --- init, validate ------------------------------------------------------------------------
def copy_tree(src: Any, dest: Path) -> list[Path]:
    written = []
    for item in sorted(src.iterdir(), key=lambda t: t.name):
        if item.name.startswith((".", "__pycache__")):
            continue
        target = dest / item.name
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            written += copy_tree(item, target)
        else:
            target.write_bytes(item.read_bytes())
            written.append(target)
    return written


def example_files() -> Any:
    """The example project shipped with the package (an importlib.resources Traversable)."""
    from importlib.resources import files

    return files("keepstep.app").joinpath("templates")


def init(root: DirArg, force: Annotated[bool, typer.Option(
        "--force", help="Write into a non-empty folder (same-named files are overwritten).")]
        = False) -> None:
    """Create a small working example project in DIR."""
    if root.exists() and not root.is_dir():
        raise UsageProblem(f"{root} is a file", "pass a new or empty folder")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise UsageProblem(f"{root} is not empty",
                           "choose a new folder, or pass --force to write the example into it")
    root.mkdir(parents=True, exist_ok=True)
    written = copy_tree(example_files(), root)
    typer.echo(f"created a keepstep project in {root} ({len(written)} files)")
    typer.echo("next:")
    typer.echo(f"  keepstep validate {root}")
    typer.echo(f"  keepstep run {root} --run R1")
    typer.echo(f"  keepstep status {root} --run R1")


def validate(root: DirArg, as_json: JsonOpt = False) -> None:
    """Check the project files: plan (units, dependencies, typed inputs, params, gates and
    their bindings, templates and their placeholders, data files, adapters), contract,
    sources, and the models (known to litellm, a key available for each provider) — without
    calling any. Every problem names the unit and field and what to do."""
    from keepstep.engine import PlanValidationError, validate_project

    root = check_dir(root)
    report = validate_project(root)
    if as_json:
        typer.echo(out.to_json(report.model_dump(mode="json")))
        if not report.ok:
            raise typer.Exit(EXIT_USAGE)
        return
    if report.problems:
        lines = [p.line() for p in report.problems]
        _print_models(report.models)
        raise PlanValidationError(lines, problems=report.problems)
    for warning in report.warnings:
        typer.echo(f"warning: {warning}")
    errors = _print_models(report.models)
    if errors:
        raise UsageProblem(f"{errors} model problem(s) above",
                           "fix the model names or keys, then validate again (docs/config.md)")
    typer.echo(f"plan OK: {report.units} units, {report.gates} gates "
               f"({report.sources} approved sources)")


def _print_models(findings: list[dict[str, Any]]) -> int:
    """Print a line per model the plan calls; return how many are errors."""
    for f in findings:
        units = f["units"]
        shown = ", ".join(units[:6]) + (f" (+{len(units) - 6})" if len(units) > 6 else "")
        prefix = {"error": "error: ", "warning": "warning: ", "ok": "model "}[f["level"]]
        typer.echo(f"{prefix}{f['message']} — used by {shown}")
    return sum(1 for f in findings if f["level"] == "error")


# --- sources -------------------------------------------------------------------------------
def sources_main(ctx: typer.Context, root: DirArg) -> None:
    """keepstep sources DIR [list | approve ID | revoke ID | add PATH --id ID --group G]."""
    ctx.obj = {"root": root}
    if ctx.invoked_subcommand is None:
        _sources_list(root, None)


def _root_of(ctx: typer.Context) -> Path:
    return check_dir(ctx.obj["root"])


def _run_snapshots(root: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """(run id -> input snapshot, a warning). The list itself needs neither the database
    nor a valid plan, so a problem with either only costs the snapshot column."""
    from keepstep.engine import KeepstepError, StorageError, input_snapshots

    try:
        with open_project_dir(root, validate=False) as project:
            return input_snapshots(project), ""
    except (StorageError, KeepstepError) as exc:
        first = str(exc).splitlines()[0]
        return {}, f"warning: run snapshots unavailable: {first}"


def _sources_list(root: Path, run_id: str | None) -> None:
    from keepstep.engine import file_sha256, load_sources

    root = check_dir(root)
    sf = load_sources(root)
    snapshots, note = _run_snapshots(root)
    if run_id is not None:
        if run_id not in snapshots:
            raise UsageProblem(f"no run {run_id!r} (runs: {', '.join(snapshots) or 'none yet'})")
        chosen: dict[str, Any] | None = snapshots[run_id]
    elif len(snapshots) == 1:
        run_id, chosen = next(iter(snapshots.items()))
    else:
        chosen = None
        if snapshots:
            note = f"pass --run to see a run's input snapshot (runs: {', '.join(snapshots)})"
    rows = []
    for s in sf.sources:
        path = root / s.path
        sha = file_sha256(str(path)) if path.is_file() else None
        shown = sha[:12] if sha else "(missing)"
        snap = ""
        if chosen is not None:
            taken = chosen["sources"].get(s.id)
            if taken is None:
                snap = "-"
            elif taken == sha:
                snap = chosen["label"]
            else:
                snap = f"{chosen['label']} (file changed since)"
        row = [s.id, s.group, "yes" if s.approved else "no", shown, s.title or s.path]
        if chosen is not None:
            row.insert(4, snap)
        rows.append(row)
    headers = ["id", "group", "approved", "sha256"]
    if chosen is not None:
        headers.append(f"run {run_id}")
    headers.append("title")
    typer.echo(out.table(headers, rows))
    approved = sum(1 for s in sf.sources if s.approved)
    typer.echo(f"{len(sf.sources)} source(s), {approved} approved")
    if note:
        typer.echo(note)


def sources_list(ctx: typer.Context, run: Annotated[str | None, typer.Option(
        "--run", "-r", help="Show the input snapshot this run is at.")] = None) -> None:
    """List sources: id, group, approved, sha256 prefix, the run's snapshot version."""
    _sources_list(ctx.obj["root"], run)


def _set_approved(root: Path, source_id: str, approved: bool) -> None:
    from keepstep.engine import load_sources, save_sources

    sf = load_sources(root)
    entry = next((s for s in sf.sources if s.id == source_id), None)
    if entry is None:
        raise UsageProblem(f"no source {source_id!r} in {root / 'sources.toml'}",
                           "known: " + (", ".join(s.id for s in sf.sources) or "none") +
                           "; add one with `keepstep sources DIR add PATH --id ID`")
    verb = "approved" if approved else "revoked"
    if entry.approved == approved:
        typer.echo(f"source {source_id} is already {'approved' if approved else 'not approved'}")
        return
    if approved and not (root / entry.path).is_file():
        raise UsageProblem(f"source {source_id}: file {entry.path} is missing",
                           "restore the file (or fix its path in sources.toml), then approve it")
    entry.approved = approved
    save_sources(root, sf)
    typer.echo(f"source {source_id} {verb} (sources.toml updated)")
    if approved:
        typer.echo("a run takes it in as a new input snapshot on its next resume")
    else:
        typer.echo("units that used it are invalidated on the next resume")
        for warning in _plan_refs(root, source_id):
            typer.echo(f"warning: {warning}")


def _plan_refs(root: Path, source_id: str) -> list[str]:
    from keepstep.engine import KeepstepError, load_plan

    try:
        plan = load_plan(root / "plan.toml")
    except KeepstepError:
        return []
    return [f"unit {u.id} names source:{source_id} in its inputs; the plan will not validate "
            "until you remove it" for u in plan.units if f"source:{source_id}" in u.inputs]


SourceIdArg = Annotated[str, typer.Argument(metavar="ID", help="The source id.")]


def sources_approve(ctx: typer.Context, source_id: SourceIdArg) -> None:
    """Approve a source (runs may then cite it)."""
    _set_approved(_root_of(ctx), source_id, True)


def sources_revoke(ctx: typer.Context, source_id: SourceIdArg) -> None:
    """Revoke a source's approval."""
    _set_approved(_root_of(ctx), source_id, False)


def sources_add(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The source file (copied into sources/ if it "
                                         "lives outside the project).")],
    source_id: Annotated[str, typer.Option("--id", help="A new, unique source id.")],
    group: Annotated[str, typer.Option("--group", help="Its source group.")] = "",
    title: Annotated[str, typer.Option("--title")] = "",
    kind: Annotated[str, typer.Option("--kind", help="e.g. 'market report'.")] = "",
    approve: Annotated[bool, typer.Option("--approve", help="Approve it at once.")] = False,
) -> None:
    """Add a source to sources.toml (not approved unless --approve)."""
    from keepstep.engine import add_source

    root = _root_of(ctx)
    entry = add_source(root, path, source_id=source_id, group=group, title=title, kind=kind,
                       approved=approve)
    if not path.resolve().is_relative_to(root.resolve()):
        typer.echo(f"copied {path} to {entry.path}")
    typer.echo(f"source {source_id} added ({entry.path}, group {group or '-'}, "
               f"{'approved' if approve else 'not approved yet'})")
    if not approve:
        typer.echo(f"approve it with `keepstep sources {root} approve {source_id}`")


def register(app: typer.Typer) -> None:
    add_command(app, init, "init")
    add_command(app, validate, "validate")
    sources_app = sub_app("List, approve, revoke and add sources (DIR first).")
    sources_app.callback(invoke_without_command=True)(friendly(sources_main))
    add_command(sources_app, sources_list, "list")
    add_command(sources_app, sources_approve, "approve")
    add_command(sources_app, sources_revoke, "revoke")
    add_command(sources_app, sources_add, "add")
    app.add_typer(sources_app, name="sources")
