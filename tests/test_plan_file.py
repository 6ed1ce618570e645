"""plan.toml saved by the plan builder keeps its comments and layout (engine.files.plan_file)."""

from __future__ import annotations

import difflib
import shutil
import tomllib
from pathlib import Path

from keepstep.engine.plan import Plan, save_plan

PLAN = Path(__file__).resolve().parents[1] / "sample_projects" / "market-entry" / "plan.toml"


def _copy(tmp_path: Path) -> tuple[Path, Plan]:
    path = tmp_path / "plan.toml"
    shutil.copy(PLAN, path)
    return path, Plan.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))


def _changed_lines(path: Path) -> list[str]:
    diff = difflib.unified_diff(PLAN.read_text(encoding="utf-8").splitlines(),
                                path.read_text(encoding="utf-8").splitlines(), lineterm="", n=0)
    return [line for line in diff if not line.startswith(("---", "+++", "@@"))]


def test_saving_an_unchanged_plan_leaves_the_file_byte_for_byte(tmp_path: Path) -> None:
    """Comments, blank lines and layout of the sample's commented plan.toml survive a save."""
    path, plan = _copy(tmp_path)
    assert "#" in path.read_text(encoding="utf-8")
    save_plan(path, plan)
    assert path.read_bytes() == PLAN.read_bytes()


def test_an_edit_of_one_unit_changes_only_that_units_line(tmp_path: Path) -> None:
    """Setting U17's max_rounds adds one line in U17's table; the rest is as it was, and the
    file reads back as the edited plan."""
    path, plan = _copy(tmp_path)
    plan.unit_map()["U17"].max_rounds = 2
    save_plan(path, plan)
    assert _changed_lines(path) == ["+max_rounds = 2"]
    text = path.read_text(encoding="utf-8")
    u17 = text.index('id = "U17"')
    assert u17 < text.index("max_rounds = 2") < text.index('id = "U18"')
    assert Plan.model_validate(tomllib.loads(text)) == plan


def test_a_deleted_and_an_added_unit_touch_only_their_own_tables(tmp_path: Path) -> None:
    """Removing U36 drops its table only; a new unit is written after U35 where the plan has
    it, with no empty keys; every comment line of the original is still there."""
    path, plan = _copy(tmp_path)
    added = plan.unit_map()["U35"].model_copy(update={"id": "U37", "title": "Second audit"})
    plan.units = [u for u in plan.units if u.id != "U36"] + [added]
    save_plan(path, plan)
    text = path.read_text(encoding="utf-8")
    assert 'id = "U36"' not in text and 'id = "U37"' in text
    assert text.index('id = "U35"') < text.index('id = "U37"')
    assert "= []" not in text.split('id = "U37"')[1]
    comments = [line for line in PLAN.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")]
    assert all(line in text.splitlines() for line in comments)
    assert [u.id for u in Plan.model_validate(tomllib.loads(text)).units] == \
        [u.id for u in plan.units]


def test_an_inline_table_edit_stays_an_inline_table(tmp_path: Path) -> None:
    """U01's ``params = { step = "inventory" }`` gains a key and stays one inline line."""
    path, plan = _copy(tmp_path)
    unit = plan.unit_map()["U01"]
    unit.params = {**unit.params, "note": "x"}
    save_plan(path, plan)
    removed, added = _changed_lines(path)
    assert removed == '-params = { step = "inventory" }'
    assert added.startswith('+params = { step = "inventory", note = "x"') and \
        added.endswith("}")
    assert Plan.model_validate(tomllib.loads(path.read_text(encoding="utf-8"))) == plan
