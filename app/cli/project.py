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
    DirArg,
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


def validate(root: DirArg) -> None:
    """Check the project files: plan (units, dependencies, gates), contract, sources (each
    approved one converts to text within max_source_mb), and the models (known to litellm, a
    key available for each provider) — without calling any."""
    from keepstep.engine import load_project_files, snapshot_sources

    root = check_dir(root)
    files = load_project_files(root)
    snapshot = snapshot_sources(root, files.sources)
    for warning in _output_warnings(files.plan):
        typer.echo(f"warning: {warning}")
    source_errors, formats = _source_findings(files)
    errors = _model_findings(files)
    plan = files.plan
    if source_errors or errors:
        what = " and ".join(p for p in (
            f"{source_errors} source problem(s)" if source_errors else "",
            f"{errors} model problem(s)" if errors else "") if p)
        raise UsageProblem(f"{what} above",
                           "fix each source as its line says (or revoke it), and the model "
                           "names or keys (docs/config.md), then validate again")
    typer.echo(f"plan OK: {len(plan.units)} units, {len(plan.gates)} gates "
               f"({len(snapshot.sources)} approved sources{formats})")


def _source_findings(files: Any) -> tuple[int, str]:
    """Print a line per source that cannot be read (an error when it is approved); return
    how many are errors and the approved formats as ``: 43 MD, 1 PDF…``."""
    from collections import Counter

    from keepstep.engine import check_sources

    checks = check_sources(files, approved_only=False)
    errors = 0
    for c in checks:
        if c.ok:
            continue
        errors += c.approved
        prefix = "error: " if c.approved else "warning: (not approved) "
        typer.echo(f"{prefix}{c.problem}" + (f"\n  → {c.hint}" if c.hint else ""))
    counts = Counter(c.format for c in checks if c.ok and c.approved)
    shown = ", ".join(f"{n} {fmt.upper()}" for fmt, n in
                      sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return errors, (f": {shown}" if shown else "")


def _model_findings(files: Any) -> int:
    """Print a line per model the plan calls; return how many are errors."""
    from keepstep.engine import model_findings

    findings = model_findings(files)
    for f in findings:
        shown = ", ".join(f.units[:6]) + (f" (+{len(f.units) - 6})" if len(f.units) > 6 else "")
        prefix = {"error": "error: ", "warning": "warning: ", "ok": "model "}[f.level]
        typer.echo(f"{prefix}{f.message} — used by {shown}")
    return sum(1 for f in findings if f.level == "error")


def _output_warnings(plan: Any) -> list[str]:
    """Declared outputs a unit's kind will not write (a likely typo, not an error)."""
    try:
        from keepstep.engine import expected_outputs
    except ImportError:  # kinds not installed: nothing to compare against
        return []
    warnings = []
    for unit in plan.units:
        expected = set(expected_outputs(unit))
        extra = sorted(set(unit.outputs) - expected)
        if expected and extra:
            warnings.append(f"unit {unit.id}: declares output(s) {', '.join(extra)} but a "
                            f"{unit.kind.value} unit writes {', '.join(sorted(expected))}")
    return warnings


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


def _source_type(path: Path) -> str:
    from keepstep.engine import ConversionError, detect_format

    try:
        return detect_format(path).upper()
    except (ConversionError, OSError):
        return "?"


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
        kind = _source_type(path) if sha else "-"
        row = [s.id, s.group, "yes" if s.approved else "no", kind, shown, s.title or s.path]
        if chosen is not None:
            row.insert(5, snap)
        rows.append(row)
    headers = ["id", "group", "approved", "type", "sha256"]
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
    """List sources: id, group, approved, type, sha256 prefix, the run's snapshot version."""
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
    if approved:
        from keepstep.engine import inspect_file

        info = inspect_file(root, root / entry.path)  # refuses a file that yields no text
        typer.echo(f"source {source_id}: {info.describe()}")
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
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The source file (copied into sources/ if it "
                                         "lives outside the project): PDF, DOCX, XLSX, CSV, "
                                         "PPTX, HTML, TXT or MD.")],
    source_id: Annotated[str, typer.Option("--id", help="A new, unique source id.")],
    group: Annotated[str, typer.Option("--group", help="Its source group.")] = "",
    title: Annotated[str, typer.Option("--title")] = "",
    kind: Annotated[str, typer.Option("--kind", help="e.g. 'market report'.")] = "",
    approve: Annotated[bool, typer.Option("--approve", help="Approve it at once.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only show what was detected and the preview; add nothing.")] = False,
) -> None:
    """Add a source to sources.toml (not approved unless --approve), after showing its
    detected type, pages/sheets/slides and a text preview. A file that yields no text, is
    over max_source_mb, is of another type or is undecodable text is refused."""
    from keepstep.engine import add_source, inspect_file

    root = _root_of(ctx)
    _show_info(inspect_file(root, path))
    if dry_run:
        typer.echo("dry run: nothing added")
        return
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
    sources_app = sub_app("List, approve, revoke and add sources (DIR first): PDF, DOCX, XLSX, "
                          "CSV, PPTX, HTML, TXT or MD.")
    sources_app.callback(invoke_without_command=True)(friendly(sources_main))
    add_command(sources_app, sources_list, "list")
    add_command(sources_app, sources_approve, "approve")
    add_command(sources_app, sources_revoke, "revoke")
    add_command(sources_app, sources_add, "add")
    app.add_typer(sources_app, name="sources")
