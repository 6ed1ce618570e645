"""Sources: sources.toml, adding and inspecting a file, the formats a source may have, and the
readability check a run makes before its first claim.

A public namespace of ``keepstep.engine`` (``from keepstep.engine import sources``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.core.inputs import (
        SourceEntry,
    )
    from keepstep.engine.files.convert import (
        SUPPORTED_FORMATS_TEXT,
        SourceInfo,
        detect_format,
    )
    from keepstep.engine.files.project import (
        SourcesFile,
        load_sources,
        save_sources,
        snapshot_sources,
    )
    from keepstep.engine.files.sources import (
        SourceCheck,
        add_source,
        check_sources,
        inspect_file,
    )
    from keepstep.storage.hashing import (
        file_sha256,
    )

_EXPORTS: dict[str, str] = {
    "SourceEntry": "keepstep.engine.core.inputs",
    "SUPPORTED_FORMATS_TEXT": "keepstep.engine.files.convert",
    "SourceInfo": "keepstep.engine.files.convert",
    "detect_format": "keepstep.engine.files.convert",
    "SourcesFile": "keepstep.engine.files.project",
    "load_sources": "keepstep.engine.files.project",
    "save_sources": "keepstep.engine.files.project",
    "snapshot_sources": "keepstep.engine.files.project",
    "SourceCheck": "keepstep.engine.files.sources",
    "add_source": "keepstep.engine.files.sources",
    "check_sources": "keepstep.engine.files.sources",
    "inspect_file": "keepstep.engine.files.sources",
    "file_sha256": "keepstep.storage.hashing",
}
__all__ = [
    "SUPPORTED_FORMATS_TEXT",
    "SourceCheck",
    "SourceEntry",
    "SourceInfo",
    "SourcesFile",
    "add_source",
    "check_sources",
    "detect_format",
    "file_sha256",
    "inspect_file",
    "load_sources",
    "save_sources",
    "snapshot_sources",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
