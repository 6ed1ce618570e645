"""Plan builder: the plan's units by phase on the left, the selected unit's form on the right,
validation messages under the form as you edit, and saving with an invalidation preview.

Edits change an in-memory copy of plan.toml's Plan; validate_plan runs on every change.
Keys work while typing in the form (ctrl+n/r/o/s: Input claims ctrl+d and ctrl+e). Removing
a unit and leaving with unsaved edits ask first (ConfirmModal).
ctrl+s, when the plan validates, first shows what the edited plan would invalidate
(Run.preview_plan, nothing written); Save then writes plan.toml with save_plan, which keeps
its comments and layout and rewrites only what changed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static, Tree

from keepstep.app.tui.format import plan_changes, preview_lines
from keepstep.app.tui.screens.confirm import ConfirmModal
from keepstep.app.tui.widgets.tick import Tick
from keepstep.engine.plan import (
    PLAN_FILE,
    EdgeType,
    Gate,
    Plan,
    Unit,
    UnitKind,
    save_plan,
    validate_plan,
)

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp

FIELDS = (("f-id", "id"), ("f-title", "title"), ("f-phase", "phase"), ("f-inputs", "inputs"),
          ("f-outputs", "outputs"), ("f-gate", "gate"), ("f-gate-options", "gate options"),
          ("f-max-rounds", "max rounds"))
EDGES = [(e.value, e.value) for e in EdgeType]


class DependencyRow(Horizontal):
    """One dependency: the unit it needs and the edge type (what kind of change travels)."""

    DEFAULT_CSS = """
    DependencyRow { height: 1; margin: 0 0 0 1; }
    DependencyRow > Input { width: 1fr; }
    DependencyRow > Select { width: 16; }
    DependencyRow > Button { width: 5; min-width: 5; }
    """

    def __init__(self, unit: str = "", edge: str = "content") -> None:
        super().__init__(classes="dep-row")
        self.unit, self.edge = unit, edge

    def compose(self) -> ComposeResult:
        yield Input(self.unit, placeholder="unit id", compact=True, classes="dep-unit")
        yield Select(EDGES, value=self.edge, allow_blank=False, compact=True, classes="dep-edge")
        yield Button("✕", compact=True, classes="dep-remove", tooltip="remove this dependency")

    def value(self) -> dict[str, str] | None:
        unit = self.query_one(".dep-unit", Input).value.strip()
        edge = self.query_one(".dep-edge", Select).value
        return {"unit": unit, "edge": str(edge)} if unit else None


class PlanBuilderScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "back"),
        Binding("ctrl+n", "add_unit", "add unit"),
        Binding("ctrl+r", "remove_unit", "remove unit (asks)"),
        Binding("ctrl+o", "add_dependency", "add dependency"),
        Binding("ctrl+s", "save", "save"),
        Binding("f2", "raw", "plan.toml as text (raw view)"),
    ]

    app: KeepstepApp

    def __init__(self) -> None:
        super().__init__()
        self.plan: Plan = Plan()
        self.index: int | None = None
        self.problems: list[str] = []
        self.dirty = False
        self.loaded: dict[str, Any] = {}
        self.base_gates: list[Gate] = []
        self.base_unit: Unit | None = None

    def compose(self) -> ComposeResult:
        yield Static("Plan builder · plan.toml", id="plan-title", classes="screen-title",
                     markup=False)
        with Horizontal(id="plan-body"):
            tree: Tree[int] = Tree("plan", id="plan-tree")
            tree.show_root = False
            tree.border_title = "Units by phase"
            yield tree
            with Vertical(id="plan-right"):
                with VerticalScroll(id="unit-form", classes="panel") as form:
                    form.border_title = "Unit"
                    for field_id, label in FIELDS[:3]:
                        yield from _field(field_id, label)
                    with Horizontal(classes="field"):
                        yield Label("kind", classes="field-label")
                        yield Select([(k.value, k.value) for k in UnitKind], allow_blank=False,
                                     compact=True, id="f-kind")
                    for field_id, label in FIELDS[3:]:
                        yield from _field(field_id, label)
                    with Horizontal(classes="field"):
                        yield Label("final", classes="field-label")
                        yield Tick("required final", compact=True, id="f-required")
                    with Horizontal(classes="field"):
                        yield Label("depends on", classes="field-label")
                        yield Button("+ dependency", compact=True, id="add-dep")
                    yield Vertical(id="f-deps")
                with VerticalScroll(id="problems-box", classes="panel") as box:
                    box.border_title = "Validation"
                    yield Static(id="problems", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.plan = self.app.project.files.plan.model_copy(deep=True)
        self.rebuild_tree()
        if self.plan.units:
            self.call_after_refresh(self.select_unit, self.plan.units[0].id)
        self.validate()
        self.query_one(Tree).focus()

    # -- tree --------------------------------------------------------------------------------
    def rebuild_tree(self) -> None:
        tree: Tree[int] = self.query_one(Tree)
        tree.clear()
        phases: dict[str, Any] = {}
        for i, unit in enumerate(self.plan.units):
            node = phases.get(unit.phase)
            if node is None:
                node = phases[unit.phase] = tree.root.add(unit.phase or "(no phase)", expand=True)
            node.add_leaf(f"{unit.id} {unit.title}", data=i)

    def _node(self, index: int) -> Any:
        tree: Tree[int] = self.query_one(Tree)
        stack = list(tree.root.children)
        while stack:
            node = stack.pop(0)
            if node.data == index:
                return node
            stack.extend(node.children)
        return None

    async def select_unit(self, unit_id: str) -> None:
        """Show ``unit_id`` in the form and put the tree's cursor on it."""
        index = next((i for i, u in enumerate(self.plan.units) if u.id == unit_id), None)
        if index is None:
            return
        await self.load_form(index)
        node = self._node(index)
        if node is not None:
            self.query_one(Tree).move_cursor(node)

    @on(Tree.NodeHighlighted, "#plan-tree")
    async def _highlighted(self, event: Tree.NodeHighlighted) -> None:
        if event.node.data is not None and event.node.data != self.index:
            await self.load_form(event.node.data)

    # -- form <-> unit -----------------------------------------------------------------------
    async def load_form(self, index: int) -> None:
        self.index = index
        unit = self.plan.units[index]
        gate = self.plan.gate_for(unit.id)
        values = {"f-id": unit.id, "f-title": unit.title, "f-phase": unit.phase,
                  "f-inputs": ", ".join(unit.inputs), "f-outputs": ", ".join(unit.outputs),
                  "f-gate": gate.question if gate else "",
                  "f-gate-options": ", ".join(gate.options) if gate else "",
                  "f-max-rounds": "" if unit.max_rounds is None else str(unit.max_rounds)}
        deps = [(d.unit, d.edge.value) for d in unit.depends_on]
        # What the form showed when the unit was loaded: a field left as shown keeps the
        # unit's (or gate's) value exactly, so a save changes only what was edited.
        self.base_gates = [g.model_copy(deep=True) for g in self.plan.gates]
        self.base_unit = unit.model_copy(deep=True)
        self.loaded = {**values, "f-kind": unit.kind.value, "f-required": unit.required_final,
                       "deps": deps}
        with self.prevent(Input.Changed, Select.Changed, Tick.Changed):
            for field_id, value in values.items():
                self.query_one(f"#{field_id}", Input).value = value
            self.query_one("#f-kind", Select).value = unit.kind.value
            self.query_one("#f-required", Tick).value = unit.required_final
            box = self.query_one("#f-deps", Vertical)
            await box.remove_children()
            await box.mount_all([DependencyRow(u, e) for u, e in deps])
        held = f" · gate {gate.id}" if gate else ""
        self.query_one("#unit-form").border_title = f"Unit {unit.id} · {unit.kind.value}{held}"

    def _text(self, field_id: str) -> str:
        return self.query_one(f"#{field_id}", Input).value.strip()

    def _list(self, field_id: str) -> list[str]:
        return [p.strip() for p in self._text(field_id).split(",") if p.strip()]

    def _edited(self, field_id: str) -> bool:
        return self._text(field_id) != self.loaded.get(field_id, "").strip()

    def apply_form(self) -> None:
        """Form -> the selected unit (and its gate) in the in-memory plan, then validate.

        Only the fields whose text differs from what was loaded are written back; the rest
        keep the unit's own values (a list written with commas inside an item, the long form
        of an input, a gate's ``also`` and ``binds`` all survive an edit of another field)."""
        if self.index is None or self.index >= len(self.plan.units):
            return
        old = self.plan.units[self.index]
        # From the unit as it was loaded, so the form's current text decides.
        data = (self.base_unit or old).model_dump(mode="json")
        for field_id, key in (("f-id", "id"), ("f-title", "title"), ("f-phase", "phase")):
            if self._edited(field_id):
                data[key] = self._text(field_id)
        if self._edited("f-inputs"):
            data["inputs"] = self._list("f-inputs")
            data["input_edges"] = {r: e for r, e in data["input_edges"].items()
                                   if r in data["inputs"]}
        if self._edited("f-outputs"):
            data["outputs"] = self._list("f-outputs")
        if self._edited("f-max-rounds"):
            data["max_rounds"] = self._text("f-max-rounds") or None
        kind = self.query_one("#f-kind", Select).value
        if kind != self.loaded.get("f-kind"):
            data["kind"] = kind
        required = self.query_one("#f-required", Tick).value
        if required != self.loaded.get("f-required"):
            data["required_final"] = required
        rows = [(v["unit"], v["edge"]) for row in self.query(DependencyRow) if (v := row.value())]
        if rows != self.loaded.get("deps"):
            data["depends_on"] = [{"unit": u, "edge": e} for u, e in rows]
        field_problems = []
        try:
            unit = Unit.model_validate(data)
        except ValidationError as exc:
            field_problems = [f"unit {data['id'] or '?'}: field {'.'.join(map(str, e['loc']))}: "
                              f"{e['msg']}" for e in exc.errors()]
            unit = None
        if unit is not None:
            self.plan.units[self.index] = unit
            self._apply_gate(unit.id)
            self.dirty = self._changes() != []
            if (old.id, old.title, old.phase) != (unit.id, unit.title, unit.phase):
                self.rebuild_tree()
                self.call_after_refresh(self._recursor)
        self.validate(field_problems)

    def _recursor(self) -> None:
        node = self._node(self.index) if self.index is not None else None
        if node is not None:
            self.query_one(Tree).move_cursor(node)

    def _apply_gate(self, new_id: str) -> None:
        """The gate that holds the unit follows the form: a renamed unit is renamed where the
        gate names it (``unit`` or ``also``); an edited question or options change only those;
        a cleared question takes only this unit out of the gate (the gate itself goes when it
        holds nothing else); a question on an ungated unit makes a new gate for it alone."""
        # From the gates as they were when the unit was loaded, so the form's current text
        # decides (a question emptied on the way to a new one leaves no trace).
        self.plan.gates = [g.model_copy(deep=True) for g in self.base_gates]
        gate = self.plan.gate_for(self.loaded["f-id"])
        if gate is not None and self.loaded["f-id"] != new_id:
            was = self.loaded["f-id"]
            gate.unit = new_id if gate.unit == was else gate.unit
            gate.also = [new_id if u == was else u for u in gate.also]
        question = self._text("f-gate")
        if not self._edited("f-gate") and not self._edited("f-gate-options"):
            return
        if not question:
            if gate is None:
                return
            others = [u for u in gate.held_units() if u != new_id]
            if not others:
                self.plan.gates.remove(gate)
            else:
                gate.unit, gate.also = others[0], others[1:]
            return
        if gate is None:
            gate = Gate(id=_slug(f"{new_id}-gate"), unit=new_id, question=question)
            self.plan.gates.append(gate)
        if self._edited("f-gate"):
            gate.question = question
        if self._edited("f-gate-options"):
            gate.options = self._list("f-gate-options")

    def _changes(self) -> list[str]:
        """What saving would change in plan.toml, key by key, against the saved plan."""
        return plan_changes(self.app.project.files.plan, self.plan)

    def validate(self, extra: list[str] | None = None) -> list[str]:
        files = self.app.project.files
        sources = {s.id: s.approved for s in files.sources.sources}
        groups = {s.group for s in files.sources.sources if s.approved and s.group}
        self.problems = list(extra or []) + validate_plan(
            self.plan, sources=sources, groups=groups,
            contract_fields=set(files.contract.fields) | {"body"})
        text = "\n".join(f"✗ {p}" for p in self.problems) or \
            f"✓ the plan validates ({len(self.plan.units)} units, {len(self.plan.gates)} gates)"
        self.query_one("#problems", Static).update(text)
        box = self.query_one("#problems-box")
        box.border_title = f"Validation · {len(self.problems)} problem(s)" if self.problems \
            else "Validation · ok"
        box.set_class(bool(self.problems), "has-problems")
        return self.problems

    @on(Input.Changed, "#unit-form Input")
    @on(Select.Changed, "#unit-form Select")
    @on(Tick.Changed, "#f-required")
    def _form_changed(self) -> None:
        self.apply_form()

    # -- structure ---------------------------------------------------------------------------
    def action_add_unit(self) -> None:
        current = self.plan.units[self.index] if self.index is not None and self.plan.units \
            else None
        numbers = [int(m.group(1)) for u in self.plan.units if (m := re.fullmatch(r"U(\d+)", u.id))]
        new_id = f"U{max(numbers, default=0) + 1:02d}"
        # The kind and (but for a render, whose document name must be unique) the params of
        # the highlighted unit, so that the new unit starts out valid.
        params = dict(current.params) if current and current.kind != UnitKind.render else {}
        unit = Unit(id=new_id, title="New unit", phase=current.phase if current else "new",
                    kind=current.kind if current else UnitKind.synthesize, params=params)
        last = max((i for i, u in enumerate(self.plan.units) if u.phase == unit.phase),
                   default=len(self.plan.units) - 1)
        self.plan.units.insert(last + 1, unit)
        self.dirty = True
        self.rebuild_tree()
        self.call_after_refresh(self.select_unit, new_id)
        self.validate()
        self.notify(f"added {new_id}: edit its fields, then ctrl+s to save")

    def action_remove_unit(self) -> None:
        """Ask first, naming what depends on the unit; only then remove it (in memory)."""
        if self.index is None or not self.plan.units:
            return
        unit = self.plan.units[self.index]
        users = [u.id for u in self.plan.units if any(d.unit == unit.id for d in u.depends_on)]
        gate = self.plan.gate_for(unit.id)
        lines = [f"{unit.id} {unit.title} ({unit.kind.value}, phase {unit.phase})", "",
                 f"Depends on it: {', '.join(users) or 'nothing'}"
                 + (" — they will not validate until you edit them" if users else ""),
                 _gate_fate(gate, unit.id),
                 "", "The edit stays in memory until ctrl+s saves plan.toml."]

        def decided(yes: bool | None) -> None:
            if yes:
                self._remove(unit.id)
            else:
                self.notify(f"{unit.id} kept")

        self.app.push_screen(ConfirmModal(f"Remove unit {unit.id}?", lines, yes="Remove it"),
                             decided)

    def _remove(self, unit_id: str) -> None:
        index = next((i for i, u in enumerate(self.plan.units) if u.id == unit_id), None)
        if index is None:
            return
        unit = self.plan.units.pop(index)
        gate = self.plan.gate_for(unit.id)
        if gate is not None:  # the gate goes only when it held nothing else
            others = [u for u in gate.held_units() if u != unit.id]
            if others:
                gate.unit, gate.also = others[0], others[1:]
            else:
                self.plan.gates.remove(gate)
        self.dirty = True
        self.index = None
        self.rebuild_tree()
        if self.plan.units:
            self.call_after_refresh(self.select_unit, self.plan.units[0].id)
        self.validate()
        self.notify(f"removed {unit.id} (units that depended on it are flagged below)")

    @on(Button.Pressed, "#add-dep")
    def action_add_dependency(self) -> None:
        if self.index is None:
            return
        row = DependencyRow()
        self.query_one("#f-deps", Vertical).mount(row)
        self.call_after_refresh(lambda: row.query_one(Input).focus())

    @on(Button.Pressed, ".dep-remove")
    def _remove_dependency(self, event: Button.Pressed) -> None:
        row = next((a for a in event.button.ancestors if isinstance(a, DependencyRow)), None)
        if row is not None:
            row.remove()
            self.call_after_refresh(self.apply_form)

    # -- save --------------------------------------------------------------------------------
    def action_save(self) -> None:
        if self.problems:
            self.app.show_error(f"plan.toml was not saved: {len(self.problems)} problem(s) "
                                "remain (listed under the form)", title="Not saved",
                                hint="fix them, then ctrl+s again")
            return
        changes = self._changes()
        if not changes:
            self.dirty = False
            self.notify("nothing to save: the plan is the same as plan.toml")
            return
        run = self.app.active_run
        if run is None:
            if self._write():
                self.notify("saved plan.toml (no run yet: nothing to invalidate)")
            return
        # The impact first, computed from the edited plan in memory: nothing is written
        # unless the person says save.
        plan = self.plan
        preview = self.app.guarded("Could not preview the change",
                                   lambda: run.preview_plan(plan))
        if preview is None:
            return

        def decided(save: bool | None) -> None:
            if not save:
                self.notify("not saved: plan.toml is unchanged (the edits are still here)")
                return
            if self._write():
                self.notify("saved plan.toml: the next resume commits the plan change")

        self.app.push_screen(ConfirmModal("Save plan.toml? · what this change invalidates",
                                          ["plan.toml changes:", *changes, "",
                                           *preview_lines(preview)], yes="Save",
                                          no="Keep editing"), decided)

    def _write(self) -> bool:
        """Write the edited plan to plan.toml; on any failure the file is put back."""
        path = self.app.project.root / PLAN_FILE
        before = path.read_bytes()
        try:
            save_plan(path, self.plan)
            self.app.project.reload()
        except Exception as exc:  # the file stays as it was
            path.write_bytes(before)
            self.app.show_error(exc, title="plan.toml was not saved")
            return False
        self.dirty = False
        return True

    def action_raw(self) -> None:
        """plan.toml as text; after a save there, the form shows the file's plan again."""
        from keepstep.app.tui.screens.raw_plan import RawPlanScreen

        if self.dirty:
            self.app.show_error("save or discard the form's edits first (ctrl+s saves)",
                                title="Unsaved edits", hint="the raw view edits the file")
            return

        def back(saved: bool | None) -> None:
            if saved and self.app.guarded("plan.toml was saved but does not load",
                                          self.app.project.reload) is not None:
                self.plan = self.app.project.files.plan.model_copy(deep=True)
                self.index = None
                self.rebuild_tree()
                if self.plan.units:
                    self.call_after_refresh(self.select_unit, self.plan.units[0].id)
                self.validate()

        self.app.push_screen(RawPlanScreen(self.app.project.root / PLAN_FILE), back)

    def action_back(self) -> None:
        """Leave; with unsaved edits, ask first (plan.toml is untouched either way)."""
        if not self.dirty:
            self.app.pop_screen()
            return

        def decided(yes: bool | None) -> None:
            if yes:
                self.app.pop_screen()
                self.app.notify("unsaved plan edits discarded; plan.toml is unchanged")

        self.app.push_screen(ConfirmModal(
            "Discard your plan edits?",
            ["The edits on this page are not saved: plan.toml is unchanged.",
             "Yes discards them; No goes back to the form (ctrl+s saves)."],
            yes="Discard them", no="Keep editing"), decided)


def _field(field_id: str, label: str) -> ComposeResult:
    yield Horizontal(Label(label, classes="field-label"), Input(compact=True, id=field_id),
                     classes="field")


def _gate_fate(gate: Gate | None, unit_id: str) -> str:
    if gate is None:
        return "It has no gate"
    others = [u for u in gate.held_units() if u != unit_id]
    if others:
        return f"Gate {gate.id!r} keeps holding {', '.join(others)}"
    return f"Its gate {gate.id!r} goes too"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


__all__ = ["DependencyRow", "PlanBuilderScreen"]
