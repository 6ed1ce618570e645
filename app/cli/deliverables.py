"""``keepstep export``: the run's current deliverables where a person finds them.

Copies the committed outputs of the document units (report, tables, notes…) into a visible
folder — ``deliverables/<run>/`` in the project by default — with ``manifest.json`` listing
each file's sha256 (the engine re-hashes every file against its record before copying).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    UsageProblem,
    add_command,
    existing_run,
    open_project_dir,
)


def export(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
           to: Annotated[Path | None, typer.Option(
               "--out", "-o", help="The folder (default: deliverables/RUN in the project).",
               show_default=False)] = None,
           formats: Annotated[list[str] | None, typer.Option(
               "--format", "-f", help="md (the Markdown and CSV as committed), docx (a Word "
               "file per Markdown deliverable, charts and citations as notes), pdf (Word files "
               "converted by LibreOffice, when installed). Repeat for several.",
               show_default=False)] = None,
           charts: Annotated[bool, typer.Option(
               "--charts/--no-charts", help="Draw the charts (risk matrix, evidence per "
               "group, price ladder) into charts/ and charts.md.")] = True,
           as_json: JsonOpt = False) -> None:
    """Copy the run's current deliverables and their manifest (sha256 each) to a folder;
    with --format docx, Word files too (and --format pdf, PDFs where LibreOffice is
    installed), with the charts of the findings.

    An earlier export in that folder is replaced; anything else there is refused. A
    deliverable whose file no longer matches its committed hash stops the export (nothing is
    written): resume the run to redo it.

    \b
    Example:
      keepstep export --run ME-042
      keepstep export --out ~/Desktop/me042-deliverables
      keepstep export --format docx --format pdf
    """
    from keepstep.engine.exports import EXPORT_FORMATS, export_documents

    wanted = tuple(dict.fromkeys(f.strip().lower() for f in formats or ["md"]))
    unknown = [f for f in wanted if f not in EXPORT_FORMATS]
    if unknown:
        raise UsageProblem(f"unknown --format {', '.join(unknown)}",
                           f"choose from {', '.join(EXPORT_FORMATS)}")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        result = the_run.export_deliverables(to)
        documents = export_documents(the_run, result, wanted, charts=charts)
    if as_json:
        typer.echo(out.to_json({**result.model_dump(mode="json"),
                                "documents": documents.model_dump(mode="json")}))
        return
    typer.echo(result.render())
    shown = documents.render()
    if shown:
        typer.echo(shown)


def register(app: typer.Typer) -> None:
    add_command(app, export, "export")


__all__ = ["register"]
