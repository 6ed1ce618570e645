"""Small committed files ride in the commit: no fsync per unit, and a file that a restart of
the machine tore is rewritten from the database at recovery instead of redoing its unit."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import open_project
from keepstep.storage.sqlite.boot import boot_id
from keepstep.storage.sqlite.connection import SQLiteBase
from tests.support.dag_project import make_dag_project

RUN = "R"

pytestmark = pytest.mark.skipif(boot_id() is None, reason="no boot id here: files are synced")


def trivial_kind(ctx: Any) -> Any:
    from keepstep.engine.kinds.context import KindOutcome, ValidatorResult

    ctx.write("out.json", {"unit": ctx.unit.id})
    return KindOutcome(validators=[ValidatorResult(name="structure", passed=True)])


@pytest.fixture
def trivial() -> Iterator[None]:
    from keepstep.engine.kinds.context import REGISTRY

    old = REGISTRY["notes"]
    REGISTRY["notes"] = (old[0], trivial_kind)
    try:
        yield
    finally:
        REGISTRY["notes"] = old


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Write transactions (and which of them sync the WAL) and os.fsync calls, process-wide."""
    seen: Counter[str] = Counter()
    write = SQLiteBase._write
    real_fsync = os.fsync

    @contextlib.contextmanager
    def counted(self: SQLiteBase, *, durable: bool = True) -> Iterator[Any]:
        seen["write"] += 1
        seen["durable" if durable else "relaxed"] += 1
        with write(self, durable=durable) as db:
            yield db

    def fsync(fd: int) -> None:
        seen["fsync"] += 1
        real_fsync(fd)

    monkeypatch.setattr(SQLiteBase, "_write", counted)
    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _project(tmp_path: Path, n: int) -> Path:
    return make_dag_project(tmp_path / "p", {f"T{i:02d}": [] for i in range(n)})


def test_a_trivial_unit_in_the_run_loop_costs_at_most_two_syncs(
    tmp_path: Path, trivial: None, counts: Counter[str]
) -> None:
    """Units that stage one small file each: ≤ 2 write transactions and ≤ 2.5 durable syncs
    per unit once the run is going (the claim and the commit; no file fsync)."""
    root = _project(tmp_path, 14)
    with open_project(root) as p:
        run = p.start_run(RUN)
        run.run(jobs=1, max_units=2)
        counts.clear()
        run.run(jobs=1, max_units=10, recover=False)
        assert sum(r.state == "succeeded" for r in run.facts_records().values()) == 12
    units = 10
    assert counts["write"] / units <= 2
    assert (counts["durable"] + counts["fsync"]) / units <= 2.5
    assert counts["fsync"] == 0


def _lose_output(root: Path, unit: str, *, earlier_boot: bool) -> tuple[Path, bytes, str]:
    with open_project(root) as p:
        run = p.get_run(RUN)
        rec = run.facts_records()[unit]
        path = p.store.artifacts.root / rec.outputs["out.json"].path
    data = path.read_bytes()
    path.chmod(0o600)
    path.write_bytes(data[: len(data) // 2])  # torn, as an unsynced file after a power cut
    if earlier_boot:  # the machine restarted since these bytes were committed
        db = sqlite3.connect(root / ".keepstep" / "state.db")
        with db:
            db.execute("UPDATE blobs SET boot_id = 'an earlier boot'")
        db.close()
    return path, data, rec.attempt


def test_an_output_torn_by_a_restart_is_rewritten_from_the_commit_not_redone(
    tmp_path: Path, trivial: None
) -> None:
    """After a restart of the machine a torn current output is rewritten from the bytes its
    commit kept: no artifact problem, no new attempt, the same bytes on disk."""
    root = _project(tmp_path, 3)
    with open_project(root) as p:
        assert p.start_run(RUN).run(jobs=1).decision == "done"
    path, data, attempt = _lose_output(root, "T01", earlier_boot=True)
    with open_project(root) as p:
        run = p.get_run(RUN)
        report = run.recover()
        assert report.artifact_problems == [] and report.invalidated == []
        assert run.facts_records()["T01"].attempt == attempt
    assert path.read_bytes() == data


def test_an_output_damaged_in_the_boot_that_committed_it_is_still_redone(
    tmp_path: Path, trivial: None
) -> None:
    """Without a restart since the commit, damage is someone's change: recovery reports it
    and the unit runs again (the kept bytes never paper over an edit)."""
    root = _project(tmp_path, 3)
    with open_project(root) as p:
        assert p.start_run(RUN).run(jobs=1).decision == "done"
    _path, _data, attempt = _lose_output(root, "T01", earlier_boot=False)
    with open_project(root) as p:
        run = p.get_run(RUN)
        report = run.recover()
        assert any(problem.startswith("T01:") for problem in report.artifact_problems)
        assert run.run(jobs=1, recover=False).decision == "done"
        assert run.facts_records()["T01"].attempt != attempt
