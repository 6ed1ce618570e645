"""What a unit kind may do while it runs: the UnitContext contract.

A kind is a function ``run(ctx: UnitContext) -> KindOutcome``. It reads its
dependencies' committed artifacts and its approved sources, calls models only
through the model step (``kinds.model_step.run_model_step``, which uses
``ctx.call_model``: budgeted, ledgered, recorded, reusable, replayable), stages
outputs with ``ctx.write`` and returns validator results with the problems behind
them. It never touches storage or changes a state: only the orchestrator does that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from keepstep.engine.core.inputs import Contract, InputSnapshot, SourceEntry
from keepstep.engine.core.plan import Plan, Unit

if TYPE_CHECKING:
    from keepstep.engine.files.convert import ConvertedSource
    from keepstep.engine.gateway.profile import ModelProfile
    from keepstep.engine.gateway.prompts import Prompt
    from keepstep.engine.kinds.model_step import CheckedAnswer, Checker, StepCall
    from keepstep.storage.models import Event


class EffectResult(Protocol):
    """What ``UnitContext.effect`` returns (``engine.run.effects.EffectOutcome`` is one)."""

    key: str
    status: str
    remote_id: str | None
    performed: bool  # this call made the external action happen
    replayed: bool  # a receipt already existed: nothing was done


class ValidatorResult(BaseModel):
    name: str
    passed: bool
    detail: str = ""


class KindOutcome(BaseModel):
    """What a kind returns: validator results, and optional facts for the checkpoint.

    ``problems`` (``answers.Problem`` dumps: field, rule, message, value) and ``answers``
    (artifact paths of rejected model answers) say what is behind failed validators; the
    orchestrator stores them with the attempt when it fails."""

    validators: list[ValidatorResult] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)  # small, e.g. {"evidence_count": 14}
    rounds: int = 1
    problems: list[dict[str, str]] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.validators)


class UnitContext(Protocol):
    run_id: str
    branch_id: str
    unit: Unit
    attempt_id: str
    plan: Plan
    contract: Contract
    snapshot: InputSnapshot
    revise_rounds: int  # revise rounds a model step may add after its first call

    def sources_for_unit(self) -> list[SourceEntry]:
        """Approved sources named by the unit's ``source:`` and ``group:`` inputs, by id."""
        ...

    def source_text(self, source_id: str) -> str:
        """Text of an approved source (read from the project folder, never copied to the DB):
        its converted text — Markdown for PDF, DOCX, XLSX, CSV, PPTX and HTML; the text itself
        for Markdown and plain text, as one string (a large source's whole text in memory:
        ``converted_source`` reads it by window). Refused for a source the unit reads only
        through ``structure`` edges (its header lines): use ``source_header``."""
        ...

    def converted_source(self, source_id: str) -> ConvertedSource:
        """An approved source as converted text with locators (page, sheet!cells, slide,
        heading path, table row), cached per (sha256, converter version). Raises a
        SourceError naming the file for one that cannot be read, RunCancelled soon after a
        cancel."""
        ...

    def source_header(self, source_id: str) -> dict[str, str]:
        """The header lines of an approved source (its front matter: title, type, date…) as
        key -> value; {} when it has none."""
        ...

    def data(self, name: str) -> dict[str, Any]:
        """The pack data file ``data/<name>.toml`` parsed ({} when the pack has none): the
        vocabulary a kind reads through a ``data:<name>`` input (declared, or implicit by its
        kind)."""
        ...

    def dep_bytes(self, unit_id: str, name: str) -> bytes:
        """A committed artifact of a dependency, by output name (hash-checked on read)."""
        ...

    def dep_json(self, unit_id: str, name: str) -> Any: ...

    def dep_path(self, unit_id: str, name: str) -> str:
        """Where a dependency's committed artifact lies, relative to the artifact root
        (for an adapter that needs a file; read the bytes with ``dep_bytes``)."""
        ...

    def template_text(self, name: str) -> str:
        """A template from the project's ``templates/`` folder (``template:<name>`` input)."""
        ...

    def prompt(self, name: str) -> Prompt:
        """The prompt template ``name`` (the project's ``prompts/<name>.md`` or the packaged
        one)."""
        ...

    def model_profile(self) -> ModelProfile:
        """What is known about the unit's model: window, output cap, structured output."""
        ...

    def call_model(self, call: StepCall, *, check: Checker) -> CheckedAnswer:
        """One round of a model step: send ``call.messages``, judge the answer with ``check``
        and record it (``calls/*.json``, with its verdict). On a retry of the unit, an earlier
        attempt's recorded answer to the very same request is reused when its file still has
        its recorded hash and ``check`` passes it.

        Raises RequestTooLarge before any call when the request cannot fit the model's
        window, BudgetExhausted before the call when the budget would be passed, and the
        classified ModelError subclasses on provider failures.
        """
        ...

    def write(self, name: str, data: bytes | str | dict[str, Any] | list[Any], *,
              media_type: str | None = None, source_ids: list[str] | None = None) -> str:
        """Stage an output into the attempt directory; returns its sha256."""
        ...

    def decision_events(self) -> list[Event]:
        """Decision events of the run so far (plan changes, approvals, budget raises…)."""
        ...

    def safe_point(self, progress: str | None = None) -> None:
        """Check for cancellation, a lost lease and the unit's time limit (raises)."""
        ...

    def effect(self, adapter: str, action: str, request: dict[str, Any], *,
               content: str | None = None) -> EffectResult:
        """One external action through the side-effect ledger (DESIGN §8), at most once per
        (run, unit, action, plan version): a retry or a resume gets the recorded receipt back.
        With ``content`` (the sha256 of the bytes delivered) it is a delivery: at most once
        per destination (the adapter's address and ``request["name"]``) and content hash,
        whatever the run, plan version or attempt.

        ``adapter`` names an ``[adapters.NAME]`` table of keepstep.toml (an unknown name
        raises KeepstepError listing the configured ones). The request is stored in the
        ledger and may be sent as is: it must carry no source text and no secrets (e.g. a
        path to a committed artifact and its sha256, never its content). An outcome that
        cannot be confirmed raises SideEffectError; the unit is then blocked, not retried.
        """
        ...


KindFn = Callable[[UnitContext], KindOutcome]


class KindSpec(BaseModel):
    """A kind's declaration: the validators it applies and whether it calls models."""

    name: str
    uses_model: bool
    validators: list[str]
    default_outputs: list[str]
    description: str


REGISTRY: dict[str, tuple[KindSpec, KindFn]] = {}


def register(spec: KindSpec) -> Callable[[KindFn], KindFn]:
    def deco(fn: KindFn) -> KindFn:
        REGISTRY[spec.name] = (spec, fn)
        return fn

    return deco
