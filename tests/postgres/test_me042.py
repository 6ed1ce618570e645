"""ME-042 on the team store: two workers in separate project folders (as two hosts) run the
pack to the end state a laptop reaches with SQLite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from tests.postgres.test_faults import assert_each_unit_committed_once, observer
from tests.support.engine_harness import RUN, copy_pack, finish, start_worker
from tests.support.fake_provider import running_provider
from tests.support.small_project import write_config

pytestmark = pytest.mark.postgres
APPROVE = {"audience": "product team"}


def outputs(root: Path) -> dict[str, dict[str, str]]:
    with open_project(root) as p:
        run = p.get_run(RUN)
        assert run.status().decision == "done"
        return {u: {n: o.sha256 for n, o in rec.outputs.items()}
                for u, rec in run.facts_records().items()}


def test_me042_on_two_hosts_reaches_the_laptop_end_state(
        tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The offline model answers in microseconds: one worker could finish every unit before
    # the other started. Every answer (the laptop's too, so that the end states compare)
    # comes from a local provider answering like the offline model with a latency per call,
    # so the two hosts overlap.
    with running_provider(latency=0.05, offline=True) as provider:
        model = {"default_model": "openai/fake-model", "api_base": provider.api_base}
        laptop = copy_pack(tmp_path / "laptop" / "me042")
        write_config(laptop, **model)
        monkeypatch.delenv("KEEPSTEP_STORE_URL", raising=False)
        with open_project(laptop) as p:
            assert p.start_run(RUN).run(approve=APPROVE, jobs=8).decision == "done"
        expected = outputs(laptop)

        monkeypatch.setenv("KEEPSTEP_STORE_URL", pg_url)
        a = copy_pack(tmp_path / "hostA" / "me042")
        write_config(a, **model)
        b = tmp_path / "hostB" / "me042"
        shutil.copytree(a, b)
        with open_project(a) as p:
            p.start_run(RUN).run(max_units=1)
        approve = ["--approve", "audience=product team"]
        workers = [start_worker(a, RUN, *approve, executor_id="hostA:1:a"),
                   start_worker(b, RUN, *approve, executor_id="hostB:2:b")]
        results = [finish(w, timeout=600) for w in workers]
    for r in results:
        assert r.returncode == 0, r.stderr[-2000:]
    got = outputs(b)
    assert set(got) == set(expected) and len(got) == 36
    differ = sorted(u for u in expected if expected[u] != got[u])
    assert differ in ([], ["U36"]), differ  # U36's change notes quote decision times
    store = observer(tmp_path, pg_url)
    try:
        assert_each_unit_committed_once(store)
        hosts = {x.executor.split(":")[0] for x in store.attempts(RUN)}
        assert {"hostA", "hostB"} <= hosts
    finally:
        store.close()
