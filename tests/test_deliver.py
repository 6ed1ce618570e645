"""The deliver kind: project adapters, one ledgered effect per file, crashes, resumes, errors.

A small 8-unit project (tests/support/small_project.py) plus U09, a deliver unit sending the
evidence table (U08) and the market-size synthesis (U06) through a configured adapter.
Crash tests run the worker as a subprocess that SIGKILLs itself at a named crash point.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from keepstep.engine.api import open_project
from keepstep.engine.core.plan import Plan, load_plan
from keepstep.engine.core.plan_checks import check_plan
from keepstep.engine.errors import ConfigError, PlanValidationError
from keepstep.engine.files.project import load_config
from keepstep.engine.kinds import expected_outputs, get_kind
from keepstep.engine.run.adapters import FileDropAdapter, WebhookAdapter
from tests.support.engine_harness import (
    RUN,
    in_flight_unit,
    make_small_project,
    run_worker,
    write_config,
)
from tests.support.small_project import PACK, small_units
from tests.support.webhook_server import WebhookServer

FILES = ("U08:evidence-table.csv", "U06:synthesis.md")
FILE_DROP = {"client_share": {"type": "file_drop", "target_dir": "../client-share"}}


def deliver_units(adapter: str = "client_share", files: tuple[str, ...] = FILES) -> list[dict]:
    return [*small_units(), {
        "id": "U09", "title": "Deliver to the client", "phase": "delivery", "kind": "deliver",
        "outputs": ["delivery.json"], "depends_on": ["U06", "U08"], "validators": ["delivered"],
        "required_final": True, "params": {"adapter": adapter, "files": list(files)}}]


@pytest.fixture
def share(tmp_path: Path) -> Path:
    folder = tmp_path / "client-share"
    folder.mkdir()
    return folder


@pytest.fixture
def project(tmp_path: Path, share: Path) -> Path:
    return make_small_project(tmp_path / "small", units=deliver_units(), adapters=FILE_DROP)


def run_project(root: Path) -> Any:
    with open_project(root) as p:
        return p.open_or_start(RUN).run()


def dropped(share: Path) -> list[str]:
    """Delivered files (temporary leftovers would start with a dot)."""
    return sorted(p.name for p in share.iterdir())


def ledger(root: Path) -> list[Any]:
    with open_project(root) as p:
        return p.store.effects(RUN)


def delivery(root: Path) -> dict[str, Any]:
    with open_project(root) as p:
        run = p.get_run(RUN)
        ref = run.facts_records()["U09"].outputs["delivery.json"]
        return json.loads((p.store.artifacts.root / ref.path).read_bytes())


def committed_bytes(root: Path, unit: str, name: str) -> bytes:
    with open_project(root) as p:
        ref = p.get_run(RUN).facts_records()[unit].outputs[name]
        return (p.store.artifacts.root / ref.path).read_bytes()


def assert_delivered_once(root: Path, share: Path) -> None:
    """Each file is in the share exactly once, byte-identical, with a committed receipt."""
    names = dropped(share)
    assert len(names) == len(FILES), names
    effects = ledger(root)
    assert len(effects) == len(FILES)
    for ref in FILES:
        unit, name = ref.split(":")
        [copy] = [n for n in names if n.endswith("--" + name)]
        assert (share / copy).read_bytes() == committed_bytes(root, unit, name)
        [row] = [e for e in effects if e.action.startswith(f"deliver:{name}@")]
        assert row.status == "committed" and row.adapter == "client_share"
        assert row.remote_id == str(share.resolve() / copy)
        assert copy.startswith(row.idem_key + "--")
    doc = delivery(root)
    assert [f["file"] for f in doc["files"]] == list(FILES)
    assert {f["status"] for f in doc["files"]} == {"committed"}
    assert {f["key"] for f in doc["files"]} == {e.idem_key for e in effects}


# --- configuration -----------------------------------------------------------------------
def test_adapters_are_built_from_keepstep_toml(project: Path, share: Path) -> None:
    """[adapters.NAME] tables become named adapters; a relative target_dir is the project's."""
    write_config(project, adapters={"crm": {"type": "webhook", "url": "http://127.0.0.1:9/hooks",
                                            "timeout_s": 3}})
    with open_project(project) as p:
        adapters = p.effect_adapters
        assert set(adapters) == {"client_share", "crm"}
        drop, hook = adapters["client_share"], adapters["crm"]
        assert isinstance(drop, FileDropAdapter) and isinstance(hook, WebhookAdapter)
        assert drop.name == "client_share" and drop.target_dir == share.resolve()
        assert hook.url == "http://127.0.0.1:9/hooks" and hook.timeout == 3
        assert p.effect_adapters is adapters
        p.reload()
        assert p.effect_adapters is not adapters


