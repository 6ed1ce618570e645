"""What the offline heuristic needs from a pack that a real model does not, checked before a
run (``keepstep validate``), each problem with what to do.

The heuristic reads risks only through words: the pack's data/risks.toml checklist (each risk's
``keywords``), or without one the generic cue words of ``offline_rules.GENERIC_RISK_CUES``.
A rank unit (or a model unit answering risks) on the offline model whose approved sources
use none of those words can only fail ("the ranking has no risks"), on every retry: that is
found here, from the sources' converted text, instead of after three attempts.
"""

from __future__ import annotations

import re
import tomllib
from typing import TYPE_CHECKING

from keepstep.engine.core.plan import PlanProblem, unit_problem
from keepstep.engine.core.presets import RISKS, answer_of
from keepstep.engine.gateway import offline_provider
from keepstep.engine.gateway.offline_rules import GENERIC_RISK_CUES, statement_kind

if TYPE_CHECKING:
    from keepstep.engine.files.project import ProjectFiles

OFFLINE_NEEDS = "offline_needs"  # the PlanProblem code


def _source_text(files: ProjectFiles) -> str | None:
    """The approved sources' converted text, lower-cased (None when one cannot be read:
    the source checks report that one)."""
    from keepstep.engine.files.convert.cache import ConversionCache
    from keepstep.engine.files.project import conversion_cache

    cache = ConversionCache(conversion_cache(files.root).folder, memory_entries=0)
    parts = []
    for entry in files.sources.sources:
        if not entry.approved:
            continue
        try:
            conv = cache.get_or_convert(files.root / entry.path,
                                        max_bytes=files.config.max_source_bytes)
        except Exception:  # noqa: BLE001 - an unreadable source is the source check's problem
            return None
        text = conv.whole_text()
        parts.append(text.lower())
    return "\n".join(parts)


def _checklist(files: ProjectFiles) -> list[dict] | None:
    path = files.root / "data" / f"{RISKS}.toml"
    try:
        risks = tomllib.loads(path.read_text(encoding="utf-8")).get("risk")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None  # missing: the generic words; unreadable: file_problems says so
    return [r for r in risks if isinstance(r, dict)] if isinstance(risks, list) else None


def _recommends(text: str) -> bool:
    """Whether a sentence of ``text`` is one the heuristic reads as an option: a
    recommendation with a figure (the statements it keeps)."""
    return any(any(ch.isdigit() for ch in s) and statement_kind(s) == "recommendation"
               for s in re.split(r"(?<=[.!?])\s+|\n", text))


def offline_needs(files: ProjectFiles) -> list[PlanProblem]:
    """A problem per ranking unit on the offline model that cannot find what it ranks in the
    approved sources: a risk, or for a ranking of options (``ranks`` other than risks) a
    course of action a source recommends."""
    ranking = [u for u in files.plan.units if answer_of(u) == "risks"
               and files.config.model_for(u.id, u.kind.value) == offline_provider.MODEL]
    units = [u for u in ranking if str(u.params.get("ranks") or "risks") == "risks"]
    options = [u for u in ranking if u not in units]
    if not ranking:
        return []
    text = _source_text(files)
    if text is None or not text.strip():
        return []
    problems = [] if _recommends(text) else [unit_problem(
        u.id, "kind", "ranks options on the offline model, which ranks the courses of action "
        "the sources recommend (a sentence with a figure and \"should\", \"recommend\", "
        "\"advises\" …); the approved sources state none",
        "set a real model for the unit (docs/config.md), or rank risks", OFFLINE_NEEDS,
        say_field=False) for u in options]
    if not units:
        return problems
    checklist = _checklist(files)
    if checklist is not None:
        words = sorted({str(k).lower() for r in checklist for k in r.get("keywords") or []})
        if any(w in text for w in words):
            return problems
        message = ("runs on the offline model, which finds a risk only where a source uses "
                   "one of data/risks.toml's keywords; the approved sources use none of them "
                   f"({', '.join(words[:6]) or 'no keywords listed'})")
        hint = ("add to each [[risk]] in data/risks.toml keywords your sources use (a phrase "
                "as it is written in them), or set a real model (docs/config.md)")
    else:
        if any(cue in text for cue in GENERIC_RISK_CUES):
            return problems
        message = ("runs on the offline model, which without data/risks.toml finds a risk only "
                   "where a source uses a generic risk word (" + ", ".join(GENERIC_RISK_CUES[:6])
                   + ", …); the approved sources use none")
        hint = ("write data/risks.toml: one [[risk]] per risk with key, title, impact (1-5) "
                "and keywords your sources use (docs/plan-format.md, data files), or set a "
                "real model (docs/config.md)")
    return problems + [unit_problem(u.id, "kind", message, hint, OFFLINE_NEEDS,
                                    say_field=False) for u in units]


__all__ = ["OFFLINE_NEEDS", "offline_needs"]
