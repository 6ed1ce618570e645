"""The call ledger and budget, as the gateway sees them (backed by the Store).

One ledger row per provider attempt. A row's ``outcome`` says how it ended: ``ok`` (an
answer that passed the unit's checks), ``invalid_output`` (an answer that was paid for and
rejected; its problems are in ``safe_message``), a provider error class, or ``reused`` (an
answer recorded by an earlier attempt of the unit, verified and taken again: no call, no
tokens, cost 0). ``response_artifact`` is ``"<path> sha256:<hex>"`` of the recorded answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keepstep.engine.errors import BudgetExhausted
from keepstep.storage import BudgetLimitReached, Store

OUTCOME_REUSED = "reused"
OUTCOME_INVALID = "invalid_output"
# Providers that run on the person's own machine: no price, and none is owed.
FREE_PROVIDERS = ("local", "ollama", "ollama_chat")
# The words of an UnpricedModel's message that tell it from a limit reached.
UNPRICED_WORDS = "has no known price"


class UnpricedModel(BudgetExhausted):
    """A model with no known price, called under a cost budget: the budget could not be kept,
    so the call is not made (the unit is blocked, as by any budget)."""


def unpriced_error(unit: str, model: str) -> UnpricedModel:
    error = UnpricedModel(
        f"{unit}: {model} {UNPRICED_WORDS} (litellm's price map has none, or 0), so the "
        "run's cost budget could not be kept; the call was not made. Give its price in "
        f'keepstep.toml ([model_settings."{model}"] input_per_mtok and output_per_mtok), '
        "call it through your own server (api_base), or remove [budget] cost; then resume")
    error.hint = (f'give its price in keepstep.toml ([model_settings."{model}"] '
                  "input_per_mtok and output_per_mtok, per million tokens), use a model "
                  "litellm prices, call it through your own server (api_base: its price is "
                  "then yours to watch), or remove `cost` from [budget] in keepstep.toml (the "
                  "calls and tokens limits still apply); then resume")
    return error


def artifact_ref(path: str, sha256: str) -> str:
    """How a row points at its recorded answer: path and the hash it must still have."""
    return f"{path} sha256:{sha256}"


def parse_artifact_ref(ref: str | None) -> tuple[str, str] | None:
    """``(path, sha256)`` of a row's ``response_artifact``, or None when it has none."""
    if not ref or " sha256:" not in ref:
        return None
    path, _, digest = ref.rpartition(" sha256:")
    return (path, digest) if path and len(digest) == 64 else None


def figures_text(figures: dict[str, dict[str, float]]) -> str:
    """``calls 3/3 (this call needs ~1), cost $0.0040/$0.0040 (…)`` from a refusal's figures:
    money with ``$``."""
    parts = []
    for counter, f in sorted(figures.items()):
        fmt = (lambda v: f"${v:.4f}") if counter == "cost" else (lambda v: f"{v:g}")
        parts.append(f"{counter} {fmt(f['used'])}/{fmt(f['limit'])} (this call needs "
                     f"~{fmt(f['requested'])})")
    return ", ".join(parts)


