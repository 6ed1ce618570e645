"""The second pack (sample_projects/vendor-dd) run end to end, offline, and its scripted changes.

A finished offline run is made once per module, delivering to one local webhook server; each
scenario works on a copy of it: an edit, the preview's invalidated set (exactly what the
plan's typed edges define), the gates that ask again, the units re-executed and the POSTs the
webhook received (the same bytes are never sent twice; changed bytes go under a new key).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keepstep.engine.api import Project, open_project
from keepstep.engine.files.project import load_contract, write_contract
from tests.support.small_project import write_config
from tests.support.webhook_server import WebhookServer

PACK = Path(__file__).resolve().parents[1] / "sample_projects" / "vendor-dd"
RUN = "VDD-1"
AUDIENCE, NEW_AUDIENCE = "operations director", "finance director"
APPROVE = {"audience": AUDIENCE, "release": "release"}
DOCUMENTS = ("memo.md", "risk-register.md", "pricing-table.csv", "release-memo.md")
ALL = {"I01", "I02", "I03", "E01", "E02", "E03", "E04", "C01", "C02", "S01", "S02", "S03",
       "K01", "D01", "D02", "D03", "A01", "D04", "X01", "N01"}


@pytest.fixture(scope="module")
def server() -> Iterator[WebhookServer]:
    srv = WebhookServer().start()
    yield srv
    srv.stop()


def copy_pack(dest: Path, server: WebhookServer) -> Path:
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns(".keepstep"))
    write_config(dest, adapters={"client": {"type": "webhook", "url": server.url,
                                            "timeout_s": 5}})
    return dest


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, server: WebhookServer) -> Path:
    """The pack run offline to the end, both gates answered, the four documents delivered."""
    root = copy_pack(tmp_path_factory.mktemp("vdd") / "vendor-dd", server)
    with open_project(root) as p:
        status = p.open_or_start(RUN).run(approve=APPROVE)
    assert status.decision == "done", status.reasons
    return root


@pytest.fixture
def project(finished: Path, tmp_path: Path) -> Path:
    target = tmp_path / "vendor-dd"
    shutil.copytree(finished, target)
    return target


def records(p: Project) -> dict[str, Any]:
    return p.get_run(RUN).facts_records()


def delivery(p: Project) -> dict[str, Any]:
    ref = records(p)["X01"].outputs["delivery.json"]
    return json.loads((p.store.artifacts.root / ref.path).read_bytes())


def requests(p: Project) -> dict[str, int]:
    return {g: len(p.store.approvals(RUN, gate_id=g)) for g in ("audience", "release")}


class Outcome:
    def __init__(self) -> None:
        self.invalidated: set[str] = set()
        self.executed: set[str] = set()
        self.asked: set[str] = set()
        self.posted: list[str] = []  # idempotency keys the webhook saw first now
        self.posts = 0
        self.pending: list[Any] = []
        self.keys_before: dict[str, str] = {}
        self.keys_after: dict[str, str] = {}


def scenario(root: Path, server: WebhookServer, edit: Callable[[Path], None],
             answers: dict[str, str] | None = None) -> Outcome:
    """Apply ``edit``, preview, resume until the gates ask, answer them, resume to the end."""
    out = Outcome()
    posts, known = server.posts, set(server.records)
    with open_project(root) as p:
        run = p.get_run(RUN)
        before = {u: r.attempt for u, r in records(p).items()}
        out.keys_before = {f["file"]: f["key"] for f in delivery(p)["files"]}
        asked_before = requests(p)
    edit(root)
    with open_project(root) as p:
        run = p.get_run(RUN)
        out.invalidated = set(run.preview().invalidated)
        status = run.resume()
        for _ in range(3):  # each gate the run reaches asks in turn
            pending = run.pending_approvals()
            if not pending:
                break
            out.pending += pending
            for gate in pending:
                choice = (answers or {}).get(gate.gate) or (
                    load_contract(root).audience if gate.gate == "audience" else "release")
                run.approve(gate.gate, choice, who="test")
            status = run.resume()
        assert status.decision == "done", status.reasons
        after = records(p)
        out.executed = {u for u, r in after.items() if before.get(u) != r.attempt}
        out.asked = {g for g, n in requests(p).items() if n > asked_before[g]}
        out.keys_after = {f["file"]: f["key"] for f in delivery(p)["files"]}
    out.posts = server.posts - posts
    out.posted = sorted(set(server.records) - known)
    return out


def test_the_pack_validates_and_ran_to_the_end(finished: Path, server: WebhookServer) -> None:
    """20 units over 4 groups, 2 gates; the run is done, the audit passed and the four
    documents were delivered once each, as metadata only."""
    with open_project(finished) as p:
        recs = records(p)
        assert set(recs) == ALL and len(p.files.plan.gates) == 2
        assert {s.group for s in p.files.approved_sources().values()} == {"V", "R", "F", "O"}
        assert recs["A01"].validators_passed and recs["A01"].facts["passed"]
        rows = delivery(p)["files"]
    assert [r["name"] for r in rows] == list(DOCUMENTS)
    assert {r["status"] for r in rows} == {"committed"}
    bodies = [server.records[r["key"]]["body"] for r in rows]
    assert {b["name"] for b in bodies} == set(DOCUMENTS)
    assert all(set(b) >= {"name", "sha256", "size"} and "quote" not in json.dumps(b)
               for b in bodies)


def test_the_header_only_inventory_lists_header_lines_and_no_hashes(finished: Path) -> None:
    """I01 reads the sources through structure edges: titles, types and dates, no sha256."""
    with open_project(finished) as p:
        ref = records(p)["I01"].outputs["inventory.json"]
        inv = json.loads((p.store.artifacts.root / ref.path).read_bytes())
    v2 = next(s for s in inv["sources"] if s["id"] == "V2")
    assert v2["header"] == {"title": "Corvane Aisle product sheet", "type": "product sheet",
                            "date": "2024-11-04"}
    assert all("sha256" not in s for s in inv["sources"]) and inv["count"] == 20


def test_a_body_edit_of_one_source_redoes_its_readers_not_the_inventory(
        project: Path, server: WebhookServer) -> None:
    """A sentence added to R4's body reaches E02 and C01 by content edges and what uses them;
    I01 (header lines only), the other extractions, C02 and S03 (which reads C02 only) are
    reused."""
    def edit(root: Path) -> None:
        path = root / "sources" / "R4-site-visit-tidewater.md"
        path.write_text(path.read_text() + "\nTidewater's team counted 14 mis-picks in the "
                        "first week after go-live.\n")

    out = scenario(project, server, edit)
    assert out.invalidated == ALL - {"I01", "I02", "I03", "E01", "E03", "E04", "C02", "S03"}
    assert out.executed <= out.invalidated and {"E02", "C01"} <= out.executed
    assert out.asked == {"release"}  # the audience is unchanged: its gate does not ask
    changed = {f for f in out.keys_after if out.keys_after[f] != out.keys_before[f]}
    assert out.posts == len(out.posted) == len(changed)  # only changed bytes, new keys


def test_a_header_line_edit_redoes_only_the_inventory_and_what_cites_it(
        project: Path, server: WebhookServer) -> None:
    """V2's date line changed: a structure change. It reaches I01 only (extraction and
    verification read bodies), then A01 and D04, which use the inventory, and what
    follows; the release memo's bytes changed, so it alone is sent again, under a new key."""
    def edit(root: Path) -> None:
        path = root / "sources" / "V2-corvane-product-sheet.md"
        path.write_text(path.read_text().replace("date: 2024-11-04", "date: 2024-11-05", 1))

    out = scenario(project, server, edit)
    assert out.invalidated == {"I01", "A01", "D04", "X01", "N01"}
    assert {"I01", "D04", "X01"} <= out.executed <= out.invalidated
    assert out.asked == {"release"}
    assert out.posts == 1 and len(out.posted) == 1
    changed = {f for f in out.keys_after if out.keys_after[f] != out.keys_before[f]}
    assert changed == {"D04:release-memo.md"}


