"""The recorded baseline of a run: the plan and input state a checkpoint holds, and the
first checkpoint of a new run.

``plan_state`` / ``inputs_state`` are the ``plan`` and ``inputs`` keys of the materialised
state (see ``engine.core.state``); recovery writes new ones when a change is committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from keepstep.engine.core.changes import detect_changes
from keepstep.engine.core.inputs import InputSnapshot
from keepstep.engine.core.plan import UnitKind
from keepstep.engine.core.templates import layout_hash
from keepstep.engine.core.timefmt import iso_utc
from keepstep.engine.files.project import ProjectFiles, snapshot_sources
from keepstep.engine.gateway.keys import OFFLINE_PROVIDER
from keepstep.storage import ArtifactImmutable, EventIn
from keepstep.storage.hashing import file_sha256

if TYPE_CHECKING:
    from keepstep.engine.core.plan import Plan
    from keepstep.engine.run.runtime import Project, Run

PRODUCER_VERSION = "keepstep-0.1.0"
PROMPT_VERSION = "prompts-1"


def template_hashes(root: Path) -> dict[str, str]:
    """template name -> sha256 of ``templates/<name>.md``."""
    tdir = root / "templates"
    if not tdir.is_dir():
        return {}
    return {p.stem: file_sha256(str(p)) for p in sorted(tdir.glob("*.md"))}


def template_layouts(root: Path) -> dict[str, str]:
    """template name -> hash of its layout (sections and placeholders, ``core.templates``):
    what tells a ``template`` edit from a ``presentation`` one."""

    tdir = root / "templates"
    if not tdir.is_dir():
        return {}
    return {p.stem: layout_hash(p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(tdir.glob("*.md"))}


def template_headings(root: Path) -> dict[str, list[str]]:
    """template name -> its Markdown headings in order (so a rename can say old and new)."""
    from keepstep.engine.core.templates import headings

    tdir = root / "templates"
    if not tdir.is_dir():
        return {}
    return {p.stem: headings(p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(tdir.glob("*.md"))}


def template_fields(root: Path) -> dict[str, list[str]]:
    """template name -> the placeholders it reads (a contract field it names reaches it)."""
    from keepstep.engine.core.templates import placeholders

    tdir = root / "templates"
    if not tdir.is_dir():
        return {}
    return {p.stem: placeholders(p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(tdir.glob("*.md"))}


def data_hashes(root: Path) -> dict[str, str]:
    """pack data file name -> sha256 of ``data/<name>.toml``."""
    ddir = root / "data"
    if not ddir.is_dir():
        return {}
    return {p.stem: file_sha256(str(p)) for p in sorted(ddir.glob("*.toml"))}


def plan_state(n: int, files: ProjectFiles, snapshot_path: str,
               templates: dict[str, str]) -> dict[str, Any]:
    """The ``plan`` state key for plan version ``n`` (its plan file kept at ``snapshot_path``)."""
    return {
        "n": n, "label": f"plan-v{n}", "fingerprint": files.plan.fingerprint(),
        "contract_hash": files.contract.hash(), "contract_fields": files.contract.field_hashes(),
        "audience": files.contract.audience, "snapshot_path": snapshot_path,
        "templates": templates, "template_layouts": template_layouts(files.root),
        "template_headings": template_headings(files.root), "data": data_hashes(files.root),
    }


def inputs_state(n: int, snapshot: InputSnapshot) -> dict[str, Any]:
    """The ``inputs`` state key for input snapshot ``n``: source ids, sha256 and groups, and
    the hashes of each source's header lines and body (so an edit is typed)."""
    return {"n": n, "label": f"in-v{n}", "hash": snapshot.hash(), "sources": snapshot.sources,
            "groups": snapshot.groups, "headers": snapshot.headers, "bodies": snapshot.bodies}


