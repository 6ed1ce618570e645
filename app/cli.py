"""The ``keepstep`` command line: a thin face over ``keepstep.engine``.

Every command opens the project through the engine API and prints what it returns;
none of them touches SQL or storage internals. Heavy modules (the engine, litellm,
textual) are imported inside the commands that need them, so ``keepstep status``
starts fast and never loads a model client or the TUI.

Exit codes: 0 success, 1 a runtime problem (a corrupt database, a refused keyring,
a broken chain), 2 a usage or validation problem (a missing folder, an invalid plan,
an unknown run, gate or unit), 130 cancelled with Ctrl-C. A user-caused failure
prints one message and what to do next, never a traceback.
"""

from __future__ import annotations

import functools
import getpass
import importlib.util
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

from . import cli_output as out

if TYPE_CHECKING:
    from keepstep.engine import Project, Run, RunStatus

EXIT_RUNTIME, EXIT_USAGE, EXIT_CANCELLED = 1, 2, 130
DEBUG_ENV = "KEEPSTEP_DEBUG"

app = typer.Typer(
    name="keepstep", no_args_is_help=False, add_completion=False,
    pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Durable, explainable long-running AI research runs.\n\n"
    "Run `keepstep` with no arguments inside a project folder to open the TUI.",
)
sources_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                          help="List, approve, revoke and add sources (DIR first).")
budget_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                         help="Budget decisions.")
keys_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                       help="API keys in the OS keyring.")
app.add_typer(sources_app, name="sources")
app.add_typer(budget_app, name="budget")
app.add_typer(keys_app, name="keys")


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
    from keepstep.engine.errors import (
        ApprovalError,
        ConfigError,
        KeepstepError,
        LeaseLost,
        PlanValidationError,
        ProjectError,
        RunCancelled,
        SourceError,
    )
    from keepstep.storage.errors import NotFound, StorageError

    if isinstance(exc, PlanValidationError | ProjectError | ConfigError | SourceError
                  | ApprovalError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, KeepstepError):
        return EXIT_RUNTIME, str(exc)
    if isinstance(exc, NotFound):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, StorageError):
        return EXIT_RUNTIME, str(exc)
    if isinstance(exc, RunCancelled):
        return EXIT_CANCELLED, "cancelled at the next safe point"
    if isinstance(exc, LeaseLost):
        return EXIT_RUNTIME, ("this executor lost its lease to another one; its output is left "
                              "as an orphan\n  → check `keepstep status`, then resume")
    return None


def _print_error(message: str) -> None:
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
            _print_error(message)
            raise typer.Exit(code) from None

    return wrapper


