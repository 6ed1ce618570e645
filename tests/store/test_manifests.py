"""Store contract: manifest rows, current pointers and orphaned attempts."""

from __future__ import annotations

from keepstep.storage import Store
from tests.store.contract import RUN, FakeClock
from tests.store.contract import stage as _stage


def test_a_fenced_commit_records_manifest_and_ends_the_attempt(run: Store) -> None:
    """A commit with a current token stores the manifest, ends the attempt, releases the lease."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    entries = [_stage(run, c.attempt_id, "a.json", b"[1]"),
               _stage(run, c.attempt_id, "t/b.csv", b"x,y")]
    v = run.commit_checkpoint(RUN, "main", 0, {"unit/U1": {"status": "done"}}, entries,
                              c.fencing_token, unit="U1", attempt_id=c.attempt_id)
    run.artifacts.seal(entries)
    manifest = run.manifest(RUN)
    assert [(e.name, e.sha256, e.checkpoint_version) for e in manifest] == [
        (e.name, e.sha256, v) for e in entries
    ]
    assert run.manifest(RUN, unit="U1", attempt_id=c.attempt_id) == manifest
    assert run.manifest(RUN, unit="U9") == []
    assert run.artifacts.verify(manifest) == []
    assert run.get_attempt(RUN, c.attempt_id).status == "committed"
    assert run.leases(RUN) == []
    assert run.orphaned_attempts(RUN) == []


def test_staged_files_without_a_commit_are_orphans_once_the_lease_is_gone(
    run: Store, clock: FakeClock
) -> None:
    """An attempt's uncommitted files are in flight under a live lease, an orphan after it."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=5)
    _stage(run, c.attempt_id, "draft.json")
    assert run.orphaned_attempts(RUN) == []
    clock.t += 10
    (orphan,) = run.orphaned_attempts(RUN)
    assert (orphan.unit, orphan.attempt_id, orphan.files) == ("U1", "U1/a1", ["draft.json"])


def test_current_pointers_follow_the_commits_that_state_them(run: Store) -> None:
    """current_attempts is the latest pointer per unit; current_history lists each change
    with the version that made it; None means no longer current."""
    run.commit_checkpoint(RUN, "main", 0, {"a": 1}, current={"U1": "U1/a1"})
    run.commit_checkpoint(RUN, "main", 1, {"b": 1}, current={"U1": "U1/a2", "U2": "U2/a1"})
    run.commit_checkpoint(RUN, "main", 2, {"c": 1})
    run.commit_checkpoint(RUN, "main", 3, {"d": 1}, current={"U1": None})
    assert run.current_attempts(RUN) == {"U2": "U2/a1"}
    assert [(c.version, c.unit, c.attempt_id) for c in run.current_history(RUN)] == [
        (1, "U1", "U1/a1"), (2, "U1", "U1/a2"), (2, "U2", "U2/a1"), (4, "U1", None)]
    assert run.current_attempts("other-run") == {}


def test_a_fork_starts_with_the_current_pointers_of_its_fork_point(run: Store) -> None:
    """fork_branch copies the pointers as of the fork version; later changes stay apart."""
    run.commit_checkpoint(RUN, "main", 0, {"a": 1}, current={"U1": "U1/a1"})
    run.commit_checkpoint(RUN, "main", 1, {"b": 1}, current={"U1": "U1/a2"})
    run.fork_branch(RUN, "main", 1, "alt")
    assert run.current_attempts(RUN, "alt") == {"U1": "U1/a1"}
    run.commit_checkpoint(RUN, "alt", 1, {"c": 1}, current={"U2": "U2/a1"})
    assert run.current_attempts(RUN, "alt") == {"U1": "U1/a1", "U2": "U2/a1"}
    assert run.current_attempts(RUN) == {"U1": "U1/a2"}
    assert [(c.branch_id, c.version, c.unit) for c in run.current_history(RUN, "alt")] == [
        ("main", 1, "U1"), ("alt", 2, "U2")]


def test_a_stray_folder_with_no_attempt_row_is_an_orphan(run: Store) -> None:
    """A folder no claim made (left by hand) is listed with has_row False, beside the
    uncommitted attempts; a full walk finds the same, and max_folders bounds it."""
    c = run.claim(RUN, "main", "U1", expected_version=0, owner="o", lease_seconds=60)
    run.release_lease(RUN, "main", "U1", c.fencing_token)
    _stage(run, c.attempt_id, "draft.json")
    _stage(run, "U1/a7", "left-by-hand.json")
    _stage(run, "U9/a1", "left-by-hand.json")
    found = [(o.attempt_id, o.has_row, o.files) for o in run.orphaned_attempts(RUN)]
    assert found == [("U1/a1", True, ["draft.json"]), ("U1/a7", False, ["left-by-hand.json"]),
                     ("U9/a1", False, ["left-by-hand.json"])]
    assert [(o.attempt_id, o.has_row, o.files)
            for o in run.orphaned_attempts(RUN, full=True, max_folders=1)] == found