def create_run(workspace: Project, run_id: str, *, branch_id: str = "main") -> None:
    """Commit the first checkpoint of a new run at plan-v1 / in-v1 from the files as they are.

    Raises storage's error when the run exists (``open_or_start`` handles the race of two
    front ends starting the same run)."""
    files = workspace.files
    snapshot = snapshot_sources(workspace.root, files.sources)
    plan_blob = (workspace.root / "plan.toml").read_bytes()
    artifacts = workspace.store.artifacts
    if not (artifacts.attempt_dir(run_id, "_plan/v1") / "plan.toml").exists():
        try:
            artifacts.stage(
                run_id, "_plan/v1", "plan.toml", plan_blob, media_type="application/toml",
                producer_version=PRODUCER_VERSION, created_at=iso_utc(workspace.clock()))
        except (ArtifactImmutable, FileNotFoundError):
            pass  # another front end is starting this run and staged the same file
    initial = {
        "plan": plan_state(1, files, f"{run_id}/_plan/v1/plan.toml",
                           template_hashes(workspace.root)),
        "inputs": inputs_state(1, snapshot),
        "versions": workspace.versions(),
        "budget": {},
    }
    workspace.store.create_run(
        run_id, initial, branch_id=branch_id,
        meta={"project": files.config.name, "created_by": workspace.executor_id},
        limits=files.config.budget.as_limits(),
        events=[EventIn(kind="decision.start", payload={
            "plan": "plan-v1", "inputs": "in-v1", "audience": files.contract.audience})],
    )
    artifacts.prepare_units(run_id, [u.id for u in files.plan.units])


class Detected(BaseModel):
    """What differs between the run's recorded baseline and the project files now."""

    model_config = {"arbitrary_types_allowed": True}
    changes: list[Any]
    files: Any
    snapshot: Any
    templates: dict[str, str]
    source_groups: dict[str, str]


def detect(run: Run, *, sources: Any = None, plan: Plan | None = None) -> Detected:
    """Re-read the project files, re-hash the sources, and list the typed changes.

    ``sources`` (a SourcesFile) and ``plan`` stand in for sources.toml and plan.toml — a
    preview of an edit not written yet; nothing is written either way."""
    # The files as loaded when the project was opened, unless they changed on disk since:
    # a resume parses plan.toml once, not twice.
    files = run.project.reload_if_changed()
    old_plan_info = run.plan_info
    old_inputs = run.store.read_key(run.run_id, "inputs", run.branch_id) or {}
    snapshot = snapshot_sources(files.root, sources if sources is not None else files.sources)
    new_plan = plan if plan is not None else files.plan
    templates = template_hashes(files.root)
    changes = detect_changes(
        old_inputs=old_inputs, new_snapshot=snapshot,
        old_contract_fields=old_plan_info.get("contract_fields", {}),
        new_contract=files.contract, old_plan=run.recorded_plan, new_plan=new_plan,
        old_templates=old_plan_info.get("templates", {}), new_templates=templates,
        old_versions=run.versions, new_versions=run.project.versions(),
        source_formats=files.source_formats(),
        old_layouts=old_plan_info.get("template_layouts"),
        new_layouts=template_layouts(files.root),
        old_data=old_plan_info.get("data"), new_data=data_hashes(files.root),
        old_headings=old_plan_info.get("template_headings"),
        new_headings=template_headings(files.root),
        template_fields=template_fields(files.root),
    )
    groups = {**old_inputs.get("groups", {}), **snapshot.groups}
    return Detected(changes=changes, files=files, snapshot=snapshot, templates=templates,
                    source_groups=groups)


def prose_writers(files: Any, plan: Plan) -> list[str]:
    """The render units whose model writes prose (any but the offline heuristic, which fills
    a template's written sections from the template instead): their estimates count those
    model steps (``engine.core.estimates.expected_calls``)."""
    offline = OFFLINE_PROVIDER + "/"
    return [u.id for u in plan.units if u.kind == UnitKind.render
            and not files.config.model_for(u.id, u.kind.value).startswith(offline)]


__all__ = ["PRODUCER_VERSION", "PROMPT_VERSION", "Detected", "create_run", "data_hashes",
           "detect", "inputs_state", "plan_state", "prose_writers", "template_fields",
           "template_hashes", "template_headings", "template_layouts"]
