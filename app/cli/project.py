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
    YesOpt,
    add_command,
    check_dir,
    here,
    on_terminal,
    open_project_dir,
    shift,
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


NewDirArg = Annotated[Path, typer.Argument(metavar="DIR", show_default=False,
                                           help="The new project folder.")]


def init(root: NewDirArg, force: Annotated[bool, typer.Option(
        "--force", help="Write into a non-empty folder (same-named files are overwritten).")]
        = False) -> None:
    """Create a small working example project in DIR.

    \b
    Example:
      keepstep init my-pack && cd my-pack && keepstep run
    """
    if root.exists() and not root.is_dir():
        raise UsageProblem(f"{root} is a file", "pass a new or empty folder")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise UsageProblem(f"{root} is not empty",
                           "choose a new folder, or pass --force to write the example into it")
    root.mkdir(parents=True, exist_ok=True)
    written = copy_tree(example_files(), root)
    typer.echo(f"created a keepstep project in {root} ({len(written)} files)")
    typer.echo("next:")
    typer.echo(f"  cd {root}")
    typer.echo("  keepstep validate")
    typer.echo("  keepstep run        # run R1 (keepstep.toml's default_run)")
    typer.echo("  keepstep status")
    typer.echo("then make it yours (your sources, question and risks): README.md in the "
               "folder, step by step")


def validate(root: DirArg = None, as_json: JsonOpt = False) -> None:
    """Check the project files: plan (units, dependencies, typed inputs, params, gates and
    their bindings, templates and their placeholders, data files, adapters), contract,
    sources (each approved one converts to text within max_source_mb), and the models
    (known to litellm, a key available for each provider) — without calling any.

    Every problem is named with its unit and field and what to do; exit 2 when there is one.
    With --json: {"ok", "units", "gates", "approved_sources", "formats", "warnings",
    "models", "problems"}; each problem has where, unit, gate, field, message, hint, code
    and line.

    \b
    Example:
      keepstep validate
      keepstep validate my-pack --json
    """
    from keepstep.engine import (
        SOURCE_UNREADABLE,
        KeepstepError,
        PlanValidationError,
        validate_project,
    )

    root = check_dir(root)
    if as_json:
        try:
            report = validate_project(root)
        except KeepstepError as exc:  # keepstep.toml, contract.md or sources.toml unreadable
            problems = [{"where": "project", "message": line, "line": line}
                        for line in _problems(exc)]
            typer.echo(out.to_json({"ok": False, "problems": problems, "warnings": []}))
            raise typer.Exit(EXIT_USAGE) from None
        data = report.model_dump(mode="json")
        data["approved_sources"] = data.pop("sources")
        for shown, problem in zip(data["problems"], report.problems, strict=True):
            shown["line"] = problem.line()
        typer.echo(out.to_json(data))
        if not report.ok:
            raise typer.Exit(EXIT_USAGE)
        return
    report = validate_project(root)
    plan = [p for p in report.problems if p.code != SOURCE_UNREADABLE and p.where != "store"]
    sources = [p for p in report.problems if p.code == SOURCE_UNREADABLE]
    for problem in (p for p in report.problems if p.where == "store"):
        raise UsageProblem(f"store: {problem.message}", problem.hint)
    for warning in report.warnings:
        typer.echo(f"warning: {warning}")
    for problem in sources:
        hint = f"\n  → {problem.hint}" if problem.hint else ""
        typer.echo(f"error: {problem.where}: {problem.message}{hint}")
    if plan:
        _print_models(report.models)
        # A command a problem names gets the project's path when you are outside it.
        raise PlanValidationError([out.commands_for(p.located(), root) for p in plan],
                                  problems=plan)
    if sources:
        _print_models(report.models)
        raise UsageProblem(f"{len(sources)} source problem(s) above",
                           "fix each source as its line says (or revoke it), then validate "
                           "again")
    errors = _print_models(report.models)
    if errors:
        raise UsageProblem(f"{errors} model problem(s) above",
                           "fix the model names or keys, then validate again (docs/config.md)")
    if report.store:
        typer.echo(f"store: {report.store}")
    shown = ", ".join(f"{n} {fmt.upper()}" for fmt, n in report.formats.items())
    typer.echo(f"plan OK: {report.units} units, {report.gates} gates "
               f"({report.sources} approved sources{': ' + shown if shown else ''})")


