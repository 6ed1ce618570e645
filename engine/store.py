"""The state store: backup, restore and garbage collection of a project, moving it to another
store, and a store's summary (team use).

A public namespace of ``keepstep.engine`` (``from keepstep.engine import store``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.run.maintenance import (
        backup_project,
        gc_project,
        restore_project,
    )
    from keepstep.engine.run.team import (
        SourceMismatch,
        StoreMove,
        StoreSummary,
        move_store,
        source_mismatches,
        store_summary,
    )

_EXPORTS: dict[str, str] = {
    "backup_project": "keepstep.engine.run.maintenance",
    "gc_project": "keepstep.engine.run.maintenance",
    "restore_project": "keepstep.engine.run.maintenance",
    "SourceMismatch": "keepstep.engine.run.team",
    "StoreMove": "keepstep.engine.run.team",
    "StoreSummary": "keepstep.engine.run.team",
    "move_store": "keepstep.engine.run.team",
    "source_mismatches": "keepstep.engine.run.team",
    "store_summary": "keepstep.engine.run.team",
}
__all__ = [
    "SourceMismatch",
    "StoreMove",
    "StoreSummary",
    "backup_project",
    "gc_project",
    "move_store",
    "restore_project",
    "source_mismatches",
    "store_summary",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
