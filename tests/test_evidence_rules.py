"""Evidence rules a real model follows (issue 20, relay run 4's blind review): entities are
never inferred, a date or publisher known only from the source register is said to be so,
a claim adds no qualifier its quote lacks and cites only the quotes that support it.

The rules are prompt text a model reads (checked here by what each prompt says) and, where
code can tell, INPUT: the writer requests say which source fields come from the register.
"""

from __future__ import annotations

from typing import Any

from keepstep.engine.gateway.prompts import load_prompt
from keepstep.engine.kinds.conflicts import Quantity
from keepstep.engine.kinds.extract import DOCUMENT, REGISTER
from keepstep.engine.kinds.synthesize import register_only


def test_extract_never_infers_an_entity() -> None:
    """extract's rule for `entity`: as the statement (or the source's title or publisher)
    names it; otherwise the source's own words or "", never a name from another statement
    or source. The quantity schema's description says the same."""
    extract = load_prompt("extract")
    assert "Never infer an entity" in extract.system
    assert "never a name from another sentence or source" in extract.system
    assert "the entity by the rule on entities" in extract.user
    described = Quantity.model_json_schema()["properties"]["entity"]["description"]
    assert "never inferred from another statement or source" in described


def test_writers_attribute_only_what_a_quote_names_and_say_register_dates() -> None:
    """synthesize, rank and render: attribution only to an organisation the cited quote (or
    its source's metadata) names, and a register-only date or publisher said to be so; the
    writers cite only supporting quotes and add no qualifier (synthesize and render)."""
    for name in ("synthesize", "rank", "render"):
        system = load_prompt(name).system
        assert "Never infer who said or owns a statement" in system, name
        assert '"from_register"' in system and "in the source register" in system, name
    for name in ("synthesize", "render"):
        system = load_prompt(name).system
        assert "Cite only what supports the sentence itself" in system, name
        assert "Add nothing a quote does not say" in system and '"in total"' in system, name


def test_the_support_check_names_added_qualifiers_as_unsupported() -> None:
    support = load_prompt("support").system
    assert "Every word of a claim counts" in support
    assert '"in total"' in support and "names the added words" in support


class _Ctx:
    """What register_only reads of a unit: each source's header lines."""

    def __init__(self, headers: dict[str, dict[str, Any]]) -> None:
        self.headers = headers

    def source_header(self, sid: str) -> dict[str, Any]:
        if sid not in self.headers:
            raise FileNotFoundError(sid)
        return self.headers[sid]


def test_register_only_names_the_date_and_publisher_the_document_does_not_state() -> None:
    """A date or publisher given by the register is register-only unless the document's own
    header states the same value; a field the document gave is never register-only; an
    unreadable header states nothing."""
    meta = {
        "Q2": {"title": "Port tariff schedule 2025", "date": "2025-02-01",
               "publisher": "Port Authority"},
        "P1": {"title": "Annual report", "date": "2024-03-15", "publisher": "Ferries Ltd"},
        "R9": {"title": "Broker note", "date": "2024-06-01"},
    }
    origins = {
        "Q2": {"title": REGISTER, "date": REGISTER, "publisher": REGISTER},
        "P1": {"title": REGISTER, "date": DOCUMENT, "publisher": REGISTER},
        "R9": {"title": REGISTER, "date": REGISTER},
    }
    ctx = _Ctx({"Q2": {}, "P1": {"title": "Annual report", "publisher": "Ferries Ltd",
                                 "date": "2024-03-15"}})
    assert register_only(ctx, meta, origins) == {  # type: ignore[arg-type]
        "Q2": ["date", "publisher"], "R9": ["date"]}


def test_code_blanks_an_entity_neither_the_quote_nor_the_source_names() -> None:
    """Relay run 4's R2: "Delivery takes about 30 months from the order." came back with
    entity "Brisland Yards", a name from the sentence before. Code blanks an entity that
    neither the quote nor the source's title or publisher names, and says so; a named one
    (also by a word's stem: "German" names "Germany"), one from the publisher and one in the
    source's own words ("the yard") stay."""
    from keepstep.engine.kinds.extract import unnamed_entities

    def item(i: str, quote: str, entity: str) -> dict[str, Any]:
        return {"id": i, "quote": quote, "quantities": [{"figure": "30", "entity": entity}]}

    items = [item("R2-e2", "Delivery takes about 30 months from the order.", "Brisland Yards"),
             item("R2-e1", "Brisland Yards quoted 30 million euro.", "Brisland Yards"),
             item("R2-e3", "German sales rose 30%.", "Germany"),
             item("R2-e4", "We grew 30% last year.", "Northwind Ltd"),
             item("R2-e5", "The yard delivers in 30 months.", "the yard")]
    notes = unnamed_entities(items, {"title": "Interview notes: shipyard sales manager",
                                     "publisher": "Northwind Ltd"})
    assert [q["entity"] for i in items for q in i["quantities"]] == [
        "", "Brisland Yards", "Germany", "Northwind Ltd", "the yard"]
    assert len(notes) == 1 and notes[0].startswith('R2-e2: entity "Brisland Yards"')
