"""The TUI's main flows, driven headless with Textual's pilot on copies of the ME-042 pack."""

from __future__ import annotations

import threading
import tomllib
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Markdown, Static

from keepstep.app.tui.screens import (
    AddSourceModal,
    ApprovalModal,
    ConfirmModal,
    DashboardScreen,
    ErrorModal,
    EventsScreen,
    ExplainScreen,
    NarrativeScreen,
    PlanBuilderScreen,
    SourcesScreen,
    TakeoverScreen,
)
from keepstep.app.tui.widgets import Tick, UnitTable
from keepstep.engine import KeepstepError, open_project
from keepstep.engine.files.project import load_sources, save_sources
from tests.support.tui_support import (
    RUN_ID,
    WHO,
    copy_of,
    copy_sample,
    gate_template,
    make_test_app,
    screen_text,
    wait_for,
)

SIZE = (100, 30)


@pytest.fixture(scope="session")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gate_template(tmp_path_factory)


@pytest.fixture
def at_gate(gate: Path, tmp_path: Path) -> Path:
    """A project whose run ME-042 waits at the audience gate (28 units current; U28–U30 are
    held by the same gate)."""
    return copy_of(gate, tmp_path / "market-entry")


def _approved(root: Path, source_id: str) -> bool:
    with open(root / "sources.toml", "rb") as fh:
        data = tomllib.load(fh)
    return next(s["approved"] for s in data["source"] if s["id"] == source_id)


def _set_approved(root: Path, source_id: str, approved: bool) -> None:
    sources = load_sources(root)
    next(s for s in sources.sources if s.id == source_id).approved = approved
    save_sources(root, sources)