def command(target: typer.Typer, name: str | None = None, **kwargs: Any) -> Callable:
    """``@target.command(name)`` with friendly error handling."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        target.command(name, **kwargs)(friendly(fn))
        return fn

    return deco


# --- shared arguments and helpers ----------------------------------------------------------
DirArg = Annotated[Path, typer.Argument(metavar="DIR", help="The project folder.",
                                        show_default=False)]
RunOpt = Annotated[str, typer.Option("--run", "-r", help="The run id, e.g. ME-042.")]
BranchOpt = Annotated[str, typer.Option("--branch", "-b", help="The branch of the run.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
ApproveOpt = Annotated[list[str] | None, typer.Option(
    "--approve", metavar="GATE=CHOICE",
    help="Answer an approval gate when the run reaches it (repeatable).")]
WhoOpt = Annotated[str | None, typer.Option("--who", help="Who decides (default: your login).")]


def _who(who: str | None) -> str:
    if who:
        return who
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return "user"


def _check_dir(root: Path) -> Path:
    if not root.exists():
        raise UsageProblem(f"{root} does not exist",
                           "pass a project folder, or create one with `keepstep init DIR`")
    if not root.is_dir():
        raise UsageProblem(f"{root} is not a folder", "pass the project folder, not a file")
    if not (root / "keepstep.toml").is_file():
        raise UsageProblem(f"{root} is not a keepstep project (no keepstep.toml)",
                           "create one with `keepstep init DIR`, or pass the project folder")
    return root


@contextmanager
def open_project_dir(root: Path) -> Iterator[Project]:
    from keepstep.engine import open_project

    project = open_project(_check_dir(root))
    try:
        yield project
    finally:
        project.close()


def _existing_run(project: Project, run_id: str, branch: str = "main") -> Run:
    if run_id not in project.runs():
        known = ", ".join(project.runs()) or "none yet"
        raise UsageProblem(f"no run {run_id!r} in {project.root} (runs: {known})",
                           f"start it with `keepstep run {project.root} --run {run_id}`")
    return project.run(run_id, branch)


def _parse_approvals(values: list[str] | None) -> dict[str, str]:
    answers: dict[str, str] = {}
    for value in values or []:
        gate, sep, choice = value.partition("=")
        if not sep or not gate.strip() or not choice.strip():
            raise UsageProblem(f"--approve {value!r} is not GATE=CHOICE",
                               "e.g. --approve audience='product team'")
        answers[gate.strip()] = choice.strip()
    return answers


def _check_gates(plan: Any, answers: dict[str, str]) -> None:
    gates = {g.id for g in plan.gates}
    unknown = sorted(set(answers) - gates)
    if unknown:
        raise UsageProblem(f"--approve names no gate of this plan: {', '.join(unknown)}",
                           "gates: " + (", ".join(sorted(gates)) or "none"))


def _models(project: Project, run: Run | None = None) -> list[str]:
    cfg = project.files.config
    kinds = {u.kind.value for u in (run.plan if run else project.files.plan).units}
    return [cfg.models.get(k, cfg.default_model) for k in sorted(kinds)] or [cfg.default_model]


def _dashboard(project: Project, run: Run, status: RunStatus) -> str:
    phases = {u.id: u.phase for u in run.plan.units}
    return out.dashboard_text(status, project=project.files.config.name, phases=phases,
                              models=_models(project, run))


def _summary_line(status: RunStatus) -> str:
    c = status.counts
    return (f"run {status.run_id} ({status.branch}): {status.decision} · {c.get('current', 0)}/"
            f"{len(status.units)} units current · checkpoint {status.head_version} · "
            f"{status.plan_version} · {status.input_version}")


# --- running -------------------------------------------------------------------------------
def drive(action: Callable[[threading.Event, Callable[[dict[str, Any]], None]], Any], *,
          quiet: bool = False) -> tuple[Any, bool]:
    """Run ``action(cancel, on_event)`` in a worker thread; Ctrl-C sets ``cancel``.

    Returns (the action's result or None, whether it was cancelled). The engine stops
    at its next safe point; a second Ctrl-C quits at once (the unit in flight is then
    an orphan that the next resume finds and redoes — committed work is never lost).
    """
    cancel = threading.Event()
    sym = out.symbols()

    def on_event(event: dict[str, Any]) -> None:
        if quiet:
            return
        line = out.progress_line(event, sym)
        if line:
            typer.echo(line)

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = action(cancel, on_event)
        except BaseException as exc:  # handed back to the main thread
            box["error"] = exc

    presses = 0

    def on_sigint(_signum: int, _frame: Any) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            cancel.set()
            typer.echo("cancel requested: stopping at the next safe point "
                       "(Ctrl-C again to quit now)", err=True)
        else:
            typer.echo("quitting now; the unit in flight is left as an orphan and redone on "
                       "resume", err=True)
            os._exit(EXIT_CANCELLED)

    worker = threading.Thread(target=work, name="keepstep-run", daemon=True)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    error = box.get("error")
    if error is not None:
        from keepstep.engine.errors import RunCancelled

        if isinstance(error, RunCancelled):
            return None, True
        raise error
    return box.get("result"), cancel.is_set()


def _finish(project: Project, run: Run, status: RunStatus | None, cancelled: bool,
            quiet: bool) -> None:
    status = status if status is not None else run.status()
    if quiet:
        typer.echo(_summary_line(status))
        typer.echo(f"next: {status.next_action}")
    else:
        typer.echo("")
        typer.echo(_dashboard(project, run, status))
    if cancelled:
        typer.echo(f"cancelled at the next safe point; continue with "
                   f"`keepstep resume {project.root} --run {run.run_id}`", err=True)
        raise typer.Exit(EXIT_CANCELLED)


# --- init, validate ------------------------------------------------------------------------
def _copy_tree(src: Any, dest: Path) -> list[Path]:
    written = []
    for item in sorted(src.iterdir(), key=lambda t: t.name):
        if item.name.startswith((".", "__pycache__")):
            continue
        target = dest / item.name
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            written += _copy_tree(item, target)
        else:
            target.write_bytes(item.read_bytes())
            written.append(target)
    return written


def example_files() -> Any:
    """The example project shipped with the package (an importlib.resources Traversable)."""
    from importlib.resources import files

    return files("keepstep.app").joinpath("templates")


@command(app, "init")
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
    written = _copy_tree(example_files(), root)
    typer.echo(f"created a keepstep project in {root} ({len(written)} files)")
    typer.echo("next:")
    typer.echo(f"  keepstep validate {root}")
    typer.echo(f"  keepstep run {root} --run R1")
    typer.echo(f"  keepstep status {root} --run R1")


@command(app, "validate")
def validate(root: DirArg) -> None:
    """Check the project files: plan (units, dependencies, gates), contract, sources."""
    from keepstep.engine import load_project_files
    from keepstep.engine.project_files import snapshot_sources

    root = _check_dir(root)
    files = load_project_files(root)
    snapshot = snapshot_sources(root, files.sources)
    for warning in _output_warnings(files.plan):
        typer.echo(f"warning: {warning}")
    plan = files.plan
    typer.echo(f"plan OK: {len(plan.units)} units, {len(plan.gates)} gates "
               f"({len(snapshot.sources)} approved sources)")


def _output_warnings(plan: Any) -> list[str]:
    """Declared outputs a unit's kind will not write (a likely typo, not an error)."""
    try:
        from keepstep.engine.kinds import expected_outputs
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
@sources_app.callback(invoke_without_command=True)
@friendly
def sources_main(ctx: typer.Context, root: DirArg) -> None:
    """keepstep sources DIR [list | approve ID | revoke ID | add PATH --id ID --group G]."""
    ctx.obj = {"root": root}
    if ctx.invoked_subcommand is None:
        _sources_list(root, None)


def _root_of(ctx: typer.Context) -> Path:
    return _check_dir(ctx.obj["root"])


def _sources_list(root: Path, run_id: str | None) -> None:
    from keepstep.engine.project_files import load_sources
    from keepstep.engine.views import input_snapshots
    from keepstep.storage.hashing import file_sha256

    root = _check_dir(root)
    from keepstep.storage.errors import StorageError

    sf = load_sources(root)
    note = ""
    try:
        snapshots = input_snapshots(root)
    except StorageError as exc:  # the list itself does not need the database
        snapshots = {}
        note = f"warning: run snapshots unavailable: {exc}"
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


@command(sources_app, "list")
def sources_list(ctx: typer.Context, run: Annotated[str | None, typer.Option(
        "--run", "-r", help="Show the input snapshot this run is at.")] = None) -> None:
    """List sources: id, group, approved, sha256 prefix, the run's snapshot version."""
    _sources_list(ctx.obj["root"], run)


def _set_approved(root: Path, source_id: str, approved: bool) -> None:
    from keepstep.engine.project_files import load_sources, save_sources

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


@command(sources_app, "approve")
def sources_approve(ctx: typer.Context, source_id: Annotated[str, typer.Argument(
        metavar="ID", help="The source id.")]) -> None:
    """Approve a source (runs may then cite it)."""
    _set_approved(_root_of(ctx), source_id, True)


@command(sources_app, "revoke")
def sources_revoke(ctx: typer.Context, source_id: Annotated[str, typer.Argument(
        metavar="ID", help="The source id.")]) -> None:
    """Revoke a source's approval."""
    _set_approved(_root_of(ctx), source_id, False)


@command(sources_app, "add")
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
    from keepstep.engine.project_files import SourceEntry, load_sources, save_sources

    root = _root_of(ctx)
    sf = load_sources(root)
    if any(s.id == source_id for s in sf.sources):
        raise UsageProblem(f"source id {source_id!r} is already used",
                           "pick a new id, or approve the existing source")
    if not path.is_file():
        raise UsageProblem(f"{path} is not a file", "pass the path of the source document")
    real, project = path.resolve(), root.resolve()
    if real.is_relative_to(project):
        rel = real.relative_to(project).as_posix()
    else:
        target = project / "sources" / path.name
        if target.exists() and target.read_bytes() != real.read_bytes():
            raise UsageProblem(f"{target} already exists with different content",
                               "rename the file, or add the copy that is already there")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(real.read_bytes())
        rel = target.relative_to(project).as_posix()
        typer.echo(f"copied {path} to {rel}")
    sf.sources.append(SourceEntry(id=source_id, path=rel, group=group, title=title or path.stem,
                                  kind=kind, approved=approve))
    save_sources(root, sf)
    typer.echo(f"source {source_id} added ({rel}, group {group or '-'}, "
               f"{'approved' if approve else 'not approved yet'})")
    if not approve:
        typer.echo(f"approve it with `keepstep sources {root} approve {source_id}`")


# --- status --------------------------------------------------------------------------------
@command(app, "status")
def status(
    root: DirArg,
    run: Annotated[str | None, typer.Option("--run", "-r", help="The run (optional when the "
                                            "project has only one).")] = None,
    branch: BranchOpt = "main",
    as_json: JsonOpt = False,
) -> None:
    """The run dashboard (or the list of runs). Never loads a model client or the TUI."""
    with open_project_dir(root) as project:
        runs = project.runs()
        if run is None and len(runs) != 1:
            if not runs:
                if as_json:
                    typer.echo(out.to_json({"runs": []}))
                else:
                    typer.echo(f"no runs yet in {project.root}; start one with "
                               f"`keepstep run {root} --run R1`")
                return
            statuses = [project.run(r).status() for r in runs]
            rows = [{k: s.model_dump(mode="json")[k] for k in (
                "run_id", "plan_version", "input_version", "head_version", "decision",
                "next_action")} for s in statuses]
            if as_json:
                typer.echo(out.to_json({"runs": rows}))
            else:
                typer.echo(out.runs_table(rows))
                typer.echo(f"show one with `keepstep status {root} --run ID`")
            return
        the_run = _existing_run(project, run or runs[0], branch)
        st = the_run.status()
        if as_json:
            typer.echo(out.to_json(st.model_dump(mode="json")))
        else:
            typer.echo(_dashboard(project, the_run, st))


# --- run, resume, retry, replay, restart, branch ---------------------------------------------
MaxUnitsOpt = Annotated[int | None, typer.Option(
    "--max-units", min=1, help="Stop after this many units have been executed.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")]


@command(app, "run")
def run_cmd(root: DirArg, run: RunOpt, approve: ApproveOpt = None, max_units: MaxUnitsOpt = None,
            branch: BranchOpt = "main", quiet: QuietOpt = False) -> None:
    """Start the run (or continue it) until done, blocked or cancelled (Ctrl-C)."""
    answers = _parse_approvals(approve)
    with open_project_dir(root) as project:
        exists = run in project.runs()
        _check_gates(project.run(run, branch).plan if exists else project.files.plan, answers)
        the_run = project.open_or_start(run, branch)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.run(cancel=cancel, on_event=on_event,
                                                 approve=answers, max_units=max_units),
            quiet=quiet)
        _finish(project, the_run, result, cancelled, quiet)


