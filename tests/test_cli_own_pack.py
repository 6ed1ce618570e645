"""A pack from `keepstep init` made the user's own through the command line only: the
example's sources removed, the user's added, `validate` naming what the offline model needs,
then a run to done and the deliverables exported."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from keepstep.app.cli.main import app

RUNNER = CliRunner()

MARKET = """# Polish e-bike market 2025

E-bike sales in Poland reached 210 thousand units in 2024.
The average selling price was 9,800 PLN per bike.
Urban commuters make up 45% of buyers.
"""
DEALERS = """dealer,city,annual units,price band
VeloMax,Warsaw,4200,9000-12000
Rowery Plus,Krakow,3100,7000-9000
"""
PRICES = """<html><body><h1>Price watch</h1>
<p>In March 2025 a discount chain began selling a cheaper e-bike at 5,900 PLN.</p>
<p>Two importers said the new tariff budget of 12 million PLN was postponed.</p>
</body></html>
"""


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


def own_sources(tmp_path: Path, root: Path) -> Path:
    """The init pack's example sources removed (their files deleted), the user's market.md
    (A1) and dealers.csv (B1) added and approved; the folder the user's files are in."""
    for sid in ("A1", "A2", "B1", "B2"):
        result = invoke("sources", "remove", root, sid, "--delete-file", "--yes")
        assert result.exit_code == 0, result.output
        assert f"source {sid} removed" in result.output
    assert list((root / "sources").iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "market.md").write_text(MARKET, encoding="utf-8")
    (mine / "dealers.csv").write_text(DEALERS, encoding="utf-8")
    (mine / "prices.html").write_text(PRICES, encoding="utf-8")
    for sid, group, name in (("A1", "A", "market.md"), ("B1", "B", "dealers.csv")):
        result = invoke("sources", "add", root, mine / name, "--id", sid, "--group", group,
                        "--approve")
        assert result.exit_code == 0, result.output
    return mine


def test_a_pack_from_init_with_the_users_own_sources_runs_to_done_offline(
        tmp_path: Path) -> None:
    """init, remove the example's sources, add one's own: validate names the rank unit's
    offline need and what to do; a source that names a risk fixes it; the run is done."""
    root = tmp_path / "ebikes"
    assert invoke("init", root).exit_code == 0
    assert (root / "README.md").is_file() and (root / "data" / "risks.toml").is_file()
    mine = own_sources(tmp_path, root)

    check = invoke("validate", root)
    assert check.exit_code == 2, check.output
    assert "unit U6" in check.output and "data/risks.toml" in check.output
    assert "keywords your sources use" in check.output

    result = invoke("sources", "add", root, mine / "prices.html", "--id", "A2", "--group",
                    "A", "--approve")
    assert result.exit_code == 0, result.output
    check = invoke("validate", root)
    assert check.exit_code == 0, check.output

    run = invoke("run", root, "--quiet", "--json")
    assert run.exit_code == 0, run.output
    status = json.loads(run.stdout)
    assert status["counts"]["current"] == len(status["units"]) and status["counts"]["failed"] == 0
    exported = invoke("export", root)
    assert exported.exit_code == 0, exported.output
    table = next((root / "deliverables").rglob("evidence-table.csv")).read_text(encoding="utf-8")
    assert table.splitlines()[0].split(",")[:3] == ["id", "source_id", "locator"]


RISKS = """[[risk]]
key = "commuters"
title = "Demand rests on urban commuters"
keywords = ["commuters"]
impact = 4
"""


def test_a_failed_rank_unit_runs_again_on_resume_once_its_data_file_is_added(
        tmp_path: Path) -> None:
    """Issue 23: the init pack on the user's own sources without data/risks.toml. validate
    names the missing file (declared input) or the missing risk words (implicit one) before
    the run; the run fails U6; once the file is there, preview says U6 runs again (with
    figures, not ~0 calls) and resume runs it: the preview and the run agree."""
    root = tmp_path / "ebikes"
    assert invoke("init", root).exit_code == 0
    own_sources(tmp_path, root)
    (root / "data" / "risks.toml").unlink()

    check = invoke("validate", root)
    assert check.exit_code == 2, check.output
    assert "unit U6" in check.output and "data file data/risks.toml is missing" in check.output
    assert "add the file or remove the input" in check.output
    assert re.search(r"plan\.toml line \d+", check.output), check.output

    plan = root / "plan.toml"
    plan.write_text(plan.read_text(encoding="utf-8").replace(
        'inputs = ["contract:audience", "data:risks"]', 'inputs = ["contract:audience"]'),
        encoding="utf-8")
    check = invoke("validate", root)
    assert check.exit_code == 2, check.output
    assert "unit U6" in check.output and "write data/risks.toml" in check.output

    first = invoke("run", root, "--quiet", "--json")
    assert first.exit_code == 4, first.output
    assert json.loads(first.stdout)["units"]["U6"]["state"] == "failed"

    (root / "data" / "risks.toml").write_text(RISKS, encoding="utf-8")
    assert invoke("validate", root).exit_code == 0
    dry = invoke("preview", root)
    assert dry.exit_code == 0, dry.output
    assert "then run U6" in dry.output and "~0 calls" not in dry.output
    assert "U6 failed before; the change reaches it, so it runs again." in dry.output
    again = invoke("resume", root, "--quiet", "--json")
    assert again.exit_code == 0, again.output
    status = json.loads(again.stdout)
    assert status["units"]["U6"]["state"] == "succeeded" and status["counts"]["failed"] == 0
    assert status["counts"]["current"] == len(status["units"])
