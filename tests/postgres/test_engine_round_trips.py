"""The engine on PostgreSQL: the round trips one unit costs (the scheduler's one read of the
head, leases, statuses and budget; the claim's two; the commit's two), and the facts cache
kept right by other executors' commits — caught up from their deltas when the
compare-and-swap fails, rebased when what the attempt consumed is unchanged, fenced when a
dependency changed under it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w

from keepstep.engine.api import open_project
from keepstep.engine.core.state import OutputRef, unit_key
from keepstep.engine.kinds.context import REGISTRY, KindOutcome, ValidatorResult
from keepstep.storage import CommitRequest
from tests.support.engine_harness import RUN, make_small_project, second_host

pytestmark = pytest.mark.postgres


class AllRoundTrips:
    """Every wait for the server's answer on any connection: a statement outside a
    pipeline, and in a pipeline each Sync and each answer fetched before it. The server's
    clock (read every few seconds, whatever the work) is counted apart."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        self.clock = 0
        self.on = False
        execute, sync = psycopg.Cursor.execute, psycopg.Pipeline.sync
        fetch, exit_ = psycopg.Cursor._fetch_pipeline, psycopg.Pipeline.__exit__

        def counted_execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if cur._conn._pipeline is None and self.on:
                if "clock_timestamp" in str(query):
                    self.clock += 1
                else:
                    self.n += 1
            return execute(cur, query, *args, **kwargs)

        def counted_sync(pipe: Any) -> None:
            self.n += self.on
            sync(pipe)

        def counted_fetch(cur: Any) -> None:
            if cur.pgresult is None and cur._conn._pipeline is not None:
                self.n += self.on
            fetch(cur)

        def counted_exit(pipe: Any, *exc: Any) -> None:
            self.n += self.on
            exit_(pipe, *exc)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
        monkeypatch.setattr(psycopg.Pipeline, "sync", counted_sync)
        monkeypatch.setattr(psycopg.Cursor, "_fetch_pipeline", counted_fetch)
        monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)


@pytest.fixture
def trivial_kind() -> Iterator[list[Callable[[Any], None]]]:
    """The notes kind replaced by one that writes one small file; hooks run inside it
    (``hooks.append(fn)``: fn(ctx) runs in the next unit executed)."""
    hooks: list[Callable[[Any], None]] = []
    old = REGISTRY["notes"]

    def kind(ctx: Any) -> KindOutcome:
        if hooks:
            hooks.pop(0)(ctx)
        ctx.write("out.json", f'{{"unit": "{ctx.unit.id}"}}\n'.encode())
        return KindOutcome(validators=[ValidatorResult(name="structure", passed=True)])

    REGISTRY["notes"] = (old[0], kind)
    try:
        yield hooks
    finally:
        REGISTRY["notes"] = old


def trivial_plan(root: Path, units: dict[str, list[str]]) -> None:
    """A project (the small one's files) whose plan is trivial notes units (id -> deps)."""
    (root / "plan.toml").write_text(tomli_w.dumps({
        "plan": {"title": "trivial units", "deliverables": []},
        "unit": [{"id": u, "title": u, "phase": "p", "kind": "notes", "outputs": ["out.json"],
                  "required_final": True, **({"depends_on": deps} if deps else {})}
                 for u, deps in units.items()]}))


def two_hosts(tmp_path: Path, units: dict[str, list[str]]) -> tuple[Path, Path]:
    a = make_small_project(tmp_path / "hostA" / "p")
    trivial_plan(a, units)
    return a, second_host(a, tmp_path)


