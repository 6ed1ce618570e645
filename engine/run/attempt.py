"""One unit through the commit protocol (DESIGN §5).

claim -> execute (model calls via the gateway) -> stage -> verify -> commit.
A heartbeat thread renews the lease; losing it (a stale token) stops the
attempt at its next safe point and leaves its files as an orphan.

Model calls (``AttemptContext.call_model``): every answer is recorded as a hashed attempt
artifact ``calls/r<round>-<n>.json`` with its verdict, and its ledger row points at it. A
retry of the unit reuses an earlier attempt's verified answer to the same request (the
rules are in ``run.call_reuse``) and records the reuse in the ledger (outcome ``reused``,
cost 0); a tampered file is refused, with an event, and the call is paid again.
"""

from __future__ import annotations

import json
import mimetypes
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keepstep.engine.core.changes import prompt_refs
from keepstep.engine.core.inputs import InputSnapshot, SourceEntry, header_fields, split_header
from keepstep.engine.core.plan import Plan, Unit
from keepstep.engine.core.state import OutputRef, UnitRecord, UnitState
from keepstep.engine.core.timefmt import iso_utc
from keepstep.engine.errors import (
    KeepstepError,
    LeaseLost,
    ReplayMiss,
    RunCancelled,
    UnitTimedOut,
)
from keepstep.engine.files.confine import project_file
from keepstep.engine.files.project import ProjectFiles, template_file
from keepstep.engine.gateway.answers import problem, summary
from keepstep.engine.gateway.call_ledger import StoreCallLedger, artifact_ref
from keepstep.engine.gateway.outage import reporting
from keepstep.engine.gateway.prompts import load_prompt
from keepstep.engine.kinds.context import KindOutcome
from keepstep.engine.kinds.model_step import DEFAULT_REVISE_ROUNDS, CheckedAnswer, StepCall
from keepstep.engine.run.baseline import PRODUCER_VERSION
from keepstep.engine.run.call_reuse import ReuseIndex
from keepstep.engine.run.effects import delivery_key, destination_of, perform_effect
from keepstep.engine.run.ending import AttemptOutcome
from keepstep.engine.run.window_check import profile_for
from keepstep.storage import (
    ArtifactEntry,
    Claim,
    Event,
    StaleFencingToken,
    Store,
    crash_point,
)
from keepstep.storage.hashing import canonical_json, file_sha256, sha256_hex

if TYPE_CHECKING:
    from keepstep.engine.run.adapters import EffectAdapter
    from keepstep.engine.run.effects import EffectOutcome


