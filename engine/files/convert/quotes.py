"""Finding a quoted passage in converted text, and checking it at a citation's locator.

Matching ignores whitespace and line breaks, Markdown emphasis marks (``*``, ``_``, a
backtick), backslashes and ``&nbsp;``, table pipes (a row may be quoted as ``Premium | 4.1%``
or ``Premium 4.1%``), the difference between curly and straight quotes or between dashes,
and letter case. It does not ignore digits, punctuation inside words, or word order.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import lru_cache

from keepstep.engine.files.convert.model import ConvertedSource
from keepstep.engine.files.convert.spill import TextFile

# A quote searched in a TextFile piece by piece is found when it (with the separators inside
# it) is shorter than this; quotes are sentences.
_PIECE_OVERLAP = 1 << 16

_IGNORED = re.compile(r"[*_`|\\]|&nbsp;")
_SEPARATORS = frozenset("|*_`\\")
_NBSP = "&nbsp;"
_CLASSES = {"'": "['\u2018\u2019]", "\u2018": "['\u2018\u2019]", "\u2019": "['\u2018\u2019]",
            '"': '["\u201c\u201d]', "\u201c": '["\u201c\u201d]', "\u201d": '["\u201c\u201d]',
            "-": "[-\u2013\u2014]", "\u2013": "[-\u2013\u2014]", "\u2014": "[-\u2013\u2014]"}
_FOLD = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                       "\u2013": "-", "\u2014": "-"})


def _fold(text: str) -> str:
    return text.lower().translate(_FOLD)


def _is_separator(text: str, i: int) -> int:
    """Length of the separator at ``text[i]`` (whitespace, a pipe, ``*``, ``_``, a backtick,
    a backslash, ``&nbsp;``), 0 when there is none."""
    ch = text[i]
    if ch.isspace() or ch in _SEPARATORS:
        return 1
    return len(_NBSP) if ch == "&" and text.startswith(_NBSP, i) else 0


class QuoteMatcher:
    """Finds a quote's tokens in order, separators between them, without compiling a regex
    of the whole quote (Python's regex compiler spends ~10 ms on a sentence-long quote).

    The longest token is the anchor: its occurrences are found by a small pattern (or
    ``str.find``), then the tokens before and after it are compared in place. ``folded``:
    case, curly quotes and dashes aside, and Markdown marks, pipes and ``&nbsp;`` count as
    separators (the citation matching); else tokens compare exactly and only whitespace
    separates them (the verbatim check).
    """

    def __init__(self, tokens: list[str], *, folded: bool) -> None:
        self.folded = folded
        self.tokens = [_fold(t) for t in tokens] if folded else list(tokens)
        # Lengths in the text: a few letters change length when lowered ("İ").
        self.lengths = [len(t) for t in tokens]
        self.anchor = max(range(len(tokens)), key=lambda i: len(tokens[i]))
        anchor = tokens[self.anchor]
        self._anchor_re = re.compile("".join(_CLASSES.get(ch, re.escape(ch)) for ch in anchor),
                                     re.IGNORECASE) if folded else None

    def _same(self, text: str, start: int, k: int) -> bool:
        piece = text[start:start + self.lengths[k]]
        return (_fold(piece) if self.folded else piece) == self.tokens[k]

    def _sep_forward(self, text: str, i: int, end: int) -> int:
        if self.folded:
            while i < end:
                n = _is_separator(text, i)
                if not n or i + n > end:
                    break
                i += n
        else:
            while i < end and text[i].isspace():
                i += 1
        return i

    def _sep_back(self, text: str, i: int, start: int) -> int:
        while i > start:
            ch = text[i - 1]
            if ch.isspace() or (self.folded and ch in _SEPARATORS):
                i -= 1
            elif self.folded and ch == ";" and i - len(_NBSP) >= start and \
                    text.startswith(_NBSP, i - len(_NBSP)):
                i -= len(_NBSP)
            else:
                break
        return i

    def _anchors(self, text: str, start: int, end: int) -> Iterator[int]:
        token = self.tokens[self.anchor]
        if self._anchor_re is not None:
            m = self._anchor_re.search(text, start, end)
            while m is not None:  # overlapping occurrences too ("aa" in "aaa" at 0 and 1)
                yield m.start()
                m = self._anchor_re.search(text, m.start() + 1, end)
            return
        i = text.find(token, start, end)
        while i >= 0:
            yield i
            i = text.find(token, i + 1, end)

    def search(self, text: str | TextFile, start: int = 0, end: int | None = None
               ) -> tuple[int, int] | None:
        """(start, end) of the first occurrence within ``text[start:end]``, or None."""
        if not isinstance(text, str):
            return self._search_pieces(text, start, end)
        end = len(text) if end is None else min(end, len(text))
        lengths, k = self.lengths, self.anchor
        for a in self._anchors(text, start, end):
            # Forward from the anchor (the anchor included), then back before it.
            pos, ok = a, True
            for j in range(k, len(lengths)):
                if j > k:
                    nxt = self._sep_forward(text, pos, end)
                    if nxt == pos:
                        ok = False
                        break
                    pos = nxt
                if pos + lengths[j] > end or not self._same(text, pos, j):
                    ok = False
                    break
                pos += lengths[j]
            if not ok:
                continue
            first = a
            for j in range(k - 1, -1, -1):
                before = self._sep_back(text, first, start)
                if before == first or before - lengths[j] < start or \
                        not self._same(text, before - lengths[j], j):
                    ok = False
                    break
                first = before - lengths[j]
            if ok:
                return first, pos
        return None

    def _search_pieces(self, text: TextFile, start: int, end: int | None
                       ) -> tuple[int, int] | None:
        # Pieces in order, each overlapping the next: the first piece holding an occurrence
        # holds the first occurrence (one shorter than the overlap).
        for base, piece in text.windows(start, end, overlap=_PIECE_OVERLAP):
            found = self.search(piece)
            if found is not None:
                return base + found[0], base + found[1]
        return None


def _tokens(quote: str) -> list[str]:
    return _IGNORED.sub(" ", unicodedata.normalize("NFKC", quote)).split()


@lru_cache(maxsize=512)
def quote_matcher(quote: str) -> QuoteMatcher | None:
    """How a citation's quote is searched for (None for an empty quote)."""
    tokens = _tokens(quote)
    return QuoteMatcher(tokens, folded=True) if tokens else None


@lru_cache(maxsize=512)
def verbatim_matcher(quote: str) -> QuoteMatcher | None:
    """The quote's exact words with any whitespace between them (None for an empty quote)."""
    tokens = quote.split()
    return QuoteMatcher(tokens, folded=False) if tokens else None


def quote_pattern(quote: str) -> re.Pattern[str] | None:
    """The regular expression ``quote_matcher`` stands for (for tests and debugging: it is
    slow to compile). None for an empty quote."""
    tokens = _tokens(quote)
    if not tokens:
        return None
    parts = ["".join(_CLASSES.get(ch, re.escape(ch)) for ch in token) for token in tokens]
    return re.compile(r"(?:[\s|*_`\\]|&nbsp;)+".join(parts), re.IGNORECASE)


def find_quote(conv: ConvertedSource, quote: str) -> str | None:
    """The locator where ``quote`` first occurs; None when it does not occur at all.

    "" when it occurs outside every located part (e.g. Markdown before its first heading).
    """
    matcher = quote_matcher(quote)
    found = None if matcher is None else matcher.search(conv.text)
    if found is None:
        return None
    locator = conv.locator_at(found[0])
    return "" if locator is None else locator


def find_occurrence(conv: ConvertedSource, quote: str, *, start: int = 0,
                    end: int | None = None) -> tuple[int, int] | None:
    """(start, end) of the first occurrence of ``quote`` within ``text[start:end]``, or None."""
    matcher = quote_matcher(quote)
    return None if matcher is None else matcher.search(conv.text, start, end)


def quote_at(conv: ConvertedSource, locator: str, quote: str) -> bool:
    """True when ``quote`` occurs within the part ``locator`` names (``""`` = anywhere).

    A locator names a page, sheet, slide, section (which includes its sub-sections), a cell
    paragraph or a table row; a quote that runs past the end of that part does not count.
    """
    matcher = quote_matcher(quote)
    if matcher is None:
        return False
    if locator == "":
        return matcher.search(conv.text) is not None
    span = conv.span_of(locator)
    if span is None:
        return False
    return matcher.search(conv.text, span[0], span[1]) is not None


__all__ = ["QuoteMatcher", "find_occurrence", "find_quote", "quote_at",
           "quote_matcher", "quote_pattern", "verbatim_matcher"]
