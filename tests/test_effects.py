"""The side-effect ledger: intent before action, receipts, reconcile after real SIGKILLs, undo.

Webhook tests talk to tests/support/webhook_server.py on 127.0.0.1; crash tests run
tests/support/effect_child.py, which SIGKILLs itself at a named crash point.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keepstep.engine.errors import LeaseLost, SideEffectError
from keepstep.engine.run.adapters import FileDropAdapter, LookupResult, WebhookAdapter
from keepstep.engine.run.effects import (
    compensate,
    compensation_key,
    compensation_preview,
    decide_unknown,
    idempotency_key,
    perform_effect,
    reconcile,
)
from keepstep.storage import SQLiteStore
from tests.support.webhook_server import WebhookServer

CHILD = Path(__file__).parent / "support" / "effect_child.py"
RUN = "ME-042"
UNIT = "U41"
ACTION = "notify-client"


@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def run_store(store: SQLiteStore) -> SQLiteStore:
    store.create_run(RUN, {})
    return store


def _claim(store: SQLiteStore, unit: str = UNIT):
    """The unit's live lease (attempt and token) if this test holds one, else a new claim."""
    held = [le for le in store.leases(RUN) if le.unit == unit]
    if held:
        return held[0]
    return store.claim(RUN, "main", unit, expected_version=store.get_head(RUN).version,
                       owner="test", lease_seconds=600)


def _perform(store: SQLiteStore, adapter, *, unit: str = UNIT, action: str = ACTION,
             plan_n: int = 1, request: dict | None = None, claim=None):
    claim = claim or _claim(store, unit)
    return perform_effect(
        store, adapter, run_id=RUN, branch_id="main", unit=unit, attempt_id=claim.attempt_id,
        action=action,
        request=request or {"action": action, "unit": unit, "note": "pack ready for review"},
        plan_n=plan_n, fencing_token=claim.fencing_token)


