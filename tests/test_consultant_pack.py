"""A second pack of our own, shaped like a consultant's engagement (tests/packs/consultant:
PLAN.md in plain words, translated into plan.toml with no workaround): a diamond of verify
units, a bounded loop, an audience gate, a release gate bound to the memo's hash and the
audit's verdict, and three deliveries — a webhook, a synced folder and an email over
STARTTLS — each counted at its receiver (issue 21: never the same bytes twice, never bytes
whose audit failed or did not run)."""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from keepstep.engine.api import open_project
from keepstep.engine.core.plan import load_plan
from keepstep.engine.files.project import load_contract, template_file
from keepstep.engine.run.validation import validate_project
from keepstep.storage.hashing import sha256_hex
from tests.support.smtp_server import SmtpServer
from tests.support.webhook_server import WebhookServer

PACK = Path(__file__).resolve().parent / "packs" / "consultant"
RUN = "BM-1"
APPROVE = {"audience": "investment committee", "release": "release"}
FILES = ("memo.md", "risk-register.md")


@pytest.fixture
def receivers(tmp_path: Path) -> Iterator[tuple[WebhookServer, SmtpServer, Path]]:
    hook = WebhookServer().start()
    mail = SmtpServer(tmp_path / "tls", login=("consultant", "app-password")).start()
    share = tmp_path / "client-share"
    share.mkdir()
    yield hook, mail, share
    hook.stop()
    mail.stop()


