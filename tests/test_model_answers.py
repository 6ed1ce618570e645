"""Reading model answers: lenient parsing, strict validation, problems that name the field,
the rule and the offending value; strict schemas for structured output."""

from __future__ import annotations

from pydantic import BaseModel

from keepstep.engine.gateway.answers import (
    check_answer,
    parse_json_answer,
    shorten,
    strict_schema,
    validate_answer,
)
from keepstep.engine.gateway.client import parse_json_content
from keepstep.engine.kinds.extract import ExtractAnswer
from keepstep.engine.kinds.synthesize import SynthesisAnswer


def test_fences_prose_and_trailing_commas_are_read() -> None:
    """A fenced answer, prose around the JSON and a trailing comma all parse."""
    for text in ('```json\n{"a": 1}\n```', 'Sure! Here it is:\n{"a": 1}\nHope this helps.',
                 '{"a": 1,}', '```\n{"a": 1}\n```\nThat is all.', '{"a": [1, 2,],}'):
        value, problems = parse_json_answer(text)
        assert problems == [] and value["a"] in (1, [1, 2]), text
    assert parse_json_content('Answer: {"a": 1}') == {"a": 1}


def test_an_answer_without_json_is_one_named_problem() -> None:
    """Prose without any object is a [json] problem on the whole answer, value shortened."""
    value, problems = parse_json_answer("I could not find anything. " * 30)
    assert value is None
    [p] = problems
    assert (p.field, p.rule) == ("(answer)", "json") and len(p.value) <= 160


def test_schema_problems_name_field_rule_and_value() -> None:
    """pydantic's errors become field paths ("evidence[0].figures"), rules and values."""
    _, problems = validate_answer(ExtractAnswer, {"evidence": [
        {"id": "A1-e1", "source_id": "A1", "quote": "q", "figures": "12%"}]})
    [p] = problems
    assert p.field == "evidence[0].figures" and p.rule == "schema:list_type"
    assert p.value == "12%"
    assert "evidence[0].figures [schema:list_type]" in p.line()


def test_wrong_keys_are_named_with_the_keys_needed() -> None:
    """Renamed keys: the problem says which key the answer needs and which it has."""
    _, _, problems = check_answer('{"findings": [], "overview": ""}', SynthesisAnswer)
    assert problems[0].rule == "schema:keys"
    assert "claims" in problems[0].message and "findings" in problems[0].message


def test_strict_schema_closes_objects_and_makes_optional_fields_nullable() -> None:
    """Strict structured output: additionalProperties false everywhere, every property
    required, optional ones nullable, defaults dropped."""

    class Inner(BaseModel):
        a: int
        b: str = "x"

    class Outer(BaseModel):
        items: list[Inner]
        note: str | None = None

    schema = strict_schema(Outer.model_json_schema())
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["items", "note"]
    inner = schema["$defs"]["Inner"]
    assert inner["additionalProperties"] is False and inner["required"] == ["a", "b"]
    assert inner["properties"]["b"]["type"] == ["string", "null"]
    assert "default" not in inner["properties"]["b"]


def test_shorten_keeps_values_short_and_single_line() -> None:
    assert shorten("a\n\nb") == "a b"
    assert len(shorten("x" * 500)) == 160


def test_a_null_in_an_optional_field_takes_its_default() -> None:
    """The strict schema a model is sent makes every optional field nullable, so a real model
    sends null for an owner or criteria it was not asked for (seen behind the relay): that is
    "not given", not a schema violation; a required field that is null still fails."""
    from keepstep.engine.gateway.answers import validate_answer
    from keepstep.engine.kinds.synthesize import RankAnswer

    ranked = {"risks": [{"id": "R1", "title": "Vendor failure", "score": 12,
                         "evidence_ids": ["F1-e2"], "criteria": None, "owner": None,
                         "mitigation": None, "likelihood": None}],
              "round": None, "revisions": None}
    answer, problems = validate_answer(RankAnswer, ranked)
    assert problems == []
    assert answer is not None and answer.risks[0].owner == "" and answer.risks[0].criteria == {}
    _, problems = validate_answer(RankAnswer, {"risks": None})
    assert [p.rule for p in problems] == ["schema:list_type"]
