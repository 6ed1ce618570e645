"""How an attempt that raised ends: ``classify(exc)`` is the one place an error becomes an
ending (pure: it reads no store), and ``AttemptOutcome`` is what the loop reports.

One sentence: a unit's attempt ends either in its commit (``run.commit``) or in exactly one
``Store.end_attempt`` transaction built from the Ending that ``classify`` gave its error
(``run.runner`` decides retry-or-fail and writes it).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    EffectRejected,
    KeepstepError,
    LeaseLost,
    ModelError,
    QuotaExhausted,
    ReplayMiss,
    RunCancelled,
    SideEffectError,
    UnitTimedOut,
)
from keepstep.engine.gateway.call_ledger import figures_text
from keepstep.engine.gateway.redaction import redact
from keepstep.storage import (
    AttemptStatus,
    StaleFencingToken,
    StorageError,
    UnitStatusChange,
    UnitStatusKind,
)
from keepstep.storage.errors import mount_point

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# Attempt statuses that count against the unit's retry bound.
RETRYABLE_STATUSES = frozenset({AttemptStatus.failed, AttemptStatus.timed_out})


class AttemptOutcome(StrEnum):
    """What happened to one attempt, as the loop reports it (``attempt`` events)."""

    committed = "committed"
    retry = "retry"        # failed; the unit will be tried again
    failed = "failed"      # failed for good (the unit's status is ``failed``)
    blocked = "blocked"    # waits for a person or a decision (the unit's status is ``blocked``)
    orphaned = "orphaned"  # its lease was taken over: the output is an orphan, never promoted
    cancelled = "cancelled"


class EndingKind(StrEnum):
    fail = "fail"        # retry within the bounds unless ``final``
    block = "block"      # the unit is blocked (``unit_status``)
    fence = "fence"      # the lease is gone
    cancel = "cancel"    # the run was cancelled
    effect = "effect"    # an external action has no receipt: blocked on it, if it is open


@dataclass(frozen=True, slots=True)
class Ending:
    """An error's ending, before the store is read (retry bounds, the effect ledger)."""

    kind: EndingKind
    status: AttemptStatus
    message: str
    error_class: str | None = None
    final: bool = False
    unit_status: UnitStatusChange | None = None
    rejected: bool = False  # an effect the adapter certainly did not do


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def safe_message(exc: BaseException, unit_id: str | None = None) -> str:
    """A short, scrubbed message for an unexpected error: its class and first line, with
    anything key-shaped redacted; never a traceback, never a provider body."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    where = f"{unit_id}: " if unit_id else ""
    text = f"{where}unexpected {type(exc).__name__}" + (f": {first}" if first else "")
    if isinstance(exc, UnicodeError):
        text += " (an input is not UTF-8 text)"
    return redact(text)


def blocked_status(exc: BaseException) -> UnitStatusChange:
    """The unit status for an error that needs a person or a decision (budget, quota, key),
    from the error's fields, never from its message's wording."""
    if isinstance(exc, BudgetExhausted):
        details: dict[str, Any] = {"kind": "budget", "figures": exc.figures}
        reason = "budget: " + (budget_text(exc.figures) if exc.figures else first_line(exc))
        # The new limit to suggest is the status's (engine.report.next_action.needs), from
        # the whole run's rate: one number on every face, none written here.
        return UnitStatusChange(UnitStatusKind.blocked, reason, details)
    if isinstance(exc, QuotaExhausted) and exc.error_class != "quota_exhausted":
        # A provider outage past provider_outage_minutes: its own words say for how long.
        return UnitStatusChange(UnitStatusKind.blocked, first_line(exc),
                                {"kind": exc.error_class})
    if isinstance(exc, QuotaExhausted):
        return UnitStatusChange(UnitStatusKind.blocked, "provider quota exhausted",
                                {"kind": "quota"})
    if isinstance(exc, AuthError):
        return UnitStatusChange(UnitStatusKind.blocked,
                                "model provider authentication failed: " + first_line(exc),
                                {"kind": "auth"})
    raise TypeError(f"{type(exc).__name__} does not block a unit")


def budget_text(figures: dict[str, dict[str, float]]) -> str:
    """``budget limit reached: calls 3/3 (this call needs ~1), …`` from a refusal's figures."""
    return "budget limit reached: " + figures_text(figures)


def classify(exc: BaseException, unit_id: str, root: Path | str) -> Ending | None:
    """The ending of an attempt whose unit raised ``exc``; None when the error is not the
    unit's to end (storage trouble, an OSError other than a full disk, a KeyboardInterrupt):
    it propagates, and the last line (``Ending`` of ``internal``) releases the attempt.
    ``root`` is where a full disk is reported (the project's folder by default)."""
    if isinstance(exc, (BudgetExhausted, QuotaExhausted, AuthError)):
        change = blocked_status(exc)
        return Ending(EndingKind.block, AttemptStatus.blocked, change.reason,
                      error_class=str(change.details["kind"]), unit_status=change)
    if isinstance(exc, OSError):
        if exc.errno not in DISK_FULL_ERRNOS:
            return None
        # A full disk is not the unit's fault and a retry cannot help until a person frees
        # space: block it (the partial file stays an orphan, never promoted).
        where = exc.filename or root
        reason = (f"storage: the disk is full ({errno.errorcode[exc.errno]}) while "
                  f"{unit_id} was staging its output — free space on "
                  f"{mount_point(where)}, then run `keepstep retry {unit_id}`; work "
                  "already committed is kept")
        return Ending(EndingKind.block, AttemptStatus.blocked, reason, error_class="storage",
                      unit_status=UnitStatusChange(UnitStatusKind.blocked, reason,
                                                   {"kind": "storage"}))
    if isinstance(exc, UnitTimedOut):
        return Ending(EndingKind.fail, AttemptStatus.timed_out, first_line(exc),
                      error_class="timeout")
    if isinstance(exc, (LeaseLost, StaleFencingToken)):
        return Ending(EndingKind.fence, AttemptStatus.fenced, first_line(exc))
    if isinstance(exc, RunCancelled):
        return Ending(EndingKind.cancel, AttemptStatus.cancelled, "cancelled")
    if isinstance(exc, ReplayMiss):
        return Ending(EndingKind.fail, AttemptStatus.failed, first_line(exc),
                      error_class="replay", final=True)
    if isinstance(exc, SideEffectError):
        return Ending(EndingKind.effect, AttemptStatus.blocked, first_line(exc),
                      error_class="effect", rejected=isinstance(exc, EffectRejected))
    if isinstance(exc, ModelError):
        return Ending(EndingKind.fail, AttemptStatus.failed,
                      f"{exc.error_class}: {first_line(exc)}", error_class=exc.error_class,
                      final=not exc.retryable)
    if isinstance(exc, StorageError):
        return None  # storage trouble is not the unit's fault (StorageError is a KeepstepError)
    if isinstance(exc, KeepstepError):
        return Ending(EndingKind.fail, AttemptStatus.failed, first_line(exc),
                      error_class="error", final=True)
    if isinstance(exc, Exception):
        # Input the kind could not read (binary or non-UTF-8 text) will not read better next
        # time; neither will a bug. Both end the unit with a message, never a crash.
        return Ending(EndingKind.fail, AttemptStatus.failed, safe_message(exc, unit_id),
                      error_class="input" if isinstance(exc, UnicodeError) else "internal",
                      final=True)
    return None


__all__ = ["AttemptOutcome", "Ending", "EndingKind", "blocked_status", "classify",
           "safe_message"]
