"""The deliveries a consultant uses besides a webhook: a synced client folder and email.

Both follow the adapter protocol of ``engine.run.adapters`` (perform under an idempotency
key, look the key up afterwards) and read the delivered bytes from the artifact root,
checked against the recorded sha256 (``delivered_bytes``). ``check_adapter`` is what
``keepstep effects test ADAPTER`` runs: one test delivery, then a lookup of its key and of a
key never used. docs/delivery.md describes each protocol.
"""

from __future__ import annotations

import email.utils
import mimetypes
import os
import smtplib
import ssl
import uuid
from email.message import EmailMessage
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field

from keepstep.engine.errors import EffectRejected, SideEffectError
from keepstep.engine.files.project import EmailConfig
from keepstep.engine.run.adapters import EffectAdapter, LookupResult, delivered_bytes
from keepstep.storage.artifacts import fsync_dir
from keepstep.storage.hashing import sha256_hex

RECEIPTS_DIR = ".keepstep-deliveries"  # in the target folder: key -> file name


def hashed_name(name: str, sha256: str) -> str:
    """``memo.md`` with sha256 ``1a2b…`` → ``memo-1a2b3c4d5e6f.md``: the content names the file,
    so the same bytes always land under the same name and changed bytes under a new one."""
    pure = PurePosixPath(name).name or "file"
    stem, dot, suffix = pure.rpartition(".")
    if not dot or not stem:
        return f"{pure}-{sha256[:12]}"
    return f"{stem}-{sha256[:12]}.{suffix}"


class FolderAdapter:
    """Writes each delivered file into ``target_dir`` (a synced client folder) under its
    content-hash name, atomically (a hidden temporary file, fsync, rename, fsync of the
    folder), then a receipt ``.keepstep-deliveries/<key>`` naming it.

    Idempotent by construction: a file already there under its content-hash name with the
    right bytes is not written again, so repeating a delivery is always safe — ``lookup``
    answers found (receipt present) or not found and safe to retry. A missing target folder
    (an unmounted drive, a sync client not running) is "cannot tell" for a lookup and
    "nothing written" for a delivery.
    """

    def __init__(self, target_dir: Path, *, name: str = "folder",
                 source_root: Path | None = None) -> None:
        self.target_dir = Path(target_dir)
        self.name = name
        self.source_root = Path(source_root) if source_root is not None else None

    def _receipt(self, key: str) -> Path:
        return self.target_dir / RECEIPTS_DIR / key

    def _atomic_write(self, final: Path, data: bytes) -> None:
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        fsync_dir(final.parent)

    def perform(self, key: str, request: dict[str, Any]) -> str:
        if not self.target_dir.is_dir():
            raise EffectRejected(f"folder {self.target_dir} does not exist (a drive not "
                                 "mounted, a sync client not running?); nothing written")
        data = delivered_bytes(request, self.source_root)
        sha = sha256_hex(data)
        final = self.target_dir / hashed_name(str(request.get("name") or "file"), sha)
        if not (final.is_file() and sha256_hex(final.read_bytes()) == sha):
            self._atomic_write(final, data)
        receipts = self.target_dir / RECEIPTS_DIR
        receipts.mkdir(exist_ok=True)
        self._atomic_write(self._receipt(key), final.name.encode("utf-8"))
        return final.name

    def lookup(self, key: str) -> LookupResult:
        if not self.target_dir.is_dir():
            return LookupResult(found=None)
        receipt = self._receipt(key)
        if receipt.is_file():
            name = receipt.read_text(encoding="utf-8").strip()
            if (self.target_dir / name).is_file():
                return LookupResult(found=True, remote_id=name, retry_safe=True)
        return LookupResult(found=False, retry_safe=True)

    def compensate(self, key: str, remote_id: str | None) -> str:
        receipt = self._receipt(key)
        name = remote_id or (receipt.read_text(encoding="utf-8").strip()
                             if receipt.is_file() else "")
        removed = []
        if name and (self.target_dir / name).is_file():
            (self.target_dir / name).unlink()
            removed.append(name)
        receipt.unlink(missing_ok=True)
        fsync_dir(self.target_dir)
        return "removed:" + (",".join(removed) or "nothing (already gone)")


def message_id(key: str) -> str:
    """The Message-ID an email delivery carries: its idempotency key, so a receiver (or a
    person searching a mailbox) recognises a second copy of the same delivery."""
    return f"<{key}@keepstep.delivery>"


