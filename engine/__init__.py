"""keepstep.engine — plans, scheduling, recovery, invalidation, budgets, approvals.

The one API the CLI, the TUI and notebooks use. Importing it loads neither
litellm (the gateway imports it lazily, on the first model call) nor textual.
"""

from keepstep.engine.api import Project, Run, open_project
from keepstep.engine.core.decide import Decision, DecisionKind, decide, ready_units
from keepstep.engine.core.plan import (
    Dependency,
    EdgeType,
    Gate,
    Plan,
    Unit,
    UnitKind,
    load_plan,
    validate_plan,
)
from keepstep.engine.core.state import Explanation, RunFacts, UnitRecord, UnitState
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
from keepstep.engine.files.project import ProjectFiles, load_project_files
from keepstep.engine.files.sources import add_source
from keepstep.engine.report.status import RunStatus
from keepstep.engine.run.recovery import RecoveryReport

__all__ = [
    "ApprovalError", "AuthError", "BudgetDecisionError", "BudgetExhausted", "ConfigError",
    "Decision", "DecisionKind",
    "Dependency", "EdgeType", "Explanation", "Gate", "KeepstepError", "LeaseLost",
    "MissingKeyError", "ModelError", "Plan", "PlanValidationError", "Project", "ProjectError",
    "ProjectFiles", "QuotaExhausted", "RateLimited", "RecoveryReport", "Run", "RunCancelled",
    "RunFacts", "RunStatus", "SourceError", "TransientModelError", "Unit", "UnitKind",
    "UnitRecord", "UnitState", "UnknownModelError", "add_source",
    "decide", "load_plan", "load_project_files",
    "open_project", "ready_units", "validate_plan",
]
