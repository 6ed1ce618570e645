"""Sources: every source in sources.toml with its type, group, approval, sha256 prefix and
how it stands against the run's input snapshot; approve / revoke / add writes sources.toml
(add goes through engine.sources.add_source, as the CLI's `sources add` does).

Approving converts the file first (it must yield text, as `keepstep sources approve`
checks): in a worker thread, so a 50 MB PDF never freezes the screen; the row says
"checking…" meanwhile, and a refusal opens the error modal with what to do.

A source that differs from the snapshot is flagged ⚑ with the units it would invalidate
(from Run.preview(), a dry run: nothing is committed until the next resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from keepstep.app.tui.format import ids, preview_lines
from keepstep.app.tui.screens.add_source import AddSourceModal
from keepstep.app.tui.screens.confirm import ConfirmModal
from keepstep.engine import KeepstepError
from keepstep.engine.sources import (
    detect_format,
    file_sha256,
    inspect_file,
    load_sources,
    save_sources,
)

if TYPE_CHECKING:
    from keepstep.app.tui.app import KeepstepApp
    from keepstep.engine.sources import SourceEntry

COLUMNS = ("", "id", "type", "group", "approved", "sha256", "snapshot", "title")


class SourcesScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back"),
        Binding("space", "toggle_approved", "approve/revoke"),
        Binding("a", "approve", "approve"),
        Binding("d", "revoke", "revoke (asks)"),
        Binding("ctrl+n", "add", "new source"),
    ]

    app: KeepstepApp

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, SourceEntry] = {}
        self.hashes: dict[str, str | None] = {}
        self.flags: dict[str, str] = {}
        self.preview: Any = None
        self.preview_note = ""
        self.checking: set[str] = set()  # sources being converted before their approval

    def compose(self) -> ComposeResult:
        yield Static(id="sources-title", classes="screen-title", markup=False)
        yield DataTable(id="sources-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="source-detail-box", classes="panel") as box:
            box.border_title = "Selected source · what a change would invalidate"
            yield Static(id="source-detail", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.reload()
        self.query_one(DataTable).focus()

    # -- facts -------------------------------------------------------------------------------
    def _snapshot(self) -> tuple[str, dict[str, str]]:
        run = self.app.active_run
        if run is None:
            return "", {}
        status = self.app.dashboard.status
        label = status.input_version if status is not None else "the run's snapshot"
        return label, dict(run.snapshot.sources)

    def _compute_preview(self) -> None:
        self.preview, self.preview_note = None, ""
        run = self.app.active_run
        if run is None:
            self.preview_note = f"run {self.app.run_id} has not started: no snapshot to compare"
        elif self.app.dashboard.running:
            self.preview_note = "a run is in progress: the preview waits until it stops"
        else:
            try:
                self.preview = run.preview()
            except KeepstepError as exc:
                self.preview_note = f"no preview: {exc}"

    def _affected(self, source: SourceEntry) -> list[str]:
        if self.preview is None:
            return []
        origins = {f"source:{source.id}", f"group:{source.group}"}
        return sorted(uid for uid, exps in self.preview.invalidated.items()
                      if any(e.origin in origins for e in exps))

    def reload(self, select: str | None = None) -> None:
        root = self.app.project.root
        sources = self.app.guarded("Could not read sources.toml", load_sources, root)
        if sources is None:
            return
        self.entries = {s.id: s for s in sources.sources}
        label, snap = self._snapshot()
        self._compute_preview()
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        self.flags = {}
        for s in sources.sources:
            path = root / s.path
            sha = file_sha256(str(path)) if path.is_file() else None
            self.hashes[s.id] = sha
            state, changed = _against(s.approved, sha, snap.get(s.id), label)
            self.flags[s.id] = state
            approved = "checking…" if s.id in self.checking else "yes" if s.approved else "no"
            table.add_row("⚑" if changed else "", s.id, _type_of(path), s.group, approved,
                          sha[:12] if sha else "(missing)", state, s.title or s.path, key=s.id)
        if select is not None and select in self.entries:
            table.move_cursor(row=table.get_row_index(select))
        elif sources.sources:
            table.move_cursor(row=min(max(row, 0), len(sources.sources) - 1))
        n_approved = sum(1 for s in sources.sources if s.approved)
        where = f" · run {self.app.run_id} at {label}" if label else ""
        self.query_one("#sources-title", Static).update(
            f"Sources · {len(sources.sources)} in sources.toml, {n_approved} approved{where}")
        self._show_detail()

    # -- detail ------------------------------------------------------------------------------
    def _current(self) -> SourceEntry | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self.entries.get(str(key))

    @on(DataTable.RowHighlighted)
    def _show_detail(self) -> None:
        source = self._current()
        lines = []
        if source is not None:
            sha = self.hashes.get(source.id)
            lines.append(f"{source.id} · {source.title or '(no title)'} · {source.kind or 'source'}"
                         f" · group {source.group or '-'}")
            lines.append(f"{source.path} · sha256 {sha[:24] + '…' if sha else '(file missing)'}")
            lines.append(f"{'approved' if source.approved else 'not approved'} · "
                         f"{self.flags.get(source.id, '')}")
            affected = self._affected(source)
            if affected:
                lines.append(f"⚑ would invalidate {len(affected)}: {ids(affected)}")
        lines.append("")
        lines.append(self.preview.summary if self.preview is not None else self.preview_note)
        self.query_one("#source-detail", Static).update("\n".join(lines))

    # -- actions -----------------------------------------------------------------------------
    def _set_approved(self, approved: bool | None) -> None:
        source = self._current()
        if source is None:
            return
        root = self.app.project.root
        sources = load_sources(root)
        entry = next((s for s in sources.sources if s.id == source.id), None)
        if entry is None:
            return
        wanted = (not entry.approved) if approved is None else approved
        if entry.approved == wanted:
            self.notify(f"{entry.id} is already {'approved' if wanted else 'not approved'}")
            return
        if wanted and not (root / entry.path).is_file():
            self.app.show_error(f"source {entry.id}: file {entry.path} is missing",
                                title="Not approved",
                                hint="restore the file (or fix its path in sources.toml)")
            return
        if wanted:
            if entry.id in self.checking:
                self.notify(f"{entry.id} is being checked already")
                return
            self.checking.add(entry.id)
            self.notify(f"checking {entry.path} before approving {entry.id}…")
            self.reload(select=entry.id)
            self._check_then_approve(entry.id, root / entry.path)
            return
        # Revoking is destructive: show what the next resume would invalidate, then ask.
        lines = [f"{entry.id} · {entry.title or entry.path} · group {entry.group or '-'}", ""]
        run = self.app.active_run
        if run is None:
            lines.append(f"run {self.app.run_id} has not started: nothing to invalidate yet")
        elif self.app.dashboard.running:
            lines.append("a run is in progress: its impact is computed when it stops")
        else:
            impact = self.app.guarded("Could not preview the revocation", run.preview_sources,
                                      {entry.id: False})
            if impact is None:
                return
            lines += preview_lines(impact, limit=12)
        lines += ["", "sources.toml is written only if you say yes."]

        def decided(yes: bool | None) -> None:
            if yes:
                self._write(entry.id, False)
            else:
                self.notify(f"{entry.id} stays approved: nothing was written")

        self.app.push_screen(ConfirmModal(f"Revoke source {entry.id}?", lines,
                                          yes="Revoke it"), decided)

    @work(thread=True, exit_on_error=False, group="approve")
    def _check_then_approve(self, source_id: str, path: Path) -> None:
        """Thread: the file must convert to text (as `keepstep sources approve` checks): a
        scanned PDF, an encrypted or over-limit file is refused, naming what to do."""
        try:
            inspect_file(self.app.project.root, path)
        except Exception as exc:  # engine refusals and file-system errors alike
            self.app.call_from_thread(self._checked, source_id, exc)
        else:
            self.app.call_from_thread(self._checked, source_id, None)

    def _checked(self, source_id: str, error: Exception | None) -> None:
        self.checking.discard(source_id)
        if error is not None:
            self.app.show_error(error, title=f"{source_id} was not approved")
            self.reload(select=source_id)
            return
        self._write(source_id, True)

    def _write(self, source_id: str, approved: bool) -> None:
        root = self.app.project.root
        sources = load_sources(root)
        entry = next(s for s in sources.sources if s.id == source_id)
        entry.approved = approved
        self.app.guarded("sources.toml was not saved", save_sources, root, sources)
        self.notify(f"source {entry.id} {'approved' if approved else 'revoked'} "
                    "(sources.toml updated; a run takes it in on its next resume)")
        self.reload()

    def action_toggle_approved(self) -> None:
        self._set_approved(None)

    def action_approve(self) -> None:
        self._set_approved(True)

    def action_revoke(self) -> None:
        self._set_approved(False)

    def action_add(self) -> None:
        self.app.push_screen(AddSourceModal(self.app.project.root), self._added)

    def _added(self, entry: SourceEntry | None) -> None:
        if entry is None:
            return
        state = "approved" if entry.approved else "not approved yet: a approves it"
        self.notify(f"source {entry.id} added ({entry.path}, {state})")
        self.reload(select=entry.id)


def _type_of(path: Path) -> str:
    """The detected format (from the file's first bytes and name), as the table shows it."""
    if not path.is_file():
        return "-"
    try:
        return detect_format(path).upper()
    except KeepstepError:
        return "refused"  # empty, encrypted or unsupported: approving says why


def _against(approved: bool, sha: str | None, taken: str | None, label: str) -> tuple[str, bool]:
    """(how a source stands against the run's snapshot, whether that is a change)."""
    if not label:
        return ("approved" if approved else "-"), False
    if approved and taken is None:
        return f"new (not in {label})", True
    if not approved and taken is not None:
        return f"revoked (in {label})", True
    if not approved:
        return "-", False
    if sha is None:
        return f"file missing (in {label})", True
    if sha != taken:
        return f"changed since {label}", True
    return label, False


__all__ = ["SourcesScreen"]
