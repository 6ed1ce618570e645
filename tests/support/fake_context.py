"""An in-memory UnitContext for kind tests, and a runner that plays a pack's plan through it.

``FakeContext`` keeps the contract of ``engine.context.UnitContext`` strict where a kind
could cheat: ``dep_bytes`` only serves declared dependencies, ``template_text`` only
declared ``template:`` inputs, ``source_text`` only approved sources. ``call_model``
gets the rendered prompt, reads its INPUT block like every model does, answers with the
responder (the offline model by default) as JSON text and records every call (``payload``
is the INPUT block); ``write`` keeps the bytes and returns their sha256.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from keepstep.engine.core.plan import Plan, Unit
from keepstep.engine.errors import SourceError
from keepstep.engine.files.convert import ConvertedSource, from_markdown
from keepstep.engine.files.project import (
    Contract,
    InputSnapshot,
    ProjectFiles,
    SourceEntry,
    load_project_files,
    snapshot_sources,
)
from keepstep.engine.gateway.offline_model import respond
from keepstep.engine.gateway.profile import ModelProfile, model_profile
from keepstep.engine.gateway.prompts import (
    Prompt,
    load_prompt,
    read_input_block,
    read_revise_problems,
)
from keepstep.engine.kinds import get_kind
from keepstep.engine.kinds.context import KindOutcome
from keepstep.engine.kinds.model_step import CheckedAnswer, StepCall
from keepstep.storage.hashing import canonical_json, sha256_hex
from keepstep.storage.models import Event

PACK = Path(__file__).resolve().parents[2] / "sample_projects" / "market-entry"
Responder = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass
class FakeContext:
    unit: Unit
    plan: Plan
    contract: Contract
    snapshot: InputSnapshot
    sources: dict[str, SourceEntry] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    converted: dict[str, ConvertedSource] = field(default_factory=dict)
    artifacts: dict[str, dict[str, bytes]] = field(default_factory=dict)  # unit -> name -> bytes
    templates: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    responder: Responder = respond
    run_id: str = "ME-042"
    branch_id: str = "main"
    attempt_id: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, bytes] = field(default_factory=dict)
    media_types: dict[str, str | None] = field(default_factory=dict)
    output_sources: dict[str, list[str] | None] = field(default_factory=dict)
    safe_points: list[str | None] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # "safe_point" / "call" in order
    revise_rounds: int = 2
    profile: ModelProfile | None = None  # default: the offline model's
    prompt_root: Path | None = None  # a project folder whose prompts/ override the packaged
    datas: dict[str, dict[str, Any]] = field(default_factory=dict)  # data/<name>.toml parsed

    def __post_init__(self) -> None:
        self.attempt_id = self.attempt_id or f"{self.unit.id}/a1"

    def sources_for_unit(self) -> list[SourceEntry]:
        groups = set(self.unit.input_refs("group"))
        ids = set(self.unit.input_refs("source"))
        return sorted((s for s in self.sources.values()
                       if s.id in self.snapshot.sources and (s.group in groups or s.id in ids)),
                      key=lambda s: s.id)

    def source_text(self, source_id: str) -> str:
        if source_id not in self.snapshot.sources:
            raise SourceError(f"source {source_id} is not approved")
        return self.texts[source_id]

    def converted_source(self, source_id: str) -> ConvertedSource:
        """The project's conversion when the runner has one for this very text, else the
        text as Markdown."""
        text = self.source_text(source_id)
        conv = self.converted.get(source_id)
        return conv if conv is not None and conv.text == text else from_markdown(text)
    def source_header(self, source_id: str) -> dict[str, str]:
        from keepstep.engine.core.inputs import header_fields, split_header

        return header_fields(split_header(self.source_text(source_id))[0])

    def data(self, name: str) -> dict[str, Any]:
        return self.datas.get(name, {})

    def dep_bytes(self, unit_id: str, name: str) -> bytes:
        if unit_id not in {d.unit for d in self.unit.depends_on}:
            raise KeyError(f"{unit_id} is not a dependency of {self.unit.id}")
        return self.artifacts[unit_id][name]

    def dep_json(self, unit_id: str, name: str) -> Any:
        return json.loads(self.dep_bytes(unit_id, name))

    def template_text(self, name: str) -> str:
        # A unit reads its own template inputs, or (an audit) those of the render units it
        # depends on, whose documents it reads by their templates' sections.
        units = self.plan.unit_map()
        allowed = set(self.unit.input_refs("template")) | {
            t for d in self.unit.depends_on if d.unit in units
            for t in units[d.unit].input_refs("template")}
        if name not in allowed:
            raise KeyError(f"template {name} is not an input of {self.unit.id}")
        return self.templates[name]

    def prompt(self, name: str) -> Prompt:
        return load_prompt(name, self.prompt_root)

    def model_profile(self) -> ModelProfile:
        return self.profile or model_profile("local/keepstep-offline")

    def call_model(self, call: StepCall, *, check: Any) -> CheckedAnswer:
        sent = read_input_block(call.messages)
        assert sent is not None, "every prompt carries an INPUT block"
        self.calls.append({"round": call.round, "task": sent.get("task"), "payload": sent,
                           "revision": call.revision, "messages": call.messages})
        self.log.append("call")
        # The responder reads the request as the offline provider does: INPUT, and in a revise
        # round the problems the feedback names.
        asked = {**sent, **({"revise": r} if (r := read_revise_problems(call.messages)) else {})}
        content = json.dumps(self.responder(json.loads(json.dumps(asked))), sort_keys=True)
        value, parsed, problems = check(content)
        return CheckedAnswer(content=content, value=value, parsed=parsed, problems=problems,
                             artifact=f"{self.attempt_id}/calls/r{call.round}-"
                             f"{len(self.calls):03d}.json")

    def write(self, name: str, data: bytes | str | dict[str, Any] | list[Any], *,
              media_type: str | None = None, source_ids: list[str] | None = None) -> str:
        if isinstance(data, (dict, list)):
            data = canonical_json(data)
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self.outputs[name] = raw
        self.media_types[name] = media_type
        self.output_sources[name] = source_ids
        return sha256_hex(raw)

    def decision_events(self) -> list[Event]:
        return list(self.events)

    def safe_point(self, progress: str | None = None) -> None:
        self.safe_points.append(progress)
        self.log.append("safe_point")

    def json_output(self, name: str) -> Any:
        return json.loads(self.outputs[name])


def with_unit(plan: Plan, unit_id: str, **changes: Any) -> Plan:
    """A copy of the plan with one unit's fields changed (e.g. ``max_rounds=1``)."""
    units = [u.model_copy(update=changes) if u.id == unit_id else u for u in plan.units]
    return plan.model_copy(update={"units": units})


