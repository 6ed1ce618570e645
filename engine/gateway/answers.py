"""Reading a model's answer: lenient parsing, strict validation, named problems.

A model answer goes through three gates, each turning what is wrong into ``Problem`` rows
that name the field, the rule and the offending value (what a revise round feeds back):

1. ``parse_json_answer`` — lenient: a Markdown fence, prose before or after the JSON and
   small syntax slips (trailing commas, a missing closing bracket) are tolerated. The text is
   tried as plain JSON first, then from its first ``{``, and only then repaired with the
   ``json-repair`` library (which would otherwise "repair" almost anything into something).
   An answer whose JSON never closes (an object or a string left open: the model stopped
   mid-answer) is repaired only so its partial value can be reported: it is a ``truncated``
   problem, and the kind revises it rather than taking what json-repair had to invent.
2. ``validate_answer`` — strict: the parsed value against the kind's pydantic model.
3. the kind's own rules (verbatim quotes, known ids, score ranges) — in the kinds.

``json_schema_of`` / ``strict_schema`` give the JSON Schema sent to a provider. Nothing here
imports litellm; ``Problem`` values are shortened so a stored problem never carries more of
a source than the offending quote.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

VALUE_CHARS = 160
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)\n?```", re.DOTALL)
# Keywords OpenAI's strict structured output rejects; dropped from a strict schema.
_STRICT_UNSUPPORTED = ("default", "minLength", "maxLength", "$schema")


class Problem(BaseModel):
    """One thing wrong with an answer: where (``field``), which rule, what was there."""

    model_config = ConfigDict(frozen=True)

    field: str
    rule: str
    message: str
    value: str = ""

    def line(self) -> str:
        got = f" (got {self.value})" if self.value else ""
        return f"{self.field} [{self.rule}]: {self.message}{got}"


def shorten(value: Any, limit: int = VALUE_CHARS) -> str:
    """A short, single-line rendering of an offending value (JSON for non-strings)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def problem(field: str, rule: str, message: str, value: Any = "") -> Problem:
    return Problem(field=field, rule=rule, message=message,
                   value=shorten(value) if value not in ("", None) else "")


def summary(problems: Iterable[Problem], shown: int = 3) -> str:
    """``"2 problem(s): a [rule]: …; b [rule]: …"`` — short enough for a ledger row."""
    items = list(problems)
    text = "; ".join(p.line() for p in items[:shown])
    more = f" (+{len(items) - shown} more)" if len(items) > shown else ""
    return f"{len(items)} problem(s): {text}{more}"


# --- 1. parse --------------------------------------------------------------------------------

def _candidates(text: str) -> list[str]:
    """Pieces of ``text`` that may hold the JSON, most likely first."""
    out = []
    for lang, body in _FENCE_RE.findall(text):
        if lang.lower() in ("", "json", "jsonc", "json5"):
            out.append(body.strip())
    out.append(text.strip())
    return out


def parse_json_answer(text: str) -> tuple[Any, list[Problem]]:
    """The JSON object in a model's answer, or ``(None, [problem])`` when there is none."""
    if not text or not text.strip():
        return None, [problem("(answer)", "json", "the answer is empty")]
    decoder = json.JSONDecoder()
    for candidate in _candidates(text):
        try:
            return json.loads(candidate), []
        except ValueError:
            pass
        start = candidate.find("{")
        if start < 0:
            continue
        try:
            value, _end = decoder.raw_decode(candidate[start:])
            return value, []
        except ValueError:
            pass
        repaired = _repair(candidate[start:])
        if isinstance(repaired, dict) and repaired:
            if unclosed(candidate[start:]):
                return repaired, [problem(
                    "(answer)", "truncated", "the JSON stops before it closes (the answer "
                    "was cut off); answer again with the complete JSON object, more briefly "
                    "if it is long")]
            return repaired, []
    return None, [problem("(answer)", "json", "the answer holds no JSON object; answer with "
                          "one JSON object only", text)]


