"""What the dashboard does for each Needs-you item, and the approval it opens.

A mixin of ``DashboardScreen`` (kept apart so the screen module stays readable): Enter on an
item answers the approval, settles the external action (the effects view, lookup first),
raises the budget or resets recovery (a form that records the decision), or explains a held
or failed unit. Every recorded decision goes through the engine's ``Run`` methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.app.tui.screens.approval import ApprovalModal
from keepstep.app.tui.screens.effects import EffectsScreen
from keepstep.app.tui.screens.explain import ExplainScreen
from keepstep.app.tui.screens.form import FormModal
from keepstep.app.tui.widgets.unit_table import UnitTable

if TYPE_CHECKING:
    from textual.screen import Screen

    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine import Run
    from keepstep.engine.views import Need, PendingApproval, RunStatus

    # To the type checker the mixin is the screen it is mixed into (notify, query_one).
    _MixedInto = Screen[None]
else:
    _MixedInto = object


class NeedsYouActions(_MixedInto):
    """The actions of the Needs-you panel (mixed into DashboardScreen)."""

    app: KeepstepApp
    status: RunStatus | None
    needs: list[Need]

    if TYPE_CHECKING:  # DashboardScreen's own, which these actions call
        def action_run(self) -> None: ...
        def refresh_status(self) -> None: ...

    # -- approvals -------------------------------------------------------------------------
    def open_approval(self, request: PendingApproval) -> None:
        run = self.app.active_run
        if run is None or isinstance(self.app.screen, ApprovalModal):
            return
        gate = next((g for g in run.plan.gates if g.id == request.gate), None)
        audience = self.app.project.files.contract.audience
        token = run.resume_tokens.pop(request.gate, None)  # shown once, then forgotten

        def answered(choice: str | None) -> None:
            if choice is None or gate is None:
                self.notify(f"not now: the run waits at gate {request.gate} (a to answer)")
                return
            recorded = self.app.guarded("The approval was not recorded", run.approve, gate.id,
                                        choice, who=self.app.who)
            if recorded is not None:
                self.notify(f"recorded: gate {gate.id} = {choice!r}; resuming")
                self.action_run()

        self.app.push_screen(ApprovalModal(request, gate=gate, preferred=audience, token=token),
                             answered)

    # -- needs you -------------------------------------------------------------------------
    def act_on(self, need: Need) -> None:
        """The action of one Needs-you item: answer, settle, raise, reset or look."""
        run = self.app.active_run
        if run is None:
            return
        if need.kind == "approval":
            request = next((r for r in (self.status.pending_approvals if self.status else [])
                            if r.gate == need.key), None)
            if request is not None:
                self.open_approval(request)
        elif need.kind == "effect":
            self.app.push_screen(EffectsScreen(key=need.key))
        elif need.kind == "budget":
            self._raise_budget(run, need)
        elif need.kind == "recovery":
            self._reset_recovery(run)
        elif need.unit:
            self.query_one(UnitTable).select(need.unit)
            self.app.push_screen(ExplainScreen(need.unit))
            self.notify(f"{need.action}: t opens the takeover (rerun {need.unit})")

    def _raise_budget(self, run: Run, need: Need) -> None:
        counter = next((k for k in ("calls", "tokens", "cost", "recoveries")
                        if f"--{k} " in need.command), "calls")
        limits = self.status.budget.get("limits", {}) if self.status else {}
        current = limits.get(counter)
        suggested = need.command.split(f"--{counter} ", 1)[-1].split()[0] \
            if f"--{counter} " in need.command else ""

        def check(values: dict[str, str]) -> str | None:
            try:
                float(values["limit"])
            except ValueError:
                return f"the new {counter} limit must be a number"
            return None if values["reason"] else "say why (it is recorded with the decision)"

        def decided(values: dict[str, str] | None) -> None:
            if values is None:
                self.notify("the budget is unchanged")
                return
            done = self.app.guarded("The budget raise was not recorded", run.raise_budget,
                                    reason=values["reason"], who=self.app.who,
                                    **{counter: float(values["limit"])})
            if done is not None:
                self.notify(f"{counter} limit now {float(values['limit']):g}; r resumes")
                self.refresh_status()

        self.app.push_screen(FormModal(
            f"Raise the {counter} budget", [need.message,
                                            f"current limit: {current:g}" if current else "",
                                            "The new limit is recorded as a budget decision; "
                                            "the units it blocked are released."],
            [("limit", f"{counter} limit", "the new limit, not an increment", suggested),
             ("reason", "reason", "why (recorded)", "")], ok="Raise it", check=check), decided)

    def _reset_recovery(self, run: Run) -> None:
        def decided(values: dict[str, str] | None) -> None:
            if values is None:
                return
            try:
                run.reset_recovery(reason=values["reason"], who=self.app.who)
            except Exception as exc:  # engine or storage: say so, nothing else changes
                self.app.show_error(exc, title="The reset was not recorded")
                return
            self.notify("recovery reset recorded; r resumes")
            self.refresh_status()

        self.app.push_screen(FormModal(
            "Reset recovery", ["Recovery stopped and waits for a person to look (see the "
                               "events). A reset is recorded; the next resume starts recovery "
                               "again from the beginning."],
            [("reason", "reason", "what you checked (recorded)", "")], ok="Reset",
            check=lambda v: None if v["reason"] else "say what you checked"), decided)


__all__ = ["NeedsYouActions"]
