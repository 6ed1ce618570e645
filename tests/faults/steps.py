"""The vocabulary of the fault table: what a case does, step by step (data, no behaviour).

A case is a pre-state, then steps: ``Worker`` starts one executor process (a fresh pid, so a
fresh executor id — every resume is "a different executor"), ``Do`` is something the harness
does between processes: an injection (``delete_artifact``), what a person does (``retry``,
``raise_budget``, ``decide_effect``), or an intermediate assertion (``expect``). The harness
(faults/harness.py) gives each action its meaning; the cases (faults/cases.py) only name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RUN = "F1"
AUDIENCE = "product team"
NEW_AUDIENCE = "investment committee"


@dataclass(frozen=True)
class Rule:
    """A model-call hook inside the worker process (faults/child.py ``--call-rules``):
    on ``unit``'s ``call``-th provider call, ``hold`` (marker, then sleep until killed),
    ``slow`` (sleep ``seconds``, then answer) or ``pause`` (marker, then SIGSTOP)."""

    unit: str
    do: str
    call: int = 1
    seconds: float = 60.0


@dataclass(frozen=True)
class Worker:
    """One executor process: ``python -m keepstep.engine.drills.worker`` plus test hooks.

    ``approve``: the answer given to the audience gate (``None``: no answer, the gate waits).
    ``name``: start in the background under that name (``Do("join", name)`` waits for it).
    ``expect``: ``"exit"`` (exit code 0), ``"killed"`` (SIGKILL, from KEEPSTEP_CRASH_AT or the
    harness), ``"error"`` (exit code 2: refused with a message).
    """

    crash_at: str | None = None
    approve: str | None = AUDIENCE
    stop_after: str | None = None
    max_units: int | None = None
    lease: float | None = None
    rules: tuple[Rule, ...] = ()
    pause_at: str | None = None
    disk_full: str | None = None
    name: str | None = None
    expect: str = "exit"


@dataclass(frozen=True)
class Do:
    action: str
    args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        return " ".join([self.action, *map(str, self.args)])


def do(action: str, *args: Any) -> Do:
    return Do(action, tuple(args))


@dataclass(frozen=True)
class Pre:
    """How far the run gets before the fault: ``fresh`` (project files, no run yet) or
    ``done`` (a run that finished, gate approved), then optionally ``max_units`` more units
    by a clean worker (the approval is recorded once the gate's unit is next)."""

    base: str = "fresh"
    max_units: int | None = None

    def __str__(self) -> str:
        return self.base + (f" + {self.max_units} units" if self.max_units else "")


@dataclass(frozen=True)
class Case:
    """One row of the fault table.

    ``expect``: the end state — ``done``, ``blocked:<kind>`` (budget, quota, auth, approval,
    effect, storage: each needs a person or a decision), ``failed:<unit>``,
    ``refused:recovery`` (recovery stops with a message), ``refused:schema`` (the worker
    refuses to open the database).
    ``reexec``: units executed more than once — model calls in more than one attempt, files
    staged by more than one attempt, or more than one commit.
    ``no_dup``: objects that must exist exactly once — ``commit:<unit>``, ``commits:*`` (every
    unit), ``calls:<unit>`` (all its calls in one attempt), ``webhook`` (each key applied once).
    ``checks``: extra named checks (faults/checks.py ``named_check``).
    """

    id: str
    group: str
    what: str
    pre: Pre
    injection: str
    steps: tuple[Worker | Do, ...]
    observe: tuple[str, ...]
    expect: str
    reexec: frozenset[str] = frozenset()
    no_dup: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    setup: tuple[Do, ...] = ()
    message: str = ""
    provider: tuple[dict[str, Any], ...] | None = None
    webhook: bool = False
    chain_ok: bool = True
    notes: str = field(default="", compare=False)
