"""keepstep.engine — the one API the CLI, the TUI and notebooks use.

Every public name is re-exported here and loaded on first use (PEP 562), so that importing
one part — ``keepstep.engine.core.decide``, say — does not load the SQLite backend, and
``keepstep status`` pays for neither litellm (imported by the gateway on the first model
call) nor textual (which the engine never imports).

``open_project(path) -> Project``; ``Project.open_or_start(run_id) -> Run``; ``Run.run()``,
``.resume()``, ``.retry(unit)``, ``.status()``, ``.explain(unit)``, ``.preview()``, … each
return a typed model (see ``engine.api``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keepstep.engine.api import (
        Project,
        Run,
        open_project,
    )
    from keepstep.engine.core.decide import (
        Decision,
        DecisionKind,
        decide,
        ready_units,
    )
    from keepstep.engine.core.explain import (
        Preview,
        UnitCost,
        UnitExplanation,
        compact_ids,
        estimate_costs,
    )
    from keepstep.engine.core.inputs import (
        Contract,
        InputSnapshot,
        SourceEntry,
    )
    from keepstep.engine.core.plan import (
        Dependency,
        EdgeType,
        Gate,
        Plan,
        PlanProblem,
        Unit,
        UnitKind,
        load_plan,
        parse_plan,
    )
    from keepstep.engine.core.plan_checks import (
        validate_plan,
    )
    from keepstep.engine.core.state import (
        Explanation,
        RunFacts,
        UnitRecord,
        UnitState,
    )
    from keepstep.engine.drills.drill import (
        drill,
    )
    from keepstep.engine.drills.story import (
        StoryResult,
        run_story,
    )
    from keepstep.engine.errors import (
        ApprovalError,
        AuthError,
        BudgetDecisionError,
        BudgetExhausted,
        ConfigError,
        KeepstepError,
        LeaseLost,
        MissingKeyError,
        ModelError,
        PlanValidationError,
        ProjectError,
        QuotaExhausted,
        RateLimited,
        RunCancelled,
        SourceError,
        TransientModelError,
        UnknownModelError,
    )
    from keepstep.engine.files.convert import (
        SUPPORTED_FORMATS_TEXT,
        ConversionError,
        SourceInfo,
        detect_format,
    )
    from keepstep.engine.files.plan_file import save_plan
    from keepstep.engine.files.project import (
        PLAN_FILE,
        ProjectConfig,
        ProjectFiles,
        SourcesFile,
        load_config,
        load_contract,
        load_project_files,
        load_sources,
        save_sources,
        snapshot_sources,
        write_contract,
    )
    from keepstep.engine.files.sources import (
        SourceCheck,
        add_source,
        check_sources,
        inspect_file,
    )
    from keepstep.engine.gateway.keys import (
        delete_api_key,
        env_var_name,
        key_source,
        require_keyring,
        set_api_key,
    )
    from keepstep.engine.gateway.model_check import (
        KeyCheck,
        KeyStatus,
        ModelFinding,
        check_key,
        key_statuses,
        model_findings,
    )
    from keepstep.engine.kinds import (
        expected_outputs,
    )
    from keepstep.engine.kinds.conflicts import (
        Conflict,
        conflicts_text,
        run_conflicts,
    )
    from keepstep.engine.report.deliverables import (
        DeliverablesExport,
        ExportedFile,
        Output,
        export_deliverables,
    )
    from keepstep.engine.report.docx_export import (
        EXPORT_FORMATS,
        DocumentsExport,
        export_documents,
    )
    from keepstep.engine.report.handover import (
        BundleReport,
        export_handover,
        verify_bundle,
    )
    from keepstep.engine.report.narrative import (
        check_narrative,
        narrative,
    )
    from keepstep.engine.report.narrative_claims import (
        Mismatch,
    )
    from keepstep.engine.report.next_action import (
        Need,
    )
    from keepstep.engine.report.progress import (
        InFlight,
        NotebookProgress,
        ProgressSnapshot,
        ProgressTracker,
        fmt_count,
        fmt_duration,
    )
    from keepstep.engine.report.status import (
        InFlightUnit,
        RunStatus,
        UnitView,
    )
    from keepstep.engine.report.views import (
        EFFECT_FIELDS,
        CompensationPreview,
        Deliverable,
        EffectRow,
        OutputInfo,
        input_snapshots,
    )
    from keepstep.engine.run.approvals import (
        ApprovalOption,
    )
    from keepstep.engine.run.deliveries import (
        AdapterCheck,
        test_effect_adapter,
    )
    from keepstep.engine.run.effects import (
        SettleResult,
    )
    from keepstep.engine.run.gates import (
        Binding,
        PendingApproval,
    )
    from keepstep.engine.run.maintenance import (
        backup_project,
        gc_project,
        restore_project,
    )
    from keepstep.engine.run.recovery import (
        RecoveryReport,
    )
    from keepstep.engine.run.takeover import (
        TAKEOVER_ACTIONS,
        mark_for_expert,
        narrow_scope,
        record_takeover,
        rerun_unit,
    )
    from keepstep.engine.run.takeover_preview import (
        TakeoverPreview,
        keep_for_drop,
        preview_branch,
        preview_cancel,
        preview_expert,
        preview_narrow,
        preview_rerun,
    )
    from keepstep.engine.run.team import (
        SourceMismatch,
        StoreMove,
        StoreSummary,
        move_store,
        source_mismatches,
        store_summary,
    )
    from keepstep.engine.run.validation import (
        SOURCE_UNREADABLE,
        ValidationReport,
        validate_project,
    )
    from keepstep.storage import (
        ApprovalRecord,
        Budget,
        ChainReport,
        Event,
        ModelCall,
        NotFound,
        StorageError,
    )
    from keepstep.storage.hashing import (
        file_sha256,
    )

# public name -> the module that defines it (tests/test_import_boundaries.py checks that
# this map and the TYPE_CHECKING imports above name the same things)
_EXPORTS: dict[str, str] = {
    "Project": "keepstep.engine.api",
    "Run": "keepstep.engine.api",
    "open_project": "keepstep.engine.api",
    "Dependency": "keepstep.engine.core.plan",
    "EdgeType": "keepstep.engine.core.plan",
    "Gate": "keepstep.engine.core.plan",
    "Plan": "keepstep.engine.core.plan",
    "Unit": "keepstep.engine.core.plan",
    "UnitKind": "keepstep.engine.core.plan",
    "load_plan": "keepstep.engine.core.plan",
    "validate_plan": "keepstep.engine.core.plan_checks",
    "parse_plan": "keepstep.engine.core.plan",
    "PlanProblem": "keepstep.engine.core.plan",
    "SOURCE_UNREADABLE": "keepstep.engine.run.validation",
    "ValidationReport": "keepstep.engine.run.validation",
    "validate_project": "keepstep.engine.run.validation",
    "Decision": "keepstep.engine.core.decide",
    "DecisionKind": "keepstep.engine.core.decide",
    "decide": "keepstep.engine.core.decide",
    "ready_units": "keepstep.engine.core.decide",
    "Explanation": "keepstep.engine.core.state",
    "RunFacts": "keepstep.engine.core.state",
    "UnitRecord": "keepstep.engine.core.state",
    "UnitState": "keepstep.engine.core.state",
    "Contract": "keepstep.engine.core.inputs",
    "InputSnapshot": "keepstep.engine.core.inputs",
    "SourceEntry": "keepstep.engine.core.inputs",
    "Preview": "keepstep.engine.core.explain",
    "UnitCost": "keepstep.engine.core.explain",
    "UnitExplanation": "keepstep.engine.core.explain",
    "compact_ids": "keepstep.engine.core.explain",
    "estimate_costs": "keepstep.engine.core.explain",
    "ApprovalError": "keepstep.engine.errors",
    "AuthError": "keepstep.engine.errors",
    "BudgetDecisionError": "keepstep.engine.errors",
    "BudgetExhausted": "keepstep.engine.errors",
    "ConfigError": "keepstep.engine.errors",
    "KeepstepError": "keepstep.engine.errors",
    "LeaseLost": "keepstep.engine.errors",
    "MissingKeyError": "keepstep.engine.errors",
    "ModelError": "keepstep.engine.errors",
    "PlanValidationError": "keepstep.engine.errors",
    "ProjectError": "keepstep.engine.errors",
    "QuotaExhausted": "keepstep.engine.errors",
    "RateLimited": "keepstep.engine.errors",
    "RunCancelled": "keepstep.engine.errors",
    "SourceError": "keepstep.engine.errors",
    "TransientModelError": "keepstep.engine.errors",
    "UnknownModelError": "keepstep.engine.errors",
    "PLAN_FILE": "keepstep.engine.files.project",
    "ProjectConfig": "keepstep.engine.files.project",
    "ProjectFiles": "keepstep.engine.files.project",
    "SourcesFile": "keepstep.engine.files.project",
    "load_project_files": "keepstep.engine.files.project",
    "load_sources": "keepstep.engine.files.project",
    "save_plan": "keepstep.engine.files.plan_file",
    "save_sources": "keepstep.engine.files.project",
    "snapshot_sources": "keepstep.engine.files.project",
    "add_source": "keepstep.engine.files.sources",
    "SourceCheck": "keepstep.engine.files.sources",
    "check_sources": "keepstep.engine.files.sources",
    "inspect_file": "keepstep.engine.files.sources",
    "SUPPORTED_FORMATS_TEXT": "keepstep.engine.files.convert",
    "ConversionError": "keepstep.engine.files.convert",
    "SourceInfo": "keepstep.engine.files.convert",
    "detect_format": "keepstep.engine.files.convert",
    "expected_outputs": "keepstep.engine.kinds",
    "Conflict": "keepstep.engine.kinds.conflicts",
    "run_conflicts": "keepstep.engine.kinds.conflicts",
    "conflicts_text": "keepstep.engine.kinds.conflicts",
    "delete_api_key": "keepstep.engine.gateway.keys",
    "env_var_name": "keepstep.engine.gateway.keys",
    "require_keyring": "keepstep.engine.gateway.keys",
    "key_source": "keepstep.engine.gateway.keys",
    "KeyCheck": "keepstep.engine.gateway.model_check",
    "KeyStatus": "keepstep.engine.gateway.model_check",
    "ModelFinding": "keepstep.engine.gateway.model_check",
    "check_key": "keepstep.engine.gateway.model_check",
    "key_statuses": "keepstep.engine.gateway.model_check",
    "model_findings": "keepstep.engine.gateway.model_check",
    "load_config": "keepstep.engine.files.project",
    "set_api_key": "keepstep.engine.gateway.keys",
    "RunStatus": "keepstep.engine.report.status",
    "UnitView": "keepstep.engine.report.status",
    "Deliverable": "keepstep.engine.report.views",
    "EFFECT_FIELDS": "keepstep.engine.report.views",
    "EffectRow": "keepstep.engine.report.views",
    "input_snapshots": "keepstep.engine.report.views",
    "DeliverablesExport": "keepstep.engine.report.deliverables",
    "ExportedFile": "keepstep.engine.report.deliverables",
    "Output": "keepstep.engine.report.deliverables",
    "export_deliverables": "keepstep.engine.report.deliverables",
    "EXPORT_FORMATS": "keepstep.engine.report.docx_export",
    "DocumentsExport": "keepstep.engine.report.docx_export",
    "export_documents": "keepstep.engine.report.docx_export",
    "InFlight": "keepstep.engine.report.progress",
    "NotebookProgress": "keepstep.engine.report.progress",
    "ProgressSnapshot": "keepstep.engine.report.progress",
    "ProgressTracker": "keepstep.engine.report.progress",
    "fmt_count": "keepstep.engine.report.progress",
    "fmt_duration": "keepstep.engine.report.progress",
    "Need": "keepstep.engine.report.next_action",
    "InFlightUnit": "keepstep.engine.report.status",
    "CompensationPreview": "keepstep.engine.report.views",
    "OutputInfo": "keepstep.engine.report.views",
    "SettleResult": "keepstep.engine.run.effects",
    "AdapterCheck": "keepstep.engine.run.deliveries",
    "test_effect_adapter": "keepstep.engine.run.deliveries",
    "load_contract": "keepstep.engine.files.project",
    "write_contract": "keepstep.engine.files.project",
    "BundleReport": "keepstep.engine.report.handover",
    "export_handover": "keepstep.engine.report.handover",
    "verify_bundle": "keepstep.engine.report.handover",
    "check_narrative": "keepstep.engine.report.narrative",
    "narrative": "keepstep.engine.report.narrative",
    "Mismatch": "keepstep.engine.report.narrative_claims",
    "ApprovalOption": "keepstep.engine.run.approvals",
    "PendingApproval": "keepstep.engine.run.gates",
    "Binding": "keepstep.engine.run.gates",
    "RecoveryReport": "keepstep.engine.run.recovery",
    "TAKEOVER_ACTIONS": "keepstep.engine.run.takeover",
    "mark_for_expert": "keepstep.engine.run.takeover",
    "narrow_scope": "keepstep.engine.run.takeover",
    "record_takeover": "keepstep.engine.run.takeover",
    "rerun_unit": "keepstep.engine.run.takeover",
    "TakeoverPreview": "keepstep.engine.run.takeover_preview",
    "keep_for_drop": "keepstep.engine.run.takeover_preview",
    "preview_branch": "keepstep.engine.run.takeover_preview",
    "preview_cancel": "keepstep.engine.run.takeover_preview",
    "preview_expert": "keepstep.engine.run.takeover_preview",
    "preview_narrow": "keepstep.engine.run.takeover_preview",
    "preview_rerun": "keepstep.engine.run.takeover_preview",
    "backup_project": "keepstep.engine.run.maintenance",
    "gc_project": "keepstep.engine.run.maintenance",
    "restore_project": "keepstep.engine.run.maintenance",
    "StoryResult": "keepstep.engine.drills.story",
    "run_story": "keepstep.engine.drills.story",
    "drill": "keepstep.engine.drills.drill",
    "ApprovalRecord": "keepstep.storage",
    "Budget": "keepstep.storage",
    "ChainReport": "keepstep.storage",
    "Event": "keepstep.storage",
    "ModelCall": "keepstep.storage",
    "NotFound": "keepstep.storage",
    "StorageError": "keepstep.storage",
    "file_sha256": "keepstep.storage.hashing",
    "StoreMove": "keepstep.engine.run.team",
    "StoreSummary": "keepstep.engine.run.team",
    "move_store": "keepstep.engine.run.team",
    "SourceMismatch": "keepstep.engine.run.team",
    "source_mismatches": "keepstep.engine.run.team",
    "store_summary": "keepstep.engine.run.team",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