def test_an_unknown_adapter_type_is_a_config_error_naming_it(project: Path) -> None:
    """type = "ftp" is refused at load, naming the adapter and the allowed types."""
    write_config(project, adapters={"archive": {"type": "ftp", "host": "files.example"}})
    with pytest.raises(ConfigError) as err:
        load_config(project)
    assert "'archive'" in str(err.value) and "file_drop, webhook" in str(err.value)


def test_adapter_config_errors_are_config_errors(project: Path) -> None:
    """A drop inside the project, a missing field or a non-http URL is refused at load."""
    bad = [
        {"type": "file_drop", "target_dir": "deliveries"},
        {"type": "file_drop"},
        {"type": "webhook", "url": "file:///etc/passwd"},
        {"type": "webhook", "url": "http://127.0.0.1/hooks", "token": "secret"},
    ]
    base = tomllib.loads((project / "keepstep.toml").read_text())
    for table in bad:
        (project / "keepstep.toml").write_text(tomli_w.dumps({**base, "adapters": {"out": table}}))
        with pytest.raises(ConfigError, match="out"):
            load_config(project)


def test_validate_refuses_a_webhook_url_carrying_credentials(project: Path) -> None:
    """`keepstep validate` refuses a webhook URL with a user and password, says where
    credentials belong, and never prints the password (issue 13, item 2)."""
    import subprocess
    import sys

    base = tomllib.loads((project / "keepstep.toml").read_text())
    table = {"type": "webhook", "url": "https://ana:s3cret-pass@hooks.example.com/in"}
    (project / "keepstep.toml").write_text(tomli_w.dumps({**base, "adapters": {"crm": table}}))
    proc = subprocess.run([sys.executable, "-m", "keepstep.app.cli", "validate",
                           str(project)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "crm" in proc.stderr and "credentials" in proc.stderr
    assert "keyring or the environment" in proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr


def test_the_deliver_kind_is_registered_without_a_model() -> None:
    """deliver writes delivery.json, validates 'delivered' and calls no model."""
    spec, _ = get_kind("deliver")
    assert not spec.uses_model and spec.validators == ["delivered"]
    plan = Plan.model_validate({"unit": deliver_units()})
    assert expected_outputs(plan.unit_map()["U09"]) == ["delivery.json"]


def test_the_pack_readme_delivery_example_validates_against_the_pack() -> None:
    """The README's deliver unit, appended to the ME-042 plan, is a valid plan."""
    text = (PACK / "README.md").read_text()
    snippet = next(block for block in text.split("```toml\n")[1:]
                   if block.startswith("# plan.toml")).split("```", 1)[0]
    unit = tomllib.loads(snippet)["unit"][0]
    plan = load_plan(PACK / "plan.toml")
    assert len(plan.units) == 36
    data = plan.to_toml_dict()
    data["unit"].append(unit)
    check_plan(Plan.model_validate(data))
    assert get_kind(unit["kind"])[0].validators == unit["validators"]


# --- running ----------------------------------------------------------------------------
def test_a_run_delivers_each_file_exactly_once_with_a_receipt(project: Path,
                                                              share: Path) -> None:
    """The run copies each listed file once; the ledger holds a committed effect each."""
    status = run_project(project)
    assert status.decision == "done", status.reasons
    assert_delivered_once(project, share)
    with open_project(project) as p:
        kinds = [e.kind for e in p.store.events(RUN) if e.kind.startswith("effect.")]
    assert kinds.count("effect.intent") == len(FILES)


def test_a_resume_after_done_delivers_nothing_again(project: Path, share: Path) -> None:
    """Resuming a finished run neither reruns the deliver unit nor copies anything."""
    run_project(project)
    before = {n: (share / n).stat().st_mtime_ns for n in dropped(share)}
    with open_project(project) as p:
        status = p.get_run(RUN).resume()
        assert status.decision == "done"
        assert [a.attempt_id for a in p.store.attempts(RUN, "U09")] == ["U09/a1"]
    assert {n: (share / n).stat().st_mtime_ns for n in dropped(share)} == before
    assert_delivered_once(project, share)


def test_a_crash_after_delivering_but_before_commit_copies_nothing_on_the_redo(
        project: Path, share: Path) -> None:
    """SIGKILL after U09 staged: its redo (a2) gets the recorded receipts, nothing is sent."""
    crashed = run_worker(project, crash_at="unit.after_stage:U09")
    assert crashed.killed, crashed.stderr[-2000:]
    assert in_flight_unit(crashed) == "U09"
    first = dropped(share)
    assert len(first) == len(FILES)
    status = run_project(project)
    assert status.decision == "done", status.reasons
    with open_project(project) as p:
        assert p.get_run(RUN).facts_records()["U09"].attempt == "U09/a2"
        assert {e.attempt_id for e in p.store.effects(RUN)} == {"U09/a1"}
    assert dropped(share) == first
    assert_delivered_once(project, share)


@pytest.mark.parametrize(("crash_at", "settled"), [
    ("effect.after_intent", "retried with the same key"),
    ("effect.after_send", "found by key"),
])
def test_a_sigkill_mid_effect_is_reconciled_on_resume(project: Path, share: Path,
                                                      crash_at: str, settled: str) -> None:
    """An intent without receipt: recovery asks the drop folder, the file ends up there once."""
    crashed = run_worker(project, crash_at=crash_at)
    assert crashed.killed, crashed.stderr[-2000:]
    assert in_flight_unit(crashed) == "U09"
    [row] = ledger(project)
    assert row.status == "intent" and row.remote_id is None
    assert len(dropped(share)) == (1 if crash_at == "effect.after_send" else 0)

    status = run_project(project)
    assert status.decision == "done", status.reasons
    assert_delivered_once(project, share)
    with open_project(project) as p:
        first = p.store.get_effect(row.idem_key)
        assert first.detail.get("resolved") == settled
        assert p.get_run(RUN).facts_records()["U09"].state.value == "succeeded"
        assert p.store.unit_statuses(RUN, "main").get("U09") is None


def test_an_unknown_adapter_name_is_refused_before_the_run_naming_the_configured_ones(
        tmp_path: Path, share: Path) -> None:
    """params.adapter naming no [adapters] table: the plan is refused before any unit runs,
    naming the configured adapters; nothing sent or recorded."""
    root = make_small_project(tmp_path / "small", units=deliver_units(adapter="dropbox"),
                              adapters=FILE_DROP)
    with pytest.raises(PlanValidationError) as err:
        run_project(root)
    assert "adapter 'dropbox'" in str(err.value) and "client_share" in str(err.value)
    assert [p.unit for p in err.value.problems] == ["U09"]
    with open_project(root, validate=False) as p:
        assert p.store.effects(RUN) == []
    assert dropped(share) == []


def test_a_missing_drop_folder_fails_the_unit_with_nothing_copied(project: Path,
                                                                 share: Path) -> None:
    """The adapter refuses (folder gone): the effect is failed, not unknown; nothing blocks."""
    share.rmdir()
    status = run_project(project)
    assert status.decision != "done"
    with open_project(project) as p:
        st = p.store.unit_statuses(RUN, "main")["U09"]
        assert st.status == "failed" and "does not exist" in st.reason
        assert {e.status for e in p.store.effects(RUN)} == {"failed"}
        share.mkdir()
        status = p.get_run(RUN).retry("U09")
    assert status.decision == "done", status.reasons
    assert_delivered_once(project, share)


class AnswerLost:
    """A file drop whose first answer is lost: the copy is made, then the call fails."""

    def __init__(self, inner: FileDropAdapter) -> None:
        self.inner = inner
        self.name = inner.name
        self.lost = 0

    def perform(self, key: str, request: dict[str, Any]) -> str:
        remote_id = self.inner.perform(key, request)
        if not self.lost:
            self.lost += 1
            raise TimeoutError("no answer from the drop folder")
        return remote_id

    def lookup(self, key: str) -> Any:
        return self.inner.lookup(key)


def test_an_unknown_outcome_blocks_the_unit_until_recovery_settles_it(project: Path,
                                                                      share: Path) -> None:
    """A lost answer blocks U09 (no blind retry); the resume's lookup finds it and unblocks."""
    with open_project(project) as p:
        p.effect_adapters = {"client_share": AnswerLost(p.effect_adapters["client_share"])}
        run = p.open_or_start(RUN)
        status = run.run()
        assert status.decision == "blocked", status.reasons
        st = p.store.unit_statuses(RUN, "main")["U09"]
        [row] = p.store.effects(RUN)
        assert st.status == "blocked" and st.details["effect"] == row.idem_key
        assert "outcome" in st.reason and row.status == "unknown"
        assert len(dropped(share)) == 1
        status = run.resume()
        assert status.decision == "done", status.reasons
        assert p.store.get_effect(row.idem_key).detail["resolved"] == "found by key"
    assert_delivered_once(project, share)


# --- webhook ---------------------------------------------------------------------------
@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


def test_a_webhook_delivery_posts_metadata_once_never_the_content(tmp_path: Path,
                                                                 server: WebhookServer) -> None:
    """Each file is POSTed once as name/sha256/size; a crash-free resume posts nothing."""
    root = make_small_project(
        tmp_path / "small", units=deliver_units(adapter="crm"),
        adapters={"crm": {"type": "webhook", "url": server.url, "timeout_s": 5}})
    status = run_project(root)
    assert status.decision == "done", status.reasons
    assert server.posts == len(FILES)
    assert sorted(server.applied.values()) == [1] * len(FILES)
    for ref in FILES:
        unit, name = ref.split(":")
        content = committed_bytes(root, unit, name)
        [body] = [r["body"] for r in server.records.values() if r["body"]["name"] == name]
        assert body["size"] == len(content) and body["unit"] == unit
        assert {"name", "sha256", "size"} <= set(body)
        assert content.decode()[:80] not in json.dumps(body)
    assert {f["remote_id"] for f in delivery(root)["files"]} == {
        r["id"] for r in server.records.values()}
    with open_project(root) as p:
        assert p.get_run(RUN).resume().decision == "done"
    assert server.posts == len(FILES)


def test_a_webhook_crash_after_send_is_found_by_key_on_resume(tmp_path: Path,
                                                             server: WebhookServer) -> None:
    """SIGKILL after the POST: recovery's GET finds the key; the action was applied once."""
    root = make_small_project(
        tmp_path / "small", units=deliver_units(adapter="crm"),
        adapters={"crm": {"type": "webhook", "url": server.url, "timeout_s": 5}})
    crashed = run_worker(root, crash_at="effect.after_send")
    assert crashed.killed, crashed.stderr[-2000:]
    assert server.posts == 1
    assert run_project(root).decision == "done"
    assert sorted(server.applied.values()) == [1] * len(FILES)
    assert server.posts == len(FILES)
    assert {e.status for e in ledger(root)} == {"committed"}