# -- dashboard ---------------------------------------------------------------------------------
async def test_dashboard_shows_versions_units_budget_and_the_waiting_gate(at_gate: Path) -> None:
    """The dashboard shows run/plan/input versions, the checkpoint, unit titles and states,
    budget, and the gate under Needs you with its action."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
        text = screen_text(app)
        assert f"run {RUN_ID} (main)" in text
        assert "plan-v1 · in-v1 · checkpoint 28 · ◼ blocked" in text
        assert "✓ current 28/36" in text and "· pending 8" in text
        assert "U03 ✓ current Frame the research questions" in text
        assert "? gate audience: Confirm the audience" in text and "→ answer the approval" in text
        assert "external unknown" not in text  # only what needs the person
        assert "next   answer the approval — a answers it" in text and "DIR" not in text
        table = app.screen.query_one(UnitTable)
        assert table.state_of("U01") == "succeeded" and table.state_of("U27") == "pending"


async def test_dashboard_fits_80_by_24_and_a_project_without_runs(tmp_path: Path) -> None:
    """A project with no run opens at 80×24 on a 'not started' dashboard of the default run
    (keepstep.toml's default_run: ME-042); r would start it."""
    root = copy_sample(tmp_path / "market-entry")
    app = make_test_app(root, run_id=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "run ME-042 (not started)" in text
        assert "press r to start run ME-042" in text
        assert app.active_run is None


async def test_unit_table_moves_with_arrows_and_explain_opens(at_gate: Path) -> None:
    """The arrows move the units table's cursor; e explains the selected unit, outputs too."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(UnitTable)
        assert table.selected == "U01"
        await pilot.press("down", "down")
        assert table.selected == "U03"
        await pilot.press("e")
        assert isinstance(app.screen, ExplainScreen)
        text = screen_text(app)
        assert "U03 — Frame the research questions" in text and "succeeded" in text
        assert "outputs (current record U03/a1)" in text and "matches its record" in text
        await pilot.press("escape")
        assert isinstance(app.screen, DashboardScreen)


# -- running, the gate, approval -----------------------------------------------------------------
async def test_run_stops_at_the_gate_then_the_approval_resumes_it_to_done(tmp_path: Path) -> None:
    """r runs in the worker; the gate opens the approval modal; approving reaches done."""
    root = copy_sample(tmp_path / "market-entry")
    app = make_test_app(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        dashboard = app.screen
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal),
                       what="the approval modal")
        modal = app.screen
        assert "Confirm the audience for the synthesis" in screen_text(app)
        assert "Binds: audience = 'product team'" in screen_text(app)
        assert modal.options[modal.chosen()]["label"] == "product team"
        assert dashboard.status.counts["current"] == 28
        await pilot.press("y")
        await wait_for(pilot, lambda: not dashboard.running and dashboard.status is not None
                       and dashboard.status.decision == "done", what="the run to be done")
        assert dashboard.status.counts["current"] == 36
        assert "checkpoint 36 · ✓ done" in screen_text(app)
    with open_project(root) as project:
        decided = project.get_run(RUN_ID).events(kinds=["approval.decided"])
        assert decided and decided[-1].payload.get("choice", "product team") == "product team"


async def test_not_now_leaves_the_gate_waiting(at_gate: Path) -> None:
    """'Not now' records nothing: the gate stays pending and the run stays blocked."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("a")
        assert isinstance(app.screen, ApprovalModal)
        await pilot.press("n")
        assert isinstance(app.screen, DashboardScreen)
        assert app.screen.status.pending_approvals


async def test_an_option_the_gate_refuses_is_shown_disabled_with_the_reason(
        at_gate: Path) -> None:
    """The option contract.md contradicts is disabled with why: the highlight cannot reach
    it, so y approves what contract.md says; nothing refused is offered as a choice."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("a")
        modal = app.screen
        assert isinstance(modal, ApprovalModal)
        text = screen_text(app)
        assert "not available: needs contract.md's audience changed to 'investment committee'" \
            in text
        await pilot.press("down")
        assert modal.options[modal.chosen()]["label"] == "product team"
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen)
                       and not app.dashboard.running, what="the resumed run")
    with open_project(at_gate) as project:
        decided = project.get_run(RUN_ID).events(kinds=["approval.decided"])
        assert decided[-1].payload["choice"] == "product team"


async def test_cancel_stops_the_run_at_a_safe_point(tmp_path: Path) -> None:
    """c sets the cancel Event: the worker returns at the next safe point, not done."""
    release = threading.Event()

    def held_run(run, cancel, on_event):
        def hold_after_each_attempt(event: dict) -> None:
            on_event(event)
            if event.get("kind") == "attempt":  # the offline run is faster than a key press
                release.wait(30)
        # One unit at a time: with more, the units beside the held one go on committing.
        return run.run(cancel=cancel, on_event=hold_after_each_attempt, jobs=1)

    root = copy_sample(tmp_path / "market-entry")
    app = make_test_app(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        dashboard = app.screen
        assert dashboard.start_engine(held_run)
        table = dashboard.query_one(UnitTable)
        await wait_for(pilot, lambda: table.state_of("U01") == "succeeded", what="a commit")
        await pilot.press("c")
        assert dashboard.cancel_event.is_set()
        release.set()
        await wait_for(pilot, lambda: not dashboard.running, what="the cancel")
        assert "cancelled at a safe point" in dashboard.progress
        assert dashboard.status.decision != "done"
        assert dashboard.status.counts["current"] == 1


async def test_a_worker_error_becomes_the_error_modal(at_gate: Path) -> None:
    """An exception in the engine worker is shown by the one error handler."""
    def broken(run, cancel, on_event):
        raise KeepstepError("the store is unhappy", hint="try again later")

    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.start_engine(broken)
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal), what="the error")
        assert "the store is unhappy" in screen_text(app)
        assert "try again later" in screen_text(app)
        assert not app.dashboard.running


# -- sources -------------------------------------------------------------------------------------
async def test_sources_screen_approves_a_source_and_flags_the_change(at_gate: Path) -> None:
    """An unapproved source is flagged against the snapshot; a approves it in sources.toml."""
    _set_approved(at_gate, "A3", False)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        assert isinstance(app.screen, SourcesScreen)
        await pilot.press("down", "down")
        text = screen_text(app)
        assert "A3 · Utility capital expenditure outlook" in text
        assert "revoked (in in-v1)" in text and "⚑ would invalidate" in text
        await pilot.press("a")
        await app.workers.wait_for_complete()  # the file is converted in a thread first
        await pilot.pause()
        assert _approved(at_gate, "A3") is True
        text = screen_text(app)
        assert "48 approved" in text and "⚑ would invalidate" not in text
        await pilot.press("space")  # revoking asks first, with the impact
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        assert "Revoke source A3?" in app.screen.title_text
        assert _approved(at_gate, "A3") is True
        await pilot.press("y")
        await pilot.pause()
        assert _approved(at_gate, "A3") is False


async def test_sources_screen_refuses_to_approve_a_file_without_text(at_gate: Path) -> None:
    """Approving a source whose file yields no text (here: emptied) shows the refusal with
    what to do, and sources.toml keeps it unapproved."""
    _set_approved(at_gate, "A3", False)
    source = next((at_gate / "sources").glob("A3-*"))
    source.write_bytes(b"")
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        assert isinstance(app.screen, SourcesScreen)
        await pilot.press("down", "down")
        assert "A3 · Utility capital expenditure outlook" in screen_text(app)
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        text = screen_text(app)
        assert f"{source.name} is empty" in text and "export it again" in text
    assert _approved(at_gate, "A3") is False


async def test_approving_converts_in_a_thread_and_the_screen_stays_live(
        at_gate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table shows each source's detected type. Approving converts the file in a worker
    thread: while a slow conversion runs the row says "checking…" and keys still work;
    sources.toml changes only once it converted."""
    import keepstep.app.tui.screens.sources as sources_screen

    _set_approved(at_gate, "A3", False)
    release, started = threading.Event(), threading.Event()
    real = sources_screen.inspect_file

    def slow_inspect(root: Path, path: Path):  # noqa: ANN202 - the engine's signature
        started.set()
        assert release.wait(10), "the test never released the conversion"
        return real(root, path)

    monkeypatch.setattr(sources_screen, "inspect_file", slow_inspect)
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        table = app.screen.query_one("#sources-table", DataTable)
        assert table.get_row("A1")[2] == "PDF"  # the type column
        assert table.get_row("A3")[2] == "MD"
        await pilot.press("down", "down", "a")
        await pilot.pause()
        assert started.wait(5)
        assert table.get_row("A3")[4] == "checking…" and _approved(at_gate, "A3") is False
        await pilot.press("up")  # the screen answers keys during the conversion
        await pilot.pause()
        assert table.cursor_row == 1
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert _approved(at_gate, "A3") is True
        assert table.get_row("A3")[4] == "yes"


async def test_sources_screen_adds_a_source_and_shows_a_duplicate_id_in_the_modal(
        at_gate: Path, tmp_path: Path) -> None:
    """n opens the add modal; a file from outside lands in sources/, the table and
    sources.toml; a duplicate id is shown in the modal, which stays open."""
    doc = tmp_path / "M1-notes.md"
    doc.write_text("# Notes\n\nThe bakery sold 120 loaves on 3 May 2025.\n", encoding="utf-8")
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        sources = app.screen
        assert isinstance(sources, SourcesScreen)
        await pilot.press("ctrl+n")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, AddSourceModal)
        modal.query_one("#add-path", Input).value = str(doc)
        await pilot.press("tab", *"M1", "tab", "M", "tab", *"Bakery", "tab", "tab", "space")
        assert modal.query_one("#add-approve", Tick).value is True
        await pilot.click("#add")
        await pilot.pause()
        assert app.screen is sources
        table = sources.query_one(DataTable)
        row = table.get_row("M1")
        assert row[1:5] == ["M1", "MD", "M", "yes"] and row[-1] == "Bakery"
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == "M1"
        assert _approved(at_gate, "M1") is True
        assert (at_gate / "sources" / "M1-notes.md").read_bytes() == doc.read_bytes()

        await pilot.press("ctrl+n")
        await pilot.pause()
        modal = app.screen
        modal.query_one("#add-path", Input).value = "sources/M1-notes.md"
        modal.query_one("#add-id", Input).value = "A1"
        modal.query_one("#add-path", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is modal
        problem = str(modal.query_one("#add-source-error", Static).render())
        assert "source id 'A1' is already used" in problem and "pick a new id" in problem
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is sources
    assert sum(1 for s in load_sources(at_gate).sources if s.id in ("A1", "M1")) == 2


async def test_add_source_modal_previews_the_file_before_it_is_added(at_gate: Path,
                                                                    tmp_path: Path) -> None:
    """Typing a path shows the detected type, its sheets and a text preview before anything
    is added or approved; a scanned PDF is shown as refused, with what to do, and adding it
    is refused inside the modal."""
    from tests.support.source_files import write_scanned_pdf

    workbook = at_gate / "sources" / "E1-brightwell-price-list.xlsx"
    scan = write_scanned_pdf(tmp_path / "N1-scan.pdf")
    listed = (at_gate / "sources.toml").read_bytes()
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("ctrl+n")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, AddSourceModal)
        preview = modal.query_one("#add-source-preview", Static)
        modal.query_one("#add-path", Input).value = str(workbook)
        await wait_for(pilot, lambda: modal.previewed == str(workbook), timeout=30,
                       what="the workbook preview")
        text = str(preview.render())
        assert "detected: Excel workbook (XLSX), 2 sheets: Price list, Volume tiers" in text
        assert "Clearline residential meter, NB-IoT: NVK 1,150 per unit." in text
        assert (at_gate / "sources.toml").read_bytes() == listed  # a preview changes nothing

        modal.query_one("#add-path", Input).value = str(scan)
        await wait_for(pilot, lambda: modal.previewed == str(scan), timeout=30,
                       what="the scan preview")
        text = str(preview.render())
        assert "cannot be a source" in text and "no text layer" in text and "OCR it" in text
        modal.query_one("#add-id", Input).value = "N1"
        await pilot.click("#add")
        await pilot.pause()
        assert app.screen is modal
        assert "no text layer" in str(modal.query_one("#add-source-error", Static).render())
    assert "N1" not in {s.id for s in load_sources(at_gate).sources}
    assert not (at_gate / "sources" / "N1-scan.pdf").exists()


# -- plan builder ---------------------------------------------------------------------------------
async def test_plan_builder_adds_a_unit_and_shows_a_dependency_cycle(at_gate: Path) -> None:
    """A new unit depending on U36, then U01 depending on it: the cycle is named; no save."""
    before = (at_gate / "plan.toml").read_bytes()
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        assert isinstance(builder, PlanBuilderScreen)
        await pilot.pause()
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert builder.plan.units[builder.index].id == "U37"
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press(*"U36")
        await pilot.pause()
        assert [d.unit for d in builder.plan.unit_map()["U37"].depends_on] == ["U36"]
        assert builder.problems == []
        await builder.select_unit("U01")
        await pilot.pause()
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press(*"U37")
        await pilot.pause()
        problems = builder.query_one("#problems", Static).render()
        assert "dependency cycle" in str(problems) and "U37" in str(problems)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
    assert (at_gate / "plan.toml").read_bytes() == before


async def test_the_tui_opens_on_an_invalid_plan_in_the_plan_builder(tmp_path: Path) -> None:
    """A plan.toml that parses but does not validate (a dependency on a unit that does not
    exist): the app opens in the plan builder with the problems shown, the fix saved there
    makes the project open normally again."""
    root = copy_sample(tmp_path / "market-entry")
    plan_file = root / "plan.toml"
    text = plan_file.read_text(encoding="utf-8")
    plan_file.write_text(text.replace('depends_on = ["U35"]', 'depends_on = ["U35", "U99"]',
                                      1), encoding="utf-8")
    with pytest.raises(KeepstepError, match="U99"):
        open_project(root).close()
    app = make_test_app(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        assert "U99" in screen_text(app) and "fix them here" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        builder = app.screen
        assert isinstance(builder, PlanBuilderScreen)
        builder.validate()
        assert any("U99" in p for p in builder.problems)
        unit = builder.plan.unit_map()["U36"]
        unit.depends_on = [d for d in unit.depends_on if d.unit != "U99"]
        builder.dirty = True
        builder.validate()
        assert builder.problems == []
        await pilot.press("ctrl+s")
        await pilot.pause()
    assert "U99" not in plan_file.read_text(encoding="utf-8")
    open_project(root).close()


async def test_plan_builder_previews_before_writing_and_saves_only_when_asked(
        at_gate: Path) -> None:
    """ctrl+s shows what the change invalidates with plan.toml untouched; "keep editing"
    writes nothing; ctrl+s then y writes it."""
    before = (at_gate / "plan.toml").read_bytes()
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        await pilot.pause()
        await builder.select_unit("U17")
        await pilot.pause()
        builder.query_one("#f-max-rounds").value = "2"
        await pilot.pause()
        assert builder.problems == [] and builder.plan.unit_map()["U17"].max_rounds == 2
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the preview")
        assert (at_gate / "plan.toml").read_bytes() == before
        text = screen_text(app)
        assert "unit U17 changed: max_rounds" in text and "↺ U25" in text
        await pilot.press("n")
        await pilot.pause()
        assert (at_gate / "plan.toml").read_bytes() == before
        assert builder.plan.unit_map()["U17"].max_rounds == 2  # the edit is still there
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the preview")
        await pilot.press("y")
        await pilot.pause()
        assert b"max_rounds = 2" in (at_gate / "plan.toml").read_bytes()
        assert not builder.dirty


# -- takeover, handover, events ------------------------------------------------------------
async def test_takeover_previews_each_choice_and_exports_the_handover(at_gate: Path) -> None:
    """Each choice shows its preview; x exports the handover bundle and shows its path."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("t")
        assert isinstance(app.screen, TakeoverScreen)
        assert "Reused (28)" in screen_text(app)
        await pilot.press("down", "down", "down")
        assert "as main-cp28" in screen_text(app) and "new branch main-cp28" in screen_text(app)
        await pilot.press("x")
        await pilot.pause()
        shown = str(app.screen.query_one("#takeover-export", Static).render())
    bundle = at_gate / "handover" / f"{RUN_ID}-main"
    assert str(bundle) in shown and bundle.is_dir()


async def test_takeover_marks_a_unit_for_an_expert_as_a_decision(at_gate: Path) -> None:
    """Confirming 'mark for an expert' records a decision event and blocks the unit."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("down", "t", *["down"] * 5)
        assert app.screen.action == "mark_for_expert"
        assert app.screen.query_one("#takeover-arg").value == "U02"
        await pilot.press("ctrl+s", "y")  # without a note: refused, the page stays
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        await pilot.press("escape")
        app.screen.query_one("#takeover-note").value = "check the contract parsing"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)  # the preview, before anything is written
        await pilot.press("y")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
        assert app.screen.status.units["U02"].state == "blocked"
        assert "U02 held: marked for an expert" in screen_text(app)
    with open_project(at_gate) as project:
        events = project.get_run(RUN_ID).events(kinds=["decision.takeover"])
        assert events[-1].payload["action"] == "mark_for_expert" and events[-1].unit == "U02"
        assert events[-1].payload["who"] == WHO


async def test_takeover_rerun_invalidates_the_unit_and_runs_it_again(at_gate: Path) -> None:
    """Rerunning a current unit previews what it invalidates, records it and runs it."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("t", "down", "down")
        assert app.screen.action == "rerun"
        app.screen.query_one("#takeover-arg").value = "U32"
        await pilot.pause()
        assert "↺ U32" in screen_text(app) and "Recorded:" in screen_text(app)
        await pilot.press("ctrl+s", "y")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal),
                       what="the run to reach the gate again")
        await pilot.press("n")
    with open_project(at_gate) as project:
        run = project.get_run(RUN_ID)
        takeover = run.events(kinds=["decision.takeover"])[-1]
        assert takeover.payload["action"] == "rerun" and takeover.unit == "U32"
        assert run.status().units["U32"].attempts == 2


async def test_takeover_branch_switches_the_dashboard_to_the_new_branch(at_gate: Path) -> None:
    """Branching forks at the head and the dashboard then shows the branch."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("t", "down", "down", "down", "ctrl+s", "y")
        await pilot.pause()
        assert isinstance(app.screen, DashboardScreen)
        assert app.active_run.branch_id == "main-cp28"
        assert f"run {RUN_ID} (main-cp28)" in screen_text(app)


async def test_events_screen_filters_by_kind_prefix(at_gate: Path) -> None:
    """Typing a kind prefix narrows the event table to that kind."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("v")
        assert isinstance(app.screen, EventsScreen)
        await pilot.press("slash", *"recovery.")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        kinds = {table.get_row_at(i)[2] for i in range(table.row_count)}
        assert kinds and all(k.startswith("recovery.") for k in kinds)


async def test_narrative_screen_renders_the_handover_story(at_gate: Path) -> None:
    """h shows the narrative generated from stored state."""
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, NarrativeScreen)
        source = app.screen.query_one(Markdown).source
        assert RUN_ID in source


async def test_quitting_mid_run_stops_the_engine_before_the_store_closes(tmp_path: Path) -> None:
    """q during a run cancels it; the app waits for the safe point, then the run resumes."""
    release = threading.Event()

    def held_run(run, cancel, on_event):
        def hold(event: dict) -> None:
            on_event(event)
            if event.get("kind") == "attempt":
                release.wait(30)
        return run.run(cancel=cancel, on_event=hold)

    root = copy_sample(tmp_path / "market-entry")
    app = make_test_app(root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.screen.start_engine(held_run)
        table = app.screen.query_one(UnitTable)
        await wait_for(pilot, lambda: table.state_of("U01") == "succeeded", what="a commit")
        release.set()
        await pilot.press("q")
    assert app.dashboard.engine_idle.is_set()
    with open_project(root) as project:
        status = project.get_run(RUN_ID).status()
        assert status.leases == [] and status.decision != "done"


async def _touch_every_field(pilot, builder: PlanBuilderScreen) -> None:
    """Change every field of the shown unit to something else (applied: the plan in memory
    changes), then put each back as it was shown."""
    from textual.widgets import Select

    inputs = {f: builder.query_one(f"#{f}", Input) for f in (
        "f-id", "f-title", "f-phase", "f-inputs", "f-outputs", "f-gate", "f-gate-options",
        "f-max-rounds")}
    kind, tick = builder.query_one("#f-kind", Select), builder.query_one("#f-required", Tick)
    edges = list(builder.query(".dep-edge").results(Select))
    shown = ({f: box.value for f, box in inputs.items()}, kind.value, tick.value,
             [e.value for e in edges])
    for field_id, box in inputs.items():
        box.value = "" if field_id in ("f-gate", "f-max-rounds") and box.value else "X9"
    kind.value = "notes" if kind.value != "notes" else "audit"
    tick.value = not tick.value
    for edge in edges:
        edge.value = "policy" if edge.value != "policy" else "content"
    await pilot.pause()
    for field_id, box in inputs.items():
        box.value = shown[0][field_id]
    kind.value, tick.value = shown[1], shown[2]
    for edge, value in zip(edges, shown[3], strict=True):
        edge.value = value
    await pilot.pause()


async def test_plan_builder_round_trips_every_field_of_every_unit_and_gate(
        at_gate: Path) -> None:
    """Every field of every unit (and the gate each shows) edited and put back: the plan in
    memory equals plan.toml's, nothing is dirty, ctrl+s has nothing to write."""
    from keepstep.engine.plan import load_plan

    before = (at_gate / "plan.toml").read_bytes()
    saved = load_plan(at_gate / "plan.toml")
    assert any(g.also for g in saved.gates)  # the gate holds further units: the case at stake
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        assert isinstance(builder, PlanBuilderScreen)
        await pilot.pause()
        for unit in saved.units:
            await builder.select_unit(unit.id)
            await pilot.pause()
            await _touch_every_field(pilot, builder)
            assert builder.plan.to_toml_dict() == saved.to_toml_dict(), unit.id
            assert builder.plan.gate_for(unit.id) == saved.gate_for(unit.id), unit.id
        assert not builder.dirty and builder.problems == []
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmModal)
    assert (at_gate / "plan.toml").read_bytes() == before


