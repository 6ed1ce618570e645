"""One unit through the commit protocol (DESIGN §5).

claim -> execute (model calls via the gateway) -> stage -> verify -> commit.
A heartbeat thread renews the lease; losing it (a stale token) stops the
attempt at its next safe point and leaves its files as an orphan.
"""

from __future__ import annotations

import json
import mimetypes
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.inputs import InputSnapshot, SourceEntry
from keepstep.engine.core.plan import Plan, Unit
from keepstep.engine.core.state import OutputRef, UnitRecord, UnitState
from keepstep.engine.core.timefmt import iso_utc
from keepstep.engine.errors import (
    AuthError,
    BudgetExhausted,
    InvalidOutput,
    KeepstepError,
    LeaseLost,
    ModelError,
    QuotaExhausted,
    ReplayMiss,
    RunCancelled,
    UnitTimedOut,
)
from keepstep.engine.files.project import ProjectFiles
from keepstep.engine.kinds.context import KindOutcome
from keepstep.storage import (
    ArtifactEntry,
    Claim,
    StaleFencingToken,
    Store,
    crash_point,
)
from keepstep.storage.hashing import canonical_json, file_sha256, sha256_hex

if TYPE_CHECKING:
    from keepstep.engine.run.adapters import EffectAdapter
    from keepstep.engine.run.effects import EffectOutcome

PRODUCER_VERSION = "keepstep-0.1.0"


class AttemptResult:
    """What happened to one attempt (returned to the run loop)."""

    def __init__(self, unit: str, attempt_id: str, outcome: str, detail: str = "",
                 version: int | None = None) -> None:
        self.unit = unit
        self.attempt_id = attempt_id
        self.outcome = outcome  # committed | blocked | failed | retry | orphaned | cancelled
        self.detail = detail
        self.version = version

    def __repr__(self) -> str:
        return f"AttemptResult({self.attempt_id}, {self.outcome}, {self.detail!r})"


def input_fingerprints(unit: Unit, files: ProjectFiles, snapshot: InputSnapshot,
                       templates: dict[str, str], versions: dict[str, str]) -> dict[str, str]:
    """The hash each of the unit's typed inputs had when it ran."""
    fields = files.contract.field_hashes()
    out = {}
    for ref in unit.inputs:
        kind, _, name = ref.partition(":")
        if kind == "source":
            out[ref] = snapshot.sources.get(name, "")
        elif kind == "group":
            members = sorted((s, h) for s, h in snapshot.sources.items()
                             if snapshot.groups.get(s) == name)
            out[ref] = sha256_hex(canonical_json(members))
        elif kind == "contract":
            out[ref] = fields.get(name, "")
        elif kind == "template":
            out[ref] = templates.get(name, "")
        elif kind == "policy":
            out[ref] = versions.get(name, "")
    return out


