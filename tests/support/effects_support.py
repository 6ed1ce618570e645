"""A small project whose deliver unit waits for a person: the webhook applied the POST, the
answer was lost, and the lookup could not tell — the state `keepstep effects settle` is for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keepstep.engine import open_project
from tests.support.engine_harness import RUN, make_small_project
from tests.support.small_project import small_units

FILES = ("U08:evidence-table.csv", "U06:synthesis.md")


def deliver_units(adapter: str = "crm") -> list[dict[str, Any]]:
    return [*small_units(), {
        "id": "U09", "title": "Deliver to the client", "phase": "delivery", "kind": "deliver",
        "outputs": ["delivery.json"], "depends_on": ["U06", "U08"], "validators": ["delivered"],
        "required_final": True, "params": {"adapter": adapter, "files": list(FILES)}}]


class LostAnswers:
    """The real adapter, but the answer to each POST is lost and lookups cannot tell."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name

    def __getattr__(self, name: str) -> Any:
        # The same destination (url) as the real adapter: a delivery's key names it.
        return getattr(self.inner, name)

    def perform(self, key: str, request: dict[str, Any]) -> str:
        self.inner.perform(key, request)
        raise TimeoutError("the answer was lost on the way back")

    def lookup(self, key: str) -> Any:
        raise ConnectionError("the lookup endpoint is down")


def blocked_on_unknown_webhook(root: Path, url: str) -> tuple[Path, str]:
    """(project, the key of the effect that waits for a person)."""
    make_small_project(root, units=deliver_units(),
                       adapters={"crm": {"type": "webhook", "url": url, "timeout_s": 2}})
    with open_project(root) as p:
        p.effect_adapters = {"crm": LostAnswers(p.effect_adapters["crm"])}
        run = p.open_or_start(RUN)
        run.run()
        status = run.resume()  # recovery asks; the lookup cannot tell: a person must decide
        assert status.decision == "blocked", status.reasons
        [row] = [e for e in run.effects() if e.needs_person]
        return root, row.key
