"""The budget is checked before every model call: calls, tokens and cost (litellm's price ×
the estimated tokens) are reserved first, so a limit blocks the call that would pass it —
and unit retries never pass the retries budget (a provider's 429 uses none of it: issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from tests.support.engine_harness import RUN, make_small_project
from tests.support.model_server import running_server

MODEL = "openai/gpt-4o-mini"
COST_LIMIT = 0.004


@pytest.fixture(autouse=True)
def _dummy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")


def test_a_cost_limit_blocks_before_the_call_that_would_pass_it(tmp_path: Path) -> None:
    """Each call reserves its estimated cost first; the one that would pass the limit is
    never sent, the unit is blocked with the figures and the exact raise command, and the
    cost spent stays within the limit."""
    with running_server("clean") as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base, budget={"cost": COST_LIMIT})
        with open_project(root) as p:
            run = p.start_run(RUN)
            status = run.run()
            calls = run.calls()
            used = p.store.get_budget(RUN).used
    assert status.decision == "blocked"
    [blocked] = [u for u, v in status.units.items() if v.state == "blocked"]
    reason = status.units[blocked].reason or ""
    # Issue 23: money with $, and one suggested limit (the status's), with no DIR placeholder.
    assert "cost" in reason and f"/${COST_LIMIT:.4f}" in reason and "this call needs" in reason
    assert "--calls" not in reason and "tokens 0/" not in reason
    assert "keepstep budget raise" not in reason and "DIR" not in status.next_action
    assert f"`keepstep budget raise --run {RUN} --cost" in status.next_action
    [need] = [n for n in status.needs if n.kind == "budget"]
    assert need.action.startswith("raise the cost limit to $")
    assert used["cost"] <= COST_LIMIT
    assert len(calls) == len(server.log)  # the refused call reached no server
    assert 0 < len(calls) < 8


def test_raising_by_the_suggested_command_lets_the_run_go_on(tmp_path: Path) -> None:
    """The suggested limit (the status's, issue 23) is enough for the refused call: after that
    decision the blocked unit runs."""
    with running_server("clean") as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base, budget={"cost": COST_LIMIT})
        with open_project(root) as p:
            run = p.start_run(RUN)
            first = run.run()
            [blocked] = [u for u, v in first.units.items() if v.state == "blocked"]
            suggested = float(first.next_action.split("--cost ")[1].split()[0])
            run.raise_budget(cost=suggested, reason="the client agreed")
            second = run.run()
    assert second.units[blocked].state == "succeeded"


def test_unit_retries_never_pass_the_retries_budget(tmp_path: Path) -> None:
    """An answer that never validates fails U03's attempts; the retry that would pass the
    retries limit is not made: U03 is blocked on the budget, used == limit. (The answers
    differ per call, like a sampling model's: byte-identical ones would stop U03 after its
    second attempt as a repeated failure, issue 21.)"""
    bad = {"match": {"task": "extract", "source_id": "A1"}, "do": "no_json", "times": None,
           "vary": True}
    with running_server("clean", rules=[bad]) as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base, budget={"retries": 1})
        with open_project(root) as p:
            run = p.start_run(RUN)
            status = run.run()
            attempts = [a.status for a in p.store.attempts(RUN, "U03")]
            used = p.store.get_budget(RUN).used
    u03 = status.units["U03"]
    assert u03.state == "blocked" and "retries 1/1" in (u03.reason or ""), u03.reason
    # Issue 23: the new limit is suggested once, by the status (its next action), not in the
    # reason as well.
    assert "--retries " in status.next_action and "DIR" not in status.next_action
    assert used["retries"] == 1
    assert attempts == ["failed", "failed"]


def test_a_429_is_waited_for_without_using_the_retries_budget(tmp_path: Path) -> None:
    """With no retries left, a 429 with Retry-After is still waited for and the call sent
    again: transient provider trouble is the provider's state, not the unit's, so no retry is
    charged and the unit succeeds. (Issue 22 item 4 reverses what this test pinned before: a
    gateway retry was charged to the retries budget and blocked the unit here.)"""
    with running_server("rate_limited") as server:
        root = make_small_project(tmp_path / "small", default_model=MODEL,
                                  api_base=server.api_base, budget={"retries": 0})
        with open_project(root) as p:
            status = p.start_run(RUN).run()
            used = p.store.get_budget(RUN).used
            attempts = [a.status for a in p.store.attempts(RUN)]
    assert status.decision == "done", status.reasons
    assert all(u.state == "succeeded" for u in status.units.values())
    assert used.get("retries", 0) == 0
    assert "failed" not in attempts  # the wait used up no attempt
    assert server.log[0]["status"] == 429 and server.log[1]["status"] == 200
    assert server.log[1]["messages"] == server.log[0]["messages"]  # the same call, sent again


UNPRICED = "openai/keepstep-unpriced-test-model"


def test_a_price_in_keepstep_toml_lets_an_unpriced_model_run_under_a_cost_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model litellm has no price for, called at its provider's address under a cost
    budget, is blocked before any call with a message naming where to give its price; with
    ``[model_settings."<model>"]`` prices in keepstep.toml the same run goes on, each call
    costing its tokens at that price; and at the project's own server (api_base) with no cost
    budget, no price is needed."""
    from tests.support.small_project import extract_only_units

    with running_server("clean") as server:
        # The provider's address from the environment, as litellm reads it: not an api_base
        # of the project, so the price is keepstep's to keep.
        monkeypatch.setenv("OPENAI_API_BASE", server.api_base)
        unpriced = make_small_project(tmp_path / "unpriced", default_model=UNPRICED,
                                      budget={"cost": 5.0}, units=extract_only_units(1))
        with open_project(unpriced) as p:
            status = p.start_run(RUN).run()
        assert status.units["E01"].state == "blocked"
        reason = status.units["E01"].reason or ""
        assert "no known price" in reason and f'[model_settings."{UNPRICED}"]' in reason
        assert "raise" not in status.next_action and "price" in status.next_action
        assert server.log == []

        priced = make_small_project(
            tmp_path / "priced", default_model=UNPRICED, budget={"cost": 5.0},
            units=extract_only_units(1),
            model_settings={UNPRICED: {"input_per_mtok": 2.0, "output_per_mtok": 8.0}})
        with open_project(priced) as p:
            run = p.start_run(RUN)
            status = run.run()
            calls = run.calls()
            used = p.store.get_budget(RUN).used
        assert status.units["E01"].state == "succeeded"
        assert calls and len(server.log) == len(calls)
        for c in calls:
            assert c.cost == pytest.approx(c.tokens_in * 2e-6 + c.tokens_out * 8e-6)
        assert used["cost"] == pytest.approx(sum(c.cost for c in calls))

        monkeypatch.delenv("OPENAI_API_BASE")
        own = make_small_project(tmp_path / "own", default_model=UNPRICED,
                                 api_base=server.api_base, units=extract_only_units(1))
        with open_project(own) as p:
            status = p.start_run(RUN).run()
        assert status.units["E01"].state == "succeeded"


def test_a_price_of_zero_in_keepstep_toml_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A zero price, or half a price, would keep no cost budget: keepstep.toml is refused
    naming the model's settings and what to give instead."""
    from keepstep.engine.errors import ConfigError
    from keepstep.engine.files.project import load_config

    for settings, words in (({"input_per_mtok": 0.0, "output_per_mtok": 0.0}, "price of 0"),
                            ({"input_per_mtok": 1.0}, "give both")):
        root = make_small_project(tmp_path / words.replace(" ", "-"),
                                  model_settings={UNPRICED: settings})
        with pytest.raises(ConfigError) as info:
            load_config(root)
        assert words in str(info.value) and "model_settings" in str(info.value)
