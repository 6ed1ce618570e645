"""Garbage collection: delete attempt folders nothing needs any more, strip old event payloads.

An attempt folder is deleted only when it is older than the window and none of these
holds: it is the current attempt of a unit on some branch (the store's current
pointers), an approval that is requested or decided is bound to one of its files, the
side-effect ledger names the attempt or one of its files, or a live lease covers it.
Committed rows stay in the database (history keeps its hashes); only files go, and the
database's copies of small committed files (``blobs``) that no remaining file needs.
Plan snapshots (``<run>/_plan/``) are never touched.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from keepstep.storage.errors import NotFound
from keepstep.storage.sqlite import SQLiteStore
from keepstep.storage.sqlite.connection import iso

STATE_DIR = ".keepstep"
DAY = 86_400.0
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class GcItem(BaseModel):
    run_id: str
    attempt_id: str
    directory: str  # relative to the artifact root
    files: list[str] = Field(default_factory=list)
    bytes: int = 0
    age_days: float
    reason: str


class GcReport(BaseModel):
    older_than_days: float
    now: float
    deleted: list[GcItem] = Field(default_factory=list)
    kept: list[GcItem] = Field(default_factory=list)
    events_stripped: int = 0
    bytes_freed: int = 0
    kept_copies_dropped: int = 0  # database copies of small committed files (``blobs``)


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return _dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a JSON-like value (keys excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _attempt_of_path(run_id: str, path: str) -> str | None:
    parts = path.split("/")
    if len(parts) >= 4 and parts[0] == run_id:
        return f"{parts[1]}/{parts[2]}"
    return None


def _protected(store: SQLiteStore, run_id: str, now: float) -> dict[str, str]:
    """attempt id -> why gc must keep it."""
    keep: dict[str, str] = {}

    def add(attempt: str | None, why: str) -> None:
        if attempt is not None:
            keep.setdefault(attempt, why)

    for b in store.branches(run_id):
        branch = b["branch_id"]
        for unit, attempt in store.current_attempts(run_id, branch).items():
            add(attempt, f"current: {unit}'s current attempt on branch {branch}")
    for lease in store.leases(run_id):
        if lease.expires_at > now:
            add(lease.attempt_id, f"in flight: leased by {lease.owner}")
    by_sha: dict[str, set[str]] = {}
    by_path: dict[str, str] = {}
    for e in store.manifest(run_id):
        by_sha.setdefault(e.sha256, set()).add(e.attempt_id)
        by_path[e.path] = e.attempt_id

    def referenced(values: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for s in values:
            if _SHA256.match(s):
                found |= by_sha.get(s, set())
            attempt = by_path.get(s) or _attempt_of_path(run_id, s)
            if attempt is not None:
                found.add(attempt)
        return found

    for a in store.approvals(run_id, statuses=["requested", "decided"]):
        for attempt in referenced(_strings(a.bound_object)):
            add(attempt, f"bound to approval {a.request_id} ({a.gate_id}, {a.status})")
    for eff in store.effects(run_id):
        add(eff.attempt_id, f"side-effect ledger: {eff.action} ({eff.idem_key}, {eff.status})")
        for attempt in referenced(_strings(eff.detail)):
            add(attempt, f"side-effect ledger: request of {eff.idem_key}")
    return keep


def _newest(directory: Path, files: list[str], attempt: Any) -> float:
    times = [directory.stat().st_mtime]
    times += [(directory / f).stat().st_mtime for f in files]
    if attempt is not None:
        times += [t for t in (_ts(attempt.ended_at), _ts(attempt.started_at)) if t is not None]
    return max(times)


def _rmtree(path: Path) -> None:
    def retry(func: Any, p: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(p), stat.S_IRWXU)
        func(p)

    shutil.rmtree(path, onerror=retry)


def gc(project_root: Path, older_than_days: float, now: float, *,
       store: SQLiteStore | None = None) -> GcReport:
    """Delete attempt folders past the window that nothing needs; strip old event payloads.

    Deleted: attempts that are no longer any unit's current attempt (invalidated or
    superseded) and orphans (never committed), once older than ``older_than_days``
    at ``now``. Kept, with the reason: current attempts, anything an open or
    decided approval or the side-effect ledger references, leased attempts, and
    everything younger than the window. Event payloads older than the window are
    stripped (events keep their metadata). An event ``maintenance.gc`` records
    what was deleted.
    """
    if older_than_days < 0:
        raise ValueError("older_than_days must be >= 0")
    state = Path(project_root) / STATE_DIR
    own = store is None
    if own:
        if not (state / "state.db").is_file():
            raise NotFound(f"no keepstep state in {project_root}",
                           hint="pass the project folder (the one holding .keepstep)")
        store = SQLiteStore(state, clock=lambda: now)
    assert store is not None
    report = GcReport(older_than_days=older_than_days, now=now)
    window = older_than_days * DAY
    # sha256 of the committed files still needed: those of attempts whose folder stays, and
    # of protected (e.g. current) attempts even if their folder is gone (a restart of the
    # machine can lose an unsynced one; recovery rewrites it from the kept copy).
    needed: set[str] = set()
    try:
        for run_id in store.runs():
            keep = _protected(store, run_id, now)
            manifest = store.manifest(run_id)
            committed = {e.attempt_id for e in manifest}
            attempts = {a.attempt_id: a for a in store.attempts(run_id)}
            staying = set(keep)
            gone: list[GcItem] = []
            for _unit, attempt_id, directory, files in store.artifacts.attempt_dirs(run_id):
                staying.add(attempt_id)
                age = now - _newest(directory, files, attempts.get(attempt_id))
                item = GcItem(
                    run_id=run_id, attempt_id=attempt_id,
                    directory=directory.relative_to(store.artifacts.root).as_posix(),
                    files=files, bytes=sum((directory / f).stat().st_size for f in files),
                    age_days=round(age / DAY, 3), reason="")
                if attempt_id in keep:
                    item.reason = keep[attempt_id]
                    report.kept.append(item)
                    continue
                kind = ("invalidated: committed, no longer any unit's current attempt"
                        if attempt_id in committed else "orphan: staged, never committed")
                if age < window:
                    item.reason = f"{kind}; within the {older_than_days:g}-day window"
                    report.kept.append(item)
                    continue
                item.reason = kind
                _rmtree(directory)
                staying.discard(attempt_id)
                gone.append(item)
            needed.update(e.sha256 for e in manifest if e.attempt_id in staying)
            report.deleted += gone
            report.events_stripped += store.strip_event_payloads(
                run_id, before_ts=iso(now - window))
            if gone:
                store.append_event(run_id, "maintenance.gc", payload={
                    "deleted": [g.attempt_id for g in gone],
                    "bytes": sum(g.bytes for g in gone), "older_than_days": older_than_days})
        report.kept_copies_dropped = store.drop_kept_copies(needed)
    finally:
        if own:
            store.close()
    report.bytes_freed = sum(i.bytes for i in report.deleted)
    return report


__all__ = ["GcItem", "GcReport", "gc"]
