"""The plan: its model (units, kinds, edges, gates), reading, checking and saving plan.toml,
and the cost estimates a plan view shows.

A public namespace of ``keepstep.engine`` (``from keepstep.engine import plan``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.core.estimates import UnitCost, estimate_costs
    from keepstep.engine.core.explain import compact_ids
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
    from keepstep.engine.core.plan_graph import gc_paused
    from keepstep.engine.files.plan_file import (
        save_plan,
    )
    from keepstep.engine.files.project import (
        PLAN_FILE,
    )
    from keepstep.engine.kinds import (
        expected_outputs,
    )

_EXPORTS: dict[str, str] = {
    "UnitCost": "keepstep.engine.core.estimates",
    "compact_ids": "keepstep.engine.core.explain",
    "estimate_costs": "keepstep.engine.core.estimates",
    "Dependency": "keepstep.engine.core.plan",
    "EdgeType": "keepstep.engine.core.plan",
    "Gate": "keepstep.engine.core.plan",
    "Plan": "keepstep.engine.core.plan",
    "PlanProblem": "keepstep.engine.core.plan",
    "Unit": "keepstep.engine.core.plan",
    "UnitKind": "keepstep.engine.core.plan",
    "load_plan": "keepstep.engine.core.plan",
    "parse_plan": "keepstep.engine.core.plan",
    "validate_plan": "keepstep.engine.core.plan_checks",
    "gc_paused": "keepstep.engine.core.plan_graph",
    "save_plan": "keepstep.engine.files.plan_file",
    "PLAN_FILE": "keepstep.engine.files.project",
    "expected_outputs": "keepstep.engine.kinds",
}
__all__ = [
    "Dependency",
    "EdgeType",
    "Gate",
    "PLAN_FILE",
    "Plan",
    "PlanProblem",
    "Unit",
    "UnitCost",
    "UnitKind",
    "compact_ids",
    "estimate_costs",
    "expected_outputs",
    "gc_paused",
    "load_plan",
    "parse_plan",
    "save_plan",
    "validate_plan",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
