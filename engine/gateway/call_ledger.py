"""The call ledger and budget, as the gateway sees them (backed by the Store)."""

from __future__ import annotations

from typing import Any

from keepstep.engine.errors import BudgetExhausted
from keepstep.storage import BudgetLimitReached, Store


class StoreCallLedger:
    """Reserve before each call (atomically checking the limits), settle after.

    A reservation that is never settled (the process died mid-call) stays in
    the ledger as ``reserved`` and its budget stays spent: a resume never gives
    budget back.
    """

    def __init__(self, store: Store, run_id: str, branch_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        self.calls_made = 0
        self._estimates: dict[str, int] = {}

    def reserve(self, ctx: Any, *, model: str, request_hash: str, est_tokens: int) -> str:
        try:
            call_id = self.store.reserve_call(
                self.run_id, branch_id=self.branch_id, unit=ctx.unit, attempt_id=ctx.attempt,
                round=ctx.round, model=model, request_hash=request_hash,
                budget_delta={"calls": 1, "tokens": est_tokens},
            )
        except BudgetLimitReached as exc:
            raise BudgetExhausted(
                f"{ctx.unit}: {exc.args[0]} — the call was not made", figures=exc.figures
            ) from None
        self._estimates[call_id] = est_tokens
        self.calls_made += 1
        return call_id

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
        est = self._estimates.pop(call_id, 0)
        self.store.settle_call(
            call_id, tokens_in=tokens_in, tokens_out=tokens_out, cost=cost,
            latency_ms=latency_ms, outcome=outcome, error_class=error_class,
            safe_message=safe_message, response_artifact=response_artifact,
            budget_delta={"tokens": tokens_in + tokens_out - est, "cost": cost},
        )
