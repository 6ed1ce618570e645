"""Figure-bearing sentences (``Claim``) and the check that reads the figures back.

A claim is a template plus its values. Rendering fills the template; ``compare`` turns each
template into a pattern, finds its lines in any text and compares every captured value with
the state's. Lines holding a digit that no claim accounts for are reported too, so a figure
cannot be slipped in unchecked. The narrative (engine.narrative) is built from claims.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from keepstep.engine.core.explain import compact_ids
from keepstep.engine.core.timefmt import parse_iso, readable_utc
from keepstep.engine.gateway.redaction import redact


@dataclass(frozen=True)
class Claim:
    """One line of the narrative that states figures: ``template.format(**values)``."""

    key: str
    template: str
    values: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One claim is one line: a value from the state never breaks it over several; and a
        # key-like string in a stored message never reaches the text.
        object.__setattr__(self, "values", {k: redact(" ".join(str(v).split()))
                                            for k, v in self.values.items()})

    def render(self) -> str:
        return self.template.format(**self.values)


Line = str | Claim


class Mismatch(BaseModel):
    """A figure the narrative states differently from the stored state (the state wins)."""

    key: str
    field: str = ""
    narrative: str | None = None  # None: the claim is missing from the text
    state: str | None = None  # None: the text states something the state does not have

    def render(self) -> str:
        where = f"{self.key}.{self.field}" if self.field else self.key
        if self.narrative is None:
            return f"{where}: the narrative leaves out {self.state!r}"
        if self.state is None:
            return f"{where}: the narrative states {self.narrative!r}, which no stored fact backs"
        return f"{where}: the narrative says {self.narrative!r}, the state says {self.state!r}"


# -- formatting --------------------------------------------------------------------------------
def number(value: float) -> str:
    value = float(value)
    return f"{int(value):,}" if value.is_integer() else f"{value:,.2f}"


def counter_value(counter: str, value: float) -> str:
    return f"${value:,.2f}" if counter == "cost" else number(value)


def when(iso: str) -> str:
    """A stored ISO timestamp as ``2026-12-01 09:48:42 UTC`` (unparseable text as it is)."""
    try:
        return readable_utc(parse_iso(iso))
    except ValueError:
        return iso


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def ids_text(ids: Any) -> str:
    ids = list(ids)
    return compact_ids(ids) if ids else "none"


def attempt_no(attempt_id: str) -> int:
    try:
        return int(attempt_id.rsplit("/a", 1)[1])
    except (IndexError, ValueError):
        return 0


def render(lines: list[Line]) -> str:
    """The Markdown text of a list of lines."""
    return "\n".join(x.render() if isinstance(x, Claim) else x for x in lines) + "\n"


# -- the check ---------------------------------------------------------------------------------
def pattern(template: str) -> tuple[re.Pattern[str], list[str]]:
    """A regex matching a line rendered from ``template``, and its fields in group order."""
    parts: list[str] = []
    names: list[str] = []
    for literal, name, _spec, _conv in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<g{len(names)}>.+?)")
            names.append(name)
    return re.compile("".join(parts)), names


def compare(expected: list[Line], text: str) -> list[Mismatch]:
    """Every claim of ``expected`` must appear in ``text`` with the same figures, and every
    other line of ``text`` holding a digit must be one of ``expected``'s fixed lines."""
    lines = [line.rstrip() for line in text.splitlines()]
    used: set[int] = set()
    out: list[Mismatch] = []
    groups: dict[str, list[Claim]] = {}
    for line in expected:
        if isinstance(line, Claim):
            groups.setdefault(line.template, []).append(line)
    # Longer literal prefixes first, so a general template never takes a specific line.
    for template in sorted(groups, key=lambda t: -len(t.split("{", 1)[0])):
        claims = groups[template]
        rx, names = pattern(template)
        hits = [(i, m) for i, line in enumerate(lines) if i not in used
                and (m := rx.fullmatch(line))]
        for k, claim in enumerate(claims):
            if k >= len(hits):
                out.append(Mismatch(key=claim.key, state=claim.render()))
                continue
            i, m = hits[k]
            used.add(i)
            for j, name in enumerate(names):
                got, want = m.group(f"g{j}").strip(), claim.values[name].strip()
                if got != want:
                    out.append(Mismatch(key=claim.key, field=name, narrative=got, state=want))
        for i, _m in hits[len(claims):]:
            used.add(i)
            out.append(Mismatch(key=claims[0].key, narrative=lines[i]))
    fixed = {line for line in expected if isinstance(line, str)}
    for i, line in enumerate(lines):
        if i not in used and line not in fixed and re.search(r"\d", line):
            out.append(Mismatch(key="unexpected", narrative=line))
    return out


__all__ = ["Claim", "Line", "Mismatch", "attempt_no", "compare", "counter_value", "ids_text",
           "number", "plural", "render", "when"]
