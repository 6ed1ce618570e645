"""``python -m keepstep.app.demo OUTDIR`` (``make demo``): the ME-042 pack, offline, end to end.

Copies ``sample_projects/market-entry`` (or, outside a source checkout, the ``keepstep
init`` example) into OUTDIR with a fresh ``.keepstep``, runs run ME-042 with the audience
approved as "product team", then prints the dashboard, the deliverables with their
sha256 (exported with their manifest to OUTDIR/deliverables/ME-042) and the handover
narrative. Exits non-zero unless
the run is done.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from keepstep.app.cli import output as out

if TYPE_CHECKING:
    from keepstep.engine.views import Deliverable

RUN_ID = "ME-042"
APPROVE = {"audience": "product team"}
SAMPLE = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry"
COPY_IGNORE = shutil.ignore_patterns(".keepstep", "__pycache__", ".ipynb_checkpoints")


def source_project() -> tuple[Path | None, str]:
    """(folder to copy, label). None means: the packaged ``keepstep init`` example."""
    if (SAMPLE / "keepstep.toml").is_file():
        return SAMPLE, f"sample project {SAMPLE}"
    return None, "the `keepstep init` example (sample_projects/market-entry not found)"


def prepare(outdir: Path) -> str:
    """Copy the project into ``outdir``, dropping any earlier state; returns its label."""
    from keepstep.app.cli.project import copy_tree, example_files

    src, label = source_project()
    if outdir.exists() and not outdir.is_dir():
        raise SystemExit(f"error: {outdir} is a file; pass a folder")
    shutil.rmtree(outdir / ".keepstep", ignore_errors=True)
    outdir.mkdir(parents=True, exist_ok=True)
    if src is not None:
        shutil.copytree(src, outdir, dirs_exist_ok=True, ignore=COPY_IGNORE)
    else:
        copy_tree(example_files(), outdir)
    return label


def deliverables_text(rows: list[Deliverable], root: Path) -> str:
    if not rows:
        return "no deliverables committed"
    table_rows = []
    for r in rows:
        path = Path(r.path)
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        table_rows.append([r.unit, r.name, r.sha256, "ok" if r.matches else "MISMATCH", shown])
    return out.table(["unit", "file", "sha256", "on disk", "path"], table_rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keepstep.app.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path, help="where to put the demo project")
    args = parser.parse_args(argv)
    outdir: Path = args.outdir

    from keepstep.app.cli.common import dashboard, describe_error, drive, models_of
    from keepstep.engine import open_project

    label = prepare(outdir)
    print(f"keepstep demo: {label} → {outdir}")
    try:
        with open_project(outdir) as project:
            models = models_of(project)
            print(out.model_line(models))
            if set(models) == {out.OFFLINE_MODEL}:
                print("The model is the offline heuristic: findings come from fixed rules over "
                      "the approved sources, not from a language model.")
            print(f"run {RUN_ID}, approving gate audience = {APPROVE['audience']!r}\n")
            run = project.open_or_start(RUN_ID)
            status, cancelled = drive(
                lambda cancel, on_event: run.run(cancel=cancel, on_event=on_event,
                                                 approve=dict(APPROVE)))
            status = run.status()
            print("\n" + dashboard(project, run, status))
            print("\nDeliverables (sha256 from the committed records)")
            print(deliverables_text(run.deliverables(), outdir.resolve()))
            if status.decision == "done":
                print("\n" + run.export_deliverables().render())
            print("\nHandover narrative")
            print(run.narrative())
    except Exception as exc:
        described = describe_error(exc)
        if described is None:
            raise
        print(f"error: {described[1]}", file=sys.stderr)
        return described[0]
    if cancelled:
        print("cancelled", file=sys.stderr)
        return 130
    if status.decision != "done":
        print(f"\nthe run is not done ({status.decision}): {status.next_action}", file=sys.stderr)
        return 1
    print(f"\nrun {RUN_ID} is done: {status.counts.get('current', 0)}/{len(status.units)} units "
          f"current, {status.checkpoint_commits} checkpoint commits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