class EmailAdapter:
    """Mails each delivered file as an attachment over SMTP (smtplib), STARTTLS first.

    ``Message-ID`` is ``<KEY@keepstep.delivery>`` (``message_id``): the idempotency key.
    A failure before the message data was accepted for sending — no connection, STARTTLS
    refused or not offered, the login refused, every recipient refused — means nothing was
    sent (``EffectRejected``); a failure after the data went out leaves the outcome unknown
    (``SideEffectError``). SMTP has no way to ask whether a message was delivered, so
    ``lookup`` cannot tell: an unknown email delivery is settled by a person, who searches
    the sent mailbox for the Message-ID (``keepstep effects settle KEY --sent|--not-sent``).

    The password comes from ``keepstep keys set smtp-NAME`` (or ``SMTP_NAME_API_KEY``) when
    the adapter sends, never from keepstep.toml or the database.
    """

    def __init__(self, *, host: str, port: int, sender: str, to: list[str], name: str = "email",
                 subject: str = "Delivery: {name}", username: str | None = None,
                 starttls: bool = True, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 30.0, source_root: Path | None = None,
                 password: Any = None) -> None:
        self.host, self.port, self.sender, self.to = host, port, sender, list(to)
        self.name, self.subject, self.username = name, subject, username
        self.starttls, self.timeout = starttls, timeout
        self.ssl_context = ssl_context
        self.source_root = Path(source_root) if source_root is not None else None
        # The destination a delivery's key names (engine.run.effects.destination_of).
        self.url = f"smtp://{host}:{port}/{','.join(self.to)}"
        self._password = password  # a callable returning the password (tests inject one)

    @classmethod
    def from_config(cls, cfg: EmailConfig, *, name: str, project_root: Path,
                    source_root: Path | None = None) -> EmailAdapter:
        context = None
        if cfg.ca_file:
            ca = (Path(project_root) / cfg.ca_file).resolve()
            context = ssl.create_default_context(cafile=str(ca))
        return cls(host=cfg.host, port=cfg.port, sender=cfg.sender, to=cfg.to, name=name,
                   subject=cfg.subject, username=cfg.username, starttls=cfg.starttls,
                   ssl_context=context, timeout=cfg.timeout_s, source_root=source_root)

    @property
    def key_name(self) -> str:
        """The name its password is stored under: ``keepstep keys set smtp-NAME``."""
        return f"smtp-{self.name}"

    def _login_password(self) -> str | None:
        if self._password is not None:
            return str(self._password())
        from keepstep.engine.gateway.keys import get_api_key, missing_key_error

        password = get_api_key(self.key_name)
        if password is None:
            raise EffectRejected(str(missing_key_error(self.key_name)) + "; nothing sent")
        return password

    def message(self, key: str, request: dict[str, Any], data: bytes) -> EmailMessage:
        name = PurePosixPath(str(request.get("name") or "document")).name
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.to)
        msg["Subject"] = self.subject.replace("{name}", name)
        msg["Message-ID"] = message_id(key)
        msg["Date"] = email.utils.formatdate(usegmt=True)
        msg["X-Keepstep-Sha256"] = str(request.get("sha256", sha256_hex(data)))
        msg.set_content(f"{name} is attached ({len(data)} bytes, sha256 "
                        f"{request.get('sha256', sha256_hex(data))}).\n")
        media = str(request.get("media_type") or mimetypes.guess_type(name)[0]
                    or "application/octet-stream").split(";")[0].strip()
        maintype, _, subtype = media.partition("/")
        msg.add_attachment(data, maintype=maintype or "application",
                           subtype=subtype or "octet-stream", filename=name)
        return msg

    def _connect(self) -> smtplib.SMTP:
        try:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        except (OSError, smtplib.SMTPException) as exc:
            raise EffectRejected(f"{self.host}:{self.port}: could not connect "
                                 f"({type(exc).__name__}); nothing sent") from exc
        try:
            smtp.ehlo()
            if self.starttls:
                if not smtp.has_extn("starttls"):
                    raise EffectRejected(f"{self.host}:{self.port} does not offer STARTTLS; "
                                         "nothing sent")
                smtp.starttls(context=self.ssl_context or ssl.create_default_context())
                smtp.ehlo()
            if self.username:
                smtp.login(self.username, self._login_password() or "")
        except EffectRejected:
            smtp.close()
            raise
        except (OSError, smtplib.SMTPException, ssl.SSLError) as exc:
            smtp.close()
            raise EffectRejected(f"{self.host}:{self.port}: {type(exc).__name__} before "
                                 "anything was sent; nothing sent") from exc
        return smtp

    def perform(self, key: str, request: dict[str, Any]) -> str:
        data = (delivered_bytes(request, self.source_root) if "path" in request
                else str(request).encode("utf-8"))
        msg = self.message(key, request, data)
        smtp = self._connect()
        try:
            refused = smtp.send_message(msg)
        except smtplib.SMTPRecipientsRefused as exc:
            raise EffectRejected(f"{self.host}: every recipient was refused; nothing "
                                 "sent") from exc
        except smtplib.SMTPSenderRefused as exc:
            raise EffectRejected(f"{self.host}: the sender {self.sender} was refused; nothing "
                                 "sent") from exc
        except (OSError, smtplib.SMTPException) as exc:  # TimeoutError is an OSError
            raise SideEffectError(f"{self.host}: {type(exc).__name__} while the message was "
                                  "being sent; outcome unknown") from exc
        finally:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()
        if refused:
            # Accepted for some recipients only: it was sent; the receipt says who missed it.
            return f"{message_id(key)} (refused: {', '.join(sorted(refused))})"
        return message_id(key)

    def lookup(self, key: str) -> LookupResult:
        return LookupResult(found=None)