class AttemptContext:
    """The UnitContext of one attempt: what an executing kind may read, call and write."""

    def __init__(
        self,
        *,
        store: Store,
        run_id: str,
        branch_id: str,
        plan: Plan,
        plan_n: int,
        unit: Unit,
        claim: Claim,
        files: ProjectFiles,
        snapshot: InputSnapshot,
        records: dict[str, UnitRecord],
        gateway: Any,
        model: str,
        api_base: str | None,
        replay: dict[str, str] | None,
        cancel: threading.Event | None,
        lease_lost: threading.Event,
        deadline: float,
        clock: Callable[[], float],
        decision_events: Callable[[], list],
        adapters: Mapping[str, EffectAdapter] | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.branch_id = branch_id
        self.plan = plan
        self.plan_n = plan_n
        self.unit = unit
        self.claim = claim
        self.attempt_id = claim.attempt_id
        self.files = files
        self.contract = files.contract
        self.snapshot = snapshot
        self.records = records
        self.gateway = gateway
        self.model = model
        self.api_base = api_base
        self.replay = replay
        self.cancel = cancel
        self.lease_lost = lease_lost
        self.deadline = deadline
        self.clock = clock
        self._decision_events = decision_events
        self.adapters = dict(adapters or {})
        self.staged: list[ArtifactEntry] = []
        self.progress = "claimed"
        self._call_seq = 0
        self.model_calls = 0

    # -- reading ---------------------------------------------------------------
    def sources_for_unit(self) -> list[SourceEntry]:
        approved = self.files.approved_sources()
        wanted = set(self.unit.input_refs("source"))
        groups = set(self.unit.input_refs("group"))
        return [s for sid, s in sorted(approved.items())
                if sid in wanted or (s.group and s.group in groups)]

    def source_text(self, source_id: str) -> str:
        return self.files.source_text(source_id)

    def _dep_ref(self, unit_id: str, name: str) -> OutputRef:
        rec = self.records.get(unit_id)
        if rec is None or name not in rec.outputs:
            raise KeepstepError(f"{self.unit.id}: dependency {unit_id} has no current output "
                                f"{name!r}")
        return rec.outputs[name]

    def dep_path(self, unit_id: str, name: str) -> str:
        return self._dep_ref(unit_id, name).path

    def dep_bytes(self, unit_id: str, name: str) -> bytes:
        ref = self._dep_ref(unit_id, name)
        data = (self.store.artifacts.root / ref.path).read_bytes()
        if sha256_hex(data) != ref.sha256:
            raise KeepstepError(
                f"{self.unit.id}: artifact {ref.path} of {unit_id} does not match its hash",
                hint="run `keepstep resume`: recovery invalidates the changed artifact and "
                "redoes it",
            )
        return data

    def dep_json(self, unit_id: str, name: str) -> Any:
        return json.loads(self.dep_bytes(unit_id, name))

    def template_text(self, name: str) -> str:
        path = self.files.root / "templates" / f"{name}.md"
        if not path.is_file():
            raise KeepstepError(f"{self.unit.id}: template {name!r} is missing ({path})",
                                hint="add the template file or fix the unit's template input")
        return path.read_text(encoding="utf-8")

    def decision_events(self) -> list:
        return self._decision_events()

    # -- control ---------------------------------------------------------------
    def safe_point(self, progress: str | None = None) -> None:
        if progress is not None:
            self.progress = progress
        if self.lease_lost.is_set():
            raise LeaseLost(f"{self.attempt_id}: lease was taken over")
        if self.cancel is not None and self.cancel.is_set():
            raise RunCancelled(f"{self.attempt_id}: cancelled")
        if self.clock() > self.deadline:
            raise UnitTimedOut(f"{self.unit.id}: passed its time limit of "
                               f"{self.unit.timeout_minutes:g} minutes")

    # -- external actions ----------------------------------------------------------
    def effect(self, adapter: str, action: str, request: dict[str, Any]) -> EffectOutcome:
        from keepstep.engine.run.effects import perform_effect

        found = self.adapters.get(adapter)
        if found is None:
            configured = ", ".join(sorted(self.adapters)) or "none"
            raise KeepstepError(
                f"{self.unit.id}: no effect adapter named {adapter!r} (configured: {configured})",
                hint=f"add an [adapters.{adapter}] table to keepstep.toml, or name a configured "
                "adapter in the unit's params")
        if self.replay is not None:
            # A replay is a new run id, so the ledger would give it new keys: acting would
            # repeat the source run's external actions.
            raise ReplayMiss(f"{self.unit.id}: replay does not repeat external actions "
                             f"({action!r} via {adapter!r})",
                             hint="the source run's effects are in its ledger (`keepstep effects`)")
        self.safe_point(f"effect {action}")
        return perform_effect(
            self.store, found, run_id=self.run_id, branch_id=self.branch_id, unit=self.unit.id,
            attempt_id=self.attempt_id, action=action, request=request, plan_n=self.plan_n,
            fencing_token=self.claim.fencing_token)

    # -- model calls -------------------------------------------------------------
    def call_model(self, payload: dict[str, Any], *, round: int = 1,
                   expect_json: bool = True) -> dict[str, Any]:
        from keepstep.engine.gateway.client import CallContext, ModelRequest, request_hash

        self.safe_point()
        self._call_seq += 1
        request = ModelRequest(
            model=self.model,
            messages=[{"role": "user", "content": canonical_json(payload)}],
            api_base=self.api_base,
            expect_json=expect_json,
        )
        rhash = request_hash(request)
        if self.replay is not None:
            content = self.replay.get(rhash)
            if content is None:
                raise ReplayMiss(
                    f"{self.unit.id}: no recorded response for request {rhash[:12]} — the plan, "
                    "sources or prompts changed since the recorded run",
                    hint="replay reproduces a run exactly; use resume to run changed units",
                )
        else:
            crash_point("unit.before_call")
            ctx = CallContext(run_id=self.run_id, branch=self.branch_id, unit=self.unit.id,
                              attempt=self.attempt_id, round=round)
            result = self.gateway.complete(ctx, request)
            crash_point("unit.after_call")
            content = result.content
            self.model_calls += 1
        name = f"calls/r{round}-{self._call_seq:03d}.json"
        self.write(name, {"request_hash": rhash, "model": self.model, "round": round,
                          "content": content}, media_type="application/json")
        try:
            return json.loads(content) if expect_json else {"text": content}
        except json.JSONDecodeError as exc:
            raise InvalidOutput(f"{self.unit.id}: model output is not JSON ({exc.msg})") from None

    # -- writing -----------------------------------------------------------------
    def write(self, name: str, data: bytes | str | dict | list, *, media_type: str | None = None,
              source_ids: list[str] | None = None) -> str:
        if isinstance(data, (dict, list)):
            blob = (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
            media_type = media_type or "application/json"
        elif isinstance(data, str):
            blob = data.encode("utf-8")
        else:
            blob = data
        media_type = media_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        entry = self.store.artifacts.stage(
            self.run_id, self.attempt_id, name, blob, media_type=media_type,
            producer_version=PRODUCER_VERSION,
            created_at=iso_utc(self.clock()),
            source_ids=source_ids or [],
        )
        self.staged.append(entry)
        return entry.sha256


class Heartbeat(threading.Thread):
    """Renews the lease every ``interval``; sets ``lost`` when the token is stale."""

    def __init__(self, store: Store, claim: Claim, *, interval: float, lease_seconds: float,
                 progress: Callable[[], str], on_event: Callable[[dict], None] | None) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{claim.attempt_id}")
        self.store = store
        self.claim = claim
        self.interval = interval
        self.lease_seconds = lease_seconds
        self.progress = progress
        self.on_event = on_event
        self.lost = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                crash_point("heartbeat.renew")
                self.store.renew_lease(
                    self.claim.run_id, self.claim.branch_id, self.claim.unit,
                    fencing_token=self.claim.fencing_token, lease_seconds=self.lease_seconds,
                    progress=self.progress(),
                )
            except StaleFencingToken:
                self.lost.set()
                return
            except Exception:  # a busy database: try again at the next beat
                continue

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)


def verify_staged(store: Store, entries: list[ArtifactEntry]) -> list[str]:
    """Re-hash staged files against what was written (catches torn or altered files)."""
    problems = []
    for e in entries:
        p = store.artifacts.path_of(e)
        if not p.is_file():
            problems.append(f"{e.path} missing")
        elif file_sha256(str(p)) != e.sha256:
            problems.append(f"{e.path} changed after staging")
    return problems


def build_record(ctx: AttemptContext, outcome: KindOutcome,
                 inputs_fp: dict[str, str]) -> UnitRecord:
    outputs = {e.name: OutputRef(sha256=e.sha256, path=e.path)
               for e in ctx.staged if not e.name.startswith("calls/")}
    consumed = {
        d.unit: {n: o.sha256 for n, o in ctx.records[d.unit].outputs.items()}
        for d in ctx.unit.depends_on if d.unit in ctx.records
    }
    return UnitRecord(
        state=UnitState.succeeded, attempt=ctx.attempt_id, outputs=outputs, consumed=consumed,
        # The plan's unit_fingerprint of this unit, without building the plan's unit map (O(plan)
        # per commit: what made bookkeeping grow with the plan).
        inputs_fp=inputs_fp, unit_fp=sha256_hex(canonical_json(ctx.unit.model_dump(mode="json"))),
        plan_n=ctx.plan_n,
        facts={**outcome.facts, "rounds": outcome.rounds, "model_calls": ctx.model_calls},
        validators_passed=outcome.passed,
    )


def blocked_reason(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, details) for an error that needs a person or a decision."""
    if isinstance(exc, BudgetExhausted):
        return "blocked", "budget: " + str(exc).split(" — ")[0].split(": ", 1)[-1], {
            "kind": "budget", "figures": exc.figures}
    if isinstance(exc, QuotaExhausted):
        return "blocked", "provider quota exhausted", {"kind": "quota"}
    if isinstance(exc, AuthError):
        return "blocked", "model provider authentication failed: " + str(exc).split("\n")[0], {
            "kind": "auth"}
    if isinstance(exc, ModelError):
        return "failed", f"{exc.error_class}: {str(exc).splitlines()[0]}", {"kind": exc.error_class}
    return "failed", str(exc).splitlines()[0], {"kind": "error"}