@command(app, "resume")
def resume(root: DirArg, run: RunOpt, approve: ApproveOpt = None, max_units: MaxUnitsOpt = None,
           branch: BranchOpt = "main", quiet: QuietOpt = False) -> None:
    """Continue a run after a restart or interruption (recovery first)."""
    answers = _parse_approvals(approve)
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        _check_gates(the_run.plan, answers)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.resume(cancel=cancel, on_event=on_event,
                                                    approve=answers, max_units=max_units),
            quiet=quiet)
        _finish(project, the_run, result, cancelled, quiet)


@command(app, "retry")
def retry(root: DirArg, run: RunOpt,
          unit: Annotated[str, typer.Argument(help="The unit to try again, e.g. U07.")],
          branch: BranchOpt = "main", who: WhoOpt = None, quiet: QuietOpt = False) -> None:
    """Same unit, new attempt (a recorded decision), then continue the run."""
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        _check_unit(the_run, unit)
        result, cancelled = drive(
            lambda cancel, on_event: the_run.retry(unit, who=_who(who), cancel=cancel,
                                                   on_event=on_event),
            quiet=quiet)
        _finish(project, the_run, result, cancelled, quiet)


def _new_run_id(project: Project, new_id: str) -> str:
    if new_id in project.runs():
        raise UsageProblem(f"run {new_id!r} already exists", "choose a new run id with --as")
    return new_id


