"""A run's deliverables where a person finds them, and any committed output, hash-checked.

``export_deliverables(run, out)`` copies the current outputs of the run's document units
(render and notes) to a visible folder — by default ``deliverables/<run>/`` in the project
(``deliverables/<run>-<branch>/`` off the main branch) — with a ``manifest.json`` listing each
file's sha256, size, unit and attempt. Every source file is re-hashed against its committed
record first; a mismatch refuses the export naming the file (nothing is written). The folder
is replaced only when it holds an earlier export (its manifest says so).

``unit_output(run, unit, name)`` reads one committed output of a current or invalidated unit
and checks its hash: the bytes returned are the bytes that were committed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.core.timefmt import iso_utc
from keepstep.engine.errors import KeepstepError
from keepstep.engine.files.confine import check_name
from keepstep.engine.report.views import DELIVERABLE_KINDS
from keepstep.storage import ChainBroken
from keepstep.storage.hashing import sha256_hex

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run

EXPORT_FORMAT = "keepstep-deliverables/1"
MANIFEST = "manifest.json"
TEXT_SUFFIXES = (".md", ".csv", ".txt", ".json", ".html", ".toml")


class Output(BaseModel):
    """One committed output: its bytes (hash-checked), where it lies and what it is."""

    unit: str
    name: str
    attempt: str
    sha256: str
    path: str  # absolute, inside .keepstep/artifacts
    data: bytes = Field(repr=False)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")

    def __str__(self) -> str:
        return self.text if self.name.endswith(TEXT_SUFFIXES) else \
            f"{self.unit}/{self.name}: {len(self.data)} bytes, sha256 {self.sha256[:16]}…"

    def _repr_markdown_(self) -> str | None:  # Jupyter shows a Markdown deliverable as such
        return self.text if self.name.endswith(".md") else None

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's text form
        p.text(str(self))


class ExportedFile(BaseModel):
    unit: str
    name: str
    file: str  # relative to the export folder
    attempt: str
    sha256: str
    size: int


class DeliverablesExport(BaseModel):
    """What ``export_deliverables`` wrote."""

    folder: str
    run_id: str
    branch: str
    plan_version: str
    exported_at: str
    files: list[ExportedFile] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)  # document units with no current output

    def _repr_html_(self) -> str:  # Jupyter: where, and each file linked
        from keepstep.engine.report.display import deliverables_html

        return deliverables_html(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's text form
        p.text(self.render())

    def render(self) -> str:
        lines = [f"exported {len(self.files)} deliverable(s) of run {self.run_id} "
                 f"({self.branch}, {self.plan_version}) to {self.folder}"]
        lines += [f"  {f.file:<28} {f.unit:<6} sha256 {f.sha256[:16]}…  {f.size} bytes"
                  for f in self.files]
        if self.missing:
            lines.append(f"  not current yet (not exported): {', '.join(self.missing)}")
        lines.append(f"  hashes: {Path(self.folder) / MANIFEST}")
        return "\n".join(lines)


def _check(run: Run, unit: str, name: str, path: Path, sha256: str) -> bytes:
    if not path.is_file():
        raise KeepstepError(f"{unit}/{name} is missing from the artifact store ({path})",
                            hint="resume the run: the unit is invalidated and redone")
    data = path.read_bytes()
    if sha256_hex(data) != sha256:
        raise KeepstepError(f"{unit}/{name} no longer matches its committed sha256 ({path})",
                            hint="resume the run: the unit is invalidated and redone")
    return data


def unit_output(run: Run, unit: str, name: str) -> Output:
    """The committed output ``name`` of ``unit``, its hash checked. KeepstepError naming what
    exists when the unit has no such output, or when the file no longer matches."""
    if unit not in run.plan.unit_map():
        raise KeepstepError(f"no unit {unit} in the plan",
                            hint="units: " + ", ".join(u.id for u in run.plan.units))
    rec = run.facts_records().get(unit)
    if rec is None:
        raise KeepstepError(f"{unit} has no committed output yet", hint="run it first")
    ref = rec.outputs.get(name)
    if ref is None:
        raise KeepstepError(f"{unit} has no output {name!r}",
                            hint="outputs: " + (", ".join(sorted(rec.outputs)) or "none"))
    path = run.store.artifacts.root / ref.path
    data = _check(run, unit, name, path, ref.sha256)
    return Output(unit=unit, name=name, attempt=rec.attempt, sha256=ref.sha256,
                  path=str(path), data=data)


def default_folder(run: Run) -> Path:
    suffix = "" if run.branch_id == "main" else f"-{run.branch_id}"
    return run.project.root / "deliverables" / f"{run.run_id}{suffix}"


def _is_export(folder: Path) -> bool:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == EXPORT_FORMAT


def export_deliverables(run: Run, out: str | Path | None = None) -> DeliverablesExport:
    """Copy the run's current deliverables and their manifest to ``out`` (see the module doc).

    Raises KeepstepError (nothing written) when a file no longer matches its record, or when
    ``out`` holds something that is not an earlier export."""
    folder = Path(out) if out is not None else default_folder(run)
    chain = run.store.verify_chain(run.run_id, run.branch_id)
    if not chain.ok:  # as resume and handover do: never hand out what cannot be trusted
        where = "; ".join(f"checkpoint {p.version}: {p.problem}" for p in chain.problems[:3])
        raise ChainBroken(
            f"run {run.run_id} ({run.branch_id}): the checkpoint chain does not verify "
            f"({where}); its deliverables cannot be trusted, so nothing was exported",
            hint=f"see where it breaks with `keepstep verify {run.project.root} --run "
            f"{run.run_id}` and restore from a backup (`keepstep restore`)")
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir())
                                                    and not _is_export(folder))):
        raise KeepstepError(f"{folder} exists and is not an earlier deliverables export",
                            hint="pass an empty or new folder with --out")
    records = run.facts_records()
    wanted = [u for u in run.plan.units if u.kind in DELIVERABLE_KINDS]
    rows: list[tuple[str, str, str, bytes]] = []
    missing = []
    for unit in wanted:
        rec = records.get(unit.id)
        if rec is None or rec.state.value != "succeeded":
            missing.append(unit.id)
            continue
        for name, ref in sorted(rec.outputs.items()):
            data = _check(run, unit.id, name, run.store.artifacts.root / ref.path, ref.sha256)
            rows.append((unit.id, name, rec.attempt, data))
    names = [name for _, name, _, _ in rows]
    files = []
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for unit_id, name, attempt, data in rows:
            file = f"{unit_id}-{name}" if names.count(name) > 1 else name
            check_name(file, "deliverable")  # validate refuses it too; the plan may be old
            (staging / file).write_bytes(data)
            files.append(ExportedFile(unit=unit_id, name=name, file=file, attempt=attempt,
                                      sha256=sha256_hex(data), size=len(data)))
        result = DeliverablesExport(
            folder=str(folder.resolve()), run_id=run.run_id, branch=run.branch_id,
            plan_version=str(run.plan_info.get("label", f"plan-v{run.plan_n}")),
            exported_at=iso_utc(run.clock()), files=files, missing=missing)
        manifest = {"format": EXPORT_FORMAT, **result.model_dump(mode="json", exclude={"folder"})}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n",
                                        encoding="utf-8")
        os.chmod(staging, 0o755)  # mkdtemp makes 0700; these are the person's documents
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


__all__ = ["DeliverablesExport", "ExportedFile", "Output", "default_folder",
           "export_deliverables", "unit_output"]
