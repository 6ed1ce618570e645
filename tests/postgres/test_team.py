"""The team store end to end: executors in separate project folders (as separate hosts)
sharing one run on PostgreSQL; committed artifacts any host reads; moving a project between
SQLite and PostgreSQL; `validate` against a server."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.storage.postgres import PostgresStore
from tests.support.engine_harness import (
    RUN,
    finish,
    make_small_project,
    second_host,
    start_worker,
)
from tests.support.fake_provider import running_provider

pytestmark = pytest.mark.postgres


def two_hosts(tmp_path: Path, **project: str) -> tuple[Path, Path]:
    """The small project in two folders: host A starts the run, host B is a checkout."""
    a = make_small_project(tmp_path / "hostA" / "small", per_group=3, **project)
    return a, second_host(a, tmp_path)


def committed_once(store: PostgresStore) -> Counter[str]:
    return Counter(a.unit for a in store.attempts(RUN) if a.status == "committed")


def test_two_hosts_share_one_run(tmp_path: Path, pg_url: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers in two project folders on one PostgreSQL store: each unit committed once, the
    chain verified, both did work, and host B holds every committed file (fetched by
    hash from the server)."""
    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    # The offline model answers in microseconds: one worker would finish every unit before
    # the other started. Its answers come from a local provider with a latency per call, so
    # the two hosts overlap (as in test_engine_executors).
    with running_provider(latency=0.4, offline=True) as provider:
        a, b = two_hosts(tmp_path, default_model="openai/fake-model",
                         api_base=provider.api_base)
        with open_project(a) as p:
            p.start_run(RUN).run(max_units=2)  # intake, so both workers meet ready units
            assert not (a / ".keepstep" / "state.db").exists()
        workers = [start_worker(a, executor_id="hostA:1:a"),
                   start_worker(b, executor_id="hostB:2:b")]
        results = [finish(w) for w in workers]
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]
    store = PostgresStore(b / ".keepstep", pg_url)
    try:
        assert store.verify_chain(RUN).ok
        units = {c.unit for c in store.list_checkpoints(RUN) if c.kind == "unit-success"}
        counts = committed_once(store)
        assert set(counts) == units and set(counts.values()) == {1}, counts
        owners = {a.executor.split(":")[0] for a in store.attempts(RUN)
                  if a.unit not in ("U01", "U02")}
        assert owners == {"hostA", "hostB"}
        assert store.artifacts.verify(store.manifest(RUN)) == []  # all present on host B
    finally:
        store.close()
    with open_project(b) as p:
        status = p.get_run(RUN).status()
        assert status.decision == "done"


def test_a_commit_stores_its_files_and_another_host_fetches_them(tmp_path: Path,
                                                                 pg_url: str) -> None:
    from tests.store.contract import stage

    a = PostgresStore(tmp_path / "a" / ".keepstep", pg_url)
    try:
        a.create_run(RUN, {})
        c = a.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=30)
        entry = stage(a, c.attempt_id, data=b'{"answer": 42}')
        a.commit_checkpoint(RUN, "main", 0, {"unit:U1": {"state": "succeeded"}}, [entry],
                            c.fencing_token, unit="U1", attempt_id=c.attempt_id)
        assert a.blob(entry.sha256) == b'{"answer": 42}'
    finally:
        a.close()
    b = PostgresStore(tmp_path / "b" / ".keepstep", pg_url)
    try:
        path = b.artifacts.path_of(entry)
        assert path.read_bytes() == b'{"answer": 42}'
        path.chmod(0o600)
        path.unlink()
        assert b.sync_artifacts(RUN) == 0  # incremental: rows already seen
        c2 = b.claim(RUN, "main", "U2", expected_version=1, owner="b", lease_seconds=30)
        assert c2.fencing_token == 2
    finally:
        b.close()
    fresh = PostgresStore(tmp_path / "b" / ".keepstep", pg_url)
    try:
        assert fresh.artifacts.path_of(entry).read_bytes() == b'{"answer": 42}'
    finally:
        fresh.close()


def test_a_failed_commit_stores_no_blob(tmp_path: Path, pg_url: str) -> None:
    from keepstep.storage import CheckpointConflict
    from tests.store.contract import stage

    s = PostgresStore(tmp_path / ".keepstep", pg_url)
    try:
        s.create_run(RUN, {})
        c = s.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=30)
        entry = stage(s, c.attempt_id, data=b"lost")
        with pytest.raises(CheckpointConflict):
            s.commit_checkpoint(RUN, "main", 5, {"x": 1}, [entry], c.fencing_token, unit="U1",
                                attempt_id=c.attempt_id)
        assert s.blob(entry.sha256) is None
    finally:
        s.close()