def with_audience(contract: Contract, audience: str) -> Contract:
    return Contract(fields={**contract.fields, "audience": audience}, body=contract.body)


def decision_event(seq: int, kind: str, unit: str | None = None, **payload: Any) -> Event:
    return Event(seq=seq, run_id="ME-042", branch_id="main", ts=f"2025-03-01T10:{seq:02d}:00Z",
                 kind=kind, unit=unit, payload=payload)


class PackRunner:
    """Runs units of a project's plan through FakeContext, keeping outputs as committed."""

    def __init__(self, root: Path = PACK, *, plan: Plan | None = None,
                 contract: Contract | None = None, events: Iterable[Event] = (),
                 responder: Responder = respond) -> None:
        self.files: ProjectFiles = load_project_files(root)
        self.plan = plan or self.files.plan
        self.contract = contract or self.files.contract
        self.snapshot = snapshot_sources(root, self.files.sources)
        self.sources = self.files.approved_sources()
        self.converted = {sid: self.files.converted_source(sid) for sid in self.sources}
        self.texts = {sid: conv.text for sid, conv in self.converted.items()}
        # Like the executor: template "report" is templates/report.md.
        self.templates = {p.stem: p.read_text(encoding="utf-8")
                          for p in sorted((root / "templates").glob("*.md"))}
        self.datas = {p.stem: tomllib.loads(p.read_text(encoding="utf-8"))
                      for p in sorted((root / "data").glob("*.toml"))}
        self.events = list(events)
        self.responder = responder
        self.artifacts: dict[str, dict[str, bytes]] = {}
        self.contexts: dict[str, FakeContext] = {}
        self.outcomes: dict[str, KindOutcome] = {}

    def context(self, unit_id: str) -> FakeContext:
        return FakeContext(unit=self.plan.unit_map()[unit_id], plan=self.plan,
                           contract=self.contract, snapshot=self.snapshot, sources=self.sources,
                           texts=self.texts, converted=self.converted,
                           artifacts=self.artifacts, templates=self.templates,
                           events=self.events, responder=self.responder, datas=self.datas)

    def run(self, unit_id: str) -> tuple[FakeContext, KindOutcome]:
        ctx = self.context(unit_id)
        _, fn = get_kind(ctx.unit.kind.value)
        outcome = fn(ctx)
        self.artifacts[unit_id] = dict(ctx.outputs)
        self.contexts[unit_id], self.outcomes[unit_id] = ctx, outcome
        return ctx, outcome

    def order(self) -> list[str]:
        return list(nx.lexicographical_topological_sort(self.plan.graph()))

    def run_all(self, until: str | None = None) -> dict[str, KindOutcome]:
        """Run every unit in dependency order (ids breaking ties), up to ``until`` included."""
        for uid in self.order():
            self.run(uid)
            if uid == until:
                break
        return self.outcomes

    def calls_per_unit(self) -> dict[str, int]:
        return {uid: len(ctx.calls) for uid, ctx in self.contexts.items()}
