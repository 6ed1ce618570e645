"""The fault table (faults/cases.py), one real-process case per row, through one harness."""

from __future__ import annotations

import pytest

from .cases import CASES
from .harness import run_case


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault_case(case, tmp_path, zygote, templates):
    """The case's end state, re-executed units and invariants hold after its real faults."""
    outcome = run_case(case, tmp_path, zygote, templates)
    assert outcome.state == case.expect
