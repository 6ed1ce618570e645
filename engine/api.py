"""The engine's entry point: ``open_project(path) -> Project -> Run``.

A facade: ``Project`` and ``Run`` are defined once, in ``run.runtime``; this module
re-exports them with ``open_project``. The CLI, the TUI and notebooks reach all three through
``keepstep.engine``; none of them reaches into SQL. Time, executor ids and the model gateway
are injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from keepstep.engine.errors import ProjectError
from keepstep.engine.run.runtime import GatewayFactory, Project, Run


def open_project(
    path: str | Path,
    *,
    validate: bool = True,
    read_only: bool = False,
    clock: Callable[[], float] | None = None,
    executor_id: str | None = None,
    gateway_factory: GatewayFactory | None = None,
    synchronous: str = "FULL",
    policy: Mapping[str, Any] | None = None,
) -> Project:
    """Open a project folder and its state database.

    ``validate=False`` opens a project whose plan does not validate yet (running still
    validates); ``read_only`` opens the database for looking only (nothing is created or
    migrated). ``clock``, ``executor_id`` and ``gateway_factory`` are injectable for tests;
    ``policy`` overrides keepstep.toml's ``[policy]`` values for this process."""
    root = Path(path)
    if not (root / "keepstep.toml").is_file():
        raise ProjectError(f"{root} is not a keepstep project (no keepstep.toml)",
                           hint=f"create one with `keepstep init {root}`")
    return Project(root, validate=validate, read_only=read_only, clock=clock or time.time,
                   executor_id=executor_id, gateway_factory=gateway_factory,
                   synchronous=synchronous, policy=policy)


__all__ = ["Project", "Run", "open_project"]
