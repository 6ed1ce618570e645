"""The TUI's screens, one per module."""

from .add_source import AddSourceModal
from .approval import ApprovalModal
from .dashboard import DashboardScreen
from .error import ErrorModal
from .events import EventsScreen
from .explain import ExplainScreen
from .narrative import NarrativeScreen
from .plan_builder import PlanBuilderScreen
from .preview import PreviewModal
from .sources import SourcesScreen
from .takeover import TakeoverScreen

__all__ = ["AddSourceModal", "ApprovalModal", "DashboardScreen", "ErrorModal", "EventsScreen",
           "ExplainScreen", "NarrativeScreen", "PlanBuilderScreen", "PreviewModal",
           "SourcesScreen", "TakeoverScreen"]