class StoreCallLedger:
    """Reserve before each call (atomically checking the limits), settle after.

    A reservation that is never settled (the process died mid-call) stays in
    the ledger as ``reserved`` and its budget stays spent: a resume never gives
    budget back.
    """

    def __init__(self, store: Store, run_id: str, branch_id: str, *,
                 api_base_for: Callable[[str], str | None] | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        # Where a model is called: an unpriced model behind the person's own server (an
        # api_base) is theirs to price; a provider's own endpoint is not free.
        self.api_base_for = api_base_for
        self.calls_made = 0
        self._estimates: dict[str, tuple[int, float]] = {}

    def _exhausted(self, unit: str, exc: BudgetLimitReached, what: str) -> BudgetExhausted:
        figures = exc.figures
        # No limit is suggested here: the status (``engine.report.next_action``) suggests
        # one from the whole run's rate, and every face shows that one.
        branch = f" --branch {self.branch_id}" if self.branch_id != "main" else ""
        return BudgetExhausted(
            f"{unit}: budget limit reached: {figures_text(figures)} — {what}",
            figures=figures,
            hint=f"`keepstep status --run {self.run_id}{branch}` suggests a new limit and the "
                 "`keepstep budget raise` command that records it; then resume")

    def reserve(self, ctx: Any, *, model: str, request_hash: str, est_tokens: int,
                est_cost: float = 0.0) -> str:
        delta: dict[str, float] = {"calls": 1, "tokens": est_tokens}
        if est_cost > 0:
            delta["cost"] = est_cost
        elif self._unpriced(model):
            raise unpriced_error(ctx.unit, model)
        try:
            call_id = self.store.reserve_call(
                self.run_id, branch_id=self.branch_id, unit=ctx.unit, attempt_id=ctx.attempt,
                round=ctx.round, model=model, request_hash=request_hash, budget_delta=delta,
            )
        except BudgetLimitReached as exc:
            raise self._exhausted(ctx.unit, exc, "the call was not made") from None
        self._estimates[call_id] = (est_tokens, est_cost if est_cost > 0 else 0.0)
        self.calls_made += 1
        return call_id

    def _unpriced(self, model: str) -> bool:
        """Whether a call of ``model`` at no price would leave a cost limit unkept."""
        if self.api_base_for is None or model.split("/", 1)[0] in FREE_PROVIDERS:
            return False
        if self.api_base_for(model):
            return False
        limits = self.store.get_budget(self.run_id, self.branch_id).limits
        return bool(limits.get("cost"))

    def reserve_retry(self, ctx: Any) -> None:
        """Charge one retry of a call to the ``retries`` budget; BudgetExhausted when that
        would pass its limit (the retry is then not made)."""
        try:
            self.store.add_usage(self.run_id, {"retries": 1}, branch_id=self.branch_id,
                                 enforce=True)
        except BudgetLimitReached as exc:
            raise self._exhausted(ctx.unit, exc, "the call was not retried") from None

    def settle(
        self,
        call_id: str,
        *,
        tokens_in: int,
        tokens_out: int,
        cost: float,
        latency_ms: int,
        outcome: str,
        error_class: str | None = None,
        safe_message: str | None = None,
        response_artifact: str | None = None,
    ) -> None:
        est_tokens, est_cost = self._estimates.pop(call_id, (0, 0.0))
        self.store.settle_call(
            call_id, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost,
            latency_ms=latency_ms, outcome=outcome, error_class=error_class,
            safe_message=safe_message, response_artifact=response_artifact,
            budget_delta={"tokens": tokens_in + tokens_out - est_tokens,
                          "cost": cost - est_cost},
        )

    def record_verdict(self, call_id: str, result: Any, *, valid: bool,
                       response_artifact: str, safe_message: str | None = None) -> None:
        """Attach the answer's verdict and recorded artifact to a settled row (the budget
        was settled already and is not touched again)."""
        self.store.settle_call(
            call_id, tokens_in=result.tokens_in, tokens_out=result.tokens_out,
            cost=result.cost, latency_ms=result.latency_ms,
            outcome="ok" if valid else OUTCOME_INVALID,
            error_class=None if valid else "InvalidOutput",
            safe_message=None if valid else (safe_message or "")[:300],
            response_artifact=response_artifact, budget_delta=None)

    def record_reuse(self, ctx: Any, *, model: str, request_hash: str,
                     response_artifact: str) -> str:
        """A row for an answer taken from an earlier attempt: outcome ``reused``, no tokens,
        cost 0, nothing charged to the budget."""
        call_id = self.store.reserve_call(
            self.run_id, branch_id=self.branch_id, unit=ctx.unit, attempt_id=ctx.attempt,
            round=ctx.round, model=model, request_hash=request_hash, budget_delta={},
            enforce=False)
        self.store.settle_call(call_id, tokens_in=0, tokens_out=0, cost=0.0, latency_ms=0,
                               outcome=OUTCOME_REUSED, response_artifact=response_artifact,
                               budget_delta=None)
        return call_id
