"""The model step: one question to a model, answered as a validated JSON object.

``run_model_step`` is the mechanism every model-calling kind goes through (and what a plan's
general model step will be set up from): it renders the prompt template with the unit's
contract fields, task and ONE INPUT block, calls the model through ``ctx.call_model`` (which
budgets, ledgers, records and — on a retry — reuses verified answers), parses the answer
leniently, validates it strictly against the kind's pydantic schema and then against the
kind's rules. While problems remain and rounds are left, a revise round asks again with the
previous answer and its problems, each named (field, rule, offending value).

Callers may rely on:
- at most ``max_rounds`` calls (default: ``1 + ctx.revise_rounds``), in order, each tagged with
  the kind's ``round`` (a bounded loop kind passes its own round number);
- ``StepResult.value`` being the validated answer when ``problems`` is empty, else None —
  ``StepResult.parsed`` holds the last answer's JSON (possibly partial) either way, so a kind
  can still write what it got and report it;
- ``StepResult.answers`` naming the recorded artifacts of every rejected answer;
- ``StepResult.models`` naming the model that answered (the unit's model, whose calls the
  ledger records), empty when no call was made;
- a ``judge`` (a second question about an answer that passed the rules, e.g. whether its
  claims' quotes support them) being asked only of an answer that passed the rules; what it
  finds is revised like a rule's problem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from keepstep.engine.gateway.answers import Problem, check_answer, json_schema_of, problem
from keepstep.engine.gateway.profile import RequestTooLarge
from keepstep.engine.gateway.prompts import REVISE, render_messages, revise_messages
from keepstep.engine.kinds.context import UnitContext

DEFAULT_REVISE_ROUNDS = 2

Rules = Callable[[Any, Mapping[str, Any]], list[Problem]]
Judge = Callable[[Any], list[Problem]]
Checker = Callable[[str], tuple[Any, dict[str, Any], list[Problem]]]


@dataclass
class StepCall:
    """What a kind asks ``ctx.call_model`` to send (one round of one step)."""

    prompt: str
    prompt_sha256: str
    messages: list[dict[str, str]]
    schema_name: str
    json_schema: dict[str, Any]
    round: int = 1
    revision: int = 0
    label: str = ""
    # The answer's expected size in tokens (items × a per-item estimate), which sizes the
    # request's max_tokens; None: the configured max_tokens.
    answer_tokens: int | None = None


@dataclass
class CheckedAnswer:
    """One answer and its verdict, as ``ctx.call_model`` returns it."""

    content: str
    value: Any
    parsed: dict[str, Any]
    problems: list[Problem]
    reused: bool = False
    artifact: str = ""  # the recorded answer's path under the artifact root


@dataclass
class StepResult:
    value: Any
    parsed: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)
    calls: int = 0
    answers: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def revisions(self) -> int:
        return max(0, self.calls - 1)


def contract_view(ctx: UnitContext) -> dict[str, str]:
    """The contract fields the unit reads through its ``contract:`` inputs — only those, so a
    prompt never depends on a field that no edge would invalidate it for."""
    out: dict[str, str] = {}
    for name in ctx.unit.input_refs("contract"):
        if name == "body":
            out[name] = ctx.contract.body.strip()
        elif name in ctx.contract.fields:
            out[name] = str(ctx.contract.fields[name])
    return out


def unit_view(ctx: UnitContext) -> dict[str, str]:
    return {"id": ctx.unit.id, "title": ctx.unit.title,
            "question": str(ctx.unit.params.get("question") or ""),
            # What a ranking ranks ("risks" when unset): its prompts speak of options, vendors…
            "ranks": str(ctx.unit.params.get("ranks") or "risks")}


def render_step(ctx: UnitContext, *, prompt: str, inputs: Mapping[str, Any],
                schema: type[BaseModel], json_schema: dict[str, Any] | None = None
                ) -> tuple[list[dict[str, str]], dict[str, Any], str]:
    """``(messages, the answer's JSON Schema, the prompt's sha256)`` for a first round."""
    template = ctx.prompt(prompt)
    answer_schema = json_schema or json_schema_of(schema)
    shown = answer_schema if ctx.model_profile().schema_in_prompt else None
    messages = render_messages(template, inputs=inputs, contract=contract_view(ctx),
                               unit=unit_view(ctx), schema=shown)
    return messages, answer_schema, template.sha256


def step_tokens(ctx: UnitContext, *, prompt: str, inputs: Mapping[str, Any],
                schema: type[BaseModel], json_schema: dict[str, Any] | None = None) -> int:
    """Tokens the first round's request would take (to decide whether inputs must be split)."""
    messages, _schema, _sha = render_step(ctx, prompt=prompt, inputs=inputs, schema=schema,
                                          json_schema=json_schema)
    return ctx.model_profile().count(messages)


def run_model_step(ctx: UnitContext, *, prompt: str, inputs: Mapping[str, Any],
                   schema: type[BaseModel], rules: Rules | None = None,
                   max_rounds: int | None = None, round: int = 1, label: str = "",
                   json_schema: dict[str, Any] | None = None,
                   judge: Judge | None = None,
                   answer_tokens: int | None = None) -> StepResult:
    """Ask, check, and revise on problems; see the module doc.

    ``json_schema`` replaces the schema sent to the model (e.g. the evidence schema an intake
    unit published); the answer is still validated against ``schema`` and ``rules``.
    ``answer_tokens`` is the answer's expected size (it sizes the request's ``max_tokens``).
    Raises RequestTooLarge when the first round cannot fit the model's window.
    """
    messages, answer_schema, sha = render_step(ctx, prompt=prompt, inputs=inputs, schema=schema,
                                               json_schema=json_schema)
    rounds = max(1, max_rounds if max_rounds is not None else 1 + ctx.revise_rounds)

    def check(text: str) -> tuple[Any, dict[str, Any], list[Problem]]:
        value, parsed, problems = check_answer(text, schema)
        if value is not None and rules is not None:
            problems = rules(value, inputs)
        return value, parsed, problems

    result = StepResult(value=None, parsed={})
    for revision in range(rounds):
        call = StepCall(prompt=prompt, prompt_sha256=sha, messages=messages,
                        schema_name=schema.__name__, json_schema=answer_schema, round=round,
                        revision=revision, label=label, answer_tokens=answer_tokens)
        try:
            answer = ctx.call_model(call, check=check)
        except RequestTooLarge:
            if revision == 0:
                raise
            # The conversation grew past the window: stop revising, report what is wrong.
            break
        result.calls += 1
        result.models = [ctx.model_profile().model]
        result.parsed = answer.parsed
        result.problems = list(answer.problems)
        if not result.problems and judge is not None:
            result.problems = judge(answer.value)
        if not result.problems:
            result.value = answer.value
            return result
        if answer.artifact:
            result.answers.append(answer.artifact)
        if revision + 1 < rounds:
            messages = revise_messages(ctx.prompt(REVISE), messages, answer.content,
                                       [p.line() for p in result.problems])
    return result


def known_ids(field_name: str, ids: list[str], known: set[str]) -> list[Problem]:
    """A problem per cited id that is not among ``known``."""
    return [problem(f"{field_name}[{n}]", "known_id", "cites an id that is not in INPUT", i)
            for n, i in enumerate(ids) if i not in known]


__all__ = ["DEFAULT_REVISE_ROUNDS", "CheckedAnswer", "Judge", "StepCall", "StepResult",
           "contract_view", "known_ids", "render_step", "run_model_step", "step_tokens",
           "unit_view"]
