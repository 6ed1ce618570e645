"""gc: never a current or referenced artifact; orphans and old attempts go after the window."""

from __future__ import annotations

import shutil
import stat
import time
from pathlib import Path

import pytest

from keepstep.engine import open_project
from keepstep.engine.run.maintenance import gc_project
from keepstep.storage import EventIn, SQLiteStore, gc
from keepstep.storage.hashing import file_sha256

PACK = Path(__file__).resolve().parent.parent / "sample_projects" / "market-entry"
RUN = "ME-042"
APPROVE = {"audience": "product team"}
DAY = 86_400.0


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    for p in dest.rglob("*"):
        if p.is_file():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dest


@pytest.fixture(scope="module")
def done_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pack run to done once; each test works on a copy."""
    root = tmp_path_factory.mktemp("done") / "project"
    shutil.copytree(PACK, root, ignore=shutil.ignore_patterns(".keepstep"))
    with open_project(root) as project:
        assert project.open_or_start(RUN).run(approve=APPROVE).decision == "done"
    return root


def _current_outputs(project) -> dict[str, str]:
    """artifact path -> sha256 of every current unit output."""
    return {ref.path: ref.sha256 for rec in project.get_run(RUN).facts_records().values()
            if rec.state.value == "succeeded" for ref in rec.outputs.values()}


def _assert_current_outputs_verify(project) -> None:
    root = project.store.artifacts.root
    outputs = _current_outputs(project)
    assert outputs
    for path, sha in outputs.items():
        assert (root / path).is_file(), path
        assert file_sha256(str(root / path)) == sha, path


def test_gc_never_deletes_current_artifacts_and_the_run_still_resumes(
    done_project: Path, tmp_path: Path
) -> None:
    """On a finished run, gc with a zero window keeps every current attempt; resume and the
    chain stay good."""
    root = _copy(done_project, tmp_path / "p")
    with open_project(root) as project:
        report = gc_project(project, 0)
        assert report.deleted == []
        assert report.kept and all(i.reason.startswith("current") for i in report.kept)
        assert report.events_stripped > 0
        _assert_current_outputs_verify(project)
        run = project.get_run(RUN)
        assert run.run(approve=APPROVE).decision == "done"
        assert project.store.verify_chain(RUN).ok
        assert all(e.payload == {} for e in project.store.events(RUN, kinds=["unit.claimed"]))


def _make_orphan(project) -> Path:
    """Claim a unit, stage a file, lose the lease: the files of a crashed attempt."""
    store = project.store
    head = store.get_head(RUN).version
    claim = store.claim(RUN, "main", "U01", expected_version=head, owner="ghost",
                        lease_seconds=60)
    store.artifacts.stage(RUN, claim.attempt_id, "draft.json", b"{}",
                          media_type="application/json", producer_version="test",
                          created_at="2024-01-01T00:00:00+00:00")
    store.release_lease(RUN, "main", "U01", claim.fencing_token)
    store.set_attempt_status(RUN, claim.attempt_id, "fenced")
    return store.artifacts.attempt_dir(RUN, claim.attempt_id)


def test_orphans_are_listed_within_the_window_and_deleted_after_it(
    done_project: Path, tmp_path: Path
) -> None:
    """An orphan younger than the window is kept and listed with why; past it, it is deleted."""
    root = _copy(done_project, tmp_path / "p")
    with open_project(root) as project:
        orphan = _make_orphan(project)
        now = time.time()
        early = gc_project(project, 7, now=now)
        (listed,) = [i for i in early.kept if i.attempt_id == "U01/a2"]
        assert "orphan" in listed.reason and "within the 7-day window" in listed.reason
        assert listed.files == ["draft.json"] and orphan.is_dir()
        late = gc_project(project, 7, now=now + 8 * DAY)
        assert [i.attempt_id for i in late.deleted] == ["U01/a2"]
        assert "orphan" in late.deleted[0].reason and not orphan.exists()
        assert late.bytes_freed == 2
        assert project.store.events(RUN, kinds=["maintenance.gc"])[-1].payload["deleted"] == [
            "U01/a2"]
        _assert_current_outputs_verify(project)
        assert project.get_run(RUN).run(approve=APPROVE).decision == "done"


def test_invalidated_attempts_are_deleted_after_the_window_and_current_ones_stay(
    done_project: Path, tmp_path: Path
) -> None:
    """After a source edit re-runs some units, gc deletes their old attempts only."""
    root = _copy(done_project, tmp_path / "p")
    source = sorted((root / "sources").glob("A*.md"))[0]  # A1 is a PDF: edit a Markdown one
    source.write_text(source.read_text() + "\nA late correction to the overview.\n")
    with open_project(root) as project:
        assert project.get_run(RUN).run(approve=APPROVE).decision == "done"
        current = {rec.attempt for rec in project.get_run(RUN).facts_records().values()}
        report = gc_project(project, 0)
        deleted = {i.attempt_id for i in report.deleted}
        assert deleted and not deleted & current
        assert all(i.reason.startswith("invalidated") for i in report.deleted)
        assert {i.attempt_id for i in report.kept} == current
        _assert_current_outputs_verify(project)
        assert project.get_run(RUN).run(approve=APPROVE).decision == "done"
        assert project.store.verify_chain(RUN).ok


class FakeClock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def _commit_attempt(store: SQLiteStore, unit: str, data: bytes) -> str:
    head = store.get_head("R").version
    claim = store.claim("R", "main", unit, expected_version=head, owner="o", lease_seconds=60)
    entry = store.artifacts.stage("R", claim.attempt_id, "out.json", data,
                                  media_type="application/json", producer_version="test",
                                  created_at="2024-01-01T00:00:00+00:00")
    record = {"state": "succeeded", "attempt": claim.attempt_id,
              "outputs": {"out.json": {"sha256": entry.sha256, "path": entry.path}}}
    store.commit_checkpoint("R", "main", head, {f"unit:{unit}": record}, [entry],
                            claim.fencing_token, unit=unit, attempt_id=claim.attempt_id,
                            current={unit: claim.attempt_id})
    return entry.sha256


def test_gc_keeps_files_bound_to_an_approval_or_named_by_the_effect_ledger(
    tmp_path: Path
) -> None:
    """Superseded attempts go, except one an approval is bound to and one the ledger names."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / ".keepstep", clock=clock)
    try:
        store.create_run("R", {"plan": "p"})
        bound_sha = _commit_attempt(store, "U1", b'"approved draft"')
        _commit_attempt(store, "U1", b'"final"')
        _commit_attempt(store, "U2", b'"sent"')
        _commit_attempt(store, "U2", b'"resent"')
        _commit_attempt(store, "U3", b'"old"')
        _commit_attempt(store, "U3", b'"new"')
        store.create_approval_request(
            request_id="req-1", run_id="R", branch_id="main", gate_id="publish", unit="U1",
            question="Publish?", options=[{"label": "yes"}],
            bound_object={"artifact_unit": "U1", "artifact": [bound_sha]},
            token_hash=None, token_expires_at=None)
        store.record_effect_intent(
            idem_key="k-1", run_id="R", branch_id="main", unit="U2", attempt_id="U2/a1",
            action="send", adapter="file-drop", request_hash="h", fencing_token=None, plan_n=1,
            detail={"request": {"file": "R/U2/a1/out.json"}})
        report = gc(tmp_path, 0, clock.t + 1, store=store)
        assert [i.attempt_id for i in report.deleted] == ["U3/a1"]
        kept = {i.attempt_id: i.reason for i in report.kept}
        assert "approval req-1" in kept["U1/a1"]
        assert "side-effect ledger" in kept["U2/a1"]
        assert all(kept[a].startswith("current") for a in ("U1/a2", "U2/a2", "U3/a2"))
        assert not store.artifacts.attempt_dir("R", "U3/a1").exists()
        assert store.artifacts.attempt_dir("R", "U1/a1").is_dir()
    finally:
        store.close()


