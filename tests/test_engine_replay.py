"""Replay: a finished run re-executed from its call ledger, with no model call at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keepstep.engine.api import open_project
from tests.support.engine_harness import RUN, copy_pack, make_small_project


class ForbiddenGateway:
    """A gateway factory that fails the test if anything asks for a model client."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, _ledger: Any) -> Any:
        self.calls += 1
        raise AssertionError("replay built a model gateway")


def _output_hashes(run: Any) -> dict[str, dict[str, str]]:
    return {u: {n: o.sha256 for n, o in rec.outputs.items()}
            for u, rec in run.facts_records().items() if rec.state.value == "succeeded"}


def _replay(root: Path, **kwargs: Any) -> tuple[Any, ForbiddenGateway, dict, dict, list]:
    forbidden = ForbiddenGateway()
    with open_project(root, gateway_factory=forbidden) as p:
        source = p.get_run(RUN)
        source_calls = source.calls()
        replayed = source.replay(f"{RUN}-replay", **kwargs)
        status = replayed.status()
        out = (_output_hashes(source), _output_hashes(replayed), replayed.calls())
        assert source.calls() == source_calls  # the source ledger is untouched
    return status, forbidden, *out


def test_replay_makes_no_model_call_and_reproduces_every_artifact(tmp_path: Path) -> None:
    """Every current output of the replay has the sha256 of the source run's; no model
    gateway is even built, and the replay's call ledger stays empty."""
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    status, gateway, source, replayed, calls = _replay(root)
    assert status.decision == "done", status.reasons
    assert gateway.calls == 0 and calls == []
    assert replayed == source
    assert len(source) == 8


def test_replay_of_changed_inputs_stops_with_a_clear_message(tmp_path: Path) -> None:
    """A request the source run never made is not sent to a model: the unit fails, saying the
    inputs changed, and still no model gateway is built."""
    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    source = root / "sources" / "B1-metering-mandate.md"
    source.write_text(source.read_text() + "\nA later note.\n")
    status, gateway, _, _, calls = _replay(root)
    assert gateway.calls == 0 and calls == []
    assert status.units["U04"].state == "failed"
    assert "no recorded response" in (status.units["U04"].reason or "")
    assert status.units["U03"].state == "succeeded"


def test_replay_of_the_me042_pack_reproduces_its_artifacts(tmp_path: Path) -> None:
    """The whole pack, gate included (the recorded approval is reused): identical outputs for
    all units but U36, whose change notes quote the run's own id and decision times."""
    root = copy_pack(tmp_path / "me042")
    with open_project(root) as p:
        assert p.start_run(RUN).run(approve={"audience": "product team"}).decision == "done"
    status, gateway, source, replayed, calls = _replay(root)
    assert status.decision == "done", status.reasons
    assert gateway.calls == 0 and calls == []
    assert set(replayed) == set(source) and len(source) == 36
    differ = sorted(u for u in source if source[u] != replayed[u])
    assert differ == ["U36"]


def _tamper_first_response(root: Path, unit: str) -> Path:
    """Flip one byte of the unit's first recorded model response (a committed, sealed file)."""
    import os
    import stat

    calls = root / ".keepstep" / "artifacts" / RUN / unit / "a1" / "calls"
    path = sorted(calls.glob("*.json"))[0]
    data = bytearray(path.read_bytes())
    at = data.index(b"notice")  # inside the recorded content, so the JSON stays readable
    data[at] = ord("N")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    path.write_bytes(bytes(data))
    return path


def test_replay_refuses_a_tampered_recorded_response_and_names_the_file(tmp_path: Path) -> None:
    """One byte changed in a committed calls/*.json: replay stops before running anything,
    naming the file, instead of replaying the altered answer (issue 13, item 1)."""
    import pytest

    from keepstep.engine.errors import KeepstepError

    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    path = _tamper_first_response(root, "U03")
    with pytest.raises(KeepstepError, match="replay refused") as err:
        _replay(root)
    assert str(path) in str(err.value) and "manifest hash" in str(err.value)
    with open_project(root) as p:
        assert f"{RUN}-replay" not in p.runs()


def test_resume_redoes_a_unit_whose_recorded_response_was_tampered(tmp_path: Path) -> None:
    """A resume re-hashes the current attempts' recorded responses: the altered one
    invalidates its unit (explained) and the unit runs again; nothing else is redone."""
    from tests.support.engine_harness import calls_by_attempt, redone_units

    root = make_small_project(tmp_path / "small")
    with open_project(root) as p:
        assert p.start_run(RUN).run().decision == "done"
    path = _tamper_first_response(root, "U03")
    with open_project(root) as p:
        run = p.get_run(RUN)
        report = run.recover()
        assert any("U03" in problem and path.name in problem
                   for problem in report.artifact_problems)
        assert "U03" in report.invalidated
        assert run.resume().decision == "done"
    assert redone_units(calls_by_attempt(root)) == {"U03"}
