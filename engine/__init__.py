"""keepstep.engine — plans, scheduling, recovery, invalidation, budgets, approvals.

The one API the CLI, the TUI and notebooks use. Importing it loads neither
litellm (the gateway imports it lazily, on the first model call) nor textual.
"""

from .decide import Decision, DecisionKind, decide, ready_units
from .errors import (
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
from .plan import Dependency, EdgeType, Gate, Plan, Unit, UnitKind, load_plan, validate_plan
from .project import Project, Run, open_project
from .project_files import ProjectFiles, load_project_files
from .recovery import RecoveryReport
from .sources import add_source
from .state import Explanation, RunFacts, UnitRecord, UnitState
from .status import RunStatus

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
