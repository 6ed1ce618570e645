"""Store contract: the side-effect ledger."""

from __future__ import annotations

import pytest

from keepstep.storage import EventIn, NotFound, StaleFencingToken, StorageError, Store
from tests.store.contract import RUN, FakeClock


def _intent(store: Store, key: str = "k-1", *, unit: str = "U1", token: int | None = None,
            compensates: str | None = None, detail: dict | None = None):
    return store.record_effect_intent(
        idem_key=key, run_id=RUN, branch_id="main", unit=unit, attempt_id=f"{unit}/a1",
        action="notify", adapter="webhook", request_hash="h-" + key, fencing_token=token,
        plan_n=1, compensates=compensates, detail=detail or {"request": {"to": "team"}})


def test_an_effect_intent_is_recorded_once_per_key(run: Store) -> None:
    """The first intent for a key is created with an event; a repeat returns it unchanged."""
    row, created = _intent(run)
    assert created and (row.status, row.idem_key, row.plan_n) == ("intent", "k-1", 1)
    again, created_again = _intent(run, detail={"request": {"to": "someone else"}})
    assert not created_again and again == row
    assert run.get_effect("k-1") == row and run.get_effect("nope") is None
    assert [e.payload["key"] for e in run.events(RUN, kinds=["effect.intent"])] == ["k-1"]
    _intent(run, "k-2", unit="U2")
    assert [r.idem_key for r in run.effects(RUN)] == ["k-1", "k-2"]
    assert [r.idem_key for r in run.effects(RUN, "intent", unit="U2")] == ["k-2"]
    assert run.effects(RUN, ["committed", "failed"]) == []
    assert run.effects(RUN, branch_id="other") == []


def test_a_fenced_executor_cannot_record_an_effect_intent(run: Store, clock: FakeClock) -> None:
    """With a fencing token, the unit's lease must still carry it; else nothing is written."""
    old = run.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=5)
    clock.t += 10
    new = run.claim(RUN, "main", "U1", expected_version=0, owner="b", lease_seconds=60)
    with pytest.raises(StaleFencingToken):
        _intent(run, token=old.fencing_token)
    assert run.get_effect("k-1") is None
    row, created = _intent(run, token=new.fencing_token)
    assert created and row.fencing_token == new.fencing_token


def test_mark_effect_moves_the_status_merges_detail_and_honours_only_if(run: Store) -> None:
    """mark_effect records a receipt (remote id kept when not given) with its event; only_if
    refuses a move from another status (None, nothing written)."""
    _intent(run)
    done = run.mark_effect("k-1", "committed", remote_id="r-9", detail={"http": 201},
                           only_if=["intent", "unknown"],
                           event=EventIn(kind="decision.effect", payload={"who": "ana"}))
    assert (done.status, done.remote_id) == ("committed", "r-9")
    assert done.detail == {"request": {"to": "team"}, "http": 201}
    assert run.events(RUN, kinds=["effect.committed"])[-1].payload["from"] == "intent"
    assert run.events(RUN, kinds=["decision.effect"])[-1].payload == {"who": "ana"}
    assert run.mark_effect("k-1", "failed", only_if=["intent"]) is None
    assert run.get_effect("k-1").status == "committed"
    assert run.mark_effect("k-1", "unknown").remote_id == "r-9"
    with pytest.raises(StorageError):
        run.mark_effect("k-1", "sent")
    with pytest.raises(NotFound):
        run.mark_effect("nope", "committed")


def test_a_committed_compensation_marks_its_original_compensated(run: Store) -> None:
    """A compensation is its own ledger entry: its intent moves the original to
    compensation-intent, its receipt to compensated; only a committed effect is compensable."""
    _intent(run, "k-1")
    with pytest.raises(StorageError):
        _intent(run, "k-1-undo", compensates="k-1")
    assert run.get_effect("k-1-undo") is None
    run.mark_effect("k-1", "committed", remote_id="r-1")
    comp, created = _intent(run, "k-1-undo", compensates="k-1")
    assert created and comp.compensates == "k-1"
    assert run.get_effect("k-1").status == "compensation-intent"
    run.mark_effect("k-1-undo", "committed", remote_id="r-2")
    assert run.get_effect("k-1").status == "compensated"
    assert [e.payload["key"] for e in run.events(RUN, kinds=["effect.compensated"])] == ["k-1"]
