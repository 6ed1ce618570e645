"""The task contract, a source entry and the input snapshot: the run's root inputs as values.

Reading them from the project folder is ``engine.files``' job; here they are plain data
with the hashes that changes and invalidation compare.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from keepstep.engine.core.hashing import canonical_json, sha256_hex


class Contract(BaseModel):
    """The task contract: front matter fields (audience, goal, scope…) plus the body."""

    fields: dict[str, Any]
    body: str

    @property
    def audience(self) -> str:
        return str(self.fields.get("audience", ""))

    def hash(self) -> str:
        return sha256_hex(canonical_json({"fields": self.fields, "body": self.body}))

    def field_hashes(self) -> dict[str, str]:
        """field -> hash of its value, plus ``body``: what a ``contract:<field>`` input saw."""
        out = {k: sha256_hex(canonical_json(v)) for k, v in self.fields.items()}
        out["body"] = sha256_hex(self.body)
        return out


class SourceEntry(BaseModel):
    """One ``[[source]]`` of sources.toml: where the file is and whether it is approved."""

    model_config = ConfigDict(extra="forbid")
    id: str
    path: str
    group: str = ""
    title: str = ""
    kind: str = ""
    # Optional metadata a prompt carries (``date``: when the source was published or last
    # amended, e.g. 2025-06-01; ``publisher``: who issued it). Left out of sources.toml when
    # empty.
    date: str = ""
    publisher: str = ""
    approved: bool = False

    @model_serializer(mode="wrap")
    def _drop_empty_metadata(self, handler: Any) -> Any:
        data = handler(self)
        for name in ("date", "publisher"):
            if isinstance(data, dict) and data.get(name) == "":
                data.pop(name)
        return data


class InputSnapshot(BaseModel):
    """The approved source set: ids and sha256 — never the text. ``headers`` and ``bodies``
    hash each source's header lines and body apart (``split_header``), so a change can be
    typed ``structure`` or ``content``; empty when not known."""

    sources: dict[str, str]  # id -> sha256
    groups: dict[str, str]  # id -> group
    headers: dict[str, str] = Field(default_factory=dict)  # id -> sha256 of its header lines
    bodies: dict[str, str] = Field(default_factory=dict)  # id -> sha256 of its body

    def hash(self) -> str:
        value: dict[str, Any] = {"sources": self.sources, "groups": self.groups}
        if self.headers:  # a header-only edit (a title in sources.toml) is a new snapshot
            value["headers"] = self.headers
        return sha256_hex(canonical_json(value))


_FENCES = ("---", "+++")


def split_header(text: str) -> tuple[str, str]:
    """(header lines, body) of a source's text: the header is a leading front-matter block
    between ``---`` (or ``+++``) lines — title, type, date and the like; no block, no header."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].strip() in _FENCES:
        fence = lines[0].strip()
        for i in range(1, len(lines)):
            if lines[i].strip() == fence or (fence == "---" and lines[i].strip() == "..."):
                return "".join(lines[:i + 1]), "".join(lines[i + 1:])
    return "", text


def header_fields(header: str) -> dict[str, str]:
    """``key: value`` (or ``key = "value"``) lines of a header block, in order."""
    out: dict[str, str] = {}
    for line in header.splitlines()[1:-1]:
        key, sep, value = line.partition(":") if ":" in line else line.partition("=")
        if sep and key.strip() and not key.startswith((" ", "\t", "#")):
            out[key.strip()] = value.strip().strip('"').strip("'")
    return out


def source_hashes(entry: SourceEntry, data: bytes) -> tuple[str, str]:
    """(header hash, body hash) of a source file: the header covers its front matter and its
    sources.toml title, kind and path (what a header-only reader sees); a file that is not
    UTF-8 text is all body."""
    try:
        header, body = split_header(data.decode("utf-8"))
        body_hash = sha256_hex(body)
    except UnicodeDecodeError:
        header, body_hash = "", sha256_hex(data)
    meta = {"header": header, "title": entry.title, "kind": entry.kind, "path": entry.path}
    meta.update({k: v for k, v in (("date", entry.date), ("publisher", entry.publisher)) if v})
    return sha256_hex(canonical_json(meta)), body_hash


__all__ = ["Contract", "InputSnapshot", "SourceEntry", "header_fields", "source_hashes",
           "split_header"]