async def test_a_title_edit_of_a_unit_held_through_also_changes_only_its_title(
        at_gate: Path) -> None:
    """U28 is held by the audience gate through `also`: editing its title and saving changes
    that one line; the preview names exactly that change; the gate still holds U27-U30."""
    plan_file = at_gate / "plan.toml"
    before = plan_file.read_text(encoding="utf-8").splitlines()
    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("p")
        builder = app.screen
        await pilot.pause()
        await builder.select_unit("U28")
        await pilot.pause()
        title = builder.query_one("#f-title", Input)
        old_title = title.value
        title.value = old_title + " (revised)"
        await pilot.pause()
        assert builder.dirty
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the preview")
        text = screen_text(app)
        assert "~ unit U28: title" in text and "(revised)" in text
        assert "gate audience" not in text
        await pilot.press("y")
        await pilot.pause()
    after = plan_file.read_text(encoding="utf-8").splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [(f'title = "{old_title}"', f'title = "{old_title} (revised)"')]
    with open_project(at_gate) as project:
        gate = project.files.plan.gate_for("U28")
        assert gate is not None and gate.held_units() == ["U27", "U28", "U29", "U30"]


# -- repair paths, the palette ------------------------------------------------------------------
async def test_the_tui_opens_the_raw_view_at_the_line_of_a_plan_that_is_not_toml(
        tmp_path: Path) -> None:
    """plan.toml with a TOML syntax error: the raw view opens with the cursor on that line;
    a save that still does not parse is refused; the fixed text is saved and the app asks
    to reopen, after which the project opens as usual."""
    from textual.widgets import TextArea

    from keepstep.app.tui.screens import PlanRepairApp, RawPlanScreen

    root = copy_sample(tmp_path / "market-entry")
    plan_file = root / "plan.toml"
    lines = plan_file.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = next(i for i, line in enumerate(lines) if line.startswith("title = ")) + 1
    good = lines[bad - 1]
    lines[bad - 1] = 'title = "unterminated\n'
    plan_file.write_text("".join(lines), encoding="utf-8")
    app = make_test_app(root)
    assert isinstance(app, PlanRepairApp)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        raw = app.screen
        assert isinstance(raw, RawPlanScreen) and raw.cursor_line == bad
        assert "not valid TOML" in screen_text(app)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal)
        await pilot.press("escape")
        area = raw.query_one(TextArea)
        area.text = area.text.replace('title = "unterminated\n', good, 1)
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
    assert app.return_value == "reopen"
    assert plan_file.read_text(encoding="utf-8").splitlines(keepends=True)[bad - 1] == good
    reopened = make_test_app(root)
    assert not isinstance(reopened, PlanRepairApp)
    reopened.project.close()


async def test_the_palette_finds_export_approve_deliverables_and_every_action(
        at_gate: Path) -> None:
    """ctrl+p then a word lists the matching commands; every dashboard key has one."""
    from textual.command import CommandPalette

    from keepstep.app.tui.app import PALETTE

    app = make_test_app(at_gate)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        actions = {a for a, _, _ in PALETTE}
        for binding in DashboardScreen.BINDINGS:
            assert binding.action in actions or binding.action == "app.quit", binding.action
        for title in (t for _, t, _ in PALETTE):
            assert title in titles
        for word, expected in (("export", "Export deliverables"), ("approve", "Approve"),
                               ("deliverables", "Deliverables")):
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette),
                           what="the palette")
            await pilot.press(*word)
            await pilot.pause(0.5)
            await wait_for(pilot, lambda expected=expected: expected in screen_text(app),
                           timeout=10, what=f"{word!r} in the palette")
            await pilot.press("escape")
            await pilot.pause()
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"approve", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalModal),
                       what="the approval from the palette")
