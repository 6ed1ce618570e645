"""No sample pack's content in engine code: ME-042's titles, companies, places, audiences,
topic keywords, risk titles and recommendation rule live in sample_projects/, not engine/."""

from __future__ import annotations

import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"
# The ME-042 acceptance drill replays the reference story against the sample pack by name
# (its run id, its audiences): it is a drill of that pack, not engine behaviour.
EXEMPT = {ENGINE / "drills" / "story.py"}
ME042 = [
    "Brightwell", "Norvania", "Norvanian", "product team", "investment committee",
    "water meter", "metered water", "Aquilon", "HydraSense", "Kestrel", "NWSA", "NVK", "krona",
    "Type approval delays", "Incumbent price cuts", "Installer shortage", "Meter-data",
    "Battery life below", "Network coverage gaps", "Run a pilot first", "staged entry",
    "(A-L)", "market-overview", "ME-042", "market-entry",
]
VENDOR_DD = ["Harbourline", "StackWise", "Corvane", "Orrin", "Aldermere", "operations director"]


def engine_files() -> list[Path]:
    return sorted(p for p in ENGINE.rglob("*") if p.suffix in (".py", ".md", ".toml")
                  and p not in EXEMPT and "__pycache__" not in p.parts)


def test_engine_code_names_no_sample_pack_content() -> None:
    """Scanning every engine source, prompt and data file finds none of the packs' strings."""
    pattern = re.compile("|".join(re.escape(s) for s in ME042 + VENDOR_DD), re.IGNORECASE)
    found = [f"{p.relative_to(ENGINE)}:{n}: {m.group(0)}"
             for p in engine_files()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1)
             for m in [pattern.search(line)] if m]
    assert not found, "\n".join(found)


def test_the_vocabulary_lives_in_the_packs_data_files() -> None:
    """ME-042's topics, audiences, risk checklist and recommendation rule are pack files."""
    pack = ENGINE.parent / "sample_projects" / "market-entry" / "data"
    assert {p.stem for p in pack.glob("*.toml")} == {"topics", "audiences", "risks",
                                                     "recommendation"}
    assert "Type approval delays market entry" in (pack / "risks.toml").read_text()
    assert "investment committee" in (pack / "audiences.toml").read_text()
