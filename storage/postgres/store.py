"""PostgresStore: the Store on a PostgreSQL server, for several executors on several hosts.

State lives on the server; each host keeps a local folder (``<project>/.keepstep``) where
its attempts stage files, exactly as with SQLite. A commit writes the committed files'
bytes into ``blobs`` (by sha256) in the commit's own transaction, so a commit is still all
or nothing and any host can read every committed artifact: a host materialises the files
it lacks from the blobs (:meth:`PostgresStore.sync_artifacts`) when it opens the store, when
it reads a head that moved, and when it claims at a head it has not seen, so the engine
reads them where it always does.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psycopg

from keepstep.storage.artifacts import ArtifactStore
from keepstep.storage.errors import StorageError
from keepstep.storage.hashing import file_sha256
from keepstep.storage.models import (
    ArtifactEntry,
    AttemptEnd,
    Claim,
    CommitRequest,
    Head,
    RunOverlay,
)
from keepstep.storage.permissions import SEALED_MODE, make_private_dir, open_private
from keepstep.storage.postgres.connection import (
    CHANGES_CHANNEL,
    RECONNECT_SECONDS,
    ConnectionLost,
    PostgresBase,
    storage_error,
)
from keepstep.storage.postgres.database import (
    check_schema,
    connect_once,
    migrate,
    redacted,
)
from keepstep.storage.sqlite.approvals import Approvals
from keepstep.storage.sqlite.calls import BUDGET_SQL, Calls
from keepstep.storage.sqlite.checkpoints import STATE_VALUES_CHUNK, STATE_VALUES_SQL, Checkpoints
from keepstep.storage.sqlite.claims import CLAIM_HEAD_SQL, CLAIM_TOKEN_SQL, Claims
from keepstep.storage.sqlite.effects import Effects
from keepstep.storage.sqlite.events import Events
from keepstep.storage.sqlite.manifests import Manifests

# PostgresStore sends statements of the shared capability classes ahead of them
# (PgConn.send_ahead), the same constants they execute: a claim's fencing token and its read
# of the head, lease and attempt number go out with BEGIN (2 round trips instead of 3); a
# commit's read of the old state values goes out with its read of the head (2 instead of 3).
# A commit's read of the budget (its usage, the budget it records) goes out with them too.
# tests/postgres/test_pipeline.py counts them.

# Committed files larger than this are refused at commit (a bytea value is at most 1 GB;
# artifacts are reports and extracts, far smaller).
MAX_BLOB_BYTES = 256 * 1024 * 1024


class PostgresStore(PostgresBase, Checkpoints, Claims, Events, Calls, Approvals, Effects,
                    Manifests):
    """The Store on PostgreSQL. ``root`` is this host's local state folder (staging and the
    artifact cache); ``url`` the server (``postgresql://user@host:5432/db``; the password
    comes from ``password``, PGPASSWORD or ~/.pgpass, never from keepstep.toml).

    ``clock=None`` uses the database server's clock for leases and timestamps; a clock
    given here replaces it (tests). ``read_only=True`` neither migrates nor writes.
    """

    def __init__(self, root: Path, url: str, *, clock: Callable[[], float] | None = None,
                 read_only: bool = False, password: str | None = None, pool_size: int = 4,
                 durable_files: bool = True, sync: bool = True) -> None:
        self.root = Path(root)
        self.url = url
        self.where = redacted(url)
        self._fixed_clock = clock
        self.clock = self.now
        self.read_only = read_only
        self.artifacts = ArtifactStore(self.root / "artifacts", durable=durable_files)
        self._password = password
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        self._synced: dict[str, int] = {}
        self._seen_heads: dict[tuple[str, str], int] = {}
        self._sync_lock = threading.Lock()
        conn = connect_once(url, password)
        try:
            try:
                check_schema(conn, self.where, read_only=read_only)
            except psycopg.Error as exc:
                raise storage_error(exc, "reading the schema version", self.where) from exc
            self.migrated = [] if read_only else migrate(conn, self.where)
        finally:
            conn.close()
        if not read_only:
            make_private_dir(self.root)
        self._init_pool(url, max_size=pool_size, password=password)
        if sync:
            for run_id in self.runs():
                try:
                    self.sync_artifacts(run_id)
                except OSError:
                    if not read_only:
                        raise
                    # A read-only look (status, explain) at a folder this user cannot
                    # write: the files stay on the server; nothing here needs them.

    # -- artifacts any host can read ------------------------------------------
    def _blob_rows(self, manifest: Iterable[ArtifactEntry]) -> list[tuple[str, int, bytes]]:
        rows: dict[str, tuple[str, int, bytes]] = {}
        for entry in manifest:
            if entry.sha256 in rows:
                continue
            path = self.artifacts.path_of(entry)
            data = path.read_bytes()
            if len(data) > MAX_BLOB_BYTES:
                raise StorageError(
                    f"{entry.path} is {len(data)} bytes; the PostgreSQL store keeps committed "
                    f"files up to {MAX_BLOB_BYTES} bytes",
                    hint="split the output, or use the SQLite store for this project")
            rows[entry.sha256] = (entry.sha256, len(data), data)
        return list(rows.values())

    # The committed files' bytes go into ``blobs`` in the commit's own transaction: read
    # here, before the writers' lock is taken, and inserted first thing by that
    # transaction (PostgresBase._write), so a commit's crash points keep their meaning.
    # Both entry points are covered, whichever of the two calls the other.
    def commit(self, request: CommitRequest) -> int:
        """The one commit (see CheckpointStore.commit), its files stored as blobs in the
        same transaction: all of it lands, or none."""
        if getattr(self._tx, "pending", None) is None:
            self._tx.pending = self._blob_rows(request.manifest)
        try:
            version: int = super().commit(request)
        finally:
            self._tx.pending = None
        return version

    def _advance_seen(self, run_id: str, branch_id: str, expected: int, version: int) -> None:
        """This host's own commit moved the head from ``expected`` to ``version``: when it
        had every file up to ``expected``, it has every file up to ``version`` (the new
        ones are its own)."""
        key = (run_id, branch_id)
        if self._seen_heads.get(key) == expected:
            self._seen_heads[key] = version

    def commit_checkpoint(self, run_id: str, branch_id: str, expected_version: int,
                          delta: Mapping[str, Any], manifest: Iterable[ArtifactEntry] = (),
                          fencing_token: int | None = None, **kwargs: Any) -> int:
        manifest = list(manifest)
        if getattr(self._tx, "pending", None) is None:
            self._tx.pending = self._blob_rows(manifest)
        self.now()  # the clock's offset, measured outside the transaction
        try:
            # The shared commit joins this transaction; its read of the old state values
            # goes out now, answered with its read of the head.
            with self._write() as db:
                keys = [] if not all(isinstance(k, str) for k in delta) else \
                    sorted({*delta, *filter(None, [kwargs.get("budget_key")])})
                for i in range(0, len(keys), STATE_VALUES_CHUNK):
                    chunk = keys[i:i + STATE_VALUES_CHUNK]
                    db.conn.send_ahead(STATE_VALUES_SQL.format(", ".join("?" * len(chunk))),
                                       [run_id, branch_id, *chunk])
                if kwargs.get("usage") or kwargs.get("budget_key") is not None:
                    db.conn.send_ahead(BUDGET_SQL, [run_id, branch_id])
                self._tx.notify = run_id
                version: int = super().commit_checkpoint(
                    run_id, branch_id, expected_version, delta, manifest, fencing_token,
                    **kwargs)
        finally:
            self._tx.pending = None
            self._tx.notify = None
        self._advance_seen(run_id, branch_id, expected_version, version)
        return version

    def get_head(self, run_id: str, branch_id: str = "main") -> Head:
        """The head (see CheckpointStore.get_head). When it moved since this host last
        looked, the files committed meanwhile (by any host) are fetched first: whatever
        this host decides from the head — recovery re-hashing current outputs, a unit
        reading its dependencies — finds them here, never "missing"."""
        head: Head = super().get_head(run_id, branch_id)
        self._saw_head(head)
        return head

    def run_overlay(self, run_id: str, branch_id: str = "main") -> RunOverlay:
        """The overlay (see ClaimStore.run_overlay) in one round trip; a head that moved
        fetches the files committed meanwhile first, as ``get_head`` does."""
        overlay: RunOverlay = super().run_overlay(run_id, branch_id)
        self._saw_head(overlay.head)
        return overlay

    def _saw_head(self, head: Head) -> None:
        if self._seen_heads.get((head.run_id, head.branch_id)) != head.version:
            try:
                self.sync_artifacts(head.run_id)
            except OSError:
                if not self.read_only:
                    raise
            self._seen_heads[(head.run_id, head.branch_id)] = head.version

    def claim(self, run_id: str, branch_id: str, unit: str, *, expected_version: int,
              owner: str, lease_seconds: float) -> Claim:
        self.now()  # the clock's offset, measured outside the transaction
        # The shared claim joins this transaction; its fencing token and its read of the
        # head go out with BEGIN (a claim that fails rolls the token back with the rest).
        with self._write() as db:
            db.conn.send_ahead(CLAIM_TOKEN_SQL, [])
            db.conn.send_ahead(CLAIM_HEAD_SQL, [unit, unit, run_id, branch_id])
            claim: Claim = super().claim(run_id, branch_id, unit,
                                         expected_version=expected_version, owner=owner,
                                         lease_seconds=lease_seconds)
        # The unit reads what was committed up to its head: make it present on this host,
        # unless this host already has everything up to that head (it read that head, or
        # made it with its own commit): then there is nothing to fetch (no round trip).
        if self._seen_heads.get((run_id, branch_id)) != expected_version:
            self.sync_artifacts(run_id)
            self._seen_heads[(run_id, branch_id)] = expected_version
        return claim

    # -- other executors' changes ---------------------------------------------------
    # The shared methods' own transaction notifies just before its COMMIT (PostgresBase
    # ._write), so their crash points keep their meaning.
    def end_attempt(self, claim: Claim, end: AttemptEnd) -> bool:
        self._tx.notify = claim.run_id  # its unit may be ready again (a retry)
        try:
            ended: bool = super().end_attempt(claim, end)
        finally:
            self._tx.notify = None
        return ended

    def release_lease(self, run_id: str, branch_id: str, unit: str, fencing_token: int) -> None:
        self._tx.notify = run_id
        try:
            super().release_lease(run_id, branch_id, unit, fencing_token)
        finally:
            self._tx.notify = None

    def wait_for_change(self, run_id: str, timeout: float) -> bool:
        """Woken by the server (LISTEN/NOTIFY): every commit, attempt ending and lease
        given back notifies in its own transaction (so only once it landed), and this
        store's listening connection hears it at once. The first call starts listening
        and returns True at once (what happened before it is unknown: read again). A lost
        listening connection waits out the timeout (polling) and listens again next time."""
        deadline = time.monotonic() + timeout
        with self._listen_lock:
            conn = self._listener
            if conn is None:
                try:
                    conn = connect_once(self.url, self._password)
                    conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                except (StorageError, psycopg.Error):
                    time.sleep(max(0.0, deadline - time.monotonic()))
                    return False
                self._listener = conn
                return True
            try:
                while (left := deadline - time.monotonic()) > 0:
                    for note in conn.notifies(timeout=left, stop_after=1):
                        if note.payload == run_id:
                            return True
                return False
            except psycopg.Error:
                self._listener = None
                try:
                    conn.close()
                except psycopg.Error:
                    pass
                time.sleep(max(0.0, deadline - time.monotonic()))
                return False

    def close(self) -> None:
        with self._listen_lock:
            if self._listener is not None:
                try:
                    self._listener.close()
                except psycopg.Error:
                    pass
                self._listener = None
        super().close()

    def sync_artifacts(self, run_id: str) -> int:
        """Write every committed file of ``run_id`` this host lacks from the blobs (sealed,
        sha256 checked); returns how many were written. Incremental: each call looks only
        at manifest rows added since the previous one."""
        if self.read_only and not self.artifacts.root.is_dir():
            return 0
        with self._sync_lock:
            mark = self._synced.get(run_id, 0)
            rows = self._q("SELECT rowid AS n, path, sha256 FROM artifacts WHERE run_id = ? "
                           "AND rowid > ? ORDER BY rowid", [run_id, mark])
            wanted = [r for r in rows if not (self.artifacts.root / r["path"]).is_file()]
            written = 0
            if wanted:
                for sha, data in self._fetch_blobs({r["sha256"] for r in wanted}).items():
                    for r in wanted:
                        if r["sha256"] == sha:
                            self._materialise(self.artifacts.root / r["path"], data, sha)
                            written += 1
            if rows:
                self._synced[run_id] = max(int(r["n"]) for r in rows if "n" in r)
            return written

    def _fetch_blobs(self, hashes: set[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        ordered = sorted(hashes)
        for i in range(0, len(ordered), 200):
            chunk = ordered[i:i + 200]
            for r in self._q("SELECT sha256, data FROM blobs WHERE sha256 IN "
                             f"({', '.join('?' * len(chunk))})", chunk):
                out[r["sha256"]] = bytes(r["data"])
        return out

    def _materialise(self, path: Path, data: bytes, sha: str) -> None:
        from keepstep.storage.hashing import sha256_hex

        if sha256_hex(data) != sha:
            raise StorageError(f"the stored blob {sha[:12]} does not match its hash",
                               hint="run `keepstep verify`; restore the database from a backup")
        if path.is_file() and file_sha256(str(path)) == sha:
            return
        make_private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.fetch")
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, SEALED_MODE)
        os.replace(tmp, path)

    def blob(self, sha256: str) -> bytes | None:
        """A committed file's bytes by content hash, or None."""
        row = self._q1("SELECT data FROM blobs WHERE sha256 = ?", [sha256])
        return bytes(row["data"]) if row else None

    # -- maintenance -------------------------------------------------------------
    def backup_to(self, target: Path) -> None:
        """A server's state is backed up with the server's own tools, not file copies."""
        raise StorageError(
            f"this project's state is on the PostgreSQL server at {self.where}; `keepstep "
            "backup` copies only the embedded SQLite file",
            hint="back it up with `pg_dump -Fc` (docs/team.md), or take a copy home first "
                 "with `keepstep store migrate --to sqlite`")


# Every Store method that writes. A connection lost inside its transaction (the server
# restarting, a network blip) wrote nothing, so the whole call runs again on a new
# connection, for up to RECONNECT_SECONDS; only the outermost call retries.
WRITES = ("create_run", "commit", "commit_checkpoint", "fork_branch", "claim", "renew_lease",
          "release_lease", "fence_expired_leases", "fence_lease", "set_attempt_status",
          "set_unit_status", "clear_unit_status", "end_attempt", "append_event",
          "strip_event_payloads", "add_usage", "set_budget_limits", "reserve_call",
          "settle_call", "create_approval_request", "consume_resume_token", "decide_approval",
          "revoke_approval", "record_effect_intent", "mark_effect", "verify_since_last")


def _retrying(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
        if getattr(self._tx, "conn", None) is not None:
            return fn(self, *args, **kwargs)
        deadline = time.monotonic() + RECONNECT_SECONDS
        while True:
            try:
                return fn(self, *args, **kwargs)
            except ConnectionLost:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    return call


for _name in WRITES:
    if hasattr(PostgresStore, _name):
        setattr(PostgresStore, _name, _retrying(getattr(PostgresStore, _name)))
