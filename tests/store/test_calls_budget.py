"""Store contract: budgets and the model-call ledger."""

from __future__ import annotations

import pytest

from keepstep.storage import BudgetLimitReached, EventIn, Store
from tests.store.contract import RUN


def test_calls_are_reserved_against_the_budget_then_settled(run: Store) -> None:
    """reserve_call counts against limits before a call; settle_call records its figures."""
    ids = [run.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1", round=r,
                            model="offline/m", request_hash=f"h{r}",
                            budget_delta={"model_calls": 1}) for r in (1, 2, 3)]
    with pytest.raises(BudgetLimitReached):
        run.reserve_call(RUN, branch_id="main", unit="U1", attempt_id="U1/a1", round=4,
                         model="offline/m", request_hash="h4", budget_delta={"model_calls": 1})
    run.settle_call(ids[0], tokens_in=3, tokens_out=4, cost=0.0, latency_ms=1, outcome="ok")
    calls = run.calls(RUN, unit="U1")
    assert [(c.call_id, c.status) for c in calls] == [
        (ids[0], "settled"), (ids[1], "reserved"), (ids[2], "reserved")
    ]
    assert run.calls(RUN, unit="U2") == []
    assert run.get_budget(RUN).left() == {"model_calls": 0}
    raised = run.set_budget_limits(RUN, {"model_calls": 5},
                                   event=EventIn(kind="budget.raised", payload={"by": "user"}))
    assert raised.left() == {"model_calls": 2}
    assert run.events(RUN, kinds=["budget.raised"])[0].payload == {"by": "user"}
    with pytest.raises(BudgetLimitReached):
        run.add_usage(RUN, {"model_calls": 3}, enforce=True)
    assert run.add_usage(RUN, {"model_calls": 2}, enforce=True).left() == {"model_calls": 0}