@command(app, "replay")
def replay(root: DirArg, run: RunOpt,
           as_: Annotated[str | None, typer.Option("--as", help="The new run id "
                                                   "(default RUN-replay).")] = None,
           quiet: QuietOpt = False) -> None:
    """Re-execute a run into a new run from its recorded responses (no model calls)."""
    with open_project_dir(root) as project:
        source = _existing_run(project, run)
        new_id = _new_run_id(project, as_ or f"{run}-replay")
        result, cancelled = drive(
            lambda cancel, on_event: source.replay(new_id, cancel=cancel, on_event=on_event),
            quiet=quiet)
        new_run = result if result is not None else project.run(new_id)
        _finish(project, new_run, None, cancelled, quiet)


@command(app, "restart")
def restart(root: DirArg, run: RunOpt,
            as_: Annotated[str, typer.Option("--as", help="The new run id.")]) -> None:
    """A new business task: a new run id from the current files (the old run is kept)."""
    with open_project_dir(root) as project:
        _existing_run(project, run)
        new = project.restart(run, _new_run_id(project, as_))
        typer.echo(f"started run {new.run_id} from the current project files "
                   f"(run {run} is kept, with a decision.restart event)")
        typer.echo(f"run it with `keepstep run {root} --run {new.run_id}`")


