"""Effect adapters: the external systems a ``deliver`` unit acts on, and how they answer.

An adapter performs an action under an idempotency key and can look the key up afterwards
(``engine.run.effects`` keeps the ledger around it). Built from keepstep.toml's
``[adapters.NAME]`` tables by ``adapters_from_config``; no adapter is ever given a secret.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from keepstep.engine.errors import EffectRejected, SideEffectError
from keepstep.engine.files.project import (
    AdapterConfig,
    EmailConfig,
    FileDropConfig,
    FolderConfig,
)
from keepstep.storage.artifacts import fsync_dir
from keepstep.storage.hashing import canonical_json, file_sha256, sha256_hex


class LookupResult(BaseModel):
    """What an adapter knows about a key: found (True/False) or cannot tell (None)."""

    found: bool | None
    remote_id: str | None = None
    retry_safe: bool = False  # when not found: performing again with the same key is safe


@runtime_checkable
class EffectAdapter(Protocol):
    """An external system. ``compensate(key, remote_id) -> str`` is optional.

    ``perform`` must send the key so the remote side can deduplicate, and return
    the remote id; raise EffectRejected only when the action certainly did not
    happen. ``lookup`` must not act; raising counts as "cannot tell".
    """

    name: str

    def perform(self, key: str, request: dict[str, Any]) -> str: ...
    def lookup(self, key: str) -> LookupResult: ...


class FileDropAdapter:
    """Copies a file (request ``{"path": ...}``) into a folder outside the project.

    The copy is named ``<key>--<original name>`` and appears atomically (temp
    file + rename), so ``lookup`` answers definitely: found, or not found and
    safe to retry. A missing target folder (an unmounted drive) is "cannot tell".
    A relative ``path`` resolves against ``source_root`` (the artifact root), so a
    recorded request stays valid when the project folder moves; with a ``sha256``
    in the request, a source that no longer matches it is refused (nothing copied).
    """

    def __init__(self, target_dir: Path, *, name: str = "file-drop",
                 project_root: Path | None = None, source_root: Path | None = None) -> None:
        self.target_dir = Path(target_dir)
        self.name = name
        self.source_root = Path(source_root) if source_root is not None else None
        if project_root is not None:
            target = self.target_dir.resolve()
            root = Path(project_root).resolve()
            if target == root or root in target.parents:
                raise ValueError(f"{target_dir} is inside the project {project_root}; a file "
                                 "drop must go to a folder outside it")

    def _matches(self, key: str) -> list[Path]:
        return sorted(self.target_dir.glob(f"{key}--*"))

    def perform(self, key: str, request: dict[str, Any]) -> str:
        if not self.target_dir.is_dir():
            raise EffectRejected(f"drop folder {self.target_dir} does not exist; nothing copied")
        source = Path(request["path"])
        if self.source_root is not None and not source.is_absolute():
            source = self.source_root / source
        if not source.is_file():
            raise EffectRejected(f"{source} is not a file; nothing copied")
        if "sha256" in request and file_sha256(str(source)) != request["sha256"]:
            raise EffectRejected(f"{source} no longer matches its recorded sha256; nothing copied")
        existing = self._matches(key)
        if existing:
            return str(existing[0])
        for stale in self.target_dir.glob(f".{key}.*.tmp"):
            stale.unlink(missing_ok=True)
        final = self.target_dir / f"{key}--{source.name}"
        tmp = self.target_dir / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        fsync_dir(self.target_dir)
        return str(final)

    def lookup(self, key: str) -> LookupResult:
        if not self.target_dir.is_dir():
            return LookupResult(found=None)
        found = self._matches(key)
        if found:
            return LookupResult(found=True, remote_id=str(found[0]), retry_safe=True)
        return LookupResult(found=False, retry_safe=True)

    def compensate(self, key: str, remote_id: str | None) -> str:
        removed = []
        for path in self._matches(key):
            path.unlink(missing_ok=True)
            removed.append(path.name)
        fsync_dir(self.target_dir)
        return "removed:" + (",".join(removed) or "nothing (already gone)")


DELIVERY_HEADERS = {"key": "Idempotency-Key", "sha256": "X-Keepstep-Sha256",
                    "name": "X-Keepstep-Name", "unit": "X-Keepstep-Unit"}


def delivered_bytes(request: Mapping[str, Any], source_root: Path | None) -> bytes:
    """The bytes a delivery request names (``path`` under the artifact root), checked against
    its ``sha256`` and ``size``: a file that changed since is refused (nothing sent)."""
    source = Path(str(request["path"]))
    if source_root is not None and not source.is_absolute():
        source = source_root / source
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise EffectRejected(f"{source} cannot be read ({type(exc).__name__}); nothing "
                             "sent") from exc
    if "sha256" in request and sha256_hex(data) != request["sha256"]:
        raise EffectRejected(f"{source} no longer matches its recorded sha256; nothing sent")
    return data


class WebhookAdapter:
    """HTTP POST with ``Idempotency-Key: <key>`` (httpx), documented in docs/delivery.md.

    A delivery (a request with ``path`` and ``sha256``, from the deliver kind) POSTs the
    file's bytes themselves, with ``Content-Type`` (its media type), ``Content-Length``,
    ``X-Keepstep-Sha256`` (hex), ``X-Keepstep-Name`` and ``X-Keepstep-Unit``; the bytes are
    read from the artifact root and checked against the sha256 first. Any other request is
    POSTed as JSON.

    lookup = GET ``{url}/{key}``: 200 found (remote id from the body's ``id``),
    404 not found and safe to retry, 410 gone (undone; not safe to resend),
    anything else or no connection: cannot tell. compensate = DELETE ``{url}/{key}``.

    A failure before the request was written — the name does not resolve, the connection is
    refused or times out while connecting, the URL is invalid — means nothing was sent
    (``EffectRejected``); a failure after it (a read error or timeout, a dropped connection,
    a 5xx) leaves the outcome unknown (``SideEffectError``).
    """

    def __init__(self, url: str, timeout: float = 5.0, *, name: str = "webhook",
                 source_root: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.name = name
        self.source_root = Path(source_root) if source_root is not None else None

    def _body(self, key: str, request: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        if "path" not in request or "sha256" not in request:
            return canonical_json(request).encode("utf-8"), {
                "Content-Type": "application/json", "Idempotency-Key": key}
        data = delivered_bytes(request, self.source_root)
        return data, {
            "Content-Type": str(request.get("media_type") or "application/octet-stream"),
            DELIVERY_HEADERS["key"]: key, DELIVERY_HEADERS["sha256"]: str(request["sha256"]),
            DELIVERY_HEADERS["name"]: urllib.parse.quote(str(request.get("name", "")), safe=""),
            DELIVERY_HEADERS["unit"]: urllib.parse.quote(str(request.get("unit", "")), safe=""),
        }

    def _call(self, method: str, url: str, body: bytes | None = None,
              headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        import httpx

        # A fresh client per call: adapters are used from several threads and rarely.
        with httpx.Client(timeout=self.timeout, follow_redirects=False, trust_env=False) as c:
            resp = c.request(method, url, content=body, headers=dict(headers or {}))
            return resp.status_code, resp.content

    def _key_url(self, key: str) -> str:
        return f"{self.url}/{urllib.parse.quote(key, safe='')}"

    @staticmethod
    def _remote_id(body: bytes, default: str) -> str:
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return default
        return str(data.get("id", default)) if isinstance(data, dict) else default

    def perform(self, key: str, request: dict[str, Any]) -> str:
        import httpx

        content, headers = self._body(key, request)
        try:
            status, body = self._call("POST", self.url, content, headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # No connection was made (DNS failure, refused, unreachable): nothing was sent.
            raise EffectRejected(f"{self.url}: could not connect ({type(exc).__name__}); "
                                 "nothing sent") from exc
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise EffectRejected(f"{self.url} is not a URL keepstep can send to; nothing "
                                 "sent") from exc
        except httpx.HTTPError as exc:
            raise SideEffectError(f"{self.url}: {type(exc).__name__} after the request was "
                                  "sent; outcome unknown") from exc
        if 200 <= status < 300:
            return self._remote_id(body, key)
        if 400 <= status < 500 and status not in (408, 409, 425, 429):
            raise EffectRejected(f"{self.url} rejected the request (HTTP {status})")
        raise SideEffectError(f"{self.url} answered HTTP {status}; outcome unknown")

    def lookup(self, key: str) -> LookupResult:
        import httpx

        try:
            status, body = self._call("GET", self._key_url(key))
        except (httpx.HTTPError, OSError):
            return LookupResult(found=None)
        if status == 200:
            return LookupResult(found=True, remote_id=self._remote_id(body, key), retry_safe=True)
        if status == 404:
            return LookupResult(found=False, retry_safe=True)
        if status == 410:
            return LookupResult(found=False, retry_safe=False)
        return LookupResult(found=None)

    def compensate(self, key: str, remote_id: str | None) -> str:
        status, _ = self._call("DELETE", self._key_url(key))
        if status in (200, 202, 204, 404, 410):
            return f"deleted:{key}"
        raise SideEffectError(f"{self.url} answered HTTP {status} to DELETE; outcome unknown")


def adapters_from_config(configs: Mapping[str, AdapterConfig], *,
                         project_root: Path, artifact_root: Path) -> dict[str, EffectAdapter]:
    """The adapters a project's ``[adapters.NAME]`` tables describe, by name.

    Built from keepstep.toml alone: no adapter is ever given a secret from the database (an
    email adapter reads its password from the keyring or the environment when it sends).
    """
    from keepstep.engine.run.deliveries import EmailAdapter, FolderAdapter

    out: dict[str, EffectAdapter] = {}
    for name, cfg in configs.items():
        if isinstance(cfg, FileDropConfig):
            out[name] = FileDropAdapter(cfg.target(project_root), name=name,
                                        project_root=project_root, source_root=artifact_root)
        elif isinstance(cfg, FolderConfig):
            out[name] = FolderAdapter(cfg.target(project_root), name=name,
                                      source_root=artifact_root)
        elif isinstance(cfg, EmailConfig):
            out[name] = EmailAdapter.from_config(cfg, name=name, project_root=project_root,
                                                 source_root=artifact_root)
        else:
            out[name] = WebhookAdapter(cfg.url, timeout=cfg.timeout_s, name=name,
                                       source_root=artifact_root)
    return out


__all__ = ["DELIVERY_HEADERS", "EffectAdapter", "FileDropAdapter", "LookupResult",
           "WebhookAdapter", "adapters_from_config", "delivered_bytes"]
