"""Takeover: choose how to continue a run someone else (or yesterday's you) left.

Left, the choices; right, for the highlighted one, what it reuses, what it invalidates
(with paths), the estimated cost and what will be recorded. Confirming records the
decision through the engine (engine.takeover, Run.retry, Run.branch) — never a hand edit.
Dismisses with ("resume" | "retry" | "cancel", unit) when the dashboard must act, else None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import networkx as nx
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from keepstep.engine.errors import KeepstepError
from keepstep.engine.explain import estimate_costs
from keepstep.engine.takeover import (
    EXPERT_REASON,
    OUT_OF_SCOPE_REASON,
    mark_for_expert,
    narrow_scope,
    out_of_scope,
    record_takeover,
    scope_of,
)

from ..format import ids, preview_lines, tokens
from .narrative import NOT_AVAILABLE, export_bundle

if TYPE_CHECKING:
    from keepstep.engine import Run

    from ..app import KeepstepApp

# (action, label, what the argument box asks for, or "" when the choice takes none)
CHOICES = (
    ("resume", "Resume", ""),
    ("narrow_scope", "Narrow scope", "units to keep (and what they need), e.g. U31 U33"),
    ("rerun", "Rerun a unit", "unit to run again, e.g. U21"),
    ("branch", "Branch", "new branch id"),
    ("cancel", "Cancel", ""),
    ("mark_for_expert", "Mark for an expert", "unit an expert must look at"),
)


class TakeoverScreen(Screen[tuple[str, str] | None]):
    BINDINGS = [
        Binding("escape", "back", "back"),
        Binding("ctrl+r", "confirm", "confirm"),
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
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        run = self.app.active_run
        head = run.head().version if run is not None else 0
        branch = run.branch_id if run is not None else "main"
        self.query_one("#takeover-title", Static).update(
            f"Takeover · run {self.app.run_id} ({branch}) at checkpoint {head} · enter on a "
            "choice or ctrl+r confirms · x exports the handover first")
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
        note.display = action in ("narrow_scope", "mark_for_expert", "cancel")
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

    def _status(self, run: Run) -> Any:
        return self.app.dashboard.status or run.status()

    def _cost(self, run: Run, units: list[str]) -> str:
        est = estimate_costs(run.plan, units, run.facts_records(), run.calls())
        calls, toks = sum(c.calls for c in est), sum(c.tokens for c in est)
        cost = sum(c.cost for c in est)
        return f"~{calls} calls, ~{tokens(toks)} tokens, ${cost:.2f}"

    def _current(self, run: Run) -> list[str]:
        return [u for u, v in self._status(run).units.items() if v.state == "succeeded"]

    def _recorded(self, what: str) -> str:
        return f"Recorded: {what} (by {self.app.who})"

    def _preview_resume(self, run: Run) -> list[str]:
        if self.app.dashboard.running:
            return ["a run is in progress: nothing to resume"]
        preview = run.preview()
        status = self._status(run)
        waiting = [u for u, v in status.units.items() if v.state in ("pending", "invalidated")]
        return ["Resume: recovery first (audit, reconcile, apply detected changes), then run "
                "what is ready.", "", *preview_lines(preview),
                f"Not yet run ({len(waiting)}): {ids(waiting)} · {self._cost(run, waiting)}",
                f"Next: {status.next_action}", "",
                self._recorded("decision.takeover action=resume, then the run's own events")]

    def _units_arg(self, run: Run) -> list[str]:
        units = [u for u in self._arg().replace(",", " ").split() if u]
        known = run.plan.unit_map()
        unknown = [u for u in units if u not in known]
        if unknown or not units:
            raise KeepstepError(f"no unit {', '.join(unknown)}" if unknown else "name a unit",
                                hint="units: " + ids(known))
        return units

    def _preview_narrow_scope(self, run: Run) -> list[str]:
        units = self._units_arg(run)
        keep = scope_of(run.plan, units)
        dropped = out_of_scope(run, units)
        todo = [u for u in keep if u not in self._current(run)]
        return [f"Keep in scope ({len(keep)}): {ids(keep)}",
                f"Reused: every current unit ({len(self._current(run))})",
                "Invalidated: none",
                f"Held back ({len(dropped)}, blocked '{OUT_OF_SCOPE_REASON}'): {ids(dropped)}",
                f"Still to run in scope ({len(todo)}): {ids(todo)} · {self._cost(run, todo)}", "",
                self._recorded(f"decision.takeover action=narrow_scope keep={' '.join(units)}, "
                               "then a blocked status per held-back unit")]

    def _descendants(self, run: Run, unit: str) -> list[str]:
        return sorted(nx.descendants(run.plan.graph(), unit))

    def _preview_rerun(self, run: Run) -> list[str]:
        unit = self._units_arg(run)[0]
        view = self._status(run).units.get(unit)
        state = view.state if view else "pending"
        lines = [f"{unit} is {state}" + (f": {view.reason}" if view and view.reason else "")]
        if state == "succeeded":
            lines.append(f"{unit} is current: a rerun reuses it (nothing to redo) and resumes.")
        else:
            lines.append(f"Runs {unit} as a new attempt (attempts so far: "
                         f"{view.attempts if view else 0}) · {self._cost(run, [unit])}")
        lines += [f"Then, when ready: {ids(self._descendants(run, unit))}",
                  f"Reused: every current unit ({len(self._current(run))}) · Invalidated: none",
                  "", self._recorded(f"decision.takeover action=retry unit={unit}, then the "
                                     "run's own events")]
        return lines

    def _preview_branch(self, run: Run) -> list[str]:
        name = self._arg()
        if not name or " " in name:
            raise KeepstepError("a branch id is one word", hint="e.g. " + self.default_branch)
        head = run.head().version
        return [f"Fork {run.run_id} at checkpoint {head} of {run.branch_id} as branch {name!r}.",
                f"Reused: every current unit ({len(self._current(run))}) · Invalidated: none",
                f"Cost now: none · {run.branch_id} is kept as it is",
                "The dashboard then shows the new branch.", "",
                self._recorded(f"decision.takeover action=branch from={run.branch_id} "
                               f"at_version={head}")]

    def _preview_cancel(self, run: Run) -> list[str]:
        running = self.app.dashboard.running
        return ["The run stops at its next safe point (the unit in flight finishes or is "
                "left as an orphan that resume redoes)." if running else
                "Nothing is running: this records the decision to stop the run here.",
                f"Reused: every current unit ({len(self._current(run))}) · Invalidated: none",
                "Cost: none", "", self._recorded("decision.takeover action=cancel")]

    def _preview_mark_for_expert(self, run: Run) -> list[str]:
        unit = self._units_arg(run)[0]
        waiting = self._descendants(run, unit)
        return [f"{unit} is held (blocked, '{EXPERT_REASON}') until a rerun releases it.",
                f"Waiting behind it ({len(waiting)}): {ids(waiting)}",
                f"Reused: every current unit ({len(self._current(run))}) · Invalidated: none",
                "Cost: none", "",
                self._recorded(f"decision.takeover action=mark_for_expert unit={unit}, then "
                               "a blocked status")]

    # -- confirm -----------------------------------------------------------------------------
    @on(OptionList.OptionSelected, "#takeover-choices")
    @on(Input.Submitted)
    @on(Button.Pressed, "#confirm")
    def action_confirm(self) -> None:
        run = self.app.active_run
        if run is None:
            return
        try:
            outcome = self._confirm(run)
        except Exception as exc:  # engine or storage: say so and stay on the page
            self.app.show_error(exc, title="The takeover was not recorded")
            return
        if outcome is not False:
            self.dismiss(outcome)

    def _confirm(self, run: Run) -> tuple[str, str] | None | bool:
        who, note = self.app.who, self.query_one("#takeover-note", Input).value.strip()
        if self.action == "resume":
            if self.app.dashboard.running:
                self.notify("a run is in progress", severity="warning")
                return False
            record_takeover(run, "resume", who=who)
            return ("resume", "")
        if self.action == "rerun":
            return ("retry", self._units_arg(run)[0])  # Run.retry records the decision
        if self.action == "narrow_scope":
            held = narrow_scope(run, self._units_arg(run), who=who, note=note)
            self.notify(f"scope narrowed: {len(held)} unit(s) held back")
            return None
        if self.action == "mark_for_expert":
            unit = self._units_arg(run)[0]
            mark_for_expert(run, unit, note, who=who)
            self.notify(f"{unit} marked for an expert")
            return None
        if self.action == "branch":
            self._preview_branch(run)  # validates the name
            new = run.branch(run.head().version, self._arg())
            self.app.switch_run(new)
            self.notify(f"branched: now showing {new.run_id} ({new.branch_id})")
            return None
        record_takeover(run, "cancel", who=who, note=note, running=self.app.dashboard.running)
        return ("cancel", "")

    def action_export(self) -> None:
        path = export_bundle(self.app)
        self.query_one("#takeover-export", Static).update(
            f"handover bundle exported: {path}" if path is not None else NOT_AVAILABLE)

    def action_back(self) -> None:
        self.dismiss(None)


__all__ = ["CHOICES", "TakeoverScreen"]
