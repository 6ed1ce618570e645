"""Recovery: idempotent, repairs changed or lost artifacts by invalidation, refuses a newer
schema, never quarantines in-flight or committed work, and keeps retry bounds."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.engine.gateway.client import ModelResult
from keepstep.engine.run.recovery import recover
from keepstep.storage import SCHEMA_VERSION, SchemaTooNew
from keepstep.storage.hashing import file_sha256
from tests.support.engine_harness import (
    RUN,
    StepClock,
    calls_by_attempt,
    ledger_ids,
    make_small_project,
    redone_units,
    run_worker,
)
from tests.support.small_project import extract_only_units


@pytest.fixture
def done(tmp_path: Path) -> Path:
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    return root


def _outputs(run: Any) -> dict[str, dict[str, str]]:
    return {u: {n: o.sha256 for n, o in r.outputs.items()}
            for u, r in run.facts_records().items()}


def test_running_recovery_twice_is_harmless(tmp_path: Path) -> None:
    """A recovery with work (an expired lease of a vanished executor, its staged file, a
    source edit) does it once; the second one finds nothing and commits nothing."""
    root = make_small_project(tmp_path / "small")
    clock = StepClock()
    with open_project(root, clock=clock) as p:
        run = p.start_run(RUN)
        run.run(max_units=2)
        head = run.head().version
        claim = p.store.claim(RUN, "main", "U03", expected_version=head,
                              owner="elsewhere:1:gone", lease_seconds=30)
        p.store.artifacts.stage(RUN, claim.attempt_id, "evidence.json", b"{}\n",
                                media_type="application/json", producer_version="test",
                                created_at="2030-01-01T00:00:00Z")
        src = root / "sources" / "A2-household-demand.md"
        src.write_text(src.read_text() + "\nAn added line.\n")
        clock.advance(60)

        first = recover(run)
        assert not first.blocked and first.did_work
        assert first.fenced == ["U03/a1"] and first.orphans == ["U03/a1"]
        assert first.changes and len(first.commits) == 1
        events = len(run.events())
        head = run.head().version

        second = recover(run)
        assert not second.blocked and not second.did_work
        assert second.fenced == second.orphans == second.changes == second.commits == []
        assert run.head().version == head
        new = [e.kind for e in run.events()[events:]]
        assert new == ["recovery.started", "recovery.audited", "recovery.done"]
        assert run.store.get_budget(RUN).used.get("recoveries") == 1


@pytest.mark.parametrize("damage", ["changed", "missing", "truncated"])
def test_damaged_current_artifact_invalidates_the_unit_and_its_dependents(
        done: Path, damage: str) -> None:
    """A changed byte, a deleted file or a file cut short of a current output (a deleted or
    cut-short file is what a power cut leaves where a file system did not keep a committed
    file's name or bytes): the unit and its dependents are invalidated with an explanation
    naming the file, the unit is redone, and nothing else is called again."""
    before_calls = calls_by_attempt(done)
    with open_project(done) as p:
        run = p.get_run(RUN)
        before = _outputs(run)
        rel = run.facts_records()["U03"].outputs["evidence.json"].path
        path = p.store.artifacts.root / rel
        if damage == "changed":
            path.chmod(stat.S_IWUSR | stat.S_IRUSR)
            data = bytearray(path.read_bytes())
            data[10] ^= 0x01
            path.write_bytes(bytes(data))
        elif damage == "truncated":
            path.chmod(stat.S_IWUSR | stat.S_IRUSR)
            os.truncate(path, path.stat().st_size // 2)
        else:
            path.unlink()
        events: list[dict] = []
        status = run.resume(on_event=events.append)
        assert status.decision == "done", status.reasons
        audited = next(e for e in events if e["kind"] == "recovery.audited")
        assert any(pr.startswith("U03:") for pr in audited["artifact_problems"])
        assert any(rel in pr for pr in audited["artifact_problems"])
        [repair] = run.events(kinds=["decision.repair"])
        invalidated = repair.payload["invalidated"]
        assert set(invalidated) == {"U03", "U05", "U06", "U07", "U08"}
        assert all(invalidated[u] for u in invalidated)  # each carries its explanation
        assert "U05" in " ".join(invalidated["U05"]) and "U03" in " ".join(invalidated["U05"])
        records = run.facts_records()
        assert records["U03"].attempt == "U03/a2"
        assert _outputs(run) == before  # deterministic units: the same bytes again
        for u in ("U05", "U06", "U07", "U08"):  # redone, or kept by the early cut-off
            assert records[u].attempt.endswith("/a2") or records[u].cutoff_note, u
        assert records["U04"].attempt == "U04/a1" and records["U01"].attempt == "U01/a1"
    after_calls = calls_by_attempt(done)
    assert "U03" in redone_units(after_calls)
    assert ledger_ids(after_calls)["U04"] == ledger_ids(before_calls)["U04"]


def _fingerprint(db: Path) -> dict[str, str]:
    # The -shm index is not data: a read-only open of a WAL database may create it.
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(db.parent.glob(db.name + "*"))
            if p.stat().st_size and not p.name.endswith("-shm")}


def test_newer_schema_is_refused_clearly_and_left_untouched(done: Path) -> None:
    """A database stamped by a newer keepstep: a clear error naming both versions and the
    fix, from the API and from a worker process (no traceback), and not a byte changed."""
    db = done / ".keepstep" / "state.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _fingerprint(db)
    with pytest.raises(SchemaTooNew) as err:
        open_project(done)
    text = str(err.value)
    assert str(SCHEMA_VERSION + 1) in text and "upgrade keepstep" in text
    worker = run_worker(done)
    assert worker.returncode == 2 and "Traceback" not in worker.stderr
    assert "upgrade keepstep" in worker.stderr
    assert _fingerprint(db) == before


class _InvalidJSONGateway:
    """Answers every call with JSON that has no evidence list: the extract validators fail.
    Each answer differs (a call counter), like a sampling model's: an attempt whose rejected
    answers repeat byte for byte would not be retried (issue 21)."""

    calls = 0

    def complete(self, ctx: Any, request: Any, **_estimates: Any) -> ModelResult:
        type(self).calls += 1
        return ModelResult(content=json.dumps({"answer": "none", "call": type(self).calls}),
                           model=request.model,
                           tokens_in=1, tokens_out=1, cost=0.0, latency_ms=0,
                           request_hash="x")


def test_recovery_keeps_failed_attempts_counted_toward_retry_bounds(tmp_path: Path) -> None:
    """Failed attempts that staged files are quarantined by recovery but keep their status,
    so a restart between retries does not reset max_unit_retries."""
    root = make_small_project(tmp_path / "small", per_group=1, units=extract_only_units(1))
    with open_project(root, gateway_factory=lambda _l: _InvalidJSONGateway()) as p:
        run = p.start_run(RUN)
        run.run(max_units=2)  # two failed attempts, then the process "restarts"
        assert [a.status for a in p.store.attempts(RUN)] == ["failed", "failed"]
        status = run.resume()
        assert status.units["E01"].state == "failed"
        attempts = p.store.attempts(RUN)
        assert [a.status for a in attempts] == ["failed"] * 3  # 1 + max_unit_retries (2)
        orphans = {o.attempt_id for o in p.store.orphaned_attempts(RUN)}
        assert orphans == {"E01/a1", "E01/a2", "E01/a3"}  # listed, never promoted
        assert recover(run).orphans == ["E01/a3"]  # quarantined once, status kept
        assert [a.status for a in p.store.attempts(RUN)] == ["failed"] * 3
        again = recover(run)
        assert not again.did_work, again


def test_recovery_never_quarantines_an_attempt_claimed_during_its_scan(tmp_path: Path) -> None:
    """An executor that claims and stages while another's recovery looks for orphans keeps
    its attempt: it is in flight, not an orphan, and its commit goes through."""
    root = make_small_project(tmp_path / "small")
    with open_project(root, executor_id="A:1:a") as pa, \
            open_project(root, executor_id="B:2:b") as pb:
        run_a = pa.start_run(RUN)
        run_a.run(max_units=2)
        staged: dict[str, Any] = {}
        real_scan = pb.store.orphaned_attempts

        def scan_as_a_claims(run_id: str, **kwargs: Any) -> Any:
            # A claims U03 and stages a file just as B's recovery starts its orphan scan.
            head = pa.store.get_head(RUN).version
            claim = pa.store.claim(RUN, "main", "U03", expected_version=head,
                                   owner="A:1:a", lease_seconds=30)
            entry = pa.store.artifacts.stage(
                RUN, claim.attempt_id, "evidence.json", b'{"evidence": []}\n',
                media_type="application/json", producer_version="test",
                created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ"))
            staged.update(claim=claim, entry=entry)
            return real_scan(run_id, **kwargs)

        pb.store.orphaned_attempts = scan_as_a_claims  # type: ignore[method-assign]
        report = recover(pb.get_run(RUN))
        assert report.orphans == [], report
        claim = staged["claim"]
        assert pa.store.get_attempt(RUN, claim.attempt_id).status == "claimed"
        assert not pa.get_run(RUN).events(kinds=["recovery.orphan"])
        version = pa.store.commit_checkpoint(
            RUN, "main", claim.claimed_at_version, {"probe": 1}, [staged["entry"]],
            claim.fencing_token, unit="U03", attempt_id=claim.attempt_id)
        assert version == claim.claimed_at_version + 1
        assert pa.store.get_attempt(RUN, claim.attempt_id).status == "committed"


def test_a_head_that_keeps_moving_stops_recovery_instead_of_recursing(done: Path,
                                                                        monkeypatch) -> None:
    """When every change commit meets a moved head, recovery gives up after a bounded number
    of restarts with a message saying what to do — no RecursionError, nothing committed."""
    from keepstep.storage import CheckpointConflict

    src = done / "sources" / "A2-household-demand.md"
    src.write_text(src.read_text() + "\nAn added line.\n")
    with open_project(done) as p:
        run = p.get_run(RUN)
        head = run.head().version
        tries = []

        def always_moved(*args: Any, **kwargs: Any) -> int:
            tries.append(1)
            raise CheckpointConflict("the head moved")

        monkeypatch.setattr(p.store, "commit_checkpoint", always_moved)
        report = recover(run)
        assert report.blocked and "head kept moving" in report.reason
        assert 1 < len(tries) <= 10
        assert run.head().version == head
        restarts = run.events(kinds=["recovery.restarted"])
        assert len(restarts) == len(tries)


def test_a_claim_lost_with_a_power_cut_is_quarantined_and_its_unit_redone(
        tmp_path: Path) -> None:
    """A claim is not synced on its own. A power cut after it staged a file but before any
    durable write loses the claim and keeps the file: recovery quarantines the stray folder
    as an orphan, the unit's next claim takes the same attempt id and sets the leftover
    folder aside (``<attempt>.lost-t<token>``, named in an event), the unit commits its own
    file, and a second recovery finds nothing to do."""
    root = make_small_project(tmp_path / "small")
    db = root / ".keepstep" / "state.db"
    with open_project(root) as p:
        run = p.start_run(RUN)
        run.run(max_units=2)
        head = run.head().version
        src, dst = sqlite3.connect(db), sqlite3.connect(tmp_path / "synced.db")
        src.backup(dst)
        src.close()
        dst.close()
        claim = p.store.claim(RUN, "main", "U03", expected_version=head,
                              owner=f"localhost:{os.getpid()}:x", lease_seconds=30)
        p.store.artifacts.stage(RUN, claim.attempt_id, "evidence.json", b'{"lost": 1}\n',
                                media_type="application/json", producer_version="test",
                                created_at="2030-01-01T00:00:00Z")
    # The power cut: the database as last synced, the staged file still on disk.
    (tmp_path / "synced.db").replace(db)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)

    with open_project(root) as p:
        run = p.get_run(RUN)
        events: list[dict] = []
        status = run.resume(on_event=events.append)
        assert status.decision == "done", status.reasons
        orphaned = [e for e in events if e["kind"] == "recovery.orphan"]
        assert [e["attempt"] for e in orphaned] == ["U03/a1"]
        [aside] = run.events(kinds=["attempt.set_aside"])
        folder = aside.payload["folder"]
        assert aside.attempt_id == "U03/a1" and folder.startswith("U03/a1.lost-t")
        lost = p.store.artifacts.root / RUN / folder / "evidence.json"
        assert lost.read_bytes() == b'{"lost": 1}\n'
        assert not lost.stat().st_mode & 0o222  # quarantined: read-only
        record = run.facts_records()["U03"]
        assert record.attempt == "U03/a1"
        out = p.store.artifacts.root / record.outputs["evidence.json"].path
        assert out.read_bytes() != b'{"lost": 1}\n'
        assert file_sha256(str(out)) == record.outputs["evidence.json"].sha256
        again = recover(run)
        assert not again.blocked and not again.did_work and again.orphans == []
