"""Reading a committed output through the engine: the bytes committed, or a clear refusal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from keepstep.engine import KeepstepError, open_project
from tests.support.engine_harness import RUN, make_small_project


@pytest.fixture
def run_done(tmp_path: Path):
    root = make_small_project(tmp_path / "small")
    with open_project(root) as project:
        run = project.open_or_start(RUN)
        run.run()
        yield run


def test_output_returns_the_committed_bytes_with_their_hash(run_done) -> None:
    """run.output(unit, name) gives .data/.text whose sha256 is the record's."""
    d = run_done.deliverables()[0]
    out = run_done.output(d.unit, d.name)
    assert hashlib.sha256(out.data).hexdigest() == d.sha256 == out.sha256
    assert out.text == out.data.decode("utf-8") and str(out)


def test_output_names_what_exists_when_asked_for_something_else(run_done) -> None:
    """An unknown output lists the unit's outputs; an unknown unit lists the units."""
    d = run_done.deliverables()[0]
    with pytest.raises(KeepstepError) as err:
        run_done.output(d.unit, "nope.md")
    assert d.name in str(err.value)
    with pytest.raises(KeepstepError, match="no unit U99"):
        run_done.output("U99", d.name)


def test_output_refuses_a_file_that_no_longer_matches(run_done) -> None:
    """A changed artifact is refused, naming the file and what to do."""
    d = run_done.deliverables()[0]
    path = Path(d.path)
    path.chmod(0o644)
    path.write_text("tampered")
    with pytest.raises(KeepstepError, match="no longer matches its committed sha256") as err:
        run_done.output(d.unit, d.name)
    assert "resume the run" in str(err.value)


def test_outputs_lists_a_units_record_without_reading_it(run_done) -> None:
    """run.outputs(unit): names, sizes, sha256 and whether each file still matches."""
    d = run_done.deliverables()[0]
    [info] = [o for o in run_done.outputs(d.unit) if o.name == d.name]
    assert info.sha256 == d.sha256 and info.matches and info.current and info.size > 0
    assert run_done.outputs("U99") == []
