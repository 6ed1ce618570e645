"""The unit kinds. Importing this package fills ``REGISTRY`` with every kind.

A kind is ``run(ctx: UnitContext) -> KindOutcome`` (see ``engine.context``): a pure,
deterministic function of what the context gives it. Each is a preset over one of a few
general mechanisms — a model step (``kinds.model_step``), a document render, an audit, a
deliver step, bookkeeping — described in ``core.presets`` (params, outputs, implicit
inputs). ``get_kind`` looks one up; ``expected_outputs`` says which artifact names a unit of
that kind will write, so a plan's declared ``outputs`` can be checked before anything runs.
"""

from __future__ import annotations

from keepstep.engine.core.plan import Unit
from keepstep.engine.core.presets import default_outputs
from keepstep.engine.errors import PlanValidationError
from keepstep.engine.kinds.context import REGISTRY, KindFn, KindSpec

from . import (  # noqa: F401  (registers)
    audit,
    deliver,
    extract,
    intake,
    render,
    synthesize,
    verify,
)

__all__ = ["REGISTRY", "expected_outputs", "get_kind"]


def get_kind(name: str) -> tuple[KindSpec, KindFn]:
    """The (spec, run function) of a kind; a plan naming an unknown kind is a plan error."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise PlanValidationError(
            [f"unit kind {name!r} is not registered (known: {', '.join(sorted(REGISTRY))})"]
        ) from None


def expected_outputs(unit: Unit) -> list[str]:
    """The artifact names a unit writes, given its kind and params (sorted)."""
    get_kind(unit.kind.value)  # an unregistered kind is a plan error
    return default_outputs(unit)
