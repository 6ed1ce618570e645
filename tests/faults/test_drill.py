"""``keepstep drill``: two seeded kills on a copy, a recovery, and the verdict on the end state."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from keepstep.app.cli import drill as cli_drill
from keepstep.engine.api import open_project
from keepstep.engine.drills import drill as drill_module
from keepstep.engine.drills.drill import DrillFacts, drill, judge, subprocess_launcher

from .steps import RUN, Pre


def _facts(**over) -> DrillFacts:
    """A clean drill: 3 units, U2 killed in flight and redone, one orphan."""
    base = dict(units=["U1", "U2", "U3"], current=["U1", "U2", "U3"], decision="done",
                worked={"U1": ["U1/a1"], "U2": ["U2/a1", "U2/a2"], "U3": ["U3/a1"]},
                commits={"U1": ["U1/a1"], "U2": ["U2/a2"], "U3": ["U3/a1"]},
                attempt_status={"U1/a1": "committed", "U2/a1": "orphaned",
                                "U2/a2": "committed", "U3/a1": "committed"},
                orphans=["U2/a1"], referenced=["U1/a1", "U2/a2", "U3/a1"], in_flight=["U2"],
                checkpoints=4)
    return DrillFacts(**{**base, **over})


def _failed(facts: DrillFacts) -> list[str]:
    return [c.name for c in judge(facts) if not c.passed]


def _project_facts(root: Path, run_id: str) -> tuple[int, int, list[str]]:
    with open_project(root) as p:
        files = sorted(str(f.relative_to(root)) for f in (root / ".keepstep" / "artifacts")
                       .rglob("*") if f.is_file())
        return p.store.get_head(run_id).version, len(p.store.attempts(run_id)), files


def test_a_clean_drill_passes_every_check():
    """The verdict on a drill whose only redo is the unit a kill cut is all green."""
    assert _failed(_facts()) == []


@pytest.mark.parametrize(("over", "failing"), [
    ({"worked": {"U1": ["U1/a1", "U1/a2"], "U2": ["U2/a1", "U2/a2"], "U3": ["U3/a1"]}},
     "re-executed units were in flight at a kill"),
    ({"current_before": ["U3"]}, "re-executed units were in flight at a kill"),
    ({"commits": {"U1": ["U1/a1"], "U2": ["U2/a1", "U2/a2"], "U3": ["U3/a1"]},
      "attempt_status": {"U1/a1": "committed", "U2/a1": "committed", "U2/a2": "committed",
                         "U3/a1": "committed"}, "orphans": []},
     "no duplicate commits"),
    ({"commits": {"U1": ["U1/a1"], "U2": ["U2/a1"], "U3": ["U3/a1"]}},
     "no commit by a stale executor"),
    ({"token_mismatch": ["U3/a1"]}, "no commit by a stale executor"),
    ({"referenced": ["U1/a1", "U2/a1", "U3/a1"]}, "orphans never referenced"),
    ({"current": ["U1", "U2"], "decision": "blocked"}, "every unit current"),
    ({"chain_ok": False, "chain_problems": ["v3: parent hash does not match"]},
     "checkpoint chain verifies"),
])
def test_the_verdict_names_what_went_wrong(over, failing):
    """Each broken promise (a stray redo, a double or stale commit, a referenced orphan, an
    unfinished run, a broken chain) fails exactly its own check."""
    assert _failed(_facts(**over)) == [failing]


@pytest.mark.parametrize("seed", [1, 7, 2024])
def test_a_finished_run_is_drilled_as_a_fresh_run_and_passes(seed, templates, zygote, tmp_path):
    """Two seeded kills and a recovery on a copy of a finished run: every check passes, the
    kills land in flight, and the project itself is not changed."""
    source = shutil.copytree(templates.done, tmp_path / "project")
    before = _project_facts(source, RUN)
    report = drill(source, RUN, seed=seed, workdir=tmp_path, launch=zygote.launcher(tmp_path))
    assert report.passed, report.render()
    assert report.mode == "fresh" and report.drill_run == f"{RUN}-drill"
    assert len(report.kills) == 2 and any(k.killed for k in report.kills), report.render()
    assert set(report.re_executed) <= {u for k in report.kills for u in k.in_flight}
    assert report.copy_kept is None and not any(tmp_path.glob("keepstep-drill-*"))
    assert _project_facts(source, RUN) == before


def test_the_same_seed_picks_the_same_kills(templates, zygote, tmp_path):
    """A drill is reproducible: the seed alone decides the crash points."""
    runs = [drill(templates.done, RUN, seed=11, workdir=tmp_path,
                  launch=zygote.launcher(tmp_path)) for _ in range(2)]
    assert [k.point for k in runs[0].kills] == [k.point for k in runs[1].kills]
    assert runs[0].passed and runs[1].passed


def test_an_unfinished_run_is_continued_as_it_stands(templates, zygote, tmp_path):
    """A run stopped before its gate is drilled as itself (resume mode) and finishes in the
    copy, while the project's run stays where it was."""
    source = shutil.copytree(templates.prepared(Pre("fresh", max_units=8), ()),
                             tmp_path / "project")
    before = _project_facts(source, RUN)
    report = drill(source, RUN, seed=5, workdir=tmp_path, launch=zygote.launcher(tmp_path))
    assert report.passed, report.render()
    assert report.mode == "resume" and report.drill_run == RUN
    assert _project_facts(source, RUN) == before


