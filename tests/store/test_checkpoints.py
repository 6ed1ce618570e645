"""Store contract: runs, branches, state and the checkpoint chain."""

from __future__ import annotations

import pytest

from keepstep.storage import CheckpointConflict, CommitRequest, NotFound, StorageError, Store
from tests.store.contract import RUN


def test_create_run_starts_at_version_zero_with_the_initial_state(run: Store) -> None:
    """A new run has head 0, its initial state, meta and limits, and a 'run.created' event."""
    head = run.get_head(RUN)
    assert (head.run_id, head.branch_id, head.version) == (RUN, "main", 0)
    assert run.read_state(RUN) == {"plan": "plan-v1", "unit/U1": {"status": "pending"}}
    assert run.read_state(RUN, prefix="unit/") == {"unit/U1": {"status": "pending"}}
    assert run.read_key(RUN, "plan") == "plan-v1"
    assert run.read_key(RUN, "absent") is None
    assert run.runs() == [RUN] and run.run_exists(RUN) and not run.run_exists("nope")
    assert run.run_meta(RUN) == {"title": "market entry"}
    assert run.get_budget(RUN).limits == {"model_calls": 3}
    assert [b["branch_id"] for b in run.branches(RUN)] == ["main"]
    assert [e.kind for e in run.events(RUN)] == ["run.created"]
    genesis = run.get_checkpoint(RUN, 0)
    assert (genesis.kind, genesis.parent_version, genesis.hash) == ("genesis", None, head.hash)


def test_creating_a_run_twice_is_refused(run: Store) -> None:
    """A run id is used once; a second create_run raises and changes nothing."""
    with pytest.raises(StorageError):
        run.create_run(RUN, {"plan": "other"})
    assert run.read_key(RUN, "plan") == "plan-v1"


def test_unknown_runs_and_checkpoints_raise_not_found(run: Store) -> None:
    """Reading a run, branch or checkpoint that does not exist raises NotFound."""
    with pytest.raises(NotFound):
        run.get_head("nope")
    with pytest.raises(NotFound):
        run.get_head(RUN, "no-branch")
    with pytest.raises(NotFound):
        run.get_checkpoint(RUN, 7)
    with pytest.raises(NotFound):
        run.run_meta("nope")


def test_commit_is_a_compare_and_swap_on_the_head(run: Store) -> None:
    """A commit on head n makes n+1 linked to n; a second commit on n raises CheckpointConflict."""
    v0 = run.get_head(RUN)
    assert run.commit_checkpoint(RUN, "main", 0, {"unit/U1": {"status": "done"}, "plan": None},
                                 kind="unit-success", unit="U1") == 1
    with pytest.raises(CheckpointConflict):
        run.commit_checkpoint(RUN, "main", 0, {"x": 1})
    cp = run.get_checkpoint(RUN, 1)
    assert (cp.parent_version, cp.parent_hash, cp.kind, cp.unit) == (0, v0.hash, "unit-success",
                                                                      "U1")
    assert cp.delta == {"unit/U1": {"status": "done"}, "plan": None}
    assert run.get_head(RUN).hash == cp.hash
    assert run.read_state(RUN) == {"unit/U1": {"status": "done"}}  # None deletes a key
    assert [c.version for c in run.list_checkpoints(RUN)] == [0, 1]
    assert [c.version for c in run.list_checkpoints(RUN, kinds=["unit-success"])] == [1]
    assert run.count_checkpoints(RUN) == {"unit-success": 1}
    assert run.verify_head(RUN).ok and run.verify_chain(RUN).ok
    assert run.events(RUN, kinds=["checkpoint.committed"])[0].payload["version"] == 1


def test_a_branch_has_its_own_head_over_shared_history(run: Store) -> None:
    """fork_branch starts a head at a past version; commits on it leave the parent alone."""
    run.commit_checkpoint(RUN, "main", 0, {"a": 1})
    run.commit_checkpoint(RUN, "main", 1, {"b": 2})
    head = run.fork_branch(RUN, "main", 1, "alt")
    assert (head.branch_id, head.version) == ("alt", 1)
    assert run.get_checkpoint(RUN, 1, "alt") == run.get_checkpoint(RUN, 1)
    run.commit_checkpoint(RUN, "alt", 1, {"c": 3})
    assert "b" not in run.read_state(RUN, "alt") and run.read_key(RUN, "c", "alt") == 3
    assert run.read_key(RUN, "c") is None and run.get_head(RUN).version == 2
    assert run.verify_chain(RUN, "alt").ok and run.verify_chain(RUN).ok
    with pytest.raises(StorageError):
        run.fork_branch(RUN, "main", 1, "alt")


def test_a_commit_moves_current_pointers_and_adds_usage_in_the_same_step(run: Store) -> None:
    """current= and usage= are written with the checkpoint; a refused commit writes neither."""
    used = run.get_budget(RUN).used
    run.commit_checkpoint(RUN, "main", 0, {"x": 1}, current={"U1": "U1/a1"},
                          usage={"wall_time_s": 1.5, "model_calls": 1})
    assert run.current_attempts(RUN) == {"U1": "U1/a1"}
    after = run.get_budget(RUN).used
    assert after["wall_time_s"] == used.get("wall_time_s", 0) + 1.5
    assert after["model_calls"] == used.get("model_calls", 0) + 1
    with pytest.raises(CheckpointConflict):
        run.commit_checkpoint(RUN, "main", 0, {"x": 2}, current={"U1": None},
                              usage={"wall_time_s": 9})
    assert run.current_attempts(RUN) == {"U1": "U1/a1"}
    assert run.get_budget(RUN).used == after


def test_a_commit_records_the_budget_at_its_checkpoint_under_budget_key(run: Store) -> None:
    """budget_key= records the used counters as they stand once the commit's usage is added,
    in the delta (chained and hashed like any key) and in the state."""
    run.add_usage(RUN, {"model_calls": 2})
    v = run.commit(CommitRequest(run_id=RUN, branch_id="main", expected_version=0,
                                 delta={"x": 1}, usage={"wall_time_s": 1.5},
                                 budget_key="budget"))
    recorded = {"model_calls": 2, "wall_time_s": 1.5}
    assert run.read_key(RUN, "budget") == recorded == run.get_budget(RUN).used
    assert run.get_checkpoint(RUN, v).delta == {"x": 1, "budget": recorded}
    run.commit_checkpoint(RUN, "main", v, {"y": 2}, budget_key="spent")  # no usage: as it is
    assert run.read_key(RUN, "spent") == recorded
    assert run.verify_chain(RUN).ok


def test_verify_since_last_checks_only_the_new_commits_and_remembers_the_head(
    run: Store
) -> None:
    """The first call checks from genesis; later calls check the remembered version and
    what was committed since — the cost follows the new commits."""
    for v in range(3):
        run.commit_checkpoint(RUN, "main", v, {f"k{v}": v})
    first = run.verify_since_last(RUN)
    assert (first.ok, first.checked, first.verified_version) == (True, 4, 3)
    again = run.verify_since_last(RUN)
    assert (again.ok, again.checked, again.verified_version) == (True, 1, 3)
    run.commit_checkpoint(RUN, "main", 3, {"k3": 3})
    run.commit_checkpoint(RUN, "main", 4, {"k4": 4})
    later = run.verify_since_last(RUN)
    assert (later.ok, later.checked, later.verified_version) == (True, 3, 5)
    assert run.verify_since_last(RUN, "main").checked == 1
