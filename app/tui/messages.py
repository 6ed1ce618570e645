"""Messages the engine worker posts back to the TUI (past tense, small dataclasses).

The worker thread never touches a widget: it turns the engine's ``on_event`` callbacks
into these and posts them; the dashboard's handlers update the screen.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from keepstep.engine.views import PendingApproval, RunStatus


@dataclass
class UnitClaimed(Message):
    """A unit's attempt took its lease and started (``status``: a fresh RunStatus when the
    worker had time to compute one, else None)."""

    unit: str
    attempt: str
    status: RunStatus | None = None


@dataclass
class UnitCommitted(Message):
    """An attempt finished (``outcome`` is the engine's: committed, failed, blocked…).

    ``status`` is a fresh RunStatus when the worker had time to compute one, else None
    (the dashboard then updates only that unit until the next full status).
    """

    unit: str
    attempt: str
    outcome: str
    detail: str = ""
    status: RunStatus | None = None


@dataclass
class RunProgressed(Message):
    """A line of progress (a decision, a recovery step). Frequent: a newer one replaces a
    queued older one."""

    text: str
    kind: str = ""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunProgressed)


@dataclass
class ApprovalRequested(Message):
    """The run stopped at a gate; ``request`` is the pending approval."""

    request: PendingApproval


@dataclass
class RunFinished(Message):
    """The engine returned: done, blocked or cancelled at a safe point."""

    status: RunStatus
    cancelled: bool = False
    label: str = "run"


@dataclass
class RunFailed(Message):
    """The engine raised. ``hint`` says what to do next when the error had one."""

    error: str
    hint: str = ""
    title: str = "The run stopped with an error"


__all__ = ["ApprovalRequested", "RunFailed", "RunFinished", "RunProgressed", "UnitClaimed",
           "UnitCommitted"]
