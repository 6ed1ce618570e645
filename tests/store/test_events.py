"""Store contract: the event log."""

from __future__ import annotations

from keepstep.storage import EventIn, Store
from tests.store.contract import RUN, FakeClock


def test_events_filter_by_kind_prefix_unit_branch_and_position(run: Store) -> None:
    """events() filters by kinds, kind prefix, unit, branch and seq, newest first on request."""
    seqs = [
        run.append_event(RUN, "unit.blocked", unit="U1", payload={"why": "quota"}),
        run.append_event(RUN, "unit.failed", unit="U2"),
        run.append_event(RUN, "recovery.started"),
    ]
    assert seqs == sorted(seqs)
    assert [e.kind for e in run.events(RUN, kind_prefix="unit.")] == ["unit.blocked",
                                                                      "unit.failed"]
    assert [e.seq for e in run.events(RUN, kinds=["recovery.started"])] == [seqs[2]]
    assert [e.payload for e in run.events(RUN, unit="U1")] == [{"why": "quota"}]
    assert [e.seq for e in run.events(RUN, after_seq=seqs[0])] == seqs[1:]
    assert [e.seq for e in run.events(RUN, newest_first=True, limit=2)] == seqs[:0:-1]
    assert run.events(RUN, branch_id="elsewhere") == []
    assert run.events("other-run") == []


def test_commit_appends_its_events_in_the_same_step(run: Store) -> None:
    """Events passed to commit_checkpoint are stored with it, after 'checkpoint.committed'."""
    run.commit_checkpoint(RUN, "main", 0, {"x": 1},
                          events=[EventIn(kind="plan.changed", payload={"to": "plan-v2"})])
    kinds = [e.kind for e in run.events(RUN)]
    assert kinds[-2:] == ["checkpoint.committed", "plan.changed"]


def test_stripping_old_payloads_keeps_each_event_and_its_metadata(
    run: Store, clock: FakeClock
) -> None:
    """strip_event_payloads empties the payloads of events older than a time; the events,
    their kinds and order stay."""
    run.append_event(RUN, "unit.blocked", unit="U1", payload={"why": "quota"})
    clock.t += 60
    run.append_event(RUN, "unit.failed", unit="U2", payload={"why": "invalid"})
    cut = run.events(RUN)[-1].ts
    assert run.strip_event_payloads(RUN, before_ts=cut) == 1
    events = run.events(RUN)
    assert [e.kind for e in events] == ["run.created", "unit.blocked", "unit.failed"]
    assert [e.payload for e in events] == [{}, {}, {"why": "invalid"}]
    assert run.strip_event_payloads(RUN, before_ts=cut) == 0