def test_an_audience_change_redoes_the_audience_units_and_asks_both_gates(
        project: Path, server: WebhookServer) -> None:
    """audience = finance director: S01-S03 and K01 (the audience readers) and the documents
    built on them; the audience gate asks again (its binding changed), and so does the
    release gate (the memo's bytes changed)."""
    def edit(root: Path) -> None:
        contract = load_contract(root)
        contract.fields["audience"] = NEW_AUDIENCE
        write_contract(root, contract)

    out = scenario(project, server, edit)
    assert out.invalidated == {"S01", "S02", "S03", "K01", "D01", "D02", "D03", "A01", "D04",
                               "X01", "N01"}
    assert {"S01", "S02", "S03", "K01", "D01", "X01"} <= out.executed
    assert out.asked == {"audience", "release"}
    audience_request = next(g for g in out.pending if g.gate == "audience")
    assert [b.ref for b in audience_request.bindings] == ["contract:audience"]
    assert "finance director" in audience_request.bindings[0].shown
    assert out.posts >= 1 and out.posts == len(out.posted)


def test_a_heading_only_template_edit_rerenders_and_redelivers_the_memo_only(
        project: Path, server: WebhookServer) -> None:
    """A heading reworded in templates/memo.md is a presentation change: D01 re-renders and
    emits presentation, so X01 (which delivers its bytes) is redone but the audit (which
    reads the template's section ids and the memo's content) is not; the release gate asks
    again for the new bytes, which go out once under a new key; nothing else is sent."""
    def edit(root: Path) -> None:
        path = root / "templates" / "memo.md"
        path.write_text(path.read_text().replace("## Conditions of signature",
                                                 "## Before signature"))

    with open_project(project) as p:
        audit_attempt = records(p)["A01"].attempt
    out = scenario(project, server, edit)
    assert out.invalidated == {"D01", "X01"}
    assert out.executed == {"D01", "X01"}
    assert out.asked == {"release"}
    release = next(g for g in out.pending if g.gate == "release")
    memo = next(b for b in release.bindings if b.ref == "artifact:D01")
    assert memo.changed and not next(b for b in release.bindings
                                     if b.ref == "verdict:A01").changed
    assert out.posts == 1 and len(out.posted) == 1
    assert {f for f in out.keys_after if out.keys_after[f] != out.keys_before[f]} == {
        "D01:memo.md"}
    with open_project(project) as p:
        assert records(p)["A01"].attempt == audit_attempt