def install(tmp_path: Path, hook: WebhookServer, mail: SmtpServer, share: Path,
            monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "consultant"
    shutil.copytree(PACK, root)
    shutil.copy2(mail.cert, root / "smtp-ca.pem")
    cfg = tomllib.loads((root / "keepstep.toml").read_text())
    cfg["adapters"]["client"]["url"] = hook.url
    cfg["adapters"]["share"]["target_dir"] = str(share)
    cfg["adapters"]["mail"].update(port=mail.port, ca_file="smtp-ca.pem")
    (root / "keepstep.toml").write_text(tomli_w.dumps(cfg))
    # The SMTP password through `keepstep keys` (its environment variable; no keyring here).
    monkeypatch.setenv("SMTP_MAIL_API_KEY", "app-password")
    return root


def test_the_translation_needs_no_workaround() -> None:
    """The six workarounds of issue 21 are absent: the cross-check reaches the extract units
    only through the other verify units; the memo names contract fields with no contract
    intake unit; the register, table and appendix use keepstep's built-in templates; the
    audit checks source groups with no inventory unit; contract.md has YAML front matter;
    the quotes source keeps its two block-quote paragraphs separated by a bare '>'."""
    plan = load_plan(PACK / "plan.toml")
    units = plan.unit_map()
    assert {d.unit for d in units["VX"].depends_on} == {"VA", "VB"}
    assert not any(u.kind.value == "intake" and u.params.get("step") in ("contract",
                                                                       "inventory")
                   for u in plan.units)
    assert sorted(p.stem for p in (PACK / "templates").glob("*.md")) == ["memo"]
    for name in ("risk-register", "evidence-table", "appendix"):
        assert template_file(PACK, name) is not None
    assert "{{ date }}" in (PACK / "templates" / "memo.md").read_text()
    assert (PACK / "contract.md").read_text().startswith("---\n")
    assert load_contract(PACK).fields["date"] == "2025-03-14"
    assert "2030\n>\n> Type approval" in (PACK / "sources" / "B5-interview-quotes.md").read_text()
    report = validate_project(PACK)
    assert report.ok and not report.problems, report.problems


def test_the_pack_runs_and_each_receiver_gets_the_audited_bytes_once(
        tmp_path: Path, receivers, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run to the end (both gates answered): the webhook, the folder and the mailbox each
    received the memo and the register exactly once, the same bytes the audit read and
    passed; a resume sends nothing again; the memo shows the contract's date and status and
    carries the provenance line although its template has no {{ notice }}."""
    hook, mail, share = receivers
    root = install(tmp_path, hook, mail, share, monkeypatch)
    with open_project(root) as p:
        run = p.open_or_start(RUN)
        status = run.run(approve=APPROVE)
        assert status.decision == "done", status.reasons
        recs = run.facts_records()
        audit = recs["AUD"]
        assert audit.validators_passed
        audited = {n: audit.consumed[u][n] for u, n in (("MEMO", "memo.md"),
                                                         ("REG", "risk-register.md"))}
        memo = (p.store.artifacts.root / recs["MEMO"].outputs["memo.md"].path).read_text()
        # The groups come from sources.toml: no inventory unit is needed to know them.
        report = (p.store.artifacts.root / audit.outputs["audit.json"].path).read_text()
        assert "group(s): A, B" in report
        # The block quotes of B5 were taken as two verbatim statements, not one.
        evidence = (p.store.artifacts.root / recs["EB"].outputs["evidence.json"].path).read_text()
        assert "by 2030" in evidence and recs["EB"].attempt == "EB/a1"
        assert run.resume().decision == "done"
    assert "2025-03-14" in memo and "draft for the steering group" in memo
    # The provenance line closes the memo's text; only the citations' footnotes follow it.
    body = memo.split("\n---\n")[0] if "[^1]:" in memo else memo
    # (issue 20: a closing line a client reads, naming the model; was "Models that answered")
    assert body.rstrip().splitlines()[-1].startswith("_Prepared with keepstep's offline "
                                                     "heuristic model (local/keepstep-offline")
    assert "Research pack" not in memo
    # The webhook: each document's bytes once, each the audited bytes.
    assert sorted(map(sha256_hex, hook.received)) == sorted(audited.values())
    assert hook.posts == 2
    # The folder: content-hash names, the audited bytes, nothing twice.
    got = {p.name: sha256_hex(p.read_bytes()) for p in share.iterdir() if p.is_file()}
    assert sorted(got.values()) == sorted(audited.values()) and len(got) == 2
    # The mailbox: one message per document, over TLS, the attachment the audited bytes.
    assert len(mail.messages) == 2 and all(mail.tls_used)
    attached = [sha256_hex(part.get_payload(decode=True)) for m in mail.messages
                for part in m.iter_attachments()]
    assert sorted(attached) == sorted(audited.values())
    assert len({m["Message-ID"] for m in mail.messages}) == 2


def test_a_failed_audit_sends_nothing_and_a_fixed_memo_goes_out_once_everywhere(
        tmp_path: Path, receivers, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first release: the memo template loses its findings section (the audit's
    group check fails) — no receiver gets anything and the release gate is not asked; then
    the section comes back with one more sentence — the audit runs on the new bytes and
    passes, the gate asks again, and each receiver gets the new memo once (the unchanged
    register is not sent again)."""
    hook, mail, share = receivers
    root = install(tmp_path, hook, mail, share, monkeypatch)
    template = root / "templates" / "memo.md"
    original = template.read_text()
    with open_project(root) as p:
        assert p.open_or_start(RUN).run(approve=APPROVE).decision == "done"
    counts = (hook.posts, len(mail.messages), len(list(share.glob("*.md"))))
    assert counts == (2, 2, 2)

    template.write_text(original.replace("<!-- section: findings -->\n", ""))
    with open_project(root) as p:
        run = p.get_run(RUN)
        status = run.resume()
        assert status.decision == "blocked"
        assert not run.facts_records()["AUD"].validators_passed
        assert run.pending_approvals() == []
        assert any("keepstep explain AUD" in r for r in status.reasons)
    assert (hook.posts, len(mail.messages), len(list(share.glob("*.md")))) == counts

    template.write_text(original.replace("## Findings\n", "## Findings\n\nEach finding cites "
                                         "its evidence.\n"))
    with open_project(root) as p:
        run = p.get_run(RUN)
        run.resume()
        [release] = run.pending_approvals()
        assert release.gate == "release"
        run.approve("release", "release", who="test")
        assert run.resume().decision == "done"
        recs = run.facts_records()
        memo = recs["AUD"].consumed["MEMO"]["memo.md"]
        assert recs["AUD"].validators_passed
        assert memo == recs["MEMO"].outputs["memo.md"].sha256
    assert hook.posts == 3 and sha256_hex(hook.received[-1]) == memo
    assert len(mail.messages) == 3
    [part] = list(mail.messages[-1].iter_attachments())
    assert sha256_hex(part.get_payload(decode=True)) == memo
    files = {sha256_hex(f.read_bytes()) for f in share.glob("*.md")}
    assert len(files) == 3 and memo in files
    assert len(set(map(sha256_hex, hook.received))) == len(hook.received)
