"""Fast paths give what the slow definitions give.

- The quote matcher finds what the regular expression of the whole quote finds:
  ``quote_pattern`` (slow to compile, kept as the definition) is the oracle on random texts
  of words, separators, curly quotes, dashes and mixed case.
- ``indented_json`` writes the text ``json.dumps(indent=1, sort_keys=True)`` writes.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from keepstep.engine.files.convert.quotes import quote_matcher, quote_pattern, verbatim_matcher
from tests.support.hypothesis_profiles import examples

WORDS = ["churn", "Churn", "4.1%", "premium", "PREMIUM", "tier", "a", "aa", "don\u2019t",
         "don't", "2019\u20132024", "2019-2024", "\u201cnet\u201d", '"net"', "x",
         "\u0130stanbul"]
SEPARATORS = [" ", "  ", "\n", " | ", "**", "_", "`", "\t", "&nbsp;", " \\ "]

texts = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)),
                 min_size=1, max_size=30).map(lambda parts: "".join(w + s for w, s in parts))
quotes = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).flatmap(
    lambda words: st.lists(st.sampled_from(SEPARATORS), min_size=len(words),
                           max_size=len(words)).map(
        lambda seps: "".join(w + s for w, s in zip(words, seps, strict=True)).strip()))


@settings(max_examples=examples(400), deadline=None)
@given(text=texts, quote=quotes, cut=st.tuples(st.integers(0, 40), st.integers(0, 400)))
def test_the_matcher_finds_the_patterns_first_occurrence(text: str, quote: str,
                                                         cut: tuple[int, int]) -> None:
    start, end = min(cut[0], len(text)), min(max(cut[0], cut[1]), len(text))
    pattern, matcher = quote_pattern(quote), quote_matcher(quote)
    if pattern is None:
        assert matcher is None
        return
    assert matcher is not None
    found = pattern.search(text, start, end)
    assert matcher.search(text, start, end) == (None if found is None else found.span())


@settings(max_examples=examples(300), deadline=None)
@given(text=texts, quote=quotes)
def test_the_verbatim_matcher_is_the_words_with_any_whitespace_between(text: str,
                                                                        quote: str) -> None:
    tokens = quote.split()
    matcher = verbatim_matcher(quote)
    if not tokens:
        assert matcher is None
        return
    assert matcher is not None
    found = re.compile(r"\s+".join(map(re.escape, tokens))).search(text)
    assert matcher.search(text) == (None if found is None else found.span())


def test_a_table_row_is_found_by_its_cells_and_case_and_dashes_aside() -> None:
    text = "| Tier | Churn |\n| --- | --- |\n| **Premium** | 4.1% |\n"
    matcher = quote_matcher("premium | 4.1%")
    assert matcher is not None
    span = matcher.search(text)
    assert span is not None and text[span[0]:span[1]] == "Premium** | 4.1%"
    assert quote_matcher("Premium 4.2%").search(text) is None  # type: ignore[union-attr]
    assert quote_matcher("2019-2024").search("in 2019\u20132024")  # type: ignore[union-attr]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=25)


@settings(max_examples=examples(300), deadline=None)
@given(value=json_values, ascii=st.booleans())
def test_the_fast_indented_json_writes_what_json_dumps_writes(value: object,
                                                              ascii: bool) -> None:
    import json

    from keepstep.engine.gateway.prompts import indented_json

    assert indented_json(value, ascii=ascii) == json.dumps(value, indent=1, sort_keys=True,
                                                           ensure_ascii=ascii)
