"""Takeover: the recorded actions a person takes over a run (narrow the scope, re-run a unit,
mark it for an expert) and the read-only previews of each.

A public namespace of ``keepstep.engine`` (``from keepstep.engine import takeover``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.run.takeover import (
        TAKEOVER_ACTIONS,
        mark_for_expert,
        narrow_scope,
        record_takeover,
        rerun_unit,
    )
    from keepstep.engine.run.takeover_preview import (
        TakeoverPreview,
        keep_for_drop,
        preview_branch,
        preview_cancel,
        preview_expert,
        preview_narrow,
        preview_rerun,
    )

_EXPORTS: dict[str, str] = {
    "TAKEOVER_ACTIONS": "keepstep.engine.run.takeover",
    "mark_for_expert": "keepstep.engine.run.takeover",
    "narrow_scope": "keepstep.engine.run.takeover",
    "record_takeover": "keepstep.engine.run.takeover",
    "rerun_unit": "keepstep.engine.run.takeover",
    "TakeoverPreview": "keepstep.engine.run.takeover_preview",
    "keep_for_drop": "keepstep.engine.run.takeover_preview",
    "preview_branch": "keepstep.engine.run.takeover_preview",
    "preview_cancel": "keepstep.engine.run.takeover_preview",
    "preview_expert": "keepstep.engine.run.takeover_preview",
    "preview_narrow": "keepstep.engine.run.takeover_preview",
    "preview_rerun": "keepstep.engine.run.takeover_preview",
}
__all__ = [
    "TAKEOVER_ACTIONS",
    "TakeoverPreview",
    "keep_for_drop",
    "mark_for_expert",
    "narrow_scope",
    "preview_branch",
    "preview_cancel",
    "preview_expert",
    "preview_narrow",
    "preview_rerun",
    "record_takeover",
    "rerun_unit",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