def _child(store_root: Path, url: str, crash_at: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KEEPSTEP_CRASH_AT"}
    if crash_at:
        env["KEEPSTEP_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, str(CHILD), str(store_root), RUN, UNIT, ACTION, "1", url],
        env=env, capture_output=True, text=True, timeout=30, check=False)


def test_the_idempotency_key_is_deterministic_readable_and_changes_with_the_plan_version() -> None:
    """Same (run, unit, action, plan_n) → same key; another plan version → another key."""
    k1 = idempotency_key(RUN, UNIT, ACTION, 1)
    assert k1 == idempotency_key(RUN, UNIT, ACTION, 1)
    assert k1.startswith("ks-me-042-u41-notify-client-p1-")
    assert idempotency_key(RUN, UNIT, ACTION, 2) != k1
    assert len({idempotency_key(RUN, UNIT, a, 1) for a in ("a b", "a-b", "a_b")}) == 3
    assert compensation_key(k1) != k1 and compensation_key(k1).startswith(k1)


def test_intent_is_committed_before_the_action_and_the_receipt_after(run_store, server) -> None:
    """A webhook effect leaves an intent event, then a committed row with the server's id."""
    out = _perform(run_store, WebhookAdapter(server.url, timeout=2))
    assert out.performed and out.status == "committed" and out.remote_id == "evt-1"
    row = run_store.get_effect(out.key)
    assert (row.status, row.adapter, row.plan_n, row.remote_id) == ("committed", "webhook", 1,
                                                                    "evt-1")
    assert row.fencing_token is not None
    kinds = [e.kind for e in run_store.events(RUN, kind_prefix="effect.")]
    assert kinds == ["effect.intent", "effect.committed"]
    assert server.applied[out.key] == 1


def test_a_replay_with_the_same_key_never_acts_twice(run_store, server) -> None:
    """Performing the same action again returns the stored receipt; the server saw one POST."""
    adapter = WebhookAdapter(server.url, timeout=2)
    first = _perform(run_store, adapter)
    again = _perform(run_store, adapter)
    assert again.key == first.key and again.replayed and not again.performed
    assert again.remote_id == first.remote_id
    assert server.posts == 1 and server.applied[first.key] == 1


def test_a_new_plan_version_gets_a_new_key_and_acts_once_more(run_store, server) -> None:
    """plan_n 2 derives a different key, so the action is applied once for each plan version."""
    adapter = WebhookAdapter(server.url, timeout=2)
    one = _perform(run_store, adapter, plan_n=1)
    two = _perform(run_store, adapter, plan_n=2)
    assert one.key != two.key
    assert server.applied == {one.key: 1, two.key: 1}


def test_the_same_key_with_a_different_request_is_refused(run_store, server) -> None:
    """A changed request under an existing key raises and sends nothing."""
    adapter = WebhookAdapter(server.url, timeout=2)
    _perform(run_store, adapter, request={"action": ACTION, "text": "v1"})
    with pytest.raises(SideEffectError, match="different"):
        _perform(run_store, adapter, request={"action": ACTION, "text": "v2"})
    assert server.posts == 1


def test_a_fenced_executor_starts_no_external_action(run_store, server) -> None:
    """After a takeover the old fencing token cannot even record an intent: LeaseLost, no POST."""
    old = _claim(run_store)
    run_store.fence_lease(RUN, "main", UNIT, old.fencing_token, reason="owner died")
    _claim(run_store)
    with pytest.raises(LeaseLost):
        _perform(run_store, WebhookAdapter(server.url, timeout=2), claim=old)
    assert server.posts == 0 and run_store.effects(RUN) == []


def test_sigkill_after_intent_then_reconcile_sends_exactly_once(run_store, server,
                                                                store_root) -> None:
    """A child killed after committing its intent sent nothing; reconcile sends once, same key."""
    proc = _child(store_root, server.url, "effect.after_intent")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    key = idempotency_key(RUN, UNIT, ACTION, 1)
    assert run_store.get_effect(key).status == "intent"
    assert server.posts == 0

    results = reconcile(run_store, {"webhook": WebhookAdapter(server.url, timeout=2)}, RUN)
    assert [(r.key, r.outcome) for r in results] == [(key, "retried")]
    assert run_store.get_effect(key).status == "committed"
    assert server.applied[key] == 1
    assert reconcile(run_store, {"webhook": WebhookAdapter(server.url, timeout=2)}, RUN) == []
    assert server.applied[key] == 1 and server.posts == 1


def test_sigkill_after_send_then_reconcile_finds_it_by_key(run_store, server, store_root) -> None:
    """A child killed after the POST but before the receipt: reconcile finds the key, sends
    nothing."""
    proc = _child(store_root, server.url, "effect.after_send")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    key = idempotency_key(RUN, UNIT, ACTION, 1)
    assert run_store.get_effect(key).status == "intent"
    assert server.applied[key] == 1

    results = reconcile(run_store, {"webhook": WebhookAdapter(server.url, timeout=2)}, RUN)
    assert [(r.outcome, r.remote_id) for r in results] == [("committed", "evt-1")]
    row = run_store.get_effect(key)
    assert (row.status, row.remote_id) == ("committed", "evt-1")
    assert server.applied[key] == 1 and server.posts == 1


def test_a_child_without_a_crash_commits_its_receipt(run_store, server, store_root) -> None:
    """The harness itself: an uninterrupted child commits, and reconcile finds nothing to do."""
    proc = _child(store_root, server.url, None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("committed ks-me-042-u41-notify-client-p1-")
    assert reconcile(run_store, {}, RUN) == []


@pytest.mark.parametrize("crash_at, applied_before", [("effect.after_intent", 0),
                                                     ("effect.after_send", 1)])
def test_with_the_server_down_reconcile_blocks_the_unit_and_retries_nothing(
    run_store, server, store_root, crash_at, applied_before
) -> None:
    """Cannot tell → unit blocked with the reason; nothing is sent, even once the server is back,
    until a person decides."""
    assert _child(store_root, server.url, crash_at).returncode == -signal.SIGKILL
    key = idempotency_key(RUN, UNIT, ACTION, 1)
    adapters = {"webhook": WebhookAdapter(server.url, timeout=1)}
    server.stop()

    results = reconcile(run_store, adapters, RUN)
    assert [r.outcome for r in results] == ["blocked"]
    status = run_store.unit_statuses(RUN)[UNIT]
    assert status.status == "blocked"
    assert status.reason.startswith("external outcome unknown: webhook cannot tell")
    assert status.details["effect"] == key
    assert run_store.get_effect(key).status == "unknown"

    server.start()
    assert [r.outcome for r in reconcile(run_store, adapters, RUN)] == ["waiting"]
    with pytest.raises(SideEffectError, match="waits for a person"):
        _perform(run_store, adapters["webhook"], claim=_claim_again(run_store))
    assert server.applied[key] == applied_before and server.posts == applied_before

    decision = "retry" if applied_before == 0 else "recheck"
    row = decide_unknown(run_store, adapters["webhook"], key, decision=decision, who="ana",
                         reason="checked the client's inbox")
    assert row.status == "committed" and row.remote_id == "evt-1"
    assert server.applied[key] == 1
    assert UNIT not in run_store.unit_statuses(RUN)
    assert run_store.events(RUN, kinds=["decision.effect"])[-1].payload["who"] == "ana"


def _claim_again(store: SQLiteStore):
    lease = next(le for le in store.leases(RUN) if le.unit == UNIT)
    store.fence_lease(RUN, "main", UNIT, lease.fencing_token, reason="the child was killed")
    return _claim(store)


def test_an_adapter_that_cannot_tell_is_never_retried_blindly(run_store) -> None:
    """lookup() returning found=None (or raising) blocks the unit; perform is not called again."""

    class Unsure:
        name = "unsure"
        performed = 0

        def perform(self, key, request):
            self.performed += 1
            raise TimeoutError("no answer")

        def lookup(self, key):
            return LookupResult(found=None)

    adapter = Unsure()
    with pytest.raises(SideEffectError, match="unknown"):
        _perform(run_store, adapter)
    assert adapter.performed == 1
    results = reconcile(run_store, {"unsure": adapter}, RUN)
    assert [r.outcome for r in results] == ["blocked"]
    assert reconcile(run_store, {}, RUN)[0].outcome == "waiting"
    assert adapter.performed == 1
    assert run_store.unit_statuses(RUN)[UNIT].status == "blocked"


def test_a_missing_adapter_blocks_instead_of_guessing(run_store, tmp_path) -> None:
    """An intent whose adapter is not configured is blocked for a person, not marked failed."""
    target = tmp_path / "outbox"
    target.mkdir()
    run_store.record_effect_intent(
        idem_key="k-orphan", run_id=RUN, branch_id="main", unit=UNIT, attempt_id=None,
        action="drop", adapter="file-drop", request_hash="0" * 64, fencing_token=None, plan_n=1)
    results = reconcile(run_store, {}, RUN)
    assert results[0].outcome == "blocked" and "no adapter named 'file-drop'" in results[0].reason


def test_file_drop_perform_lookup_and_compensate(run_store, tmp_path) -> None:
    """The copy is named by key and found by it; undoing removes it through its own ledger entry."""
    outbox, src = tmp_path / "outbox", tmp_path / "project" / "pack.md"
    outbox.mkdir()
    src.parent.mkdir()
    src.write_text("# ME-042 pack\n")
    adapter = FileDropAdapter(outbox, project_root=src.parent)
    out = _perform(run_store, adapter, action="deliver-pack", request={"path": str(src)})
    dropped = Path(out.remote_id)
    assert dropped.parent == outbox and dropped.name == f"{out.key}--pack.md"
    assert dropped.read_text() == "# ME-042 pack\n"
    assert not list(outbox.glob(".*"))  # no temp file left behind
    assert adapter.lookup(out.key) == LookupResult(found=True, remote_id=str(dropped),
                                                   retry_safe=True)
    assert adapter.lookup("ks-other").found is False

    undo = compensate(run_store, adapter, run_store.get_effect(out.key), who="ana",
                      reason="client cancelled")
    assert not dropped.exists()
    assert undo.key == compensation_key(out.key) and undo.status == "committed"
    assert undo.remote_id == f"removed:{dropped.name}"
    comp = run_store.get_effect(undo.key)
    assert comp.compensates == out.key and comp.action == "compensate:deliver-pack"
    assert run_store.get_effect(out.key).status == "compensated"
    assert compensate(run_store, adapter, run_store.get_effect(out.key)).replayed
    kinds = [e.kind for e in run_store.events(RUN, kind_prefix="effect.")]
    assert kinds[-4:] == ["effect.compensation-intent", "effect.intent", "effect.committed",
                          "effect.compensated"]


def test_file_drop_refuses_a_target_inside_the_project(tmp_path) -> None:
    """A drop folder inside the project is refused when the adapter is built."""
    with pytest.raises(ValueError, match="outside"):
        FileDropAdapter(tmp_path / "proj" / "out", project_root=tmp_path / "proj")


def test_file_drop_cannot_tell_when_its_folder_is_gone(run_store, tmp_path) -> None:
    """A vanished drop folder (an unmounted drive) makes lookup say "cannot tell": blocked."""
    outbox, src = tmp_path / "outbox", tmp_path / "pack.md"
    outbox.mkdir()
    src.write_text("x")
    adapter = FileDropAdapter(outbox)
    claim = _claim(run_store)
    run_store.record_effect_intent(
        idem_key=idempotency_key(RUN, UNIT, "deliver", 1), run_id=RUN, branch_id="main",
        unit=UNIT, attempt_id=claim.attempt_id, action="deliver", adapter="file-drop",
        request_hash="0" * 64, fencing_token=claim.fencing_token, plan_n=1)
    outbox.rmdir()
    assert adapter.lookup("anything").found is None
    assert reconcile(run_store, {"file-drop": adapter}, RUN)[0].outcome == "blocked"


def test_compensation_preview_lists_committed_effects(run_store, tmp_path) -> None:
    """The preview lists what a cancel or rollback would undo, by units or since a version."""
    outbox, src = tmp_path / "outbox", tmp_path / "a.md"
    outbox.mkdir()
    src.write_text("a")
    adapter = FileDropAdapter(outbox)
    early = _perform(run_store, adapter, unit="U10", action="drop", request={"path": str(src)})
    run_store.commit_checkpoint(RUN, "main", 0, {"unit:U10": {"ok": True}},
                                fencing_token=early.effect.fencing_token, unit="U10",
                                attempt_id=early.effect.attempt_id)
    late = _perform(run_store, adapter, unit="U20", action="drop", request={"path": str(src)})
    assert [e.idem_key for e in compensation_preview(run_store, RUN)] == [early.key, late.key]
    assert [e.idem_key for e in compensation_preview(run_store, RUN, since_version=1)] == [
        late.key]
    assert [e.idem_key for e in compensation_preview(run_store, RUN, units=["U10"])] == [
        early.key]
    compensate(run_store, adapter, late.effect)
    assert [e.idem_key for e in compensation_preview(run_store, RUN)] == [early.key]


def test_webhook_compensation_deletes_by_key_and_reconciles_after_a_crash(run_store,
                                                                          server) -> None:
    """DELETE {url}/{key} undoes it; an undo intent left without receipt settles by lookup."""
    adapter = WebhookAdapter(server.url, timeout=2)
    out = _perform(run_store, adapter)
    # simulate a crash after the undo's intent: record it, do the DELETE, no receipt
    ckey = compensation_key(out.key)
    run_store.record_effect_intent(
        idem_key=ckey, run_id=RUN, branch_id="main", unit=UNIT, attempt_id=None,
        action=f"compensate:{ACTION}", adapter="webhook", request_hash="0" * 64,
        fencing_token=None, plan_n=1, compensates=out.key)
    assert run_store.get_effect(out.key).status == "compensation-intent"
    adapter.compensate(out.key, out.remote_id)
    results = reconcile(run_store, {"webhook": adapter}, RUN)
    assert [(r.key, r.outcome) for r in results] == [(ckey, "committed")]
    assert run_store.get_effect(out.key).status == "compensated"
    assert server.deleted[out.key] == 1 and server.applied[out.key] == 1