class AdapterCheck(BaseModel):
    """What ``keepstep effects test ADAPTER`` found: whether the receiver took a delivery,
    and whether its lookup answers for that key and for a key never used."""

    adapter: str
    key: str
    delivered: bool
    remote_id: str | None = None
    found_after: bool | None = Field(default=None, description="lookup of the test key")
    unknown_key: bool | None = Field(default=None, description="lookup of a key never used "
                                     "(False is the right answer)")
    problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="what the check could not "
                             "ask (an email has no lookup)")

    @property
    def ok(self) -> bool:
        return not self.problems


def check_adapter(adapter: EffectAdapter, scratch: Path) -> AdapterCheck:
    """Deliver a small test document through ``adapter`` under a fresh key, then look that
    key up (the answer must be found) and a key never used (the answer must be not found).
    An adapter whose protocol has no lookup (email) is reported as such, not as a failure of
    the receiver. ``scratch`` is a private folder for the test document."""
    tag = uuid.uuid4().hex[:12]
    key, never = f"ks-test-{tag}", f"ks-test-never-{tag}"
    body = f"keepstep delivery test {tag}\n".encode()
    scratch.mkdir(parents=True, exist_ok=True)
    doc = scratch / f"keepstep-test-{tag}.txt"
    doc.write_bytes(body)
    request = {"unit": "TEST", "name": doc.name, "size": len(body), "sha256": sha256_hex(body),
               "media_type": "text/plain; charset=utf-8", "path": str(doc)}
    check = AdapterCheck(adapter=adapter.name, key=key, delivered=False)
    try:
        check.remote_id = adapter.perform(key, request)
        check.delivered = True
    except Exception as exc:  # noqa: BLE001 - reported, whatever the adapter raised
        check.problems.append(f"the test delivery failed: {type(exc).__name__}: {exc}")
        return check
    finally:
        doc.unlink(missing_ok=True)
    if isinstance(adapter, EmailAdapter):
        check.notes.append(
            "SMTP has no lookup: an unknown email outcome is settled by a person (search the "
            f"sent mailbox for Message-ID {message_id(key)}); the test message was accepted")
        return check
    for which, k, want in (("the test key", key, True), ("a key never used", never, False)):
        try:
            got = adapter.lookup(k)
        except Exception as exc:  # noqa: BLE001 - reported
            check.problems.append(f"lookup of {which} failed: {type(exc).__name__}: {exc}")
            continue
        if which == "the test key":
            check.found_after = got.found
        else:
            check.unknown_key = got.found
        if got.found is not want:
            check.problems.append(
                f"lookup of {which} answered {_said(got)}; it must answer "
                f"{'found' if want else 'not found'} (see docs/delivery.md)")
    return check


def test_effect_adapter(root: Path, name: str) -> AdapterCheck:
    """``keepstep effects test NAME``: build the project's ``[adapters.NAME]`` from
    keepstep.toml and ``check_adapter`` it (a real test delivery to the real receiver)."""
    import tempfile

    from keepstep.engine.errors import ConfigError
    from keepstep.engine.files.project import load_config
    from keepstep.engine.run.adapters import adapters_from_config

    root = Path(root).resolve()
    config = load_config(root)
    if name not in config.adapters:
        configured = ", ".join(sorted(config.adapters)) or "none"
        raise ConfigError(f"no adapter named {name!r} in {root / 'keepstep.toml'} (configured: "
                          f"{configured})", hint=f"add an [adapters.{name}] table; see "
                          "docs/delivery.md")
    with tempfile.TemporaryDirectory(prefix="keepstep-adapter-test-") as scratch:
        adapter = adapters_from_config({name: config.adapters[name]}, project_root=root,
                                       artifact_root=Path(scratch))[name]
        return check_adapter(adapter, Path(scratch))


def _said(got: LookupResult) -> str:
    return "cannot tell" if got.found is None else "found" if got.found else "not found"


__all__ = ["AdapterCheck", "EmailAdapter", "FolderAdapter", "check_adapter", "hashed_name",
           "message_id", "test_effect_adapter"]
