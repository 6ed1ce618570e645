"""The task contract, a source entry and the input snapshot: the run's root inputs as values.

Reading them from the project folder is ``engine.files``' job; here they are plain data
with the hashes that changes and invalidation compare.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

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
    approved: bool = False


class InputSnapshot(BaseModel):
    """The approved source set: ids and sha256 — never the text."""

    sources: dict[str, str]  # id -> sha256
    groups: dict[str, str]  # id -> group

    def hash(self) -> str:
        return sha256_hex(canonical_json({"sources": self.sources, "groups": self.groups}))


__all__ = ["Contract", "InputSnapshot", "SourceEntry"]
