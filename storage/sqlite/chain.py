"""Checkpoint hashes and chain verification: the head check, the whole chain, and the
incremental check that remembers the newest verified version."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from keepstep.storage.errors import NotFound
from keepstep.storage.hashing import (
    EMPTY_STATE_HASH,
    canonical_json,
    sha256_hex,
    state_hash_of,
    state_hash_update,
)
from keepstep.storage.models import ChainProblem, ChainReport, Checkpoint, Head
from keepstep.storage.sqlite.connection import SQLiteBase

HASHED_FIELDS = (
    "run_id", "branch_id", "version", "parent_branch", "parent_version", "parent_hash",
    "kind", "schema_version", "unit", "attempt", "fencing_token", "state_hash", "created_at",
)


def checkpoint_hash(row: Mapping[str, Any]) -> str:
    """The hash of a checkpoint row (its delta given decoded or as JSON text)."""
    fields = {k: row[k] for k in HASHED_FIELDS}
    delta = row["delta"]
    fields["delta"] = json.loads(delta) if isinstance(delta, str) else delta
    return sha256_hex(canonical_json(fields))


def object_json(values: Mapping[str, str | None]) -> str:
    """canonical_json of a dict whose values are already canonical JSON (None -> null).

    Byte-identical to ``canonical_json({k: json.loads(v)})``: sorted keys, no
    spaces — so a commit encodes each delta value once, not three times.
    """
    return "{" + ",".join(
        f"{json.dumps(k, ensure_ascii=False)}:{'null' if values[k] is None else values[k]}"
        for k in sorted(values)
    ) + "}"


def _scalar_json(value: Any) -> str:
    """canonical_json of one field value (a string, an int or None) without json.dumps's
    per-call set-up: the same C string encoder ``ensure_ascii=False`` uses."""
    if value is None:
        return "null"
    if type(value) is str:
        return str(encode_basestring(value))
    if type(value) is int:
        return str(value)
    return canonical_json(value)


def checkpoint_hash_encoded(row: Mapping[str, Any], delta_json: str) -> str:
    """checkpoint_hash of ``row`` whose delta is given as its canonical JSON.

    The fields are written in canonical_json's (sorted) key order with the delta text in
    its place: the same bytes canonical_json gives, at a fraction of its cost (a resume
    hashes every checkpoint committed since the last verified one; tests pin the equality).
    """
    j = _scalar_json
    return sha256_hex(
        f'{{"attempt":{j(row["attempt"])},"branch_id":{j(row["branch_id"])},'
        f'"created_at":{j(row["created_at"])},"delta":{delta_json},'
        f'"fencing_token":{j(row["fencing_token"])},"kind":{j(row["kind"])},'
        f'"parent_branch":{j(row["parent_branch"])},"parent_hash":{j(row["parent_hash"])},'
        f'"parent_version":{j(row["parent_version"])},"run_id":{j(row["run_id"])},'
        f'"schema_version":{j(row["schema_version"])},"state_hash":{j(row["state_hash"])},'
        f'"unit":{j(row["unit"])},"version":{j(row["version"])}}}')


def _row_hash_ok(row: Mapping[str, Any]) -> bool:
    """Whether a stored row matches its hash: from its delta text as stored (canonical, as
    every commit writes it), else decoded and encoded again."""
    try:
        stored = str(row["hash"])
        return (checkpoint_hash_encoded(row, str(row["delta"])) == stored
                or checkpoint_hash(row) == stored)
    except (ValueError, TypeError):  # undecodable delta text: edited
        return False


def checkpoint_of(row: Mapping[str, Any]) -> Checkpoint:
    data = dict(row)
    data["delta"] = json.loads(data["delta"])
    return Checkpoint(**data)


class ChainChecks(SQLiteBase):
    """Chain verification of SQLiteStore (uses its checkpoint reads)."""

    if TYPE_CHECKING:  # provided by Checkpoints (sqlite/checkpoints.py)
        def get_head(self, run_id: str, branch_id: str = "main") -> Head: ...
        def get_checkpoint(self, run_id: str, version: int, branch_id: str = "main"
                           ) -> Checkpoint: ...
        def list_checkpoints(self, run_id: str, branch_id: str = "main", *,
                             kinds: Iterable[str] | None = None, since_version: int = 0,
                             limit: int | None = None) -> list[Checkpoint]: ...
        def _lineage(self, run_id: str, branch_id: str) -> list[tuple[str, int | None]]: ...

    def _raw_rows(self, run_id: str, branch_id: str, since_version: int) -> list[dict[str, Any]]:
        """The lineage's checkpoint rows from ``since_version``, as stored (delta as text):
        what the incremental check hashes without decoding anything."""
        rows: list[dict[str, Any]] = []
        for b, upto in self._lineage(run_id, branch_id):
            sql = ("SELECT * FROM checkpoints WHERE run_id = ? AND branch_id = ? "
                   "AND version >= ?")
            params: list[Any] = [run_id, b, since_version]
            if upto is not None:
                sql += " AND version <= ?"
                params.append(upto)
            rows.extend(self._q(sql, params))
        return rows

    def _materialised_hash(self, run_id: str, branch_id: str) -> str:
        rows = self._q(
            "SELECT key, value FROM current_state WHERE run_id = ? AND branch_id = ?",
            [run_id, branch_id],
        )
        return state_hash_of({r["key"]: r["value"] for r in rows})

    def verify_head(self, run_id: str, branch_id: str = "main") -> ChainReport:
        problems: list[ChainProblem] = []
        head = self.get_head(run_id, branch_id)

        def bad(v: int, what: str) -> None:
            problems.append(ChainProblem(version=v, branch_id=branch_id, problem=what))

        try:
            cp = self.get_checkpoint(run_id, head.version, branch_id)
        except NotFound:
            bad(head.version, "head checkpoint row is missing")
            return ChainReport(ok=False, checked=0, problems=problems)
        if checkpoint_hash(cp.model_dump()) != cp.hash:
            bad(cp.version, "checkpoint row does not match its hash (edited)")
        if cp.hash != head.hash:
            bad(cp.version, "branch head hash does not match the head checkpoint")
        if cp.parent_version is not None:
            try:
                parent = self.get_checkpoint(run_id, cp.parent_version, branch_id)
                if parent.hash != cp.parent_hash:
                    bad(cp.version, f"parent hash does not match checkpoint {parent.version}")
            except NotFound:
                bad(cp.version, f"parent checkpoint {cp.parent_version} is missing")
        if self._materialised_hash(run_id, branch_id) != cp.state_hash:
            bad(cp.version, "materialised state does not match the head's state hash")
        return ChainReport(ok=not problems, checked=1, problems=problems)

    def verify_chain(self, run_id: str, branch_id: str = "main") -> ChainReport:
        problems: list[ChainProblem] = []
        head = self.get_head(run_id, branch_id)
        rows = {c.version: c for c in self.list_checkpoints(run_id, branch_id)}

        def bad(v: int, what: str) -> None:
            problems.append(ChainProblem(version=v, branch_id=branch_id, problem=what))

        if head.version not in rows:
            bad(head.version, "head checkpoint row is missing")
        elif rows[head.version].hash != head.hash:
            bad(head.version, "branch head hash does not match the head checkpoint")
        for v in range(head.version, -1, -1):
            cp = rows.get(v)
            if cp is None:
                bad(v, f"checkpoint {v} is missing (the chain breaks here)")
                continue
            if checkpoint_hash(cp.model_dump()) != cp.hash:
                bad(v, "checkpoint row does not match its hash (edited)")
            if v == 0:
                if cp.parent_version is not None or cp.kind != "genesis":
                    bad(v, "version 0 is not a genesis checkpoint")
                continue
            if cp.parent_version != v - 1:
                bad(v, f"parent version is {cp.parent_version}, expected {v - 1}")
            parent = rows.get(v - 1)
            if parent is not None and parent.hash != cp.parent_hash:
                bad(v, f"parent hash does not match checkpoint {v - 1}")
        # Replay: each stored state hash must follow from its parent's and its delta.
        state: dict[str, str] = {}
        current = EMPTY_STATE_HASH
        for v in range(0, head.version + 1):
            cp = rows.get(v)
            if cp is None:
                break
            removed, added = [], []
            for key in sorted(cp.delta):
                if key in state:
                    removed.append((key, state.pop(key)))
                if cp.delta[key] is not None:
                    state[key] = canonical_json(cp.delta[key])
                    added.append((key, state[key]))
            current = state_hash_update(current, removed, added)
            if current != cp.state_hash:
                bad(v, "state hash does not follow from the parent state and the delta")
                current = cp.state_hash
        else:
            if self._materialised_hash(run_id, branch_id) != current:
                bad(head.version, "materialised state differs from the replayed chain")
        problems.sort(key=lambda p: -p.version)
        return ChainReport(ok=not problems, checked=len(rows), problems=problems,
                           verified_version=head.version if not problems else None)

    def verify_since_last(self, run_id: str, branch_id: str = "main") -> ChainReport:
        head = self.get_head(run_id, branch_id)
        mark = self._q1("SELECT version, hash FROM chain_verified WHERE run_id = ? "
                        "AND branch_id = ?", [run_id, branch_id])
        if mark is not None and mark["version"] > head.version:
            mark = None  # a marker ahead of the head cannot be trusted: start over
        start = mark["version"] if mark is not None else 0
        # Raw rows, each hashed from its stored delta text (a commit stores the canonical
        # encoding, so no row is decoded): the cost per checkpoint is one sha256. A row whose
        # text is not canonical is hashed the slow way before it is called edited.
        rows = self._raw_rows(run_id, branch_id, start)
        by_version = {r["version"]: r for r in rows}
        problems: list[ChainProblem] = []

        def bad(v: int, what: str) -> None:
            problems.append(ChainProblem(version=v, branch_id=branch_id, problem=what))

        for v in range(start, head.version + 1):
            cp = by_version.get(v)
            if cp is None:
                bad(v, f"checkpoint {v} is missing (the chain breaks here)")
                continue
            if not _row_hash_ok(cp):
                bad(v, "checkpoint row does not match its hash (edited)")
            if mark is not None and v == start:
                if cp["hash"] != mark["hash"]:
                    bad(v, "checkpoint changed since it was last verified")
                continue
            if v == 0:
                if cp["parent_version"] is not None or cp["kind"] != "genesis":
                    bad(v, "version 0 is not a genesis checkpoint")
                continue
            if cp["parent_version"] != v - 1:
                bad(v, f"parent version is {cp['parent_version']}, expected {v - 1}")
            parent = by_version.get(v - 1)
            if parent is not None and parent["hash"] != cp["parent_hash"]:
                bad(v, f"parent hash does not match checkpoint {v - 1}")
        top = by_version.get(head.version)
        if top is not None and top["hash"] != head.hash:
            bad(head.version, "branch head hash does not match the head checkpoint")
        problems.sort(key=lambda p: p.version)
        verified = mark["version"] if mark is not None else None
        if not problems:
            verified = head.version
            if not self.read_only and (mark is None or mark["version"] != head.version):
                # Not synced on its own: losing the marker only means checking more next time.
                with self._write(durable=False) as db:
                    db.conn.execute(
                        "INSERT INTO chain_verified (run_id, branch_id, version, hash) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (run_id, branch_id) DO UPDATE SET "
                        "version = excluded.version, hash = excluded.hash",
                        [run_id, branch_id, head.version, head.hash])
        return ChainReport(ok=not problems, checked=len(rows), problems=problems,
                           verified_version=verified)
