"""Figures stated before their period ended: forecasts and partial counts, marked by code.

A source dated 15 March 2024 that gives a count "in 2024" wrote it before 2024 was over: it
is a forecast, a target or a count so far, never the year's outcome. Code finds these from
what is recorded — each figure's ``period`` (its structured quantity) and its source's date
(the metadata verify recorded, ``source_meta``) — so no model has to notice it:

- ``stale_labels`` gives each such evidence item its label, ``stated <date>``
  (the source's date in words), which synthesize and render requests carry beside the
  evidence (``stated_before_period_end``) and the evidence table shows in its
  ``stated_before`` column;
- ``label_for`` gives the words a document adds to a sentence (a finding, a written
  sentence) that states such a figure without saying it is one (no "forecast", "expected",
  "as of" … in the sentence): the documents label it, whatever the writer wrote.

A period or a date that cannot be read marks nothing. A period ends at the last day it can
mean ("2024": 31 December 2024; "Q1 2024": 31 March 2024; "March 2024": 31 March 2024); a
source dated only by its year or month is taken at the last day it can mean, so only a
period that certainly ended after the source was written is marked.

Callers may rely on: ``period_end`` and ``source_date`` returning ``datetime.date`` or None;
``stale_labels`` mapping evidence id -> (label, the figures as written that are stale).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Any

from keepstep.engine.kinds.citable import human_date
from keepstep.engine.kinds.claims import stated_figures
from keepstep.engine.kinds.conflicts import quantities_of
from keepstep.engine.kinds.extract import REGISTER

_MONTHS = {m.lower(): n for n, m in enumerate(calendar.month_name) if m} | {
    m.lower(): n for n, m in enumerate(calendar.month_abbr) if m} | {"sept": 9}
_YEAR = r"(?<!\d)((?:19|20)\d\d)(?!\d)"
_ISO_RE = re.compile(rf"{_YEAR}-(\d{{1,2}})(?:-(\d{{1,2}}))?(?!\d)")
_QUARTER_RE = re.compile(rf"\bq([1-4])\b\W*{_YEAR}|{_YEAR}\W*q([1-4])\b")
_HALF_RE = re.compile(rf"\bh([12])\b\W*{_YEAR}|{_YEAR}\W*h([12])\b")
_MONTH_RE = re.compile(r"\b(" + "|".join(sorted(_MONTHS, key=len, reverse=True))
                       + rf")\.?\s+(?:(\d{{1,2}}),?\s+)?{_YEAR}")
_DAY_MONTH_RE = re.compile(r"\b(\d{1,2})\s+(" + "|".join(sorted(_MONTHS, key=len, reverse=True))
                           + rf")\.?,?\s+{_YEAR}")
_YEAR_RE = re.compile(_YEAR)
# Words that say a figure is not an outcome: a document sentence with one needs no label.
_SAYS_SO_RE = re.compile(
    r"\b(?:forecast\w*|expect\w*|project\w*|plan\w*|estimat\w*|target\w*|budget\w*|outlook|"
    r"will|would|should|could|may|might|scheduled|due|anticipat\w*|intend\w*|aim\w*|"
    r"as of|so far|to date|year-to-date|ytd|by then|at the time|preliminary|provisional|"
    r"before (?:the|its|that) (?:year|period|quarter|month)|stated (?:in|on|before))\b",
    re.IGNORECASE)


_LABEL = "stated "


def _month_end(year: int, month: int) -> date | None:
    if not 1 <= month <= 12:
        return None
    return date(year, month, calendar.monthrange(year, month)[1])


def period_end(period: str) -> date | None:
    """The last day ``period`` can mean ("2024" -> 2024-12-31, "Q1 2024" -> 2024-03-31,
    "2024-03" or "March 2024" -> 2024-03-31, "2024-03-15" -> that day; a range or several
    years: the last); None when it names no year."""
    text = str(period).strip().lower()
    if not text:
        return None
    ends: list[date] = []
    for m in _ISO_RE.finditer(text):
        year, month = int(m.group(1)), int(m.group(2))
        try:
            ends.append(date(year, month, int(m.group(3))) if m.group(3)
                        else _month_end(year, month) or date(year, 12, 31))
        except ValueError:
            continue
    for months, pattern in ((3, _QUARTER_RE), (6, _HALF_RE)):
        for m in pattern.finditer(text):
            part, year_text = (m.group(1), m.group(2)) if m.group(1) else (m.group(4),
                                                                            m.group(3))
            ends.append(_month_end(int(year_text), int(part) * months)
                        or date(int(year_text), 12, 31))
    for m in _MONTH_RE.finditer(text):
        year, month = int(m.group(3)), _MONTHS[m.group(1)]
        try:
            ends.append(date(year, month, int(m.group(2))) if m.group(2)
                        else _month_end(year, month) or date(year, 12, 31))
        except ValueError:
            continue
    if ends:
        return max(ends)
    years = [int(y) for y in _YEAR_RE.findall(text)]
    return date(max(years), 12, 31) if years else None


def source_date(text: str) -> date | None:
    """A source's date as recorded ("2024-03-15", "15 March 2024", "March 2024", "2024"),
    at the last day it can mean; None when it cannot be read."""
    text = str(text).strip().lower()
    m = _DAY_MONTH_RE.search(text)
    if m:
        try:
            return date(int(m.group(3)), _MONTHS[m.group(2)], int(m.group(1)))
        except ValueError:
            return None
    return period_end(text)


# What a label adds to a date that only the project's source register gives (``origins``: a
# source's date field recorded as the register's): the document itself does not state it.
REGISTER_DATE = " per the source register"


def stale_labels(evidence: Iterable[Mapping[str, Any]],
                 meta: Mapping[str, Mapping[str, Any]],
                 origins: Mapping[str, Mapping[str, Any]] | None = None
                 ) -> dict[str, tuple[str, list[str]]]:
    """evidence id -> ("stated <the source's date>", the figures as written whose
    period ends after it), for each item with at least one such figure. A date ``origins``
    records as the source register's (``extract.REGISTER``) is labelled so: "stated
    1 February 2025 per the source register"."""
    out: dict[str, tuple[str, list[str]]] = {}
    for item in evidence:
        info = meta.get(str(item.get("source_id", ""))) or {}
        written = str(info.get("date") or "").strip()
        dated = source_date(written) if written else None
        if dated is None:
            continue
        figures = [q.figure for q in quantities_of(item)
                   if (end := period_end(q.period)) is not None and end > dated]
        if figures:
            sid = str(item.get("source_id", ""))
            register = (origins or {}).get(sid, {}).get("date") == REGISTER
            out[str(item.get("id"))] = (
                f"{_LABEL}{human_date(written)}{REGISTER_DATE if register else ''}", figures)
    return out