@command(app, "branch")
def branch_cmd(root: DirArg, run: RunOpt,
               at: Annotated[int, typer.Option("--at", min=0, help="The checkpoint version.")],
               as_: Annotated[str, typer.Option("--as", help="The new branch id.")],
               branch: Annotated[str, typer.Option("--from", help="The branch to fork.")]
               = "main") -> None:
    """Fork a run at a checkpoint under its own branch id and head."""
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        head = the_run.head().version
        if at > head:
            raise UsageProblem(f"checkpoint {at} is past the head of {run}/{branch} ({head})",
                               f"pick a version from 0 to {head}")
        new = the_run.branch(at, as_)
        typer.echo(f"branch {as_} of run {run} forked at checkpoint {at}")
        typer.echo(f"continue it with `keepstep resume {root} --run {run} --branch "
                   f"{new.branch_id}`")


# --- budget ----------------------------------------------------------------------------------
@command(budget_app, "raise")
def budget_raise(
    root: DirArg, run: RunOpt,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the decision).")],
    calls: Annotated[float | None, typer.Option("--calls", min=0)] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", min=0)] = None,
    cost: Annotated[float | None, typer.Option("--cost", min=0)] = None,
    recoveries: Annotated[float | None, typer.Option("--recoveries", min=0)] = None,
    branch: BranchOpt = "main", who: WhoOpt = None,
) -> None:
    """Raise budget limits (a recorded decision); units blocked by the budget are released."""
    if not reason.strip():
        raise UsageProblem("a budget raise needs a reason", "pass --reason '...'")
    limits = {k: v for k, v in {"calls": calls, "tokens": tokens, "cost": cost,
                                "recoveries": recoveries}.items() if v is not None}
    if not limits:
        raise UsageProblem("no limit given", "pass at least one of --calls, --tokens, --cost, "
                           "--recoveries (the new limit, not an increment)")
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        budget = the_run.raise_budget(reason=reason, who=_who(who), **limits)
        for k, v in limits.items():
            used = budget.used.get(k, 0) if hasattr(budget, "used") else 0
            typer.echo(f"{k}: limit now {v:g} (used {used:g})")
        typer.echo(f"recorded as a budget decision by {_who(who)}: {reason}")
        typer.echo(f"continue with `keepstep resume {root} --run {run}`")


