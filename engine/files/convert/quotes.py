"""Finding a quoted passage in converted text, and checking it at a citation's locator.

Matching ignores whitespace and line breaks, Markdown emphasis marks (``*``, ``_``, a
backtick), table pipes (a row may be quoted as ``Premium | 4.1%`` or ``Premium 4.1%``), the
difference between curly and straight quotes or between dashes, and letter case. It does not
ignore digits, punctuation inside words, or word order.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from keepstep.engine.files.convert.model import ConvertedSource

_IGNORED = re.compile(r"[*_`|]")
_SEPARATOR = r"(?:[\s|*_`\\]|&nbsp;)+"
_CLASSES = {"'": "['\u2018\u2019]", "\u2018": "['\u2018\u2019]", "\u2019": "['\u2018\u2019]",
            '"': '["\u201c\u201d]', "\u201c": '["\u201c\u201d]', "\u201d": '["\u201c\u201d]',
            "-": "[-\u2013\u2014]", "\u2013": "[-\u2013\u2014]", "\u2014": "[-\u2013\u2014]"}


@lru_cache(maxsize=256)
def quote_pattern(quote: str) -> re.Pattern[str] | None:
    """The compiled pattern a quote is searched with (None for an empty quote)."""
    tokens = _IGNORED.sub(" ", unicodedata.normalize("NFKC", quote)).split()
    if not tokens:
        return None
    parts = ["".join(_CLASSES.get(ch, re.escape(ch)) for ch in token) for token in tokens]
    return re.compile(_SEPARATOR.join(parts), re.IGNORECASE)


def find_quote(conv: ConvertedSource, quote: str) -> str | None:
    """The locator where ``quote`` first occurs; None when it does not occur at all.

    "" when it occurs outside every located part (e.g. Markdown before its first heading).
    """
    pattern = quote_pattern(quote)
    if pattern is None:
        return None
    match = pattern.search(conv.text)
    if match is None:
        return None
    locator = conv.locator_at(match.start())
    return "" if locator is None else locator


def find_occurrence(conv: ConvertedSource, quote: str, *, start: int = 0,
                    end: int | None = None) -> tuple[int, int] | None:
    """(start, end) of the first occurrence of ``quote`` within ``text[start:end]``, or None."""
    pattern = quote_pattern(quote)
    if pattern is None:
        return None
    match = pattern.search(conv.text, start, len(conv.text) if end is None else end)
    return None if match is None else match.span()


def locate_quote(conv: ConvertedSource, quote: str, *, start: int = 0,
                 end: int | None = None) -> str | None:
    """Where ``quote`` first occurs within ``text[start:end]``: the locator of the innermost
    part holding the whole occurrence (a table row, a page, a section...), ``""`` when no
    located part holds it, None when it does not occur there at all."""
    found = find_occurrence(conv, quote, start=start, end=end)
    if found is None:
        return None
    locator = conv.locator_of(*found)
    return "" if locator is None else locator


def quote_at(conv: ConvertedSource, locator: str, quote: str) -> bool:
    """True when ``quote`` occurs within the part ``locator`` names (``""`` = anywhere).

    A locator names a page, sheet, slide, section (which includes its sub-sections), a cell
    paragraph or a table row; a quote that runs past the end of that part does not count.
    """
    pattern = quote_pattern(quote)
    if pattern is None:
        return False
    if locator == "":
        return pattern.search(conv.text) is not None
    span = conv.span_of(locator)
    if span is None:
        return False
    return pattern.search(conv.text, span[0], span[1]) is not None


__all__ = ["find_occurrence", "find_quote", "locate_quote", "quote_at", "quote_pattern"]