class AttemptResult:
    """What happened to one attempt (returned to the run loop)."""

    def __init__(self, unit: str, attempt_id: str, outcome: AttemptOutcome, detail: str = "",
                 version: int | None = None) -> None:
        self.unit = unit
        self.attempt_id = attempt_id
        self.outcome = outcome
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
        elif kind == "data":
            out[ref] = templates.get(ref, "")

    for ref in prompt_refs(unit):
        # The prompt's hash joins the unit's fingerprint: a prompt edit is a typed change.
        if ref in versions:
            out[ref] = versions[ref]
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
        decision_events: Callable[[], list[Event]],
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
        self.replay = replay
        self.cancel = cancel
        self.lease_lost = lease_lost
        self.deadline = deadline
        self.clock = clock
        self._decision_events = decision_events
        self.adapters = dict(adapters or {})
        self.staged: list[ArtifactEntry] = []
        self.progress = "claimed"
        # A dependency's committed artifact, read and hash-checked once per attempt (committed
        # files never change; kinds read one verify output several times).
        self._dep_cache: dict[tuple[str, str], bytes] = {}
        self._call_seq = 0
        self.model_calls = 0
        self.reused_calls = 0
        self.revisions = 0
        config = files.config
        self.revise_rounds = getattr(config, "revise_rounds", DEFAULT_REVISE_ROUNDS)
        self.api_base = (config.api_base_for(model) if hasattr(config, "api_base_for")
                         else api_base)
        self._prompts: dict[str, Any] = {}
        self._profile: Any = None
        self._reuse: ReuseIndex | None = None

    # -- reading ---------------------------------------------------------------
    def sources_for_unit(self) -> list[SourceEntry]:
        approved = self.files.approved_sources()
        wanted = set(self.unit.input_refs("source"))
        groups = set(self.unit.input_refs("group"))
        return [s for sid, s in sorted(approved.items())
                if sid in wanted or (s.group and s.group in groups)]

    def source_text(self, source_id: str) -> str:
        return str(self.converted_source(source_id).whole_text())

    def converted_source(self, source_id: str) -> Any:
        # The file is hashed again (not the snapshot's sha256 taken on trust): a file edited
        # since the snapshot must never be cached under the old hash. The run's cancel event
        # reaches the converter, so Ctrl-C stops a long conversion within a fraction of a second.
        self._check_reads_body(source_id)
        return self.files.converted_source(source_id, cancel=self.cancel)

    def _check_reads_body(self, source_id: str) -> None:
        entry = self.files.approved_sources().get(source_id)
        refs = [f"source:{source_id}"] + ([f"group:{entry.group}"] if entry and entry.group
                                          else [])
        named = [r for r in refs if r in self.unit.inputs]
        if named and not any(self.unit.reads_content(r) for r in named):
            raise KeepstepError(
                f"{self.unit.id}: reads source {source_id} only through structure edges (its "
                "header lines), not its body",
                hint=f"add \"content\" to the edges of {named[0]} in the unit's inputs")

    def source_header(self, source_id: str) -> dict[str, str]:

        entry = self.files.approved_sources().get(source_id)
        if entry is None:
            raise KeepstepError(f"{self.unit.id}: source {source_id} is not approved")
        try:
            text = (self.files.root / entry.path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            return {}
        return header_fields(split_header(text)[0])

    def data(self, name: str) -> dict[str, Any]:
        import tomllib

        path = project_file(self.files.root, "data", f"{name}.toml", what="data file")
        try:
            return _parsed_toml(path)
        except FileNotFoundError:
            return {}
        except tomllib.TOMLDecodeError as exc:
            raise KeepstepError(f"{self.unit.id}: data/{name}.toml is not valid TOML: {exc}",
                                hint="fix the line it names (`keepstep validate` checks it)"
                                ) from None

    def _dep_ref(self, unit_id: str, name: str) -> OutputRef:
        rec = self.records.get(unit_id)
        if rec is None or name not in rec.outputs:
            raise KeepstepError(f"{self.unit.id}: dependency {unit_id} has no current output "
                                f"{name!r}")
        return rec.outputs[name]

    def dep_path(self, unit_id: str, name: str) -> str:
        return self._dep_ref(unit_id, name).path

    def dep_bytes(self, unit_id: str, name: str) -> bytes:
        cached = self._dep_cache.get((unit_id, name))
        if cached is not None:
            return cached
        ref = self._dep_ref(unit_id, name)
        data = (self.store.artifacts.root / ref.path).read_bytes()
        if sha256_hex(data) != ref.sha256:
            raise KeepstepError(
                f"{self.unit.id}: artifact {ref.path} of {unit_id} does not match its hash",
                hint="run `keepstep resume`: recovery invalidates the changed artifact and "
                "redoes it",
            )
        self._dep_cache[(unit_id, name)] = data
        return data

    def dep_json(self, unit_id: str, name: str) -> Any:
        return json.loads(self.dep_bytes(unit_id, name))

    def template_text(self, name: str) -> str:
        path = template_file(self.files.root, name) or self.files.root / "templates" / f"{name}.md"
        if not path.is_file():
            raise KeepstepError(f"{self.unit.id}: template {name!r} is missing ({path})",
                                hint="add the template file or fix the unit's template input")
        return path.read_text(encoding="utf-8")

    def decision_events(self) -> list[Event]:
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
    def effect(self, adapter: str, action: str, request: dict[str, Any], *,
               content: str | None = None) -> EffectOutcome:

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
        key = identity = None
        if content is not None:
            # A delivery: keyed by destination + content hash, never plan version or attempt.
            destination = destination_of(found, str(request.get("name", "")))
            key = delivery_key(destination, content)
            identity = {"destination": destination, "sha256": content,
                        "size": request.get("size")}
        return perform_effect(
            self.store, found, run_id=self.run_id, branch_id=self.branch_id, unit=self.unit.id,
            attempt_id=self.attempt_id, action=action, request=request, plan_n=self.plan_n,
            fencing_token=self.claim.fencing_token, key=key, identity=identity)

    # -- model calls -------------------------------------------------------------
    def prompt(self, name: str) -> Any:
        if name not in self._prompts:

            self._prompts[name] = load_prompt(name, self.files.root)
        return self._prompts[name]

    def model_profile(self) -> Any:
        if self._profile is None:

            self._profile = profile_for(self.files, self.model)
        return self._profile

    def _ledger(self) -> Any:

        return StoreCallLedger(self.store, self.run_id, self.branch_id)

    def call_model(self, call: StepCall, *, check: Any) -> CheckedAnswer:
        # Lazy on purpose (start-up): the client module is loaded by the first model call,
        # or in the background from the start of a run that calls a real model
        # (Run.preload_model_client).
        from keepstep.engine.gateway.client import CallContext, ModelRequest, request_hash

        self.safe_point()
        profile = self.model_profile()
        cfg = self.files.config
        request = ModelRequest(
            model=self.model, messages=call.messages, temperature=cfg.temperature,
            max_tokens=(max_tokens := profile.max_tokens_for(call.answer_tokens)),
            api_base=self.api_base,
            timeout_s=cfg.request_timeout_s,
            response_format=profile.response_format(call.schema_name, call.json_schema),
            options=profile.options(),
            price_per_token=(profile.input_cost_per_token, profile.output_cost_per_token)
            if profile.price_source == "keepstep.toml" else None,
        )
        tokens_in = profile.count(call.messages)
        if tokens_in > profile.input_tokens:
            what = f"{self.unit.id}: the {call.prompt} request" + (
                f" ({call.label})" if call.label else "")
            raise profile.too_large(what, tokens_in)
        rhash = request_hash(request)
        self._call_seq += 1
        ctx = CallContext(run_id=self.run_id, branch=self.branch_id, unit=self.unit.id,
                          attempt=self.attempt_id, round=call.round)
        result = None
        reused_from: str | None = None
        if self.replay is not None:
            content = self.replay.get(rhash)
            if content is None:
                raise ReplayMiss(
                    f"{self.unit.id}: no recorded response for request {rhash[:12]} — the plan, "
                    "sources or prompts changed since the recorded run",
                    hint="replay reproduces a run exactly; use resume to run changed units",
                )
            value, parsed, problems = check(content)
        else:
            if self._reuse is None:
                self._reuse = ReuseIndex(self.store, self.run_id, self.branch_id, self.unit.id,
                                         self.attempt_id, self.records.get(self.unit.id))
            found = self._reuse.answer(rhash, check)
            if found is not None:
                reused_from, content, (value, parsed, problems) = found
            else:
                crash_point("unit.before_call")
                est_out = max_tokens
                with reporting(lambda text: setattr(self, "progress", text)):  # provider waits
                    result = self.gateway.complete(
                        ctx, request, est_tokens=tokens_in + est_out,
                        est_cost=profile.estimate_cost(tokens_in, est_out))
                crash_point("unit.after_call")
                content = result.content
                self.model_calls += 1
                value, parsed, problems = check(content)
                if result.finish_reason == "length":
                    problems = [problem("(answer)", "truncated",
                                        f"the answer was cut off at max_tokens = "
                                        f"{max_tokens}; answer more briefly"),
                                *problems]
        name = f"calls/r{call.round}-{self._call_seq:03d}.json"
        record: dict[str, Any] = {
            "request_hash": rhash, "model": self.model, "round": call.round,
            "revision": call.revision, "prompt": call.prompt,
            "prompt_sha256": call.prompt_sha256, "content": content,
            "valid": not problems, "problems": [p.model_dump() for p in problems]}
        if reused_from:
            record["reused_from"] = reused_from
        self.write(name, record, media_type="application/json")
        entry = self.staged[-1]
        ref = artifact_ref(entry.path, entry.sha256)
        if reused_from is not None:
            self._ledger().record_reuse(ctx, model=self.model, request_hash=rhash,
                                        response_artifact=ref)
            self.reused_calls += 1
        elif result is not None and result.call_id:
            self._ledger().record_verdict(result.call_id, result, valid=not problems,
                                          response_artifact=ref,
                                          safe_message=summary(problems) if problems else None)
        if call.revision:
            self.revisions += 1
        return CheckedAnswer(content=content, value=value, parsed=parsed, problems=problems,
                             reused=reused_from is not None, artifact=entry.path)

    # -- writing -----------------------------------------------------------------
    def write(self, name: str, data: bytes | str | dict[str, Any] | list[Any], *,
              media_type: str | None = None, source_ids: list[str] | None = None) -> str:
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
                 progress: Callable[[], str],
                 on_event: Callable[[dict[str, Any]], None] | None,
                 lost: threading.Event | None = None) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{claim.attempt_id}")
        self.store = store
        self.claim = claim
        self.interval = interval
        self.lease_seconds = lease_seconds
        self.progress = progress
        self.on_event = on_event
        # Set when the token is stale; the attempt's context watches the same event.
        self.lost = lost if lost is not None else threading.Event()
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
        facts={**outcome.facts, "rounds": outcome.rounds, "model_calls": ctx.model_calls,
               **({"reused_calls": ctx.reused_calls} if ctx.reused_calls else {}),
               **({"revise_rounds": ctx.revisions} if ctx.revisions else {})},
        validators_passed=outcome.passed,
    )


