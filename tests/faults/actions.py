"""What the harness does between worker processes: injections, a person's decisions, and
intermediate assertions. ``Do("name", *args)`` in a case calls ``do_name(*args)`` here.

Project files are edited with the engine's own loaders; the database is only touched directly
to simulate damage (a broken hash, a foreign schema version). A ``CaseRun`` (faults/harness.py)
provides ``root``, ``case``, ``project()``, ``named``, ``webhook``, ``finish()`` and
``observed_state()``.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from keepstep.engine.files.project import load_contract, write_contract
from keepstep.storage import SCHEMA_VERSION
from keepstep.storage.hashing import file_sha256

from .checks import CaseFailed, expect
from .steps import RUN, Case

if TYPE_CHECKING:
    from .harness import WorkerRun
    from .zygote import Zygote


def _writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


@contextmanager
def raw_db(root: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection, the way damage or a foreign keepstep would touch the file."""
    conn = sqlite3.connect(root / ".keepstep" / "state.db", isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


@dataclass
class Snapshot:
    calls: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    head: int = 0
    used: dict[str, float] = field(default_factory=dict)
    posts: int = 0
    db_sha: str = ""


class Actions:
    """The ``do_*`` actions of a case run (a mixin of faults.harness.CaseRun)."""

    case: Case
    root: Path
    snap: Snapshot
    webhook: Any
    zygote: Zygote
    named: dict[str, WorkerRun]

    def _wait_marker(self, run: WorkerRun, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not (run.marker and run.marker.exists()):
            expect(self.zygote.poll(run.pid) is None,
                   f"{self.case.id}: worker {run.n} ended before reaching its hook:\n"
                   f"{run.stderr[-2000:]}")
            expect(time.monotonic() < deadline, f"{self.case.id}: no marker from worker {run.n}")
            time.sleep(0.01)

    def _wait_stopped(self, run: WorkerRun) -> None:
        self._wait_marker(run)
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{run.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            expect(time.monotonic() < deadline, f"worker {run.n} did not stop")
            time.sleep(0.01)

    def snapshot(self) -> Snapshot:
        with self.project() as p:
            store = p.store
            attempts = Counter(a.unit for a in store.attempts(RUN))
            snap = Snapshot(calls=len(store.calls(RUN)), attempts=dict(attempts),
                            head=store.get_head(RUN).version,
                            used=dict(store.get_budget(RUN).used))
        snap.posts = self.webhook.posts if self.webhook is not None else 0
        return snap

    # background workers
    def do_kill_when_marked(self, worker: str) -> None:
        run = self.named[worker]
        self._wait_marker(run)
        os.kill(run.pid, signal.SIGKILL)
        self.finish(run)

    def do_wait_stopped(self, worker: str) -> None:
        self._wait_stopped(self.named[worker])

    def do_wake(self, worker: str) -> None:
        os.kill(self.named[worker].pid, signal.SIGCONT)

    def do_join(self, worker: str) -> None:
        self.finish(self.named[worker])

    def do_wait_lease_expiry(self) -> None:
        with self.project() as p:
            leases = p.store.leases(RUN)
        expect(bool(leases), f"{self.case.id}: no lease to wait for")
        time.sleep(max(0.0, max(le.expires_at for le in leases) - time.time()) + 0.1)

    def do_sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    # artifacts and files
    def _output(self, unit: str, name: str) -> Path:
        with self.project() as p:
            rec = p.get_run(RUN).facts_records()[unit]
            return p.store.artifacts.root / rec.outputs[name].path

    def do_delete_artifact(self, unit: str, name: str) -> None:
        self._output(unit, name).unlink()

    def do_flip_byte(self, unit: str, name: str) -> None:
        path = self._output(unit, name)
        _writable(path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x20
        path.write_bytes(bytes(data))

    def do_plant_orphan(self, unit: str, attempt: str) -> None:
        d = self.root / ".keepstep" / "artifacts" / RUN / unit / attempt
        d.mkdir(parents=True)
        (d / "evidence.json").write_text('{"evidence": [], "planted": "stray attempt folder"}\n')

    def do_plant_partial(self, unit: str) -> None:
        """A torn write: truncated temporary files in the unit's uncommitted attempt."""
        with self.project() as p:
            attempt = [a for a in p.store.attempts(RUN, unit) if a.status != "committed"][-1]
            d = p.store.artifacts.attempt_dir(RUN, attempt.attempt_id)
        (d / "calls").mkdir(parents=True, exist_ok=True)
        (d / "evidence.json.tmp").write_bytes(b'{"evidence": [{"id": "C1-e1", "quo')
        (d / "calls" / "r1-002.json.tmp").write_bytes(b'{"content": "{\\"evid')

    def do_edit_source(self, sid: str) -> None:
        path = next((self.root / "sources").glob(f"{sid}-*.md"))
        path.write_text(path.read_text() + "\nA 2025 survey found that 41 percent of "
                        "households would pay 3 euros a month for leak alerts.\n")

    def do_revoke_source(self, sid: str) -> None:
        data = tomllib.loads((self.root / "sources.toml").read_text())
        for s in data["source"]:
            if s["id"] == sid:
                s["approved"] = False
        (self.root / "sources.toml").write_text(tomli_w.dumps(data))

    def do_add_source(self, sid: str, group: str) -> None:
        rel = f"sources/{sid}-tender-results.md"
        (self.root / rel).write_text(
            "# Tender results 2025\n\nIn 2025 utilities awarded 7 meter tenders worth 48 "
            "million euros in total.\n\nThe largest tender covered 120000 connections.\n")
        data = tomllib.loads((self.root / "sources.toml").read_text())
        data["source"].append({"id": sid, "path": rel, "group": group, "approved": True,
                               "title": "Tender results 2025", "kind": "market report"})
        (self.root / "sources.toml").write_text(tomli_w.dumps(data))

    def do_set_contract(self, key: str, value: str) -> None:
        contract = load_contract(self.root)
        contract.fields[key] = value
        write_contract(self.root, contract)

    def do_edit_template(self, name: str) -> None:
        """A typo fixed in a heading: heading wording is the one edit of a template's words
        that stays a presentation change (a sentence added or changed in its fixed text is
        a template change, core.templates.layout_hash)."""
        path = self.root / "templates" / f"{name}.md"
        text = path.read_text()
        old, new = "\n## About the model\n", "\n## About the models\n"
        expect(old in text, f"templates/{name}.md has no heading {old.strip()!r} to edit")
        path.write_text(text.replace(old, new, 1))

    def do_record_output_change(self, unit: str, edge: str) -> None:
        """A person records that ``unit``'s committed output changed in one aspect (content:
        its claims; presentation: only its format). The engine computes this kind of change
        (``unit_output_changed`` + ``invalidate``) but has no command that records one, so
        the harness commits it as recovery commits a repair: invalidated records, one
        checkpoint, a ``decision.repair`` event."""
        from keepstep.engine.core.changes import unit_output_changed
        from keepstep.engine.core.invalidation import invalidate
        from keepstep.engine.core.plan import EdgeType
        from keepstep.engine.core.state import UnitState, unit_key
        from keepstep.storage import EventIn

        with self.project() as p:
            run = p.get_run(RUN)
            change = unit_output_changed(unit, EdgeType(edge), f"{unit}'s output changed "
                                         f"({edge})")
            records = run.facts_records()
            result = invalidate(run.plan, [change], records)
            delta: dict[str, Any] = {}
            for uid, exps in result.affected.items():
                rec = records[uid].model_copy(update={"state": UnitState.invalidated,
                                                      "explanations": exps})
                delta[unit_key(uid)] = rec.model_dump(mode="json")
            delta["budget"] = p.store.get_budget(RUN).used
            p.store.commit_checkpoint(
                RUN, "main", p.store.get_head(RUN).version, delta, kind="repair",
                current=dict.fromkeys(result.affected),
                events=[EventIn(kind="decision.repair", payload={
                    "changes": [change.model_dump(mode="json")],
                    "invalidated": sorted(result.affected), "who": "fault suite"})])

    # the database
    def do_break_parent_hash(self) -> None:
        with raw_db(self.root) as conn:
            head = conn.execute("SELECT head_version FROM branches WHERE run_id = ?",
                                [RUN]).fetchone()[0]
            conn.execute("UPDATE checkpoints SET parent_hash = ? WHERE run_id = ? AND "
                         "version = ?", ["0" * 64, RUN, head])

    def do_stamp_newer_schema(self) -> None:
        with raw_db(self.root) as conn:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        self.snap.db_sha = file_sha256(str(self.root / ".keepstep" / "state.db"))

    def do_downgrade_schema(self) -> None:
        """What a keepstep of schema 1 left behind: no approvals, no side-effect ledger."""
        with raw_db(self.root) as conn:
            conn.execute("DROP TABLE approvals")
            conn.execute("DROP TABLE side_effects")
            conn.execute("DELETE FROM _sqlite_migrations WHERE name = "
                         "'m002_approvals_effects'")
            conn.execute("PRAGMA user_version = 1")

    # what a person does
    def do_retry(self, unit: str) -> None:
        with self.project() as p:
            p.get_run(RUN).retry(unit, who="fault suite", max_units=0)

    def do_raise_budget(self, counter: str, value: float) -> None:
        with self.project() as p:
            p.get_run(RUN).raise_budget(reason="the client approved more work", who="fault suite",
                                    **{counter: value})

    def do_refused_raise(self, counter: str, value: float, reason: str, fragment: str) -> None:
        from keepstep.engine.errors import BudgetDecisionError

        before = self.snapshot()
        with self.project() as p:
            try:
                p.get_run(RUN).raise_budget(reason=reason, who="fault suite", **{counter: value})
            except BudgetDecisionError as exc:
                expect(fragment in str(exc), f"refusal says {exc!s}, not {fragment!r}")
            else:
                raise CaseFailed(f"raising {counter} to {value} with reason {reason!r} was "
                                 "accepted")
            limits = p.store.get_budget(RUN).limits
        expect(self.snapshot().used == before.used, "a refused raise changed the counters")
        expect(limits.get(counter) != value, "a refused raise changed the limit")

    def do_revoke_approval(self) -> None:
        from keepstep.engine.run.gates import revoke_choice

        with self.project() as p:
            run = p.get_run(RUN)
            revoke_choice(run, run.plan.gates[0], who="fault suite",
                          reason="the client wants to confirm the audience again")

    def do_webhook_down(self) -> None:
        self.webhook.stop()

    def do_webhook_up(self) -> None:
        self.webhook.start()

    def do_decide_effect(self, decision: str) -> None:
        from keepstep.engine.run.adapters import WebhookAdapter
        from keepstep.engine.run.effects import decide_unknown

        with self.project() as p:
            (row,) = p.store.effects(RUN, ("intent", "unknown"))
            decide_unknown(p.store, WebhookAdapter(self.webhook.url, timeout=2.0),
                           row.idem_key, decision=decision, who="fault suite")

    # intermediate assertions
    def do_snapshot(self) -> None:
        self.snap = self.snapshot()

    def do_expect(self, state: str) -> None:
        got = self.observed_state()
        expect(got == state, f"{self.case.id} after {self.last.n} worker(s): state {got}, "
               f"expected {state}")

    def do_expect_no_new_calls(self) -> None:
        now = self.snapshot()
        expect(now.calls == self.snap.calls, f"{now.calls - self.snap.calls} model call(s) "
               "were made while the run was blocked")
        expect(now.posts == self.snap.posts, "the webhook was called while the outcome was "
               "unknown")

    def do_expect_not_run(self, unit: str) -> None:
        now = self.snapshot()
        expect(now.attempts.get(unit, 0) == self.snap.attempts.get(unit, 0),
               f"{unit} was attempted although its gate had no applying approval")

