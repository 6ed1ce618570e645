"""What the faces show, as typed results: the dashboard and its units, live progress, the
approvals waiting, the effects ledger, deliverables, previews and explanations, the stored
records (events, calls, budget, chain) and the disagreements between sources.

A public namespace of ``keepstep.engine`` (``from keepstep.engine import views``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.core.explain import (
        Preview,
        UnitExplanation,
    )
    from keepstep.engine.core.inputs import (
        InputSnapshot,
    )
    from keepstep.engine.core.state import (
        UnitState,
    )
    from keepstep.engine.kinds.conflicts import (
        Conflict,
        conflicts_text,
        run_conflicts,
    )
    from keepstep.engine.report.next_action import (
        Need,
    )
    from keepstep.engine.report.progress import (
        InFlight,
        NotebookProgress,
        ProgressSnapshot,
        ProgressTracker,
        fmt_count,
        fmt_duration,
    )
    from keepstep.engine.report.status import (
        InFlightUnit,
        RunStatus,
        UnitView,
    )
    from keepstep.engine.report.views import (
        EFFECT_FIELDS,
        CompensationPreview,
        Deliverable,
        EffectRow,
        OutputInfo,
        input_snapshots,
    )
    from keepstep.engine.run.approvals import (
        ApprovalOption,
    )
    from keepstep.engine.run.effects import (
        SettleResult,
    )
    from keepstep.engine.run.gates import (
        Binding,
        PendingApproval,
    )
    from keepstep.engine.run.recovery import (
        RecoveryReport,
    )
    from keepstep.storage import (
        ApprovalRecord,
        Budget,
        ChainReport,
        Event,
        ModelCall,
    )

_EXPORTS: dict[str, str] = {
    "Preview": "keepstep.engine.core.explain",
    "UnitExplanation": "keepstep.engine.core.explain",
    "InputSnapshot": "keepstep.engine.core.inputs",
    "UnitState": "keepstep.engine.core.state",
    "Conflict": "keepstep.engine.kinds.conflicts",
    "conflicts_text": "keepstep.engine.kinds.conflicts",
    "run_conflicts": "keepstep.engine.kinds.conflicts",
    "Need": "keepstep.engine.report.next_action",
    "InFlight": "keepstep.engine.report.progress",
    "NotebookProgress": "keepstep.engine.report.progress",
    "ProgressSnapshot": "keepstep.engine.report.progress",
    "ProgressTracker": "keepstep.engine.report.progress",
    "fmt_count": "keepstep.engine.report.progress",
    "fmt_duration": "keepstep.engine.report.progress",
    "InFlightUnit": "keepstep.engine.report.status",
    "RunStatus": "keepstep.engine.report.status",
    "UnitView": "keepstep.engine.report.status",
    "CompensationPreview": "keepstep.engine.report.views",
    "Deliverable": "keepstep.engine.report.views",
    "EFFECT_FIELDS": "keepstep.engine.report.views",
    "EffectRow": "keepstep.engine.report.views",
    "OutputInfo": "keepstep.engine.report.views",
    "input_snapshots": "keepstep.engine.report.views",
    "ApprovalOption": "keepstep.engine.run.approvals",
    "SettleResult": "keepstep.engine.run.effects",
    "Binding": "keepstep.engine.run.gates",
    "PendingApproval": "keepstep.engine.run.gates",
    "RecoveryReport": "keepstep.engine.run.recovery",
    "ApprovalRecord": "keepstep.storage",
    "Budget": "keepstep.storage",
    "ChainReport": "keepstep.storage",
    "Event": "keepstep.storage",
    "ModelCall": "keepstep.storage",
}
__all__ = [
    "ApprovalOption",
    "ApprovalRecord",
    "Binding",
    "Budget",
    "ChainReport",
    "CompensationPreview",
    "Conflict",
    "Deliverable",
    "EFFECT_FIELDS",
    "EffectRow",
    "Event",
    "InFlight",
    "InFlightUnit",
    "InputSnapshot",
    "ModelCall",
    "Need",
    "NotebookProgress",
    "OutputInfo",
    "PendingApproval",
    "Preview",
    "ProgressSnapshot",
    "ProgressTracker",
    "RecoveryReport",
    "RunStatus",
    "SettleResult",
    "UnitExplanation",
    "UnitState",
    "UnitView",
    "conflicts_text",
    "fmt_count",
    "fmt_duration",
    "input_snapshots",
    "run_conflicts",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
