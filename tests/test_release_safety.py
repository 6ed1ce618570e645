"""What was audited is what is released (issue 21, release safety 1), on the vendor pack run
to the end against a local webhook: the release gate binds the delivered bytes and the audit
verdict computed on them; bytes that changed in substance are audited again before the gate
can be asked, whatever the change was classified as; a failed audit does not ask the gate."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from keepstep.engine.api import open_project
from keepstep.storage.hashing import sha256_hex
from tests.support.webhook_server import WebhookServer
from tests.test_vendor_dd import APPROVE, RUN, copy_pack, records

PRICE = "The list price is EUR 987,654 a year. "


@pytest.fixture(scope="module")
def server() -> Iterator[WebhookServer]:
    srv = WebhookServer().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, server: WebhookServer) -> Path:
    root = copy_pack(tmp_path_factory.mktemp("rel") / "vendor-dd", server)
    with open_project(root) as p:
        assert p.open_or_start(RUN).run(approve=APPROVE).decision == "done"
    return root


@pytest.fixture
def project(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished, tmp_path / "vendor-dd")
    return tmp_path / "vendor-dd"


def add_price(root: Path) -> None:
    path = root / "templates" / "memo.md"
    path.write_text(path.read_text().replace("Every price cited here", PRICE +
                                             "Every price cited here"))


def delivered(server: WebhookServer) -> list[bytes]:
    return list(server.received)


def test_a_sentence_with_a_price_is_audited_before_anything_is_asked_or_sent(
        project: Path, server: WebhookServer) -> None:
    """The issue's case, now classified as a template change: the audit runs again on the
    new memo, fails on the figure, the release gate is not asked and nothing is sent; the
    reason says what failed and what to do."""
    sent = len(server.received)
    add_price(project)
    with open_project(project) as p:
        run = p.get_run(RUN)
        before = records(p)["A01"].attempt
        status = run.resume()
        assert status.decision == "blocked"
        assert records(p)["A01"].attempt != before and not records(p)["A01"].validators_passed
        held = next(r for r in status.reasons if r.startswith("X01"))
        assert "987,654" in held and "keepstep explain A01" in held
        assert run.pending_approvals() == []
    assert len(server.received) == sent


def test_whatever_the_classifier_says_changed_bytes_are_audited_again_first(
        project: Path, server: WebhookServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: with a classifier that calls every template edit presentation (the
    audit not reached by the invalidation walk), the memo re-renders with a new figure; before
    the release gate is asked, the gate finds the audit ran on other bytes that differ in
    substance, invalidates it (explained), and the audit fails on the new bytes: nothing is
    asked, nothing is sent."""
    import keepstep.engine.core.changes as changes
    from keepstep.engine.core.plan import EdgeType

    classify = changes._template_changes

    def blind(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the classifier's signature
        return [c.model_copy(update={"edge": EdgeType.presentation,
                                     "labels": [EdgeType.presentation]})
                for c in classify(*args, **kwargs)]

    monkeypatch.setattr(changes, "_template_changes", blind)
    sent = len(server.received)
    with open_project(project) as p:
        before = records(p)["A01"].attempt
    add_price(project)
    with open_project(project) as p:
        run = p.get_run(RUN)
        preview = run.preview()
        assert "A01" not in preview.invalidated and "D01" in preview.invalidated
        status = run.resume()
        recs = records(p)
        assert recs["A01"].attempt != before and not recs["A01"].validators_passed
        assert status.decision == "blocked" and run.pending_approvals() == []
        repairs = run.events(kinds=["decision.repair"])
        assert repairs and "A01" in repairs[-1].payload["invalidated"]
        assert "audited again before the release gate asks" in str(repairs[-1].payload)
    assert len(server.received) == sent


def test_the_release_gate_binds_the_bytes_and_the_verdict_on_those_bytes(
        project: Path, server: WebhookServer) -> None:
    """A heading rename (presentation; the audit not redone): the gate asks again, binding
    the new bytes and A01's passed verdict, carried over because the bytes differ from what
    it audited in presentation only; once released, the new memo is sent once, never twice,
    and every byte string sent passed an audit."""
    path = project / "templates" / "memo.md"
    path.write_text(path.read_text().replace("## Conditions of signature",
                                             "## Before signature"))
    sent = len(server.received)
    with open_project(project) as p:
        run = p.get_run(RUN)
        run.resume()
        [release] = run.pending_approvals()
        audited = next(b for b in release.bindings if b.ref == "audited:X01")
        assert audited.passed and audited.changed and "A01 passed on D01:memo.md" in audited.shown
        memo = records(p)["D01"].outputs["memo.md"].sha256
        assert release.bound_object["binds"]["audited:X01"]["D01:memo.md"]["sha256"] == memo
        run.approve("release", "release", who="test")
        assert run.resume().decision == "done"
        assert run.pending_approvals() == []
        assert run.resume().decision == "done"
    new = server.received[sent:]
    assert [sha256_hex(b) for b in new] == [memo]
    assert len(set(map(sha256_hex, server.received))) == len(server.received)
