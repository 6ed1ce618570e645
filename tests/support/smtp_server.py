"""A local SMTP server for the email adapter's tests (aiosmtpd, 127.0.0.1, a free port) with
STARTTLS (a self-signed certificate made here) and optional AUTH; ``messages`` holds what it
received, parsed."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import socket
import ssl
from email.message import Message
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1/localhost, valid for a day."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class _Handler:
    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, ANN201
        self.server.messages.append(email.message_from_bytes(envelope.content,
                                                             policy=email.policy.default))
        self.server.tls_used.append(session.ssl is not None)
        return "250 OK"


class SmtpServer:
    """``start()``/``stop()``; ``messages`` (parsed); ``cert`` is the CA file to trust."""

    def __init__(self, folder: Path, *, starttls: bool = True,
                 login: tuple[str, str] | None = None) -> None:
        self.messages: list[Message] = []
        self.tls_used: list[bool] = []
        self.port = _free_port()
        self.login = login
        self.cert, key = self_signed(folder)
        context = None
        if starttls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.cert, key)
        kwargs: dict = {}
        if login is not None:
            kwargs = {"authenticator": self._auth, "auth_require_tls": True}
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port,
                                      tls_context=context, require_starttls=starttls,
                                      **kwargs)

    def _auth(self, server, session, envelope, mechanism, auth_data):  # noqa: ANN001, ANN202
        ok = (isinstance(auth_data, LoginPassword) and self.login is not None
              and (auth_data.login.decode(), auth_data.password.decode()) == self.login)
        return AuthResult(success=ok)

    def start(self) -> SmtpServer:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()
