"""Deliver the document (issue 21, release safety 3): the webhook POSTs the file's bytes
with its media type, sha256, size and idempotency key; a folder adapter writes atomically
under a content-hash name and is idempotent by construction; an email adapter sends over
SMTP with STARTTLS, Message-ID = the key, its password through `keepstep keys`; and
`keepstep effects test ADAPTER` checks a receiver answers both lookups."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.errors import EffectRejected
from keepstep.engine.files.project import load_config
from keepstep.engine.run.adapters import WebhookAdapter, adapters_from_config
from keepstep.engine.run.deliveries import EmailAdapter, FolderAdapter, message_id
from keepstep.storage.hashing import sha256_hex
from tests.support.smtp_server import SmtpServer
from tests.support.webhook_server import WebhookServer

MEMO = b"# Memo\n\nThe list price is AMC 204,000 a year.\n"


@pytest.fixture
def server():
    srv = WebhookServer().start()
    yield srv
    srv.stop()


def request(tmp_path: Path, data: bytes = MEMO, name: str = "memo.md") -> dict:
    (tmp_path / "art").mkdir(exist_ok=True)
    (tmp_path / "art" / name).write_bytes(data)
    return {"unit": "U9", "name": name, "size": len(data), "sha256": sha256_hex(data),
            "media_type": "text/markdown; charset=utf-8", "path": name}


def test_the_webhook_receives_the_document_bytes_not_a_path(tmp_path: Path, server) -> None:
    """The POST body is the file itself; the headers carry media type, sha256, size, name
    and the idempotency key; a second POST with the key is not applied again."""
    adapter = WebhookAdapter(server.url, timeout=2, source_root=tmp_path / "art")
    req = request(tmp_path)
    assert adapter.perform("ks-k1", req) == "evt-1"
    body = server.records["ks-k1"]["body"]
    assert server.received == [MEMO] and body["size"] == len(MEMO) and body["unit"] == "U9"
    assert body["sha256"] == sha256_hex(MEMO) and body["name"] == "memo.md"
    assert body["content_type"] == "text/markdown; charset=utf-8"
    adapter.perform("ks-k1", req)
    assert server.applied["ks-k1"] == 1 and server.received == [MEMO, MEMO]  # deduplicated
    assert adapter.lookup("ks-k1").found is True and adapter.lookup("ks-k2").found is False


def test_the_webhook_refuses_bytes_that_changed_since_they_were_recorded(
        tmp_path: Path, server) -> None:
    """Bytes no longer matching the recorded sha256 are not sent (EffectRejected)."""
    adapter = WebhookAdapter(server.url, timeout=2, source_root=tmp_path / "art")
    req = request(tmp_path)
    (tmp_path / "art" / "memo.md").write_bytes(MEMO + b"edited\n")
    with pytest.raises(EffectRejected, match="no longer matches"):
        adapter.perform("ks-k1", req)
    assert server.posts == 0


def test_the_folder_adapter_writes_atomically_under_a_content_hash_name(
        tmp_path: Path) -> None:
    """memo-<sha12>.md appears whole (no temporary file left); the same bytes again write
    nothing new, whatever the key; changed bytes get a new name; lookups answer by key."""
    target = tmp_path / "client"
    target.mkdir()
    adapter = FolderAdapter(target, source_root=tmp_path / "art")
    req = request(tmp_path)
    name = adapter.perform("ks-k1", req)
    assert name == f"memo-{sha256_hex(MEMO)[:12]}.md"
    assert (target / name).read_bytes() == MEMO
    assert adapter.perform("ks-k2", req) == name  # idempotent by construction
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == [name]
    assert not list(target.glob(".*.tmp"))
    assert adapter.lookup("ks-k1").found and adapter.lookup("ks-k2").found
    never = adapter.lookup("ks-never")
    assert never.found is False and never.retry_safe
    other = adapter.perform("ks-k3", request(tmp_path, MEMO + b"more\n"))
    assert other != name and len([p for p in target.iterdir() if p.suffix == ".md"]) == 2
    assert FolderAdapter(tmp_path / "unmounted").lookup("ks-k1").found is None


def test_a_folder_adapter_inside_the_project_is_refused(tmp_path: Path) -> None:
    from keepstep.engine.errors import ConfigError
    from tests.support.small_project import make_small_project

    root = make_small_project(tmp_path / "p", adapters={"share": {
        "type": "folder", "target_dir": "out"}})
    with pytest.raises(ConfigError, match="inside the project"):
        load_config(root)


@pytest.fixture
def smtp(tmp_path: Path):
    srv = SmtpServer(tmp_path / "tls", login=("ana", "s3cret")).start()
    yield srv
    srv.stop()


def email_adapter(tmp_path: Path, smtp: SmtpServer, **kw) -> EmailAdapter:
    args = {"host": "127.0.0.1", "port": smtp.port, "sender": "consultant@example.test",
            "to": ["client@example.test"], "username": "ana",
            "ssl_context": ssl.create_default_context(cafile=str(smtp.cert)),
            "source_root": tmp_path / "art", "name": "client-mail"}
    return EmailAdapter(**{**args, **kw})


def test_the_email_adapter_sends_over_starttls_with_the_key_as_message_id(
        tmp_path: Path, smtp: SmtpServer, monkeypatch) -> None:
    """The password comes from `keepstep keys` (here its environment variable); the message
    went over TLS, carries Message-ID <key@…> and the document as its attachment."""
    monkeypatch.setenv("SMTP_CLIENT_MAIL_API_KEY", "s3cret")
    adapter = email_adapter(tmp_path, smtp)
    assert adapter.key_name == "smtp-client-mail"
    assert adapter.perform("ks-dlv-k1", request(tmp_path)) == message_id("ks-dlv-k1")
    [msg] = smtp.messages
    assert smtp.tls_used == [True]
    assert msg["Message-ID"] == "<ks-dlv-k1@keepstep.delivery>"
    [part] = list(msg.iter_attachments())
    assert part.get_filename() == "memo.md" and part.get_payload(decode=True) == MEMO
    assert adapter.lookup("ks-dlv-k1").found is None  # SMTP cannot be asked: a person settles


def test_the_email_adapter_sends_nothing_without_its_password_or_without_tls(
        tmp_path: Path, smtp: SmtpServer, monkeypatch) -> None:
    """No password stored: refused before connecting, nothing sent. A server that offers no
    STARTTLS: refused before the login, nothing sent."""
    monkeypatch.delenv("SMTP_CLIENT_MAIL_API_KEY", raising=False)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    with pytest.raises(EffectRejected, match="keepstep keys set smtp-client-mail"):
        email_adapter(tmp_path, smtp).perform("ks-dlv-k1", request(tmp_path))
    plain = SmtpServer(tmp_path / "tls2", starttls=False).start()
    try:
        with pytest.raises(EffectRejected, match="does not offer STARTTLS"):
            email_adapter(tmp_path, plain, password=lambda: "x").perform(
                "ks-dlv-k2", request(tmp_path))
        assert plain.messages == []
    finally:
        plain.stop()
    assert smtp.messages == []


def test_email_config_from_keepstep_toml(tmp_path: Path) -> None:
    """[adapters.NAME] type = "email" builds an EmailAdapter; no password in the file."""
    from tests.support.small_project import make_small_project

    root = make_small_project(tmp_path / "p", adapters={"mail": {
        "type": "email", "host": "smtp.example.test", "from": "a@example.test",
        "to": ["b@example.test"], "username": "a"}})
    config = load_config(root)
    [adapter] = adapters_from_config(config.adapters, project_root=root,
                                     artifact_root=tmp_path).values()
    assert isinstance(adapter, EmailAdapter) and adapter.starttls and adapter.port == 587


def _project_with(tmp_path: Path, adapters: dict) -> Path:
    from tests.support.small_project import make_small_project

    return make_small_project(tmp_path / "p", adapters=adapters)


def test_effects_test_checks_that_the_receiver_answers_both_lookups(tmp_path: Path,
                                                                    server) -> None:
    """A well-behaved receiver: accepted, the test key found, a key never used not found."""
    root = _project_with(tmp_path, {"client": {"type": "webhook", "url": server.url}})
    result = CliRunner().invoke(app, ["effects", "test", str(root), "client"])
    assert result.exit_code == 0, result.output
    assert "found" in result.output and "OK: the receiver answers both" in result.output
    assert server.posts == 1


def test_effects_test_fails_a_receiver_whose_lookup_does_not_answer(tmp_path: Path,
                                                                    server) -> None:
    """A receiver that takes POSTs but answers every lookup 404 fails the check (exit 1)."""
    server.get = lambda key: (404, {"error": "no lookups here"})  # type: ignore[method-assign]
    root = _project_with(tmp_path, {"client": {"type": "webhook", "url": server.url}})
    result = CliRunner().invoke(app, ["effects", "test", str(root), "client"])
    assert result.exit_code == 1, result.output
    assert "lookup of the test key answered not found; it must answer found" in result.output


def test_effects_test_of_a_folder(tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    root = _project_with(tmp_path, {"share": {"type": "folder", "target_dir": str(share)}})
    result = CliRunner().invoke(app, ["effects", "test", str(root), "share"])
    assert result.exit_code == 0, result.output
    assert len(list(share.glob("keepstep-test-*.txt"))) == 1
