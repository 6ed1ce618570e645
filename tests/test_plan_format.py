"""The plan format is written down: docs/plan-format.md is generated from the plan models'
field descriptions, covers every kind, prefix, edge type, binding, part and check, and is
current."""

from __future__ import annotations

from pathlib import Path

from keepstep.engine.core.plan import INPUT_PREFIXES, EdgeType, UnitKind
from keepstep.engine.core.plan_reference import (
    BINDINGS,
    CHECKS,
    described_models,
    plan_format_markdown,
)
from keepstep.engine.core.presets import CHECK_KINDS, PARTS, PRESETS

DOC = Path(__file__).resolve().parents[1] / "docs" / "plan-format.md"
REGENERATE = "python -m keepstep.engine.core.plan_reference > docs/plan-format.md"


def test_every_plan_model_field_has_a_description() -> None:
    """A field of plan.toml (tables, kind params, fills, rows, checks) without a description
    fails here: the reference would list it unexplained."""
    missing = [f"{model.__name__}.{name}" for model in described_models()
               for name, info in model.model_fields.items() if not (info.description or "")
               .strip()]
    assert missing == []


def test_the_reference_file_is_current() -> None:
    """docs/plan-format.md is what the generator writes now."""
    assert DOC.read_text(encoding="utf-8") == plan_format_markdown(), f"run: {REGENERATE}"


def test_the_reference_covers_kinds_prefixes_edges_bindings_parts_and_checks() -> None:
    """Every kind preset and its params, input prefix, edge type, gate binding, render part
    and audit check appears in the reference."""
    text = plan_format_markdown()
    assert set(PRESETS) == {k.value for k in UnitKind}
    for kind in PRESETS:
        assert f"### `{kind}` params" in text
    for prefix in INPUT_PREFIXES:
        assert f"| `{prefix}:` |" in text
    for edge in EdgeType:
        assert f"| `{edge.value}` |" in text
    for binding in BINDINGS:
        assert f"| `{binding}` |" in text
    for part in PARTS:
        assert f"| `{part}` |" in text
    assert len(CHECKS) == len(CHECK_KINDS)
    for check in CHECK_KINDS:
        assert f'### `check = "{check}"`' in text
    assert "| `on_last_round` |" in text and "| `binds` |" in text
