"""Whether a project can run: every problem of its plan against its files, at once.

``files.project.plan_problems`` (``core.plan.find_problems``) checks the plan on its own
(ids, edges, kinds' params, gate bindings, documents named by audits and deliveries).
``run.folder_checks.file_problems`` checks it against the project folder (templates, data
files, sources, adapters, prompts, providers). Each problem names the unit (or gate, or
file), the field and what to do.

``validate_project`` is what ``keepstep validate`` shows (``--json`` prints the report): it
never raises for a plan problem — the report lists them — only for files it cannot read at
all (keepstep.toml, contract.md, sources.toml), with their own messages.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from keepstep.engine.core.plan import Plan, PlanProblem, plan_problem
from keepstep.engine.errors import KeepstepError, PlanValidationError
from keepstep.engine.files.project import (
    load_project_files,
    plan_problems,
    snapshot_sources,
    with_lines,
)
from keepstep.engine.files.sources import check_sources
from keepstep.engine.gateway.model_check import model_findings
from keepstep.engine.kinds import expected_outputs
from keepstep.engine.run.folder_checks import file_problems
from keepstep.engine.run.window_check import window_findings

SOURCE_UNREADABLE = "source_unreadable"  # a PlanProblem code: an approved source that fails


class ValidationReport(BaseModel):
    """``keepstep validate``'s findings: every plan problem, model finding and warning."""

    ok: bool = Field(description="true when nothing stops the plan from running")
    problems: list[PlanProblem] = Field(default_factory=list, description="what stops it, "
                                        "each with unit, field, message and what to do")
    models: list[dict[str, Any]] = Field(default_factory=list, description="a line per model "
                                         "the plan calls (level error, warning or ok)")
    warnings: list[str] = Field(default_factory=list, description="likely typos that do not "
                                "stop a run")
    units: int = Field(default=0, description="units in the plan")
    gates: int = Field(default=0, description="gates in the plan")
    sources: int = Field(default=0, description="approved sources")
    formats: dict[str, int] = Field(default_factory=dict, description="approved, readable "
                                    "sources per format, most first (md, pdf, xlsx, …)")
    store: str = Field(default="", description="the store the project uses and, for a "
                       "server, whether it is reachable and its schema version (read only)")


def validate_project(root: Path, *, models: bool = True) -> ValidationReport:
    """Every problem that stops the project's plan from running, and the model findings.

    Raises (with its own message) only when keepstep.toml, contract.md or sources.toml cannot
    be read at all; plan problems are in the report."""
    root = Path(root)
    try:
        files = load_project_files(root, validate=False)
    except PlanValidationError as exc:  # plan.toml is not TOML, or has shape errors
        problems = exc.problems or [plan_problem(e) for e in exc.errors]
        return ValidationReport(ok=False, problems=problems)
    problems = plan_problems(files) + with_lines(root, file_problems(files))
    report = ValidationReport(ok=not problems, problems=problems, units=len(files.plan.units),
                              gates=len(files.plan.gates))
    if not problems:
        report.sources = len(snapshot_sources(root, files.sources).sources)
        report.warnings = output_warnings(files.plan)
    # Every source converts the way a unit will read it: an approved one that cannot is a
    # problem (named with its file and what to do), one not approved yet a warning.
    checks = check_sources(files, approved_only=False)
    for c in checks:
        if c.ok:
            continue
        if c.approved:
            report.problems.append(PlanProblem(
                where=f"source {c.source_id}", field="path",
                message=c.problem.removeprefix(f"source {c.source_id}: "), hint=c.hint,
                code=SOURCE_UNREADABLE, say_field=False))
        else:
            report.warnings.append(f"(not approved) {c.problem}"
                                   + (f" — {c.hint}" if c.hint else ""))
    # The store: a server is reached and its schema version read, without writing.
    # Lazy: the handle module loads the run machinery, which a validation needs only here.
    from keepstep.engine.run.runtime import store_password
    from keepstep.storage.selection import check_store, choose_store

    try:
        choice = choose_store(files.config.store.url)
        found = check_store(choice, store_password(choice))
        report.store = found.message
        if not found.ok:
            report.problems.append(PlanProblem(where="store", field="url",
                                               message=found.message, hint=found.hint,
                                               say_field=False))
    except KeepstepError as exc:  # KEEPSTEP_STORE_URL is not a PostgreSQL URL
        report.problems.append(PlanProblem(where="store", field="url", message=exc.message,
                                           hint=exc.hint, say_field=False))
    if not report.problems:  # what the offline model needs of the pack (engine.gateway)
        from keepstep.engine.gateway.offline_needs import offline_needs

        report.problems += offline_needs(files)
    counts = Counter(c.format for c in checks if c.ok and c.approved)
    report.formats = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    report.ok = not report.problems
    if models:

        report.models = [f.model_dump() for f in model_findings(files)]
        # Steps that will not fit their model's window (estimates: warnings).
        report.models += [f.model_dump() for f in window_findings(files)]
        report.ok = report.ok and not any(f["level"] == "error" for f in report.models)
    return report


def output_warnings(plan: Plan) -> list[str]:
    """Declared outputs a unit's kind will not write (a likely typo, not an error)."""

    warnings = []
    for unit in plan.units:
        expected = set(expected_outputs(unit))
        extra = sorted(set(unit.outputs) - expected)
        if expected and extra:
            warnings.append(f"unit {unit.id}: declares output(s) {', '.join(extra)} but a "
                            f"{unit.kind.value} unit writes {', '.join(sorted(expected))}")
    return warnings


__all__ = ["SOURCE_UNREADABLE", "ValidationReport", "file_problems", "output_warnings",
           "validate_project"]
