"""Takeover: choose how to continue a run someone else (or yesterday's you) left.

Left, the choices; right, for the highlighted one, what it reuses, what it invalidates
(with paths), the estimated cost and what will be recorded. Confirming records the
decision through the engine (engine.takeover, Run.branch) — never a hand edit. The previews
are the engine's own (engine.takeover_preview): the TUI and `keepstep takeover` agree.
Dismisses with ("resume" | "cancel", unit) when the dashboard must act, else None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from keepstep.app.tui.format import ids, preview_lines, takeover_lines, tokens
from keepstep.app.tui.screens.confirm import ConfirmModal
from keepstep.app.tui.screens.narrative import export_bundle
from keepstep.engine import KeepstepError
from keepstep.engine.takeover import (
    TakeoverPreview,
    mark_for_expert,
    narrow_scope,
    preview_branch,
    preview_cancel,
    preview_expert,
    preview_narrow,
    preview_rerun,
    record_takeover,
    rerun_unit,
)

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import Run

# (action, label, what the argument box asks for, or "" when the choice takes none)
CHOICES = (
    ("resume", "Resume", ""),
    ("narrow_scope", "Narrow scope", "units to keep (and what they need), e.g. U31 U33"),
    ("rerun", "Rerun a unit", "unit to run again, e.g. U21"),
    ("branch", "Branch", "new branch id"),
    ("cancel", "Cancel", ""),
    ("mark_for_expert", "Mark for an expert", "unit an expert must look at (note required)"),
)


class TakeoverScreen(Screen[tuple[str, str] | None]):
    BINDINGS = [
        Binding("escape", "back", "back"),
        Binding("ctrl+s", "confirm", "record (asks)"),
        Binding("x", "export", "export handover"),
    ]

    app: KeepstepApp

    def __init__(self, unit: str | None = None) -> None:
        super().__init__()
        self.unit = unit or ""
        self.action = "resume"

    def compose(self) -> ComposeResult:
        yield Static(id="takeover-title", classes="screen-title", markup=False)
        with Horizontal(id="takeover-body"):
            with Vertical(id="takeover-left", classes="panel") as left:
                left.border_title = "Choose"
                yield OptionList(*(Option(label, id=action) for action, label, _ in CHOICES),
                                 id="takeover-choices")
            with Vertical(id="takeover-right", classes="panel") as right:
                right.border_title = "Preview"
                yield Input(id="takeover-arg")
                yield Input(placeholder="note for the record (optional)", id="takeover-note")
                with VerticalScroll(id="takeover-preview-box"):
                    yield Static(id="takeover-preview", markup=False)
                with Horizontal(classes="buttons"):
                    yield Button("Confirm", id="confirm", variant="warning", compact=True)
        yield Static(id="takeover-export", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        run = self.app.active_run
        head = run.head().version if run is not None else 0
        branch = run.branch_id if run is not None else "main"
        self.query_one("#takeover-title", Static).update(
            f"Takeover · run {self.app.run_id} ({branch}) at checkpoint {head} · enter on a "
            "choice or ctrl+s records (after a yes) · x exports the handover first")
        self.default_branch = f"{branch}-cp{head}"
        choices = self.query_one(OptionList)
        choices.highlighted = 0
        choices.focus()
        self._set_action("resume")

    # -- the preview -------------------------------------------------------------------------
    def _arg(self) -> str:
        return self.query_one("#takeover-arg", Input).value.strip()

    def _set_action(self, action: str) -> None:
        self.action = action
        hint = next(h for a, _, h in CHOICES if a == action)
        arg = self.query_one("#takeover-arg", Input)
        note = self.query_one("#takeover-note", Input)
        arg.display = bool(hint)
        note.display = action in ("narrow_scope", "rerun", "mark_for_expert", "cancel")
        arg.placeholder = hint
        with self.prevent(Input.Changed):
            arg.value = self.default_branch if action == "branch" else \
                self.unit if hint else ""
        self.update_preview()

    @on(OptionList.OptionHighlighted, "#takeover-choices")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id:
            self._set_action(event.option.id)

    @on(Input.Changed, "#takeover-arg")
    def _arg_changed(self) -> None:
        self.update_preview()

    def update_preview(self) -> None:
        run = self.app.active_run
        if run is None:
            lines = ["no run yet"]
        else:
            try:
                lines = getattr(self, f"_preview_{self.action}")(run)
            except KeepstepError as exc:
                lines = [f"cannot preview: {exc}"]
        self.query_one("#takeover-preview", Static).update("\n".join(lines))

    def _units_arg(self, run: Run) -> list[str]:
        units = [u for u in self._arg().replace(",", " ").split() if u]
        known = run.plan.unit_map()
        unknown = [u for u in units if u not in known]
        if unknown or not units:
            raise KeepstepError(f"no unit {', '.join(unknown)}" if unknown else "name a unit",
                                hint="units: " + ids(known))
        return units

    def _show(self, preview: TakeoverPreview) -> list[str]:
        return takeover_lines(preview, who=self.app.who)

    def _preview_resume(self, run: Run) -> list[str]:
        if self.app.dashboard.running:
            return ["a run is in progress: nothing to resume"]
        status = self.app.dashboard.status or run.status()
        waiting = [u for u, v in status.units.items() if v.state in ("pending", "invalidated")]
        return ["Resume: recovery first (audit, reconcile, apply detected changes), then run "
                "what is ready.", "", *preview_lines(run.preview()),
                f"Not yet run ({len(waiting)}): {ids(waiting)} · "
                f"{self._first_run_cost(run, waiting)}",
                f"Next: {status.next_action}", "",
                f"Recorded: decision.takeover action=resume, then the run's own events "
                f"(by {self.app.who})"]

    def _first_run_cost(self, run: Run, units: list[str]) -> str:
        est = run.estimate(units)
        return (f"~{sum(c.calls for c in est)} calls, ~{tokens(sum(c.tokens for c in est))} "
                f"tokens, ${sum(c.cost for c in est):.2f} (estimate)")

    def _preview_narrow_scope(self, run: Run) -> list[str]:
        return self._show(preview_narrow(run, self._units_arg(run)))

    def _preview_rerun(self, run: Run) -> list[str]:
        return self._show(preview_rerun(run, self._units_arg(run)[0], who=self.app.who))

    def _preview_branch(self, run: Run) -> list[str]:
        return self._show(preview_branch(run, run.head().version, self._arg()))

    def _preview_cancel(self, run: Run) -> list[str]:
        lines = self._show(preview_cancel(run))
        if self.app.dashboard.running:
            lines.insert(1, "· the run in progress here stops at its next safe point")
        return lines

    def _preview_mark_for_expert(self, run: Run) -> list[str]:
        return self._show(preview_expert(run, self._units_arg(run)[0]))

    # -- confirm -----------------------------------------------------------------------------
    @on(OptionList.OptionSelected, "#takeover-choices")
    @on(Input.Submitted)
    @on(Button.Pressed, "#confirm")
    def action_confirm(self) -> None:
        """Ask first — the preview on the right is the impact — then record the choice."""
        run = self.app.active_run
        if run is None:
            return
        self.update_preview()
        lines = str(self.query_one("#takeover-preview", Static).render()).splitlines()
        if lines and lines[0].startswith("cannot preview"):
            self.app.show_error(lines[0], title="Nothing to record")
            return
        label = next(lbl for a, lbl, _ in CHOICES if a == self.action)

        def decided(yes: bool | None) -> None:
            if not yes:
                self.notify("nothing recorded")
                return
            try:
                outcome = self._confirm(run)
            except Exception as exc:  # engine or storage: say so and stay on the page
                self.app.show_error(exc, title="The takeover was not recorded")
                return
            if outcome is not False:
                self.dismiss(outcome)

        self.app.push_screen(ConfirmModal(f"{label}: record this decision?", lines,
                                          yes="Record it"), decided)

    def _confirm(self, run: Run) -> tuple[str, str] | None | Literal[False]:
        """Record the highlighted choice through the engine; False keeps the page open."""
        who, note = self.app.who, self.query_one("#takeover-note", Input).value.strip()
        if self.action in ("resume", "rerun") and self.app.dashboard.running:
            self.notify("a run is in progress: cancel it first", severity="warning")
            return False
        if self.action == "resume":
            record_takeover(run, "resume", who=who)
            return ("resume", "")
        if self.action == "rerun":
            unit = self._units_arg(run)[0]
            invalidated = rerun_unit(run, unit, who=who, note=note)
            self.notify(f"rerun of {unit} recorded (invalidated {ids(invalidated)}); running")
            return ("resume", unit)
        if self.action == "narrow_scope":
            held = narrow_scope(run, self._units_arg(run), who=who, note=note)
            self.notify(f"scope narrowed: {len(held)} unit(s) held back")
            return None
        if self.action == "mark_for_expert":
            unit = self._units_arg(run)[0]
            if not note:
                raise KeepstepError("say what the expert should look at",
                                    hint="write it in the note box, then confirm")
            mark_for_expert(run, unit, note, who=who)
            self.notify(f"{unit} marked for an expert")
            return None
        if self.action == "branch":
            preview_branch(run, run.head().version, self._arg())  # validates the name
            new = run.branch(run.head().version, self._arg())
            self.app.switch_run(new)
            self.notify(f"branched: now showing {new.run_id} ({new.branch_id})")
            return None
        record_takeover(run, "cancel", who=who, note=note, running=self.app.dashboard.running)
        return ("cancel", "")

    def action_export(self) -> None:
        path = export_bundle(self.app)
        self.query_one("#takeover-export", Static).update(
            f"handover bundle exported: {path}" if path is not None else "not exported")

    def action_back(self) -> None:
        self.dismiss(None)


__all__ = ["CHOICES", "TakeoverScreen"]
