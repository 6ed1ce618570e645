"""A small project for the engine fault tests: 8 units over two source groups of the pack.

A full run takes well under a second (plus litellm's import on the first model call), so
crash, budget and recovery tests can run it many times. Units, in plan order:

    U01 intake inventory (group A, B)      U05 verify A + B (1 call)
    U02 intake evidence schema             U06 synthesize (1 call)        required
    U03 extract group A (1 call/source)    U07 rank, at most 2 rounds     required
    U04 extract group B (1 call/source)    U08 render the evidence table  required

With two sources per group the run makes 2 + 2 + 1 + 1 + 2..4 model calls. Only the
chosen sources, the pack's templates and its data files (vocabulary) are copied.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

PACK = Path(__file__).resolve().parents[2] / "sample_projects" / "market-entry"
GROUPS = ("A", "B")
MODEL_UNITS = ("U03", "U04", "U05", "U06", "U07")

DEFAULT_CONFIG: dict[str, Any] = {
    "name": "small",
    "default_model": "local/keepstep-offline",
    # The crash, budget and recovery tests count calls and kills in plan order: one unit at
    # a time (tests/test_parallel*.py run this project with more jobs).
    "max_parallel": 1,
    "budget": {"calls": 200, "tokens": 1_000_000, "cost": 5.0, "retries": 50,
               "recoveries": 50},
    "policy": {"lease_seconds": 30.0, "heartbeat_seconds": 10.0, "max_unit_retries": 2,
               "max_recoveries": 5, "recovery_cooldown_s": 0.0,
               "stall_no_commit_s": 1800.0, "stall_repeated_errors": 3},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def small_units(groups: tuple[str, ...] = GROUPS) -> list[dict[str, Any]]:
    a, b = groups
    return [
        {"id": "U01", "title": "Inventory", "phase": "intake", "kind": "intake",
         "inputs": [f"group:{a}", f"group:{b}"], "outputs": ["inventory.json"],
         "validators": ["structure"], "params": {"step": "inventory"}},
        {"id": "U02", "title": "Evidence schema", "phase": "intake", "kind": "intake",
         "outputs": ["evidence-schema.json"], "validators": ["structure"],
         "params": {"step": "schema"}},
        {"id": "U03", "title": f"Extract group {a}", "phase": "extraction", "kind": "extract",
         "inputs": [f"group:{a}"], "outputs": ["evidence.json"],
         "depends_on": [{"unit": "U02", "edge": "structure"}],
         "validators": ["structure", "citations"]},
        {"id": "U04", "title": f"Extract group {b}", "phase": "extraction", "kind": "extract",
         "inputs": [f"group:{b}"], "outputs": ["evidence.json"],
         "depends_on": [{"unit": "U02", "edge": "structure"}],
         "validators": ["structure", "citations"]},
        {"id": "U05", "title": f"Verify groups {a} + {b}", "phase": "verification",
         "kind": "verify", "inputs": [f"group:{a}", f"group:{b}"],
         "outputs": ["verified.json"], "depends_on": ["U03", "U04"],
         "validators": ["structure", "citations", "claim_check"]},
        {"id": "U06", "title": "Market size", "phase": "synthesis", "kind": "synthesize",
         "outputs": ["synthesis.json", "synthesis.md"], "depends_on": ["U05"],
         "validators": ["structure", "citations"], "required_final": True,
         "params": {"question": "How large is the market, and what does regulation require?"}},
        {"id": "U07", "title": "Risk ranking", "phase": "synthesis", "kind": "rank",
         "outputs": ["ranking.json", "ranking.md"], "depends_on": ["U05"],
         "validators": ["structure", "citations", "claim_check"], "max_rounds": 2,
         "required_final": True,
         "params": {"question": "What could stop or slow the entry?"}},
        {"id": "U08", "title": "Evidence table", "phase": "deliverables", "kind": "render",
         "inputs": ["template:evidence-table"], "outputs": ["evidence-table.csv"],
         "depends_on": ["U05"], "validators": ["structure", "citations"],
         "required_final": True,
         "params": {"document": "evidence-table", "template": "evidence-table"}},
    ]


def write_plan(root: Path, units: list[dict[str, Any]], *,
               deliverables: list[str] | None = None) -> None:
    if deliverables is None:
        deliverables = [o for o in ("evidence-table.csv",)
                        if any(o in u.get("outputs", []) for u in units)]
    doc = {"plan": {"title": "small keepstep test plan", "deliverables": deliverables},
           "unit": units}
    (root / "plan.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")


def write_config(root: Path, **overrides: Any) -> dict[str, Any]:
    """Merge ``overrides`` (nested dicts merge) into keepstep.toml and write it."""
    path = root / "keepstep.toml"
    current = tomllib.loads(path.read_text()) if path.is_file() else DEFAULT_CONFIG
    cfg = _merge(current, overrides)
    path.write_text(tomli_w.dumps(cfg), encoding="utf-8")
    return cfg


def make_small_project(dest: Path, *, per_group: int = 2, groups: tuple[str, ...] = GROUPS,
                       units: list[dict[str, Any]] | None = None,
                       **config: Any) -> Path:
    """Write a small project into ``dest`` (created) and return it.

    ``units`` replaces the default 8-unit plan; ``config`` is merged into keepstep.toml.
    """
    dest.mkdir(parents=True, exist_ok=True)
    sources = tomllib.loads((PACK / "sources.toml").read_text())["source"]
    chosen = []
    for group in groups:
        chosen += sorted((s for s in sources if s["group"] == group),
                         key=lambda s: s["id"])[:per_group]
    (dest / "sources").mkdir(exist_ok=True)
    for s in chosen:
        shutil.copy2(PACK / s["path"], dest / s["path"])
    (dest / "sources.toml").write_text(tomli_w.dumps({"source": chosen}), encoding="utf-8")
    shutil.copytree(PACK / "templates", dest / "templates", dirs_exist_ok=True)
    # The pack's vocabulary (topics, audiences, risk checklist) that its kinds read.
    shutil.copytree(PACK / "data", dest / "data", dirs_exist_ok=True)
    shutil.copy2(PACK / "contract.md", dest / "contract.md")
    write_plan(dest, units if units is not None else small_units(groups))
    (dest / "keepstep.toml").unlink(missing_ok=True)
    write_config(dest, **config)
    return dest


def extract_only_units(n: int = 1, *, groups: tuple[str, ...] = GROUPS) -> list[dict[str, Any]]:
    """``n`` independent extract units (one per group), each required: for plans whose model
    is a scripted fake that only has to return ``{"evidence": []}``."""
    return [
        {"id": f"E{i + 1:02d}", "title": f"Extract group {g}", "phase": "extraction",
         "kind": "extract", "inputs": [f"group:{g}"], "outputs": ["evidence.json"],
         "validators": ["structure", "citations"], "required_final": True}
        for i, g in enumerate(groups[:n])
    ]