def test_a_failed_drill_keeps_the_copy_and_says_where(templates, zygote, tmp_path):
    """When the end state is wrong (here the recovery worker never runs), the verdict fails
    and the copy is kept for a person to look at."""
    real = zygote.launcher(tmp_path)

    def no_recovery(args, crash_at):
        return real(args, crash_at) if crash_at else 0

    report = drill(templates.done, RUN, seed=3, workdir=tmp_path, launch=no_recovery)
    assert not report.passed
    assert "every unit current" in [c.name for c in report.checks if not c.passed]
    assert report.copy_kept and Path(report.copy_kept).is_dir()
    assert report.copy_kept in report.render() and "FAIL" in report.render()


def test_an_unknown_run_is_refused(templates, tmp_path):
    """Drilling a run the project does not have is refused with the runs it does have."""
    from keepstep.engine.errors import KeepstepError

    with pytest.raises(KeepstepError, match="no run 'NOPE'") as err:
        drill(templates.done, "NOPE", seed=1, workdir=tmp_path)
    assert RUN in str(err.value)


def test_the_default_launcher_starts_a_real_worker_and_reports_its_kill(templates, tmp_path):
    """The subprocess launcher runs ``python -m keepstep.engine.drills.worker`` with the crash point
    in its environment: a kill before the first claim comes back as -SIGKILL."""
    project = shutil.copytree(templates.fresh, tmp_path / "project")
    launch = subprocess_launcher(tmp_path)
    assert launch([str(project), "--run", "R9"], "claim.before") == -signal.SIGKILL
    assert launch([str(project), "--run", "R9", "--max-units", "0"], None) == 0
    assert sorted(p.name for p in tmp_path.glob("worker-*.log")) == ["worker-1.log",
                                                                     "worker-2.log"]


def _cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _main() -> None:
        """keepstep (just the drill command)."""

    cli_drill.register(app)
    return app


def test_keepstep_drill_prints_the_report(templates, zygote, tmp_path, monkeypatch):
    """``keepstep drill DIR --run ID --seed N`` prints the checks and PASS, exit code 0."""
    monkeypatch.setattr(drill_module, "subprocess_launcher",
                        lambda log_dir: zygote.launcher(log_dir))
    result = CliRunner().invoke(_cli(), ["drill", str(templates.done), "--run", RUN,
                                         "--seed", "4", "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "seed 4" in result.output and "PASS" in result.output
    assert "✓ no duplicate commits" in result.output


def test_keepstep_drill_exits_1_on_a_failed_drill_and_2_on_an_unknown_run(
        templates, zygote, tmp_path, monkeypatch):
    """A failed verdict exits 1 with the report; an unknown run is a usage error (exit 2)."""
    real = zygote.launcher(tmp_path)
    monkeypatch.setattr(drill_module, "subprocess_launcher",
                        lambda log_dir: lambda args, crash_at: real(args, crash_at)
                        if crash_at else 0)
    runner = CliRunner()
    failed = runner.invoke(_cli(), ["drill", str(templates.done), "--run", RUN, "--seed", "2",
                                    "--workdir", str(tmp_path)])
    assert failed.exit_code == 1, failed.output
    assert "FAIL" in failed.output and "kept in" in failed.output
    unknown = runner.invoke(_cli(), ["drill", str(templates.done), "--run", "NOPE"])
    assert unknown.exit_code == 2
    assert "no run 'NOPE'" in unknown.output