def test_move_a_project_to_postgres_and_home_again(tmp_path: Path, pg_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from keepstep.engine.store import move_store

    monkeypatch.delenv("KEEPSTEP_STORE_URL", raising=False)
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        before = p.start_run(RUN).run(max_units=3)
        head = p.get_run(RUN).store.get_head(RUN)
    moved = move_store(root, pg_url)
    assert moved.runs == [RUN] and moved.blobs > 0 and moved.checked_versions == head.version + 1
    assert f'url = "{pg_url}"' in (root / "keepstep.toml").read_text()
    assert not (root / ".keepstep" / "state.db").exists()
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.store.get_head(RUN) == head
        assert run.status().counts == before.counts
        final = run.resume()
        assert final.decision == "done"
        head2 = run.store.get_head(RUN)
    shutil.rmtree(root / ".keepstep" / "artifacts" / RUN / "U01")  # fetched back on the way
    home = move_store(root, "sqlite")
    assert home.runs == [RUN] and (root / ".keepstep" / "artifacts" / RUN / "U01").is_dir()
    assert "[store]" not in (root / "keepstep.toml").read_text()
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.store.get_head(RUN) == head2
        assert run.store.verify_chain(RUN).ok
        assert run.store.artifacts.verify(run.store.manifest(RUN)) == []
        assert run.status().decision == "done"


def test_validate_reaches_the_server_without_writing(tmp_path: Path, pg_server: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    from keepstep.engine.run.validation import validate_project
    from tests.support.pg_fixtures import drop_database, with_database

    root = make_small_project(tmp_path / "small")
    name = f"ks_validate_{id(tmp_path) % 100000}"
    with psycopg.connect(with_database(pg_server, "postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    url = with_database(pg_server, name)
    try:
        monkeypatch.setenv("KEEPSTEP_STORE_URL", url)
        report = validate_project(root, models=False)
        assert report.ok and "no keepstep schema yet" in report.store
        with psycopg.connect(url) as conn:  # nothing was created
            assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = "
                                "'public'").fetchone() == (0,)
        monkeypatch.setenv("KEEPSTEP_STORE_URL", url.replace(url.split("/")[2], "127.0.0.1:1"))
        report = validate_project(root, models=False)
        assert not report.ok and "cannot be reached" in report.problems[0].message
    finally:
        drop_database(pg_server, url)


def test_a_host_whose_source_differs_leaves_only_its_readers_to_the_other(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host B's copy of one approved source differs from the bytes the run recorded: B's
    worker names the file, runs every unit that does not read it (directly, by its group,
    or through the evidence it checks) and leaves those that do; it records no input
    change. Host A's worker then runs the units B left: every unit committed once, the
    chain verified, the run done."""
    import subprocess
    import sys

    from tests.support.engine_harness import REPO, worker_env

    monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
    a, b = two_hosts(tmp_path)
    with open_project(a) as p:
        p.start_run(RUN).run(max_units=2)  # U01 (inventory) and U02 by host A
        store = p.get_run(RUN).store
        inputs = store.read_key(RUN, "inputs")
        source = next(s for s in p.files.sources.sources if s.approved and s.group == "A")
    with (b / source.path).open("a", encoding="utf-8") as f:
        f.write("\nedited on host B only\n")
    readers = {"U01", "U03", "U05", "U06", "U07", "U08"}  # group A, or evidence from it

    def worker(root: Path) -> tuple[str, str, int]:
        """(the worker's executor-id part ":pid:", its stderr, its exit code)."""
        proc = subprocess.Popen([sys.executable, "-m", "keepstep.app.cli", "worker", str(root),
                                 "--run", RUN, "-q", "-j", "2"], env=worker_env(), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _out, err = proc.communicate(timeout=300)
        return f":{proc.pid}:", err, proc.returncode

    host_b, err, code = worker(b)
    assert code == 0, err[-2000:]
    assert source.path in err and "differs from the approved sha256" in err
    assert "U03" in err
    observer = PostgresStore(tmp_path / "observer" / ".keepstep", pg_url, sync=False)
    try:
        by_b = {x.unit for x in observer.attempts(RUN) if host_b in x.executor}
        assert by_b == {"U04"}  # every unit B could run: U02 was done, the rest read A
        assert not by_b & readers
        assert observer.read_key(RUN, "inputs") == inputs  # B's copy is not the team's
        assert not [e for e in observer.events(RUN) if e.kind.startswith("decision.input")]
    finally:
        observer.close()
    host_a, err, code = worker(a)
    assert code == 0, err[-2000:]
    observer = PostgresStore(tmp_path / "observer" / ".keepstep", pg_url, sync=False)
    try:
        assert observer.verify_chain(RUN).ok
        counts = committed_once(observer)
        assert set(counts) == readers | {"U02", "U04"} and set(counts.values()) == {1}
        assert {x.unit for x in observer.attempts(RUN)
                if host_a in x.executor} == readers - {"U01"}
        assert observer.read_key(RUN, "inputs") == inputs
    finally:
        observer.close()
    with open_project(a) as p:
        assert p.get_run(RUN).status().decision == "done"


def test_a_host_has_the_files_of_every_head_it_reads(tmp_path: Path, pg_url: str) -> None:
    """Host B is open while host A commits: the next time B reads the head, A's files are
    already on B (recovery on B re-hashes current outputs; they must not look missing)."""
    from tests.store.contract import stage

    a = PostgresStore(tmp_path / "a" / ".keepstep", pg_url)
    b = PostgresStore(tmp_path / "b" / ".keepstep", pg_url)
    try:
        a.create_run(RUN, {})
        assert b.get_head(RUN).version == 0
        c = a.claim(RUN, "main", "U1", expected_version=0, owner="a", lease_seconds=30)
        entry = stage(a, c.attempt_id, data=b"from host A")
        a.commit_checkpoint(RUN, "main", 0, {"unit:U1": {"state": "succeeded"}}, [entry],
                            c.fencing_token, unit="U1", attempt_id=c.attempt_id)
        assert not b.artifacts.path_of(entry).exists()
        assert b.get_head(RUN).version == 1
        assert b.artifacts.verify(b.manifest(RUN)) == []
    finally:
        a.close()
        b.close()
