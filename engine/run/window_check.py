"""Which model steps will not fit their model's window, said before a run (``keepstep
validate``), with what to do.

Estimates, made without a tokenizer or a call (about four characters a token): a step's
request is its prompt (the template, and the answer's schema where the model reads it from
the prompt) plus what it sends, and its answer must fit beside it.

- an extract step is split into chunks on paragraph boundaries, so only its sources' longest
  paragraph must fit (with its answer);
- a claim check is split into batches, so it always fits;
- a synthesis or ranking (or a general model step) sends the verified evidence of every
  source it reaches in one request: estimated at ``EVIDENCE_PER_SOURCE_TOKEN`` tokens of
  evidence per token of those sources' text (the quotes, their fields and locators: about
  twice the text in the runs measured); a document's written sections send findings and their cited
  quotes only, and are not estimated here.

Callers may rely on: one warning per step that will not fit, naming the unit, its kind, the
model, the estimate against the window and what to do; nothing for the offline model (it has
no window) or a step that fits.
"""

from __future__ import annotations

import math
from typing import Any

from keepstep.engine.core.changes import PROMPT_PREFIX, prompt_refs
from keepstep.engine.core.plan import Unit, UnitKind
from keepstep.engine.core.presets import evidence_sources
from keepstep.engine.errors import KeepstepError
from keepstep.engine.files.project import ProjectFiles
from keepstep.engine.gateway import offline_provider
from keepstep.engine.gateway.model_check import ModelFinding
from keepstep.engine.gateway.profile import ModelProfile, model_profile
from keepstep.engine.gateway.prompts import load_prompt
from keepstep.engine.kinds.common import unit_source_ids
from keepstep.engine.kinds.extract import expected_answer, paragraphs

EVIDENCE_PER_SOURCE_TOKEN = 2.0
_SCHEMA_TOKENS = 1_000  # an answer schema written into the prompt, about
_ONE_REQUEST = (UnitKind.synthesize, UnitKind.rank, UnitKind.model)


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def profile_for(files: ProjectFiles, model: str) -> ModelProfile:
    """The model's profile under the project's keepstep.toml (as a run builds it)."""
    cfg = files.config
    settings = cfg.settings_for(model)
    return model_profile(model, max_tokens=cfg.max_tokens,
                         context_tokens=settings.context_tokens or cfg.context_tokens,
                         price=settings.price_per_token(),
                         max_output_tokens=settings.max_output_tokens)


class _Texts:
    """Approved sources' converted texts, each read once (None: unreadable, reported by the
    source check already)."""

    def __init__(self, files: ProjectFiles) -> None:
        self.files = files
        self._texts: dict[str, str | None] = {}

    def get(self, sid: str) -> str | None:
        if sid not in self._texts:
            try:
                text = self.files.converted_source(sid).text
                self._texts[sid] = text if isinstance(text, str) else None
            except KeepstepError:
                self._texts[sid] = None
        return self._texts[sid]


def _overhead(files: ProjectFiles, unit: Unit, profile: ModelProfile) -> int:
    chars = 0
    for ref in prompt_refs(unit):
        try:
            prompt = load_prompt(ref.removeprefix(PROMPT_PREFIX), files.root)
        except KeepstepError:
            continue  # a broken prompt has its own problem
        chars = max(chars, len(prompt.system) + len(prompt.user))
    return _tokens(chars) + (_SCHEMA_TOKENS if profile.schema_in_prompt else 0)


def window_findings(files: ProjectFiles) -> list[ModelFinding]:
    """A warning per model step whose request (estimated) will not fit its model's window."""
    plan = files.plan
    units = plan.unit_map()
    approved = files.approved_sources()
    groups = {sid: s.group for sid, s in approved.items()}
    texts = _Texts(files)
    out: list[ModelFinding] = []
    for unit in plan.units:
        if not prompt_refs(unit):
            continue
        model = files.config.model_for(unit.id, unit.kind.value)
        if model == offline_provider.MODEL:
            continue
        try:
            profile = profile_for(files, model)
        except KeepstepError:
            continue  # an unknown model has its own finding
        overhead = _overhead(files, unit, profile)
        message = _extract_message(unit, profile, overhead, texts, groups) \
            if unit.kind == UnitKind.extract else \
            _one_request_message(unit, profile, overhead, texts, groups, units) \
            if unit.kind in _ONE_REQUEST else None
        if message:
            out.append(ModelFinding(level="warning", model=model, units=[unit.id],
                                    message=message))
    return out


def _extract_message(unit: Unit, profile: ModelProfile, overhead: int, texts: _Texts,
                     groups: dict[str, str]) -> str | None:
    worst: tuple[int, int, str] | None = None
    for sid in sorted(unit_source_ids(unit, groups)):
        text = texts.get(sid)
        if not text:
            continue
        longest = max(paragraphs(text), key=len, default="")
        need, answer = overhead + _tokens(len(longest)), expected_answer(longest)
        if (need > profile.input_tokens or answer > profile.answer_limit) and (
                worst is None or need + answer > worst[0] + worst[1]):
            worst = (need, answer, sid)
    if worst is None:
        return None
    need, answer, sid = worst
    return (f"{unit.id} (extract): a paragraph of source {sid} needs ~{need:,} tokens to send "
            f"and ~{answer:,} to answer, but {profile.window_text()} and answers at most "
            f"{profile.answer_limit:,}: it cannot be split further. Break that paragraph up in "
            "the source, or use a model with a larger window")


def _one_request_message(unit: Unit, profile: ModelProfile, overhead: int, texts: _Texts,
                         groups: dict[str, str], units: dict[str, Any]) -> str | None:
    sids = sorted({s for e in evidence_sources(unit, units) for s in unit_source_ids(e, groups)})
    chars = sum(len(t) for s in sids if (t := texts.get(s)))
    if not chars:
        return None
    evidence = math.ceil(_tokens(chars) * EVIDENCE_PER_SOURCE_TOKEN)
    need = overhead + evidence
    if need <= profile.input_tokens:
        return None
    return (f"{unit.id} ({unit.kind.value}): its one request will need ~{need:,} tokens (the "
            f"verified evidence of {len(sids)} source(s), estimated from their text) but "
            f"{profile.window_text()}. Split it into smaller units (each over fewer sources or "
            "extraction units), or use a model with a larger window (set context_tokens in "
            "its [model_settings] if its real window is larger)")


__all__ = ["EVIDENCE_PER_SOURCE_TOKEN", "profile_for", "window_findings"]