# --- ledgers, events, approvals ------------------------------------------------------------
@command(app, "calls")
def calls(root: DirArg, run: RunOpt,
          unit: Annotated[str | None, typer.Option("--unit", help="Only this unit.")] = None,
          as_json: JsonOpt = False) -> None:
    """The model call ledger: unit, attempt, round, model, tokens, cost, outcome."""
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run)
        rows = [out.call_row(c) for c in the_run.calls() if unit is None or c.unit == unit]
        typer.echo(out.to_json(rows) if as_json else out.calls_text(rows))


@command(app, "events")
def events(root: DirArg, run: RunOpt,
           kind: Annotated[str | None, typer.Option("--kind", help="Kind prefix, e.g. "
                                                    "'decision.' or 'recovery'.")] = None,
           unit: Annotated[str | None, typer.Option("--unit")] = None,
           limit: Annotated[int | None, typer.Option("--limit", min=1,
                                                     help="Only the newest N.")] = None,
           as_json: JsonOpt = False) -> None:
    """The run's event log, oldest first."""
    with open_project_dir(root) as project:
        the_run = _existing_run(project, run)
        found = the_run.events(kind_prefix=kind, unit=unit, limit=limit,
                               newest_first=limit is not None)
        if limit is not None:
            found = list(reversed(found))
        if as_json:
            typer.echo(out.to_json([e.model_dump(mode="json") for e in found]))
        else:
            typer.echo(out.events_text(found))


@command(app, "approvals")
def approvals(root: DirArg, run: RunOpt, branch: BranchOpt = "main",
              as_json: JsonOpt = False) -> None:
    """Pending approval requests, with what each option reuses and redoes."""
    from keepstep.engine.approvals_flow import pending_approvals

    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        pending = pending_approvals(the_run)
        typer.echo(out.to_json(pending) if as_json else
                   out.approvals_text(pending, run, str(root)))


@command(app, "approve")
def approve(root: DirArg, run: RunOpt,
            gate: Annotated[str, typer.Argument(help="The gate id, e.g. audience.")],
            choice: Annotated[str, typer.Option("--choice", help="One of the gate's options.")],
            token: Annotated[str | None, typer.Option("--token", help="A resume token, when "
                                                      "the request came with one.")] = None,
            branch: BranchOpt = "main", who: WhoOpt = None) -> None:
    """Answer an approval gate (bound to the current plan version and contract)."""
    from keepstep.engine.approvals_flow import record_choice

    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        gates = {g.id: g for g in the_run.plan.gates}
        if gate not in gates:
            raise UsageProblem(f"no gate {gate!r} in {the_run.plan_info.get('label', 'the plan')}",
                               "gates: " + (", ".join(gates) or "none"))
        record_choice(the_run, gates[gate], choice, who=_who(who), token=token)
        typer.echo(f"recorded: gate {gate} = {choice!r} (by {_who(who)})")
        typer.echo(f"continue with `keepstep resume {root} --run {run}`")


# --- keys ----------------------------------------------------------------------------------
@command(keys_app, "set")
def keys_set(provider: Annotated[str, typer.Argument(help="e.g. openai, anthropic.")]) -> None:
    """Store a provider's API key in the OS keyring (read with a hidden prompt)."""
    from keepstep.engine.keys import env_var_name, set_api_key

    if sys.stdin is not None and sys.stdin.isatty():
        key = typer.prompt(f"API key for {provider} (input hidden)", hide_input=True,
                           default="", show_default=False)
    else:  # piped in (`... | keepstep keys set openai`): no prompt, no echo warning
        key = sys.stdin.readline() if sys.stdin is not None else ""
    if not key.strip():
        raise UsageProblem("no key entered", f"or set the environment variable "
                           f"{env_var_name(provider)} instead")
    set_api_key(provider, key)
    typer.echo(f"stored the key for {provider} in the OS keyring (service 'keepstep'); "
               f"{env_var_name(provider)}, when set, takes precedence")


