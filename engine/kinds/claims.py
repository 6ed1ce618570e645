"""Claims against their quotes: stated figures, checked calculations, and the support check.

A claim (a synthesis finding, a document's sentence) cites evidence ids. Code checks what
code can: every figure the claim states is in a quote it cites, or is the result of the
claim's ``calculation`` — an arithmetic expression over figures of the cited quotes that
code recomputes (``evaluate``: numbers, + - * / and parentheses, ``15%`` as 0.15; no names,
no calls, no ``eval``). A figure is one quantity however it is written: "18 million" states 18
and 18000000, "four" states 4 (``quote_values``), in a quote, a claim's text and an operand.
What only a reader can judge — whether the quotes *say* what the claim says — is asked of the
model afterwards (``support_judge``): per claim, do its cited quotes support it, contradict it
or not address it (an enum), and every claim not supported goes back to the writer as a named
problem to revise.

Callers may rely on: ``calculation_problems`` passing exactly when every operand is a cited
figure (a number a cited quote writes in digits or as a word, at its written scale or as
the whole number — "18 million" is 18 or 18000000, "22000000" is also 22 (million) — or one
of ``FREE_CONSTANTS``:
1, 100, 1000 and the calendar's 7, 12, 24, 52, 60, 365), the result a calculation writes after
``=`` (if any) is what its arithmetic gives, and each recomputed result (several
calculations separated by ``;``) is a figure the text states (to the
precision the text writes it, or as a percentage, at either scale: "4 million" states 4 and
4000000); ``claim_rules`` giving one named problem
per broken rule, so a revise round can say which claim broke which.

A difference stated beside both its ends ("varying by 4 million euro (18 to 22 million)")
is an implicit calculation: with ``ranges=True`` (the rank step's figures; not a claim's,
whose derived figures need their ``calculation``) it passes when code recomputes it as the
difference of the two ends written in the same field ("A to B", "A-B", "from A to B",
"between A and B"), and both ends are themselves figures of the cited quotes. A difference
whose ends are not both cited, or that is not their difference, is a missing figure as
before, and the feedback names it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from keepstep.engine.gateway.answers import Problem, problem
from keepstep.engine.gateway.offline_rules import normalise
from keepstep.engine.kinds.model_step import known_ids

# A figure standing on its own: "2026", "4.5%", "1,250" — not the digits of "S01" or "A1-e3".
_FIGURE_RE = re.compile(r"(?<![A-Za-z0-9_.,-])\d+(?:[.,]\d+)*%?(?![A-Za-z0-9_-])")
# Operands of a calculation: a number, optionally with thousands separators and a percent sign.
_OPERAND_RE = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?%?|\.\d+%?")
# Constants a calculation may use without citing them: per-cent and per-mille scaling, and
# the calendar's conversions (a monthly price over a year, a weekly volume over a year).
FREE_CONSTANTS = frozenset({1.0, 100.0, 1000.0, 7.0, 12.0, 24.0, 52.0, 60.0, 365.0})
# Numbers a quote writes as words ("six sites", "a five-year term") are figures it states.
_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
          "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
         "eighty": 80, "ninety": 90}
_WORD_NUMBERS = {w: float(n) for n, w in enumerate(_UNITS)} | {
    w: float(n) for w, n in _TENS.items()} | {
    # "twenty-four", "twenty four"
    f"{t}{sep}{u}": float(n + i) for t, n in _TENS.items() for i, u in enumerate(_UNITS)
    if 0 < i < 10 for sep in ("-", " ")} | {"hundred": 100.0, "dozen": 12.0}
_WORD_RE = re.compile(r"[a-z]+")
_COMPOUND_RE = re.compile(rf"\b(?:{'|'.join(_TENS)})[- ](?:{'|'.join(_UNITS[1:10])})\b")
# A scale word after a figure: "18 million" is 18000000 (the number as a quantity).
_SCALE_WORDS = {"thousand": 1e3, "million": 1e6, "mn": 1e6, "mio": 1e6, "billion": 1e9,
                "bn": 1e9}
_SCALE_AFTER_RE = re.compile(r"\s*(thousand|million|mn|mio|billion|bn)\b")
_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv}
_MAX_EXPRESSION = 300

Verdict = Literal["supports", "contradicts", "does_not_address"]


class CalculationError(ValueError):
    """An expression that is not plain arithmetic over numbers."""


def figures_of(text: str) -> list[str]:
    """The stand-alone figures of a text, in order."""
    return _FIGURE_RE.findall(text)


# Numbers that name rather than measure: a version, release, standard or label ("release
# 12.4", "TLS 1.2", "SOC 2", "ISO 27001", "tier 2", "P1" is not a figure already), and dates
# (a day beside its month, a year): a claim may state them without a quote holding them.
_MONTHS = ("jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
           "sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?")
_LABEL_WORDS = ("version|release|v|build|model|tls|ssl|soc|iso|iec|nist|pci|dss|gdpr|hipaa|"
                "android|ios|windows|java|python|phase|tier|level|stage|step|round|clause|"
                "section|article|annex|schedule|appendix|exhibit|chapter|page|p|item|no|"
                "number|type|class|category|priority|sev|severity|generation|gen|wave|lot")
_NAMING_RE = re.compile(
    rf"(?:\b(?:{_LABEL_WORDS})\.?\s*(?:/\s*[a-z]+\s*)?)(\d+(?:\.\d+)*)(?!\d|,\d)"
    rf"|\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b"
    rf"|\b(?:{_MONTHS})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b"
    r"|(?<![\d,.])((?:19|20)\d\d)(?!\d|%|[.,]\d)")


def stated_figures(text: str) -> list[str]:
    """The figures a text states as quantities (``figures_of`` of its normalised form),
    without the numbers that name something: versions, releases, standards and labels, days
    beside their month, and years."""
    norm = normalise(text)
    naming = [m.span(g) for m in _NAMING_RE.finditer(norm) for g in range(1, 5)
              if m.group(g) is not None]
    return [m.group(0) for m in _FIGURE_RE.finditer(norm) if m.span() not in naming]


def word_numbers(text: str) -> set[float]:
    """The numbers a text writes as words ("four weeks", "twenty-four months", "a dozen")."""
    norm = normalise(text)
    compounds = _COMPOUND_RE.findall(norm)
    return {_WORD_NUMBERS[w] for w in _WORD_RE.findall(_COMPOUND_RE.sub(" ", norm)) + compounds
            if w in _WORD_NUMBERS}


def scaled_figures(text: str) -> list[tuple[str, float]]:
    """Each stand-alone figure of a (normalised) text with the scale word written after it
    ("18 million" -> ("18", 1e6); "412,000" -> ("412,000", 1.0))."""
    out = []
    for m in _FIGURE_RE.finditer(text):
        scale = _SCALE_AFTER_RE.match(text, m.end())
        out.append((m.group(0), _SCALE_WORDS[scale.group(1)] if scale and not
                    m.group(0).endswith("%") else 1.0))
    return out


def quote_values(quote: str) -> set[float]:
    """Every value a quote states: its figures as written, each with its scale word read
    ("18 million" states 18 and 18000000), and its numbers written in words (so "18 million
    euro" and "18000000 euro" are one quantity wherever figures are compared)."""
    norm = normalise(quote)
    out = word_numbers(norm)
    for figure, scale in scaled_figures(norm):
        value = figure_value(figure)
        out |= {value, value * scale}
    return out


def figure_value(figure: str) -> float:
    """``"1,250"`` -> 1250.0, ``"4.5%"`` -> 4.5 (the number as written, percent sign off)."""
    text = figure.rstrip("%")
    text = text.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", text) else \
        text.replace(",", ".")
    return float(text)


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression: numbers (``1,250``, ``4.5``, ``15%`` = 0.15),
    ``+ - * /``, unary minus and parentheses. CalculationError for anything else."""
    if len(expression) > _MAX_EXPRESSION:
        raise CalculationError("the calculation is too long")
    text = _OPERAND_RE.sub(lambda m: repr(_operand(m.group(0))), expression.replace("×", "*")
                           .replace("÷", "/").replace("−", "-"))
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"not an arithmetic expression: {exc.msg}") from None
    return _walk(tree.body)


def _operand(figure: str) -> float:
    value = figure_value(figure) if figure[0] != "." else float(figure.rstrip("%"))
    return value / 100 if figure.endswith("%") else value


def _walk(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculationError("division by zero")
        return _OPS[type(node.op)](left, right)
    raise CalculationError(f"only numbers, + - * / and parentheses are allowed "
                           f"(found {type(node).__name__})")


def split_calculation(text: str) -> tuple[str, str | None]:
    """``"1200 * 0.85 = 1020"`` -> ("1200 * 0.85", "1020"); no ``=``: (text, None)."""
    left, sep, right = text.partition("=")
    return (left.strip(), right.strip() or None) if sep else (text.strip(), None)


def _decimals(figure: str) -> int:
    text = figure.rstrip("%")
    if re.fullmatch(r"\d{1,3}(,\d{3})+", text):
        return 0
    return len(re.split(r"[.,]", text, maxsplit=1)[1]) if re.search(r"[.,]", text) else 0


def states(figure: str, value: float) -> bool:
    """Whether ``figure`` as written is ``value`` at the precision it is written with (a
    percentage may also state a fraction: "85%" states 0.85)."""
    wanted = figure_value(figure)
    tolerance = 0.5 * 10 ** -_decimals(figure) + 1e-9
    candidates = [value, value * 100] if figure.endswith("%") else [value]
    return any(abs(c - wanted) <= tolerance for c in candidates)


def calculation_problems(at: str, text: str, calculation: str, ids: list[str],
                         quotes: Mapping[str, str]) -> tuple[list[Problem], set[str]]:
    """The problems of a claim's calculation, and the figures of ``text`` it accounts for.
    Several calculations may stand in one, separated by ``;``: each is checked on its own."""
    cited: set[float] = set()
    for i in ids:
        cited |= quote_values(quotes.get(i, ""))
    # An operand carries no scale word: a quote's 22000000 may be used as 22 (million) or
    # 22000 (thousand), as its "18 million" may be used as 18 or 18000000.
    cited |= {v / scale for v in cited for scale in (1e3, 1e6, 1e9)
              if v >= scale and v % scale == 0}
    out: list[Problem] = []
    accounted: set[str] = set()
    for part in (p.strip() for p in calculation.split(";")):
        if not part:
            continue
        expression, stated = split_calculation(part)
        try:
            value = evaluate(expression)
        except CalculationError as exc:
            out.append(problem(f"{at}.calculation", "calculation", str(exc), part))
            continue
        # A result written after "=" must be what the arithmetic gives ("22 - 18 = 5" is wrong).
        written = figures_of(normalise(stated or ""))
        if len(written) == 1 and not states(written[0], value):
            out.append(problem(f"{at}.calculation", "calculation_stated",
                               f"the arithmetic gives {value:g}, not {written[0]}", part))
        for operand in _OPERAND_RE.findall(expression):
            number = figure_value(operand) if operand[0] != "." else float(operand.rstrip("%"))
            if number not in cited and number not in FREE_CONSTANTS:
                out.append(problem(f"{at}.calculation", "calculation_operand",
                                   "the operand is in none of the cited quotes", operand))
        # "3 million" states 3000000 as well as 3 (the operands may be scaled either way).
        these = {f for f, scale in scaled_figures(normalise(text))
                 if states(f, value) or (scale != 1.0 and states(f, value / scale))}
        if not these:
            out.append(problem(f"{at}.calculation", "calculation_result",
                               f"the calculation gives {value:g}, which the text does not "
                               "state", part))
        accounted |= these
    return out, accounted


# A range written with both its ends: "18 to 22", "18-22", "from 18 to 22", "between 18 and 22".
_RANGE_RE = re.compile(r"(?<![A-Za-z0-9_.,-])(\d+(?:[.,]\d+)*)\s*(?:to|-|–|—|and)\s*"
                       r"(\d+(?:[.,]\d+)*)(?![A-Za-z0-9_-])")


def range_differences(text: str, cited: set[str]) -> set[str]:
    """The figures of ``text`` that are the difference of a range written in ``text`` whose
    two ends are both ``cited`` figures (an implicit calculation code recomputes)."""
    norm = normalise(text)
    differences = [abs(figure_value(b) - figure_value(a)) for a, b in _RANGE_RE.findall(norm)
                   if a in cited and b in cited]
    return {f for f in figures_of(norm) if f not in cited
            and any(states(f, d) for d in differences)}


def figure_problems(at: str, text: str, ids: list[str], quotes: Mapping[str, str],
                    calculation: str | None = None, ranges: bool = False,
                    field: str = "text") -> list[Problem]:
    """A problem per figure of ``text`` that none of the cited quotes contains and the
    claim's checked calculation does not give (with ``ranges``, nor is the difference of a
    range of cited figures written beside it); and the calculation's own problems.
    ``field`` names the checked field in the problem (``{at}.{field}``)."""
    cited: set[str] = set()
    values: set[float] = set()
    for i in ids:
        cited |= set(figures_of(normalise(quotes.get(i, ""))))
        values |= quote_values(quotes.get(i, ""))
    out: list[Problem] = []
    derived: set[str] = set()
    if calculation:
        out, derived = calculation_problems(at, text, calculation, ids, quotes)
        if out:
            derived = set()
    if ranges:
        derived |= range_differences(text, cited)
    # A figure the quote writes another way is the same figure: "4" for "four", "18,000,000"
    # for "18 million" (and "18 million" for "18,000,000").
    scales = dict(scaled_figures(normalise(text)))
    # Numbers in the calculation itself restate cited figures; only the text is checked.
    return out + [problem(f"{at}.{field}", "cited_figure", "the figure is in none of the cited "
                          "quotes (a derived figure needs its calculation)", f)
                  for f in stated_figures(text) if f not in cited and f not in derived
                  and _value_of(f, scales) not in values]


def _value_of(figure: str, scales: Mapping[str, float]) -> float | None:
    """A stated figure's value with the scale word the text writes after it (None when it
    is not a number: a percentage is compared as written only)."""
    if figure.endswith("%"):
        return None
    try:
        return figure_value(figure) * scales.get(figure, 1.0)
    except ValueError:
        return None


def figure_holders(text: str, ids: list[str], quotes: Mapping[str, str],
                   calculation: str | None = None) -> list[str]:
    """The ids a claim's citation names in a document: when the text states a figure, the
    cited quotes that hold one of its figures (or, with a calculation, one of its operands),
    and the cited quotes that state no quantity at all (they support the sentence's other
    clauses: advice, a requirement, a definition), in the order cited; every cited id when
    it states none, or none of them holds one. A cited quote whose only quantities are
    figures the sentence does not state is left out: a reader follows a citation to the
    quote holding the figure, not to each id of a finding."""
    stated = set(stated_figures(text))
    operands: set[float] = set()
    for part in (calculation or "").split(";"):
        expression, _result = split_calculation(part)
        for operand in _OPERAND_RE.findall(expression):
            value = figure_value(operand) if operand[0] != "." else float(operand.rstrip("%"))
            if value not in FREE_CONSTANTS:
                operands.add(value)
    if not stated and not operands:
        return list(ids)
    keep: list[str] = []
    holds = False
    scales = dict(scaled_figures(normalise(text)))
    stated_values = {v for f in stated for v in [_value_of(f, scales)] if v is not None}
    for i in ids:
        quote = normalise(quotes.get(i, ""))
        held = set(figures_of(quote))
        values = quote_values(quote)
        if held & stated or values & operands or values & stated_values:
            keep.append(i)
            holds = True
        elif not stated_figures(quote):
            keep.append(i)
    return keep if holds else list(ids)


def claim_rules(field_name: str, quotes: Mapping[str, str]) -> Any:
    """Rules for an answer of claims: text, at least one known id, figures in the cited
    quotes or given by a checked calculation."""

    def rules(answer: Any, inputs: Mapping[str, Any]) -> list[Problem]:
        claims = getattr(answer, field_name)
        problems: list[Problem] = []
        if quotes and not claims:
            problems.append(problem(field_name, "non_empty", "no claims were made"))
        for n, c in enumerate(claims):
            at = f"{field_name}[{n}]"
            if not c.text.strip():
                problems.append(problem(f"{at}.text", "required", "the claim has no text"))
            if not c.evidence_ids:
                problems.append(problem(f"{at}.evidence_ids", "cites", "cites no evidence"))
            problems += known_ids(f"{at}.evidence_ids", c.evidence_ids, set(quotes))
            problems += figure_problems(at, c.text, c.evidence_ids, quotes,
                                        getattr(c, "calculation", None))
        return problems

    return rules


# --- the support check -----------------------------------------------------------------------
class SupportVerdict(BaseModel):
    model_config = ConfigDict(extra="allow")

    claim: str = Field(description="the claim's id in INPUT")
    verdict: Verdict = Field(description="supports: the cited quotes state it (or give the "
                             "figures its calculation uses); contradicts: they say otherwise; "
                             "does_not_address: they do not speak to it")
    reason: str = Field(default="", description="one short sentence")


class SupportAnswer(BaseModel):
    """The support check's answer: one verdict per claim."""

    model_config = ConfigDict(extra="allow")

    verdicts: list[SupportVerdict]


