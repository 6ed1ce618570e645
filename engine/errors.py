"""Engine errors. One base; narrow subclasses; messages say what to do next.

Cancellation and a lost lease derive from BaseException on purpose: a stray
``except Exception`` in unit code must not swallow them.
"""

from __future__ import annotations

from typing import Any

from keepstep.storage.errors import KeepstepError as KeepstepError  # re-exported


class ProjectError(KeepstepError):
    """The project folder or one of its files is missing or malformed."""


class PlanValidationError(KeepstepError):
    """A plan failed validation; ``errors`` lists every problem found (as lines);
    ``problems`` the same as typed ``core.plan.PlanProblem`` values when the validator gave
    them (unit, field, message, hint)."""

    def __init__(self, errors: list[Any], *, problems: list[Any] | None = None) -> None:
        self.errors = list(errors)
        self.problems = list(problems or [])
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"plan.toml has {len(self.errors)} problem(s):\n{lines}")


class SourceError(KeepstepError):
    """A source is missing, unreadable or not approved."""


class ConfigError(KeepstepError):
    """keepstep.toml is missing a field or has a wrong value."""


# --- models -----------------------------------------------------------------


class ModelError(KeepstepError):
    """A model call failed. ``error_class`` is the engine's classification."""

    error_class: str = "permanent"
    retryable: bool = False


class TransientModelError(ModelError):
    error_class = "transient"
    retryable = True


class RateLimited(ModelError):
    error_class = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.retry_after = retry_after


class QuotaExhausted(ModelError):
    error_class = "quota_exhausted"
    hint = "the provider account is out of quota: top it up or switch model, then resume"


class AuthError(ModelError):
    error_class = "auth"
    hint = "check the API key (`keepstep keys set PROVIDER`) or its environment variable"


class InvalidOutput(ModelError):
    error_class = "invalid_output"
    retryable = True


class PermanentModelError(ModelError):
    error_class = "permanent"


class MissingKeyError(ModelError):
    error_class = "auth"


class UnknownModelError(ModelError):
    error_class = "permanent"


class KeyringUnavailable(KeepstepError):
    """No usable OS keyring: a key cannot be stored there (the environment still works)."""


# --- run control ------------------------------------------------------------


class BudgetExhausted(KeepstepError):
    """A budget limit would be exceeded; the unit is blocked, not failed."""

    def __init__(self, message: str, *, figures: dict[str, Any] | None = None,
                 hint: str | None = None):
        super().__init__(
            message,
            hint=hint or "record a decision raising the limit (`keepstep status` suggests the "
            "new limit and the `keepstep budget raise` command), then resume",
        )
        self.figures = figures or {}


class BudgetDecisionError(KeepstepError):
    """A budget decision was asked for wrongly (no reason, no limit, an unknown counter, a
    lower limit); nothing was recorded."""


class LeaseLost(BaseException):
    """This executor's lease was fenced; it must stop and leave its output as an orphan."""


class RunCancelled(BaseException):
    """Cancellation was requested; stop at the next safe point."""


class RecoveryError(KeepstepError):
    """Recovery could not proceed and needs a person."""


class ApprovalError(KeepstepError):
    """An approval, decision or resume token was refused."""


class SideEffectError(KeepstepError):
    """An external action could not be confirmed or performed."""


class EffectRejected(SideEffectError):
    """The adapter knows for certain that the action was NOT done (e.g. HTTP 400).

    Anything else an adapter raises from ``perform`` means "outcome unknown".
    """


class UnitTimedOut(KeepstepError):
    """The unit passed its time limit; stopped at a safe point."""


class ReplayMiss(KeepstepError):
    """Replay found no recorded response for a request."""
