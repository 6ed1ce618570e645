"""A team's keepstep: which store a project uses, and moving a project between the
embedded SQLite file and a shared PostgreSQL server (``keepstep store migrate``)."""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from pathlib import Path

from pydantic import BaseModel, Field

from keepstep.engine.errors import ProjectError
from keepstep.engine.files.project import CONFIG_FILE, STATE_DIR, load_config
from keepstep.engine.run.runtime import store_password
from keepstep.storage.selection import (
    ENV_URL,
    StoreChoice,
    check_url,
    choose_store,
    open_store,
    password_source,
)


class StoreSummary(BaseModel):
    """Which store a project uses and where its password comes from (never the password)."""

    backend: str
    where: str
    source: str
    password_from: str


def store_summary(root: Path) -> StoreSummary:
    """The store ``root``'s project uses (KEEPSTEP_STORE_URL wins over keepstep.toml)."""
    config = load_config(Path(root))
    choice = choose_store(config.store.url)
    return StoreSummary(backend=choice.backend, where=choice.describe(), source=choice.source,
                        password_from=password_source(choice, store_password(choice)))


class StoreMove(BaseModel):
    """What ``keepstep store migrate`` did."""

    source: str
    target: str
    runs: list[str]
    rows: dict[str, int]
    blobs: int = Field(description="committed files stored on the server")
    files: int = Field(description="committed files fetched from the server to this folder")
    checked_versions: int = Field(description="checkpoints verified in the copy")
    old_state: str | None = Field(default=None, description="where the old SQLite file went")
    env_note: str | None = None


def _set_store_url(root: Path, url: str | None) -> None:
    """Point keepstep.toml at ``url`` (None: the embedded SQLite store), comments kept."""
    import tomlkit

    path = root / CONFIG_FILE
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    if url is None:
        store = doc.get("store")
        if store is not None:
            store.pop("url", None)
            if not store:
                del doc["store"]
    else:
        if "store" not in doc:
            doc.add(tomlkit.nl())
            doc["store"] = tomlkit.table()
        doc["store"]["url"] = url
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tomlkit.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


def move_store(root: Path, to: str) -> StoreMove:
    """Copy the project's whole state (every run, chain verified before and after, the
    committed files) into the store ``to`` names — ``postgresql://user@host/db`` or
    ``sqlite`` — and point keepstep.toml at it. The target must be empty; the source is not
    changed (the old SQLite file is kept beside, renamed)."""
    from keepstep.storage.transfer import copy_state

    root = Path(root).resolve()
    config = load_config(root)
    source = choose_store(config.store.url)
    if to.strip().lower() == "sqlite":
        target = StoreChoice(None, "keepstep store migrate")
    else:
        target = StoreChoice(check_url(to, allow_password=False), "keepstep store migrate")
    if target.url == source.url:
        raise ProjectError(f"the project already uses {source.describe()}",
                           hint="name the other store with --to")
    state = root / STATE_DIR
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    src = open_store(state, source, password=store_password(source))
    old_state: str | None = None
    try:
        if target.url is not None:
            dst = open_store(state, target, password=store_password(target))
            try:
                report = copy_state(src, dst)
            finally:
                dst.close()
        else:
            if (state / "state.db").exists():
                raise ProjectError(f"{state / 'state.db'} exists; moving the state home would "
                                   "replace it",
                                   hint="move that file away first (it is an older copy)")
            incoming = state / f"incoming-{stamp}"
            dst = open_store(incoming, target)
            try:
                report = copy_state(src, dst)
            finally:
                dst.close()
            for suffix in ("", "-wal", "-shm"):
                moved = incoming / f"state.db{suffix}"
                if moved.exists():
                    os.replace(moved, state / f"state.db{suffix}")
            shutil.rmtree(incoming, ignore_errors=True)
    finally:
        src.close()
    if source.url is None:  # the old file stays, renamed, so nothing opens it by mistake
        for suffix in ("", "-wal", "-shm"):
            old = state / f"state.db{suffix}"
            if old.exists():
                os.replace(old, state / f"state.db.moved-{stamp}{suffix}")
        old_state = str(state / f"state.db.moved-{stamp}")
    _set_store_url(root, target.url)
    env_note = None
    if os.environ.get(ENV_URL):
        env_note = (f"{ENV_URL} is set in this environment and wins over keepstep.toml: "
                    "unset it (or point it at the new store)")
    return StoreMove(source=source.describe(), target=target.describe(), runs=report.runs,
                     rows=report.rows, blobs=report.blobs, files=report.files,
                     checked_versions=report.checked_versions, old_state=old_state,
                     env_note=env_note)


class SourceMismatch(BaseModel):
    """An approved source whose bytes on this host differ from what the run recorded."""

    source_id: str
    path: str
    units: list[str] = Field(description="units that read it (directly or by its group)")
    problem: str  # "differs" | "missing"


def source_mismatches(root: Path, run_id: str, branch_id: str = "main"
                      ) -> list[SourceMismatch]:
    """This host's approved sources against the run's recorded input snapshot (its sha256
    per source): each one that differs or is missing here, with the units reading it.
    A worker joins a shared run only when this is empty, so that a host with other bytes
    neither runs those units nor records its copy as the team's input change."""
    from keepstep.engine.files.project import load_project_files
    from keepstep.storage.hashing import file_sha256

    root = Path(root).resolve()
    files = load_project_files(root, validate=False)
    choice = choose_store(files.config.store.url)
    store = open_store(root / STATE_DIR, choice, read_only=choice.url is None,
                       password=store_password(choice))
    try:
        recorded = (store.read_key(run_id, "inputs", branch_id) or {})
    finally:
        store.close()
    hashes: dict[str, str] = recorded.get("sources") or {}
    groups: dict[str, str] = recorded.get("groups") or {}
    out: list[SourceMismatch] = []
    by_id = {s.id: s for s in files.sources.sources}
    for source_id, sha in sorted(hashes.items()):
        entry = by_id.get(source_id)
        path = (root / entry.path) if entry is not None else None
        if path is None or not path.is_file():
            problem = "missing"
        elif file_sha256(str(path)) != sha:
            problem = "differs"
        else:
            continue
        group = groups.get(source_id)
        units = [u.id for u in files.plan.units
                 if source_id in u.input_refs("source")
                 or (group is not None and group in u.input_refs("group"))]
        out.append(SourceMismatch(source_id=source_id,
                                  path=entry.path if entry is not None else "(not listed)",
                                  units=units, problem=problem))
    return out


__all__ = ["SourceMismatch", "StoreMove", "StoreSummary", "move_store", "source_mismatches",
           "store_summary"]
