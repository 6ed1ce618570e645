"""What leaves a run: the deliverables and documents exported, the handover bundle and its
narrative (and their checks), and the delivery adapters' test.

A public namespace of ``keepstep.engine`` (``from keepstep.engine import exports``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.report.deliverables import (
        DeliverablesExport,
        ExportedFile,
        Output,
        export_deliverables,
    )
    from keepstep.engine.report.docx_export import (
        EXPORT_FORMATS,
        DocumentsExport,
        export_documents,
    )
    from keepstep.engine.report.handover import (
        BundleReport,
        export_handover,
        verify_bundle,
    )
    from keepstep.engine.report.narrative import (
        check_narrative,
        narrative,
    )
    from keepstep.engine.report.narrative_claims import (
        Mismatch,
    )
    from keepstep.engine.run.deliveries import (
        AdapterCheck,
        test_effect_adapter,
    )

_EXPORTS: dict[str, str] = {
    "DeliverablesExport": "keepstep.engine.report.deliverables",
    "ExportedFile": "keepstep.engine.report.deliverables",
    "Output": "keepstep.engine.report.deliverables",
    "export_deliverables": "keepstep.engine.report.deliverables",
    "DocumentsExport": "keepstep.engine.report.docx_export",
    "EXPORT_FORMATS": "keepstep.engine.report.docx_export",
    "export_documents": "keepstep.engine.report.docx_export",
    "BundleReport": "keepstep.engine.report.handover",
    "export_handover": "keepstep.engine.report.handover",
    "verify_bundle": "keepstep.engine.report.handover",
    "check_narrative": "keepstep.engine.report.narrative",
    "narrative": "keepstep.engine.report.narrative",
    "Mismatch": "keepstep.engine.report.narrative_claims",
    "AdapterCheck": "keepstep.engine.run.deliveries",
    "test_effect_adapter": "keepstep.engine.run.deliveries",
}
__all__ = [
    "AdapterCheck",
    "BundleReport",
    "DeliverablesExport",
    "DocumentsExport",
    "EXPORT_FORMATS",
    "ExportedFile",
    "Mismatch",
    "Output",
    "check_narrative",
    "export_deliverables",
    "export_documents",
    "export_handover",
    "narrative",
    "test_effect_adapter",
    "verify_bundle",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
