"""keepstep's Textual TUI. ``make_app(project_path)`` builds it; the CLI and tests use it."""

from keepstep.app.tui.app import KeepstepApp, make_app

__all__ = ["KeepstepApp", "make_app"]