# --- verify, explain, preview ----------------------------------------------------------------
@command(app, "verify")
def verify(root: DirArg, run: RunOpt, branch: BranchOpt = "main") -> None:
    """Verify the whole checkpoint chain of a run (links and state hashes)."""
    from keepstep.engine.views import verify_run_chain

    with open_project_dir(root) as project:
        report = verify_run_chain(_existing_run(project, run, branch))
        typer.echo(out.chain_text(report))
        if not report.ok:
            raise typer.Exit(EXIT_RUNTIME)


def _engine_feature(module: str, what: str) -> None:
    """Stop with a clear message when an optional engine module is not in this build."""
    if importlib.util.find_spec(module) is None:
        _print_error(f"{what} is not available in this build yet")
        raise typer.Exit(EXIT_RUNTIME)


def _check_unit(run: Run, unit: str) -> None:
    units = run.plan.unit_map()
    if unit not in units:
        raise UsageProblem(f"no unit {unit!r} in {run.plan_info.get('label', 'the plan')}",
                           "units: " + ", ".join(units))


@command(app, "explain")
def explain(root: DirArg, run: RunOpt,
            unit: Annotated[str, typer.Argument(help="The unit, e.g. U27.")],
            branch: BranchOpt = "main", as_json: JsonOpt = False) -> None:
    """Why a unit is in its state: attempts, invalidation path, gate or budget figures."""
    _engine_feature("keepstep.engine.explain", "`keepstep explain`")
    from keepstep.engine.views import explain_run_unit

    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        _check_unit(the_run, unit)
        result = explain_run_unit(the_run, unit)
        typer.echo(out.to_json(result.model_dump(mode="json")) if as_json
                   else out.render_any(result))


@command(app, "preview")
def preview(root: DirArg, run: RunOpt, branch: BranchOpt = "main",
            as_json: JsonOpt = False) -> None:
    """Dry run: what the project files' edits would reuse and invalidate, before resuming."""
    _engine_feature("keepstep.engine.explain", "`keepstep preview`")
    from keepstep.engine.views import preview_run

    with open_project_dir(root) as project:
        the_run = _existing_run(project, run, branch)
        result = preview_run(the_run)
        typer.echo(out.to_json(result.model_dump(mode="json")) if as_json
                   else out.preview_text(result))


@command(app, "backup")
def backup(root: DirArg, to: Annotated[Path | None, typer.Option(
        "--to", help="The backup file (default .keepstep/backups/state-<time>.db).")] = None,
        ) -> None:
    """A consistent copy of the project database (the artifacts stay where they are)."""
    from keepstep.engine.views import backup_state

    with open_project_dir(root) as project:
        target = backup_state(project, to)
        typer.echo(f"database copied to {target}")


# --- TUI -------------------------------------------------------------------------------------
def launch_tui(root: Path) -> None:
    _check_dir(root)
    if importlib.util.find_spec("keepstep.app.tui") is None:
        _print_error("the TUI is not available in this build yet")
        typer.echo(f"use the commands instead, e.g. `keepstep status {root}` "
                   "(see `keepstep --help`)", err=True)
        raise typer.Exit(EXIT_RUNTIME)
    from keepstep.app.tui import make_app

    make_app(root).run()


@command(app, "tui")
def tui(root: Annotated[Path, typer.Argument(help="The project folder.")] = Path(".")) -> None:
    """Open the TUI on a project."""
    launch_tui(root)


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
        friendly(launch_tui)(here)
        return
    typer.echo(ctx.get_help())
    _print_error(f"no keepstep.toml in {here}")
    typer.echo("  → cd into a project folder, or create one with `keepstep init DIR`", err=True)
    raise typer.Exit(EXIT_USAGE)


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
                _print_error("interrupted")
                sys.exit(EXIT_CANCELLED)
            _print_error(f"internal error: {type(exc).__name__}: {exc}")
            typer.echo(f"  → this is a bug in keepstep; set {DEBUG_ENV}=1 to see the traceback",
                       err=True)
            sys.exit(EXIT_RUNTIME)
        code, message = described
        _print_error(message)
        sys.exit(code)


if __name__ == "__main__":
    main()
