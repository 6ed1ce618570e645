"""The handover page a colleague reads: conclusions first (recommendation, top risks, open
disagreements), nothing stale on a done run, and each citation linked to the cited
statement in the bundle's sources/. Checked as parsed HTML and in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from keepstep.app.cli.main import app
from keepstep.engine.report.handover import group_errors, link_citations

RUNNER = CliRunner()


def invoke(*args: object):
    return RUNNER.invoke(app, [str(a) for a in args])


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.headings: list[str] = []
        self.text: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if a.get("id"):
            self.ids.add(a["id"])
        self._in = tag if tag in ("h2", "h3") else None

    def handle_data(self, data):
        self.text.append(data)
        if self._in:
            self.headings.append(data.strip())
            self._in = None


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("handover") / "pack"
    assert invoke("init", root).exit_code == 0
    assert invoke("run", root, "--quiet").exit_code == 0
    out = root / "hb"
    result = invoke("handover", root, "--out", out, "--sources", "files")
    assert result.exit_code == 0, result.output
    assert "export the handover" not in result.output
    return out


def test_the_page_opens_with_the_conclusions(bundle: Path) -> None:
    """Conclusions is the first section: recommendation, top risks, open disagreements."""
    page = _parse(bundle / "index.html")
    assert page.headings[:4] == ["Conclusions", "Recommendation", "Top risks",
                                 "Open disagreements"]
    text = " ".join(page.text)
    assert "Decide once the top risk" in text and "R1" in text


def test_a_done_run_shows_nothing_stale(bundle: Path) -> None:
    """No retry advice, no 'not yet quarantined', no telling the reader to export the
    handover they are reading."""
    text = (bundle / "index.html").read_text(encoding="utf-8")
    for stale in ("keepstep retry", "not yet quarantined", "keepstep handover",
                  "or the handover"):
        assert stale not in text


def test_every_citation_links_to_its_excerpt_and_the_source_file(bundle: Path) -> None:
    page = _parse(bundle / "index.html")
    cites = [h for h in page.links if h.startswith("sources/") and "#" in h]
    assert cites
    for href in cites:
        target, fragment = urlsplit(href).path, urlsplit(href).fragment
        linked = _parse(bundle / target)
        assert fragment in linked.ids
        files = [h for h in linked.links if h.startswith("files/")]
        assert files and all((bundle / "sources" / urlsplit(f).path).is_file() for f in files)
    assert invoke("verify-bundle", bundle).exit_code == 0


def test_errors_of_units_current_again_are_history() -> None:
    status = SimpleNamespace(run_id="R1", needs=[], units={
        "U6": SimpleNamespace(state="succeeded"), "U7": SimpleNamespace(state="failed")})
    groups = group_errors([
        {"kind": "attempt.failed", "class": "invalid_output", "unit": "U6", "ts": "t1"},
        {"kind": "attempt.failed", "class": "timeout", "unit": "U7", "ts": "t2"}], status)
    by_cause = {g["cause"]: g for g in groups}
    assert by_cause["invalid_output"]["resolved"]
    assert "retry" not in by_cause["invalid_output"]["action"]
    assert not by_cause["timeout"]["resolved"] and "retry" in by_cause["timeout"]["action"]


def test_link_citations_links_only_known_ids_inside_brackets() -> None:
    html = "<p>x [A1-e1, B2-e9] and A1-e1 alone</p>"
    out = link_citations(html, {"A1-e1": "sources/A1.html#A1-e1"})
    assert out == ('<p>x [<a class="cite" href="sources/A1.html#A1-e1">A1-e1</a>, B2-e9] '
                   "and A1-e1 alone</p>")


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        # Debian's package, installed when missing (as .ci/run does).
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=False,
                       capture_output=True, timeout=900)
        found = shutil.which("chromium")
    return found


def test_headless_chromium_shows_the_conclusions_and_follows_a_source_link(
        bundle: Path, tmp_path: Path) -> None:
    """The page rendered by Chromium: a screenshot is taken, the rendered DOM holds the
    conclusions, and the first citation's link opens the cited statement."""
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed and cannot be installed here")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "page.png"
    index = (bundle / "index.html").resolve().as_uri()
    subprocess.run([*flags, "--window-size=1200,1200", f"--screenshot={shot}", index],
                   check=True, capture_output=True, timeout=120)
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000
    dom = subprocess.run([*flags, "--dump-dom", index], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert "Conclusions" in dom and "Top risks" in dom
    href = next(h for h in _parse(bundle / "index.html").links
                if h.startswith("sources/") and "#" in h)
    target = subprocess.run([*flags, "--dump-dom", f"{index.rsplit('/', 1)[0]}/{href}"],
                            check=True, capture_output=True, text=True, timeout=120).stdout
    fragment = urlsplit(href).fragment
    assert f'id="{fragment}"' in target and "<blockquote>" in target