def support_inputs(field_name: str, claims: list[Any], quotes: Mapping[str, str],
                   headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """INPUT of the support check: each claim with the quotes it cites (only those), a table
    row's quote with its table's header row (``headers``), so its cells can be read."""
    headers = headers or {}
    return {"task": "support", "claims": [
        {"id": f"{field_name}[{n}]", "text": c.text,
         **({"calculation": c.calculation} if getattr(c, "calculation", None) else {}),
         "quotes": [{"id": i, "quote": quotes[i],
                     **({"table_header": headers[i]} if headers.get(i) else {})}
                    for i in c.evidence_ids if i in quotes]}
        for n, c in enumerate(claims)]}


def support_problems(field_name: str, claims: list[Any], answer: SupportAnswer | None
                     ) -> list[Problem]:
    """A problem per claim the check did not find supported (or did not judge)."""
    if answer is None:
        return []
    verdicts = {v.claim: v for v in answer.verdicts}
    out = []
    for n, c in enumerate(claims):
        at = f"{field_name}[{n}]"
        v = verdicts.get(at)
        if v is None:
            continue
        if v.verdict != "supports":
            words = {"contradicts": "its cited quotes contradict it",
                     "does_not_address": "its cited quotes do not address it"}[v.verdict]
            out.append(problem(f"{at}.text", f"support:{v.verdict}",
                               f"{words}{': ' + v.reason if v.reason else ''}; rewrite the "
                               "claim to say what the quotes say, cite the quotes that say "
                               "it, or drop it", c.text))
    return out


__all__ = ["FREE_CONSTANTS", "CalculationError", "SupportAnswer", "SupportVerdict",
           "calculation_problems", "claim_rules", "evaluate", "figure_holders", "figure_problems",
           "figure_value", "quote_values", "scaled_figures", "word_numbers",
           "figures_of", "range_differences", "split_calculation", "stated_figures", "states",
           "support_inputs", "support_problems"]
