"""The TUI's screens, one per module."""

from keepstep.app.tui.screens.add_source import AddSourceModal
from keepstep.app.tui.screens.approval import ApprovalModal
from keepstep.app.tui.screens.confirm import ConfirmModal
from keepstep.app.tui.screens.dag import DagScreen
from keepstep.app.tui.screens.dashboard import DashboardScreen
from keepstep.app.tui.screens.deliverables import DeliverablesScreen
from keepstep.app.tui.screens.effects import EffectsScreen, SettleModal
from keepstep.app.tui.screens.error import ErrorModal
from keepstep.app.tui.screens.events import EventsScreen
from keepstep.app.tui.screens.explain import ExplainScreen
from keepstep.app.tui.screens.form import FormModal
from keepstep.app.tui.screens.narrative import NarrativeScreen
from keepstep.app.tui.screens.plan_builder import PlanBuilderScreen
from keepstep.app.tui.screens.raw_plan import PlanRepairApp, RawPlanScreen
from keepstep.app.tui.screens.sources import SourcesScreen
from keepstep.app.tui.screens.takeover import TakeoverScreen

__all__ = ["AddSourceModal", "ApprovalModal", "ConfirmModal", "DagScreen", "DashboardScreen",
           "DeliverablesScreen", "EffectsScreen", "ErrorModal", "EventsScreen", "ExplainScreen",
           "FormModal", "NarrativeScreen", "PlanBuilderScreen", "PlanRepairApp",
           "RawPlanScreen", "SettleModal",
           "SourcesScreen", "TakeoverScreen"]