def test_gc_drops_the_kept_copies_of_the_files_it_deletes_only(tmp_path: Path) -> None:
    """The database's copy of a small committed file goes with the last folder holding it;
    copies of current files (and of bytes another kept file shares) stay."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / ".keepstep", clock=clock)
    try:
        store.create_run("R", {"plan": "p"})
        old = _commit_attempt(store, "U1", b'"old"')
        shared = _commit_attempt(store, "U2", b'"same"')
        current = _commit_attempt(store, "U1", b'"new"')
        assert _commit_attempt(store, "U2", b'"same"') == shared
        report = gc(tmp_path, 0, clock.t + 1, store=store)
        assert sorted(i.attempt_id for i in report.deleted) == ["U1/a1", "U2/a1"]
        assert report.kept_copies_dropped == 1
        assert store.blob(old) is None
        assert store.blob(current) == b'"new"' and store.blob(shared) == b'"same"'
        assert gc(tmp_path, 0, clock.t + 1, store=store).kept_copies_dropped == 0
    finally:
        store.close()


def test_gc_strips_event_payloads_older_than_the_window_and_keeps_metadata(
    tmp_path: Path
) -> None:
    """Old events keep kind, unit and time but lose their payload; recent ones keep it."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / ".keepstep", clock=clock)
    try:
        store.create_run("R", {"plan": "p"}, events=[EventIn(kind="note", payload={"x": 1})])
        clock.t += 10 * DAY
        store.append_event("R", "note", unit="U1", payload={"x": 2})
        report = gc(tmp_path, 7, clock.t, store=store)
        assert report.events_stripped == 1  # run.created carries no payload
        old, new = store.events("R", kinds=["note"])
        assert (old.kind, old.payload) == ("note", {})
        assert (new.kind, new.unit, new.payload) == ("note", "U1", {"x": 2})
    finally:
        store.close()


def test_the_stores_current_pointers_match_the_engines_records_after_the_story(
    story_dir: Path,
) -> None:
    """After the ME-042 story (crashes, invalidations, a plan change, cut-offs) the pointers
    gc and backup read name exactly the attempts the engine's records hold as current."""
    with open_project(story_dir) as project:
        records = project.get_run(RUN).facts_records()
        current = {u: r.attempt for u, r in records.items() if r.state.value == "succeeded"}
        assert len(current) == 36
        assert project.store.current_attempts(RUN) == current