def _print_models(findings: list[dict[str, Any]]) -> int:
    """Print a line per model the plan calls; return how many are errors."""
    for f in findings:
        units = f["units"]
        shown = ", ".join(units[:6]) + (f" (+{len(units) - 6})" if len(units) > 6 else "")
        prefix = {"error": "error: ", "warning": "warning: ", "ok": "model "}[f["level"]]
        typer.echo(f"{prefix}{f['message']} — used by {shown}")
    return sum(1 for f in findings if f["level"] == "error")


def _problems(exc: BaseException) -> list[str]:
    """The problems an engine error lists, one per line (its hint is not a problem)."""
    text = str(exc).split("\n  → ")[0]
    lines = [line.strip().lstrip("-•").strip() for line in text.splitlines()]
    return [line for line in lines if line] or [str(exc)]


# --- sources -------------------------------------------------------------------------------
RunFilter = Annotated[str | None, typer.Option(
    "--run", "-r", help="Show the input snapshot this run is at.")]


def _run_snapshots(root: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """(run id -> input snapshot, a warning). The list itself needs neither the database
    nor a valid plan, so a problem with either only costs the snapshot column."""
    from keepstep.engine import KeepstepError, StorageError
    from keepstep.engine.views import input_snapshots

    try:
        with open_project_dir(root, validate=False) as project:
            return input_snapshots(project), ""
    except (StorageError, KeepstepError) as exc:
        first = str(exc).splitlines()[0]
        return {}, f"warning: run snapshots unavailable: {first}"


def _source_type(path: Path) -> str:
    from keepstep.engine import ConversionError
    from keepstep.engine.sources import detect_format

    try:
        return detect_format(path).upper()
    except (ConversionError, OSError):
        return "?"


def _default_run(root: Path) -> str | None:
    from keepstep.engine import KeepstepError, load_project_files

    try:
        return load_project_files(root, validate=False).config.default_run
    except KeepstepError:
        return None


def _sources_rows(root: Path, run_id: str | None) -> tuple[list[dict[str, Any]], str | None,
                                                         str | None, str]:
    """(one dict per source, the run whose snapshot is compared, its label, a note)."""
    from keepstep.engine.sources import file_sha256, load_sources

    sf = load_sources(root)
    snapshots, note = _run_snapshots(root)
    if run_id is not None:
        if run_id not in snapshots:
            raise UsageProblem(f"no run {run_id!r} (runs: {', '.join(snapshots) or 'none yet'})")
    elif len(snapshots) == 1:
        run_id = next(iter(snapshots))
    elif (default := _default_run(root)) in snapshots:
        run_id = default
    elif snapshots:
        note = f"pass --run to see a run's input snapshot (runs: {', '.join(snapshots)})"
    chosen = snapshots.get(run_id) if run_id is not None else None
    rows = []
    for s in sf.sources:
        path = root / s.path
        sha = file_sha256(str(path)) if path.is_file() else None
        snap = None
        if chosen is not None:
            taken = chosen["sources"].get(s.id)
            snap = "-" if taken is None else chosen["label"] if taken == sha else \
                f"{chosen['label']} (file changed since)"
        rows.append({"id": s.id, "group": s.group, "approved": s.approved,
                     "type": _source_type(path) if sha else None, "sha256": sha,
                     "path": s.path, "title": s.title, "kind": s.kind, "snapshot": snap})
    return rows, run_id if chosen is not None else None, \
        chosen["label"] if chosen is not None else None, note


def sources_list(root: DirArg = None, run: RunFilter = None, as_json: JsonOpt = False) -> None:
    """List sources: id, group, approved, type, sha256 prefix, the run's snapshot version.

    Works even when the plan does not validate. With --json: {"run", "snapshot", "sources"}.

    \b
    Example:
      keepstep sources list
      keepstep sources list my-pack --run ME-042 --json
    """
    root = check_dir(root)
    rows, run_id, label, note = _sources_rows(root, run)
    if as_json:
        typer.echo(out.to_json({"run": run_id, "snapshot": label, "sources": rows}))
        return
    headers = ["id", "group", "approved", "type", "sha256"]
    if run_id is not None:
        headers.append(f"run {run_id}")
    headers.append("title")
    table_rows = []
    for r in rows:
        row = [r["id"], r["group"], "yes" if r["approved"] else "no", r["type"] or "-",
               r["sha256"][:12] if r["sha256"] else "(missing)"]
        if run_id is not None:
            row.append(r["snapshot"])
        row.append(r["title"] or r["path"])
        table_rows.append(row)
    typer.echo(out.table(headers, table_rows))
    approved = sum(1 for r in rows if r["approved"])
    typer.echo(f"{len(rows)} source(s), {approved} approved")
    if note:
        typer.echo(note)


def _impact(root: Path, source_id: str, approved: bool) -> str | None:
    """What approving / revoking would invalidate in the default run, before writing."""
    from keepstep.engine import KeepstepError, StorageError
    from keepstep.engine.plan import compact_ids

    try:
        with open_project_dir(root, validate=False) as project:
            runs = project.runs()
            if not runs:
                return None
            run = project.get_run(project.default_run_id() if project.default_run_id() in runs
                                  else runs[-1])
            found = run.preview_sources({source_id: approved})
    except (KeepstepError, StorageError, UsageProblem):
        return None
    if not found.invalidated:
        return f"impact on run {run.run_id}: nothing invalidated"
    return (f"impact on run {run.run_id}: the next resume invalidates "
            f"{len(found.invalidated)} unit(s): {compact_ids(list(found.invalidated))} "
            f"({found.summary})")


def _set_approved(root: Path, source_id: str, approved: bool, *, yes: bool = True) -> None:
    from keepstep.engine.sources import load_sources, save_sources

    sf = load_sources(root)
    entry = next((s for s in sf.sources if s.id == source_id), None)
    if entry is None:
        raise UsageProblem(f"no source {source_id!r} in {root / 'sources.toml'}",
                           "known: " + (", ".join(s.id for s in sf.sources) or "none") +
                           "; add one with `keepstep sources add PATH --id ID`")
    verb = "approved" if approved else "revoked"
    if entry.approved == approved:
        typer.echo(f"source {source_id} is already {'approved' if approved else 'not approved'}")
        return
    if approved and not (root / entry.path).is_file():
        raise UsageProblem(f"source {source_id}: file {entry.path} is missing",
                           "restore the file (or fix its path in sources.toml), then approve it")
    if approved:
        from keepstep.engine.sources import inspect_file

        info = inspect_file(root, root / entry.path)  # refuses a file that yields no text
        typer.echo(f"source {source_id}: {info.describe()}")
    impact = _impact(root, source_id, approved)
    if impact:
        typer.echo(impact)
    # A person at a terminal confirms a revoke that would redo work (scripts pass --yes or
    # run without a terminal; re-approving undoes it).
    if not yes and impact and "nothing invalidated" not in impact and on_terminal() and \
            not typer.confirm(f"Revoke {source_id}?", default=False):
        typer.echo(f"source {source_id} not revoked (sources.toml unchanged)")
        return
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
    from keepstep.engine import KeepstepError
    from keepstep.engine.plan import load_plan

    try:
        plan = load_plan(root / "plan.toml")
    except KeepstepError:
        return []
    return [f"unit {u.id} names source:{source_id} in its inputs; the plan will not validate "
            "until you remove it" for u in plan.units if f"source:{source_id}" in u.inputs]


SourceIdArg = Annotated[str | None, typer.Argument(metavar="ID", show_default=False,
                                                   help="The source id.")]


def _source_id(root: Path | None, source_id: str | None) -> tuple[Path, str]:
    root, source_id = shift(root, source_id)
    if source_id is None:
        raise UsageProblem("name the source", "e.g. keepstep sources approve A3")
    return check_dir(root), source_id


def sources_approve(root: DirArg = None, source_id: SourceIdArg = None) -> None:
    """Approve a source (runs may then cite it).

    \b
    Example:
      keepstep sources approve A3
    """
    _set_approved(*_source_id(root, source_id), True)


def sources_revoke(root: DirArg = None, source_id: SourceIdArg = None,
                   yes: YesOpt = False) -> None:
    """Revoke a source's approval; prints what the next resume would invalidate first and,
    at a terminal, asks before writing when that is any work.

    \b
    Example:
      keepstep sources revoke A3
    """
    _set_approved(*_source_id(root, source_id), False, yes=yes)


def sources_remove(
    root: DirArg = None, source_id: SourceIdArg = None, yes: YesOpt = False,
    delete_file: Annotated[bool, typer.Option(
        "--delete-file", help="Also delete its file under sources/ (kept by default).")] = False,
) -> None:
    """Take a source out of sources.toml. Its file stays in sources/ unless --delete-file.
    Prints what the next resume would invalidate first and, at a terminal, asks before
    writing when that is any work. A unit that names it (source:ID) is named too.

    \b
    Example:
      keepstep sources remove A1
      keepstep sources remove A1 --delete-file --yes
    """
    from keepstep.engine.sources import load_sources, save_sources

    root, source_id = _source_id(root, source_id)
    sf = load_sources(root)
    entry = next((s for s in sf.sources if s.id == source_id), None)
    if entry is None:
        raise UsageProblem(f"no source {source_id!r} in {root / 'sources.toml'}",
                           "known: " + (", ".join(s.id for s in sf.sources) or "none"))
    impact = _impact(root, source_id, False) if entry.approved else None
    if impact:
        typer.echo(impact)
    if not yes and impact and "nothing invalidated" not in impact and on_terminal() and \
            not typer.confirm(f"Remove {source_id}?", default=False):
        typer.echo(f"source {source_id} not removed (sources.toml unchanged)")
        return
    sf.sources = [s for s in sf.sources if s.id != source_id]
    save_sources(root, sf)
    path = (root / entry.path).resolve()
    shared = any((root / s.path).resolve() == path for s in sf.sources)
    if delete_file and path.is_file() and not shared and \
            path.is_relative_to((root / "sources").resolve()):
        path.unlink()
        typer.echo(f"source {source_id} removed (sources.toml updated; {entry.path} deleted)")
    else:
        kept = " (another source lists it)" if shared else ""
        typer.echo(f"source {source_id} removed (sources.toml updated; {entry.path} kept"
                   f"{kept})")
    if entry.approved:
        typer.echo("units that used it are invalidated on the next resume")
    for warning in _plan_refs(root, source_id):
        typer.echo(f"warning: {warning}")


PREVIEW_LINES = 8


def _show_info(info: Any) -> None:
    """What a person sees before approving a file: type, structure, size, a text preview."""
    typer.echo(f"detected: {info.describe()}")
    for warning in info.warnings:
        typer.echo(f"warning: {warning}")
    lines = [line for line in info.preview.splitlines() if line.strip()][:PREVIEW_LINES]
    typer.echo("preview:")
    for line in lines:
        typer.echo(f"  | {line if len(line) <= 96 else line[:95] + '…'}")


def sources_add(
    root: DirArg = None,
    path: Annotated[Path | None, typer.Argument(
        metavar="PATH", show_default=False,
        help="The source file (copied into sources/ if it lives outside the project): PDF, "
             "DOCX, XLSX, CSV, PPTX, HTML, TXT or MD.")] = None,
    source_id: Annotated[str, typer.Option("--id", help="A new, unique source id.")] = "",
    group: Annotated[str, typer.Option("--group", help="Its source group.")] = "",
    title: Annotated[str, typer.Option("--title")] = "",
    kind: Annotated[str, typer.Option("--kind", help="e.g. 'market report'.")] = "",
    approve: Annotated[bool, typer.Option("--approve", help="Approve it at once.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only show what was detected and the preview; add nothing.")] = False,
) -> None:
    """Add a source to sources.toml (not approved unless --approve), after showing its
    detected type, pages/sheets/slides and a text preview. A file that yields no text, is
    over max_source_mb, is of another type or is undecodable text is refused.

    \b
    Example:
      keepstep sources add ~/notes/interview.md --id M1 --group M --approve
      keepstep sources add report.pdf --id A5 --group A --dry-run
    """
    from keepstep.engine.sources import add_source, inspect_file

    root, shifted = shift(root, None if path is None else str(path))
    if shifted is None:
        raise UsageProblem("name the file to add", "e.g. keepstep sources add notes.md --id M1")
    path = Path(shifted)
    root = check_dir(root)
    _show_info(inspect_file(root, path))
    if dry_run:
        typer.echo("dry run: nothing added")
        return
    if not source_id:
        raise UsageProblem("a new source needs an id", "pass --id, e.g. --id M1")
    entry = add_source(root, path, source_id=source_id, group=group, title=title, kind=kind,
                       approved=approve)
    if not path.resolve().is_relative_to(root.resolve()):
        typer.echo(f"copied {path} to {entry.path}")
    typer.echo(f"source {source_id} added ({entry.path}, group {group or '-'}, "
               f"{'approved' if approve else 'not approved yet'})")
    if not approve:
        typer.echo(f"approve it with `keepstep sources approve {here(root)}{source_id}`")


def register(app: typer.Typer) -> None:
    add_command(app, init, "init")
    add_command(app, validate, "validate")
    sources_app = sub_app("List, approve, revoke, add and remove sources: PDF, DOCX, XLSX, "
                          "CSV, PPTX, HTML, TXT or MD.\n\n"
                          "`keepstep sources` alone lists them. The old order "
                          "`keepstep sources DIR list` still works, with a note.",
                          default="list")
    add_command(sources_app, sources_list, "list")
    add_command(sources_app, sources_approve, "approve")
    add_command(sources_app, sources_revoke, "revoke")
    add_command(sources_app, sources_add, "add")
    add_command(sources_app, sources_remove, "remove")
    app.add_typer(sources_app, name="sources")