def unclosed(text: str) -> bool:
    """Whether JSON text ends inside a string or an open object or array (it was cut off),
    as opposed to a slip json-repair mends without inventing an ending (a trailing comma)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_string or depth > 0


def _repair(text: str) -> Any:
    import json_repair  # lazily: only answers that are not plain JSON need it

    try:
        return json_repair.loads(text)
    except Exception:  # noqa: BLE001 - a repair that fails is simply no answer
        return None


# --- 2. validate -----------------------------------------------------------------------------

def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(answer)"


def validate_answer(schema: type[BaseModel], value: Any) -> tuple[BaseModel | None,
                                                                    list[Problem]]:
    """``value`` as an instance of ``schema``, or the problems pydantic found (named)."""
    if not isinstance(value, dict):
        return None, [problem("(answer)", "schema:type", "the answer must be a JSON object",
                              value)]
    try:
        return schema.model_validate(_nulls_as_absent(schema, value)), []
    except ValidationError as exc:
        problems = [problem(_loc(e["loc"]), f"schema:{e['type']}", e["msg"],
                            "" if e["type"] == "missing" else e.get("input", ""))
                    for e in exc.errors()]
    expected = sorted(schema.model_fields)
    unexpected = sorted(set(value) - set(expected))
    missing = [p for p in problems if p.rule == "schema:missing" and "." not in p.field
               and "[" not in p.field]
    if missing and unexpected:
        # Wrong keys: say which ones the answer has and which it must have.
        problems.insert(0, problem("(answer)", "schema:keys",
                                   f"the answer needs the key(s) "
                                   f"{', '.join(p.field for p in missing)} (of "
                                   f"{', '.join(expected)}); it has {', '.join(unexpected)}"))
    return None, problems


def check_answer(text: str, schema: type[BaseModel]) -> tuple[BaseModel | None, dict[str, Any],
                                                                list[Problem]]:
    """Parse then validate: ``(instance or None, the parsed dict or {}, problems)``."""
    value, problems = parse_json_answer(text)
    if problems:
        # A cut-off answer keeps its partial value for the kind to report; it is not valid.
        return None, value if isinstance(value, dict) else {}, problems
    parsed, problems = validate_answer(schema, value)
    return parsed, value if isinstance(value, dict) else {}, problems


# --- schemas ---------------------------------------------------------------------------------

def json_schema_of(schema: type[BaseModel]) -> dict[str, Any]:
    """The pydantic model's JSON Schema (as a provider or a prompt sees it)."""
    return schema.model_json_schema()


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy fit for strict structured output: every object closed, every property
    required (an optional one becomes nullable), unsupported keywords dropped."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items() if k not in _STRICT_UNSUPPORTED}
        props = out.get("properties")
        if out.get("type") == "object" or isinstance(props, dict):
            props = props if isinstance(props, dict) else {}
            required = set(node.get("required") or [])
            for name, prop in list(props.items()):
                if name not in required:
                    props[name] = _nullable(prop)
            out["properties"] = props
            out["required"] = list(props)
            out["additionalProperties"] = False
        return out

    return walk(schema)


def _nulls_as_absent(schema: type[BaseModel], value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with a null left out where the field is optional but not nullable: the
    strict schema a model is sent makes every optional field nullable (``strict_schema``), so
    a null there means "not given" and takes the field's default. Nested models likewise."""
    out = dict(value)
    for name, field in schema.model_fields.items():
        key = field.alias or name
        if key not in out:
            continue
        item = out[key]
        nested = _model_of(field.annotation)
        if item is None and not field.is_required() and not _allows_none(field.annotation):
            del out[key]
        elif nested is not None and isinstance(item, dict):
            out[key] = _nulls_as_absent(nested, item)
        elif nested is not None and isinstance(item, list):
            out[key] = [_nulls_as_absent(nested, x) if isinstance(x, dict) else x for x in item]
    return out


def _allows_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, directly or as a list's items."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    if isinstance(prop.get("enum"), list) and None not in prop["enum"]:
        # An enum restricts the value whatever the type says: null must be one of it (a
        # topic no name fits is null, never forced into a topic).
        prop = {**prop, "enum": [*prop["enum"], None]}
    kind = prop.get("type")
    if isinstance(kind, str):
        return {**prop, "type": [kind, "null"]}
    if isinstance(kind, list):
        return prop if "null" in kind else {**prop, "type": [*kind, "null"]}
    if "anyOf" in prop:
        options = prop["anyOf"]
        return prop if {"type": "null"} in options else {
            **prop, "anyOf": [*options, {"type": "null"}]}
    return {"anyOf": [prop, {"type": "null"}]}


__all__ = ["Problem", "check_answer", "json_schema_of", "parse_json_answer", "problem",
           "shorten", "strict_schema", "summary", "unclosed", "validate_answer"]