def stated_before(labels: Mapping[str, tuple[str, list[str]]],
                  ids: Iterable[str] | None = None) -> dict[str, str]:
    """evidence id -> its label, for the marked items of ``labels`` (``stale_labels``; only
    ``ids`` when given): what a request carries as INPUT's ``stated_before_period_end``."""
    wanted = None if ids is None else set(ids)
    return {i: label for i, (label, _figures) in labels.items()
            if wanted is None or i in wanted}


def label_for(text: str, ids: Iterable[str],
              labels: Mapping[str, tuple[str, list[str]]]) -> str:
    """The words a document adds after a sentence that states a figure of a marked item
    it cites (``stale_labels``) without saying it is not an outcome, in parentheses with a
    leading space: "" when it states none of them, or says so itself."""
    if not labels or _SAYS_SO_RE.search(text):
        return ""
    stated = {f.replace(",", "") for f in stated_figures(text)}
    found = [labels[i][0] for i in ids if i in labels and any(
        f.replace(",", "") in stated for fig in labels[i][1] for f in stated_figures(fig))]
    if not found:
        return ""
    dates = [label.removeprefix(_LABEL) for label in dict.fromkeys(found)]
    return (f" ({_LABEL}{' and '.join(dates)}, before the period it covers had ended: "
            "not a final figure)")


__all__ = ["label_for", "period_end", "source_date", "stale_labels", "stated_before"]