_DIAGNOSIS_PROBLEMS = 20


def record_diagnosis(ctx: AttemptContext, outcome: KindOutcome) -> dict[str, Any]:
    """What is behind an attempt's failed validators, kept with the attempt: the failed
    validators' details, the model answers' problems (field, rule, message, offending value —
    never more of a source than the offending quote) and the recorded rejected answers.

    Written as the attempt's ``problems.json`` artifact (hashed like every artifact); the
    returned dict is what the attempt's events and the unit's status carry."""
    problems = outcome.problems[:_DIAGNOSIS_PROBLEMS]
    diagnosis: dict[str, Any] = {
        "validators": [{"name": v.name, "detail": v.detail} for v in outcome.validators
                       if not v.passed],
        "problems": problems,
        "more_problems": max(0, len(outcome.problems) - len(problems)),
        "answers": list(outcome.answers),
    }
    ctx.write("problems.json", diagnosis, media_type="application/json")
    diagnosis["file"] = ctx.staged[-1].path
    return diagnosis


# A pack's data files are read by every model step (its topics go into each extraction
# prompt): parsed once per version of the file (its size, times and inode), shared by
# threads.
_TOML_CACHE: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
_TOML_LOCK = threading.Lock()


def _parsed_toml(path: Path) -> dict[str, Any]:
    """``path`` parsed as TOML (a copy: callers may change it). FileNotFoundError when it is
    missing or not a file; TOMLDecodeError when it does not parse."""
    import copy
    import tomllib

    try:
        st = path.stat()
    except OSError:
        raise FileNotFoundError(str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FileNotFoundError(str(path))
    stamp = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
    key = str(path)
    with _TOML_LOCK:
        hit = _TOML_CACHE.get(key)
    if hit is None or hit[0] != stamp:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
        with _TOML_LOCK:
            if len(_TOML_CACHE) >= 64:
                _TOML_CACHE.clear()
            _TOML_CACHE[key] = (stamp, doc)
        hit = (stamp, doc)
    return copy.deepcopy(hit[1])
