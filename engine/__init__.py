"""keepstep.engine — the one API the CLI, the TUI and notebooks use.

``open_project(path) -> Project``; ``Project.open_or_start(run_id) -> Run``; ``Run.run()``,
``.resume()``, ``.retry(unit)``, ``.status()``, ``.explain(unit)``, ``.preview()``, … each
return a typed model (``Project`` and ``Run`` are defined in ``engine.run.runtime``).

The public surface is the names below plus seven namespaces, each a module of its own public
names: ``plan`` (the plan model, plan.toml), ``sources`` (sources.toml, adding and inspecting
files), ``keys`` (model keys and their checks), ``takeover``, ``store`` (backup, restore, gc,
moving the store), ``views`` (the typed results the faces show) and ``exports`` (deliverables,
documents, the handover bundle and its narrative). Every other module of the engine is
internal: a face imports ``keepstep.engine`` and its namespaces only
(tests/test_import_boundaries.py).

Every public name is loaded on first use (PEP 562), so that importing one part —
``keepstep.engine.core.decide``, say — does not load the SQLite backend, and
``keepstep status`` pays for neither litellm (imported by the gateway on the first model
call) nor textual (which the engine never imports).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine import (
        exports,
        keys,
        plan,
        sources,
        store,
        takeover,
        views,
    )
    from keepstep.engine.api import (
        Project,
        Run,
        open_project,
    )
    from keepstep.engine.core.inputs import (
        Contract,
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
        ConversionError,
    )
    from keepstep.engine.files.project import (
        ProjectConfig,
        ProjectFiles,
        load_config,
        load_contract,
        load_project_files,
        write_contract,
    )
    from keepstep.engine.run.validation import (
        SOURCE_UNREADABLE,
        ValidationReport,
        validate_project,
    )
    from keepstep.storage import (
        NotFound,
        StorageError,
    )

# public name -> the module that defines it; a namespace maps to this package (it is the
# submodule keepstep.engine.<name>). tests/test_import_boundaries.py checks that this map
# and the TYPE_CHECKING imports above name the same things.
_EXPORTS: dict[str, str] = {
    "exports": "keepstep.engine",
    "keys": "keepstep.engine",
    "plan": "keepstep.engine",
    "sources": "keepstep.engine",
    "store": "keepstep.engine",
    "takeover": "keepstep.engine",
    "views": "keepstep.engine",
    "Project": "keepstep.engine.api",
    "Run": "keepstep.engine.api",
    "open_project": "keepstep.engine.api",
    "Contract": "keepstep.engine.core.inputs",
    "drill": "keepstep.engine.drills.drill",
    "StoryResult": "keepstep.engine.drills.story",
    "run_story": "keepstep.engine.drills.story",
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
    "ConversionError": "keepstep.engine.files.convert",
    "ProjectConfig": "keepstep.engine.files.project",
    "ProjectFiles": "keepstep.engine.files.project",
    "load_config": "keepstep.engine.files.project",
    "load_contract": "keepstep.engine.files.project",
    "load_project_files": "keepstep.engine.files.project",
    "write_contract": "keepstep.engine.files.project",
    "SOURCE_UNREADABLE": "keepstep.engine.run.validation",
    "ValidationReport": "keepstep.engine.run.validation",
    "validate_project": "keepstep.engine.run.validation",
    "NotFound": "keepstep.storage",
    "StorageError": "keepstep.storage",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