def test_a_trivial_unit_costs_five_round_trips_through_the_engine(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        trivial_kind: list[Callable[[Any], None]]) -> None:
    """Between one unit's commit and the next one's, at --jobs 1: one read of head, leases,
    statuses and budget; the claim (2); the commit (2). The attempt reads the plan, inputs
    and versions from the facts cache, and the commit reads neither the head nor the
    budget first."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    root = make_small_project(tmp_path / "p")
    trivial_plan(root, {f"T{i:02d}": [] for i in range(12)})
    trips = AllRoundTrips(monkeypatch)
    per_unit: list[int] = []

    def on_event(e: dict[str, Any]) -> None:
        if e["kind"] == "attempt":
            assert e["outcome"] == "committed"
            if trips.on:
                per_unit.append(trips.n)
            trips.on, trips.n = True, 0

    with open_project(root) as p:
        status = p.start_run(RUN).run(jobs=1, on_event=on_event)
    assert status.decision == "done"
    assert len(per_unit) == 11 and per_unit == [5] * 11, per_unit


def test_another_hosts_commit_between_claim_and_commit_is_caught_up_and_rebased(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        trivial_kind: list[Callable[[Any], None]]) -> None:
    """Host B commits T1 while host A's T0 is in its attempt: A's commit (made on the head
    its cache holds) fails the compare-and-swap, the cache applies B's delta (no full
    reload), T0 is committed on the new head, and A never claims T1."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    a, b = two_hosts(tmp_path, {"T0": [], "T1": [], "T2": []})
    seen: dict[str, Any] = {}
    with open_project(a, executor_id="hostA:1:a") as pa, \
            open_project(b, executor_id="hostB:2:b") as pb:
        run_a = pa.start_run(RUN)

        def host_b_commits_t1(ctx: Any) -> None:
            cache = run_a.facts_cache()
            seen["before"] = (cache.version, cache.generation)
            # B runs T1 (T0 is leased to A): one unit, committed on B's host.
            assert pb.get_run(RUN).run(max_units=1, recover=False).decision != "failed"
            seen["b_head"] = pb.store.get_head(RUN).version

        trivial_kind.append(host_b_commits_t1)
        status = run_a.run(jobs=1)
        assert status.decision == "done"
        cache = run_a.facts_cache()
        attempts = pa.store.attempts(RUN)
        committed = Counter(x.unit for x in attempts if x.status == "committed")
        assert committed == {"T0": 1, "T1": 1, "T2": 1}
        owner = {x.unit: x.executor for x in attempts}
        assert owner == {"T0": "hostA:1:a", "T1": "hostB:2:b", "T2": "hostA:1:a"}
        t0 = next(c for c in pa.store.list_checkpoints(RUN) if c.unit == "T0")
        assert t0.version == seen["b_head"] + 1  # made on B's head, after the conflict
        assert cache.generation == seen["before"][1]  # B's delta applied, not a reload
        assert set(cache.records) == {"T0", "T1", "T2"}
        assert cache.version == pa.store.get_head(RUN).version
        assert pa.store.verify_chain(RUN).ok


def test_a_dependency_changed_by_another_host_fences_the_attempt(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        trivial_kind: list[Callable[[Any], None]]) -> None:
    """Host B commits a different output of T0 while host A's T1 (which consumed T0) is
    in its attempt: A's commit fails the compare-and-swap, the cache catches up, the
    rebase check sees the changed dependency and the attempt is fenced (its output an
    orphan), never committed on top of the new T0."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    a, b = two_hosts(tmp_path, {"T0": [], "T1": ["T0"]})
    with open_project(a, executor_id="hostA:1:a") as pa, \
            open_project(b, executor_id="hostB:2:b") as pb:
        run_a = pa.start_run(RUN)
        run_a.run(jobs=1, max_units=1)  # T0

        def host_b_changes_t0(ctx: Any) -> None:
            store = pb.store
            head = store.get_head(RUN)
            record = pb.get_run(RUN).facts_records()["T0"]
            changed = record.model_copy(update={"outputs": {
                "out.json": OutputRef(sha256="0" * 64, path=record.outputs["out.json"].path)}})
            store.commit(CommitRequest(run_id=RUN, branch_id="main",
                                       expected_version=head.version, kind="repair",
                                       delta={unit_key("T0"): changed.model_dump(mode="json")}))

        trivial_kind.append(host_b_changes_t0)
        events: list[dict[str, Any]] = []
        run_a.run(jobs=1, max_units=1, recover=False, on_event=events.append)
        outcomes = [(e["unit"], e["outcome"]) for e in events if e["kind"] == "attempt"]
        assert outcomes == [("T1", "orphaned")]
        (t1,) = pa.store.attempts(RUN, "T1")
        assert t1.status == "fenced"
        assert "T1" not in run_a.facts_cache().records
        assert run_a.facts_cache().records["T0"].outputs["out.json"].sha256 == "0" * 64
        assert not any(c.unit == "T1" for c in pa.store.list_checkpoints(RUN))
