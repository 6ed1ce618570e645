"""``keepstep handover``, ``verify-bundle``, ``story`` and ``narrative``.

``register(app)`` adds the four commands to the main typer app (``app/cli.py`` calls it).
Each opens the project through the engine API; the engine is imported inside the commands,
so importing this module stays cheap.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_RUNTIME,
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    UsageProblem,
    add_command,
    check_dir,
    commands_for,
    existing_run,
    open_project_dir,
)

OutOpt = Annotated[Path | None, typer.Option(
    "--out", "-o", show_default=False,
    help="Where to write the bundle: a folder, or a file ending in .zip (default: "
    "handover/RUN.zip in the project).")]


SourcesOpt = Annotated[str, typer.Option(
    "--sources", help="What of the sources goes in: excerpts (each cited statement under its "
    "evidence id and locator), files (the approved source files too), none.")]


def handover(root: DirArg = None, run: RunOpt = None, out_path: OutOpt = None,
             branch: BranchOpt = "main", sources: SourcesOpt = "excerpts",
             as_json: JsonOpt = False) -> None:
    """Export the handover bundle (folder or .zip) and verify it. Its index.html opens with
    the conclusions (recommendation, top risks, open disagreements); each citation links to
    the cited statement in sources/.

    \b
    Example:
      keepstep handover --run ME-042 --out handover-ME-042.zip
      keepstep handover --sources files --out ~/Desktop/handover
    """
    if sources not in ("excerpts", "files", "none"):
        raise UsageProblem(f"unknown --sources {sources!r}", "choose excerpts, files or none")
    from keepstep.engine.exports import export_handover, verify_bundle

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        if out_path is None:
            out_path = project.root / "handover" / f"{the_run.run_id}.zip"
        path = export_handover(the_run, out_path, sources=sources)
        report = verify_bundle(path)
        status = the_run.status()
    if as_json:
        typer.echo(out.to_json({"path": str(path), "verify": report.model_dump(mode="json")}))
    else:
        typer.echo(f"handover bundle: {path}")
        typer.echo(report.render())
        following = ("done: send the bundle; Word files of the deliverables with "
                     "`keepstep export --format docx`" if status.decision == "done" else
                     commands_for(status.next_action, project.root))
        typer.echo(f"open {path / 'index.html' if path.is_dir() else path} · next: "
                   f"{following}")
    if not report.ok:
        raise typer.Exit(EXIT_RUNTIME)


def verify_bundle_cmd(path: Annotated[Path, typer.Argument(
        metavar="PATH", help="A handover bundle: its folder or its .zip.")],
        as_json: JsonOpt = False) -> None:
    """Check every file of a handover bundle against its manifest.json hashes."""
    from keepstep.engine.exports import verify_bundle

    if not path.exists():
        raise UsageProblem(f"{path} does not exist", "pass a bundle folder or .zip file")
    report = verify_bundle(path)
    typer.echo(out.to_json(report.model_dump(mode="json")) if as_json else report.render())
    if not report.ok:
        raise typer.Exit(EXIT_RUNTIME)


def _story_workdir(pack: Path, workdir: Path | None) -> Path:
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="keepstep-story-")) / "ME-042"
    pack_r, work_r = pack.resolve(), workdir.resolve()
    if work_r == pack_r or work_r in pack_r.parents:
        raise UsageProblem(f"--workdir {workdir} holds the pack itself; the story replaces its "
                           "workdir", "pass an empty or new folder")
    if work_r.exists() and (not work_r.is_dir() or (any(work_r.iterdir())
                                                    and not (work_r / "keepstep.toml").is_file())):
        raise UsageProblem(f"--workdir {workdir} is not empty and is not an earlier story copy; "
                           "the story would replace it", "pass an empty or new folder")
    return workdir


def story(pack: Annotated[Path, typer.Argument(metavar="PACK", show_default=False,
                                              help="The sample pack folder.")],
          workdir: Annotated[Path | None, typer.Option(
        "--workdir", "-w", help="Where to copy the pack (replaced). Default: a new temp folder."
)] = None) -> None:
    """Run the ME-042 story on a copy of the pack: a killed executor, a budget block and an
    audience change, printing each decision; exit 1 if an end-state check fails."""
    from keepstep.engine import run_story

    pack = check_dir(pack)
    target = _story_workdir(pack, workdir)
    result = run_story(pack, target, say=typer.echo)
    failed = [c for c in result.checks if not c.passed]
    typer.echo(f"\nstory project: {result.project}")
    if failed:
        typer.echo(f"{len(failed)} end-state check(s) failed: "
                   + ", ".join(c.name for c in failed), err=True)
        raise typer.Exit(EXIT_RUNTIME)
    typer.echo(f"all {len(result.checks)} end-state checks passed")


def narrative_cmd(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
                  check: Annotated[Path | None, typer.Option(
                      "--check", metavar="FILE",
                      help="Compare the figures of a narrative file with the state instead "
                      "(a mismatch raises an alert and exits 1).")] = None,
                  as_json: JsonOpt = False) -> None:
    """The handover narrative, generated from the run's stored state (no model).

    With --json: {"run", "narrative"} or, with --check, {"file", "ok", "mismatches"}.

    \b
    Example:
      keepstep narrative --run ME-042 > narrative.md
      keepstep narrative --check narrative.md
    """
    from keepstep.engine.exports import check_narrative, narrative

    if check is not None and not check.is_file():
        raise UsageProblem(f"{check} is not a file", "pass a narrative.md to check")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        if check is None:
            text = narrative(the_run)
            if as_json:
                typer.echo(out.to_json({"run": the_run.run_id, "branch": the_run.branch_id,
                                        "narrative": text}))
            else:
                typer.echo(text, nl=False)
            return
        mismatches = check_narrative(the_run, check.read_text(encoding="utf-8"))
    if as_json:
        typer.echo(out.to_json({"file": str(check), "ok": not mismatches,
                                "mismatches": [m.render() for m in mismatches]}))
        if mismatches:
            raise typer.Exit(EXIT_RUNTIME)
        return
    if not mismatches:
        typer.echo(f"{check}: every figure matches the state")
        return
    typer.echo(f"{check}: {len(mismatches)} figure(s) differ from the state (the state wins; "
               "an alert was recorded):")
    for m in mismatches:
        typer.echo(f"  - {m.render()}")
    raise typer.Exit(EXIT_RUNTIME)


COMMANDS = (("handover", handover), ("verify-bundle", verify_bundle_cmd), ("story", story),
            ("narrative", narrative_cmd))


def register(app: typer.Typer) -> None:
    """Add the handover commands to ``app``."""
    for name, fn in COMMANDS:
        add_command(app, fn, name)


__all__ = ["register"]