def test_the_same_bytes_after_a_plan_change_are_not_delivered_again(
        project: Path, server: WebhookServer) -> None:
    """X01's definition changed (its files listed in another order: plan-v2, X01 redone) with
    every document unchanged: the keys are the same (destination + content hash, not the
    plan version), the ledger's receipts come back and the webhook gets 0 new POSTs; the
    release gate, whose bound values did not change, does not ask again."""
    def edit(root: Path) -> None:
        path = root / "plan.toml"
        text = path.read_text()
        old = ('files = ["D01:memo.md", "D02:risk-register.md", "D03:pricing-table.csv", '
               '"D04:release-memo.md"]')
        assert old in text
        path.write_text(text.replace(old, 'files = ["D04:release-memo.md", "D01:memo.md", '
                                     '"D02:risk-register.md", "D03:pricing-table.csv"]'))

    out = scenario(project, server, edit)
    assert out.invalidated == {"X01", "N01"}
    assert "X01" in out.executed
    assert out.posts == 0 and out.posted == []
    assert out.keys_after == out.keys_before
    assert out.asked == set()
    with open_project(project) as p:
        assert p.get_run(RUN).plan_n == 2
        assert {r["sent"] for r in delivery(p)["files"]} == {False}


def test_a_failed_audit_blocks_the_release_and_the_webhook_gets_nothing(
        tmp_path: Path) -> None:
    """The memo template lost its required 'conditions' section: A01 commits a failed
    verdict; X01 is held (never claimed) with the failing check named and what to do; the
    release gate is not asked about bytes that cannot go out (issue 21: a failed audit does
    not ask the gate); a resume sends nothing."""
    with _server() as srv:
        root = copy_pack(tmp_path / "vendor-dd", srv)
        path = root / "templates" / "memo.md"
        text = path.read_text()
        start = text.index("<!-- section: conditions -->")
        path.write_text(text[:start] + text[text.index("---", start):])
        with open_project(root) as p:
            run = p.open_or_start(RUN)
            status = run.run(approve={"audience": AUDIENCE})
            assert status.decision == "blocked"
            recs = records(p)
            assert "A01" in recs and not recs["A01"].validators_passed
            assert "X01" not in recs
            held = next(r for r in status.reasons if r.startswith("X01"))
            assert "A01 failed its checks" in held and "conditions" in held
            assert "keepstep explain A01" in held
            assert run.pending_approvals() == []
            assert not any("waits for approval" in r for r in status.reasons)
            status = run.resume()
            assert status.decision == "blocked" and "X01" not in records(p)
            assert not p.store.effects(RUN)
        assert srv.posts == 0


class _server:
    def __enter__(self) -> WebhookServer:
        self.srv = WebhookServer().start()
        return self.srv

    def __exit__(self, *exc: object) -> None:
        self.srv.stop()


def test_the_pack_runs_end_to_end_against_the_real_model_test_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """openai/gpt-4o-mini over HTTP to tests/support/model_server.py (realistic formatting,
    some invalid answers revised): the run is done, the memo's summary is model-written
    (the render prompt), the audit passes and the four documents are delivered once."""
    from tests.support.model_server import running_server

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-keepstep-dummy-0000")
    with _server() as hook, running_server("mixed", every=9) as model:
        root = copy_pack(tmp_path / "vendor-dd", hook)
        write_config(root, default_model="openai/gpt-4o-mini", api_base=model.api_base)
        with open_project(root) as p:
            status = p.open_or_start(RUN).run(approve=APPROVE)
            assert status.decision == "done", status.reasons
            recs = records(p)
            assert recs["A01"].validators_passed
            called = {c.unit for c in p.store.calls(RUN)}
        assert "D01" in called  # the prose summary was asked of the model
        assert sum(r.facts.get("revise_rounds", 0) for r in recs.values()) >= 1
        assert hook.posts == len(DOCUMENTS) == len(hook.records)


def test_a_figure_the_pricing_table_does_not_hold_fails_the_figures_check(
        tmp_path: Path) -> None:
    """A price written into the memo's pricing section by hand (in no row of the pricing
    table) fails A01's figures check, naming the figure; the delivery is held."""
    with _server() as srv:
        root = copy_pack(tmp_path / "vendor-dd", srv)
        path = root / "templates" / "memo.md"
        text = path.read_text()
        path.write_text(text.replace("Every price cited here is in the pricing comparison",
                                     "The list price is EUR 987,654. Every price cited here "
                                     "is in the pricing comparison"))
        with open_project(root) as p:
            status = p.open_or_start(RUN).run(approve={"audience": AUDIENCE})
            assert status.decision == "blocked"
            assert not records(p)["A01"].validators_passed
            held = next(r for r in status.reasons if r.startswith("X01"))
            assert "figures" in held and "987,654" in held
        assert srv.posts == 0
