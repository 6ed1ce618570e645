"""The handover bundle: everything a colleague needs to take a run over, with hashes.

``export_handover(run, out)`` writes a folder (or a ``.zip`` when ``out`` ends so):

    index.html            the page tying it together (tables, links; no external assets)
    narrative.md          the story, generated from the structured state (engine.narrative)
    contract.md           the task contract
    plan.toml             the plan snapshot the run is at
    dag.svg               the DAG coloured by unit state
    state/*.json          baseline checkpoint, unit states, input snapshot (ids + sha256),
                          invalidations, orphans, approvals, budget, external unknowns,
                          recent errors, recoveries, the next step
    deliverables/*        the current outputs of the render and notes units, copied
    manifest.json         sha256 + size of every other file, and the artifact manifest rows
                          of the current outputs

Never bundled: model responses (``calls/*.json``), source text, approval token hashes, keys.
Every text is passed through ``redact`` and ``verify_bundle`` scans for key-like strings.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .display import Raw, budget_rows, key_values, state_badge, table
from .errors import KeepstepError
from .narrative import check_narrative, narrative

if TYPE_CHECKING:
    from .project import Run

BUNDLE_FORMAT = "keepstep-handover/1"
MANIFEST = "manifest.json"
RECENT_ERRORS = 50
ERROR_KINDS = ("attempt.failed", "unit.blocked", "recovery.failed", "recovery.blocked",
               "attempt.fenced")
# Keys never written to a bundle, whatever their value.
DROP_KEYS = frozenset({"token_hash", "token", "resume_token", "secret", "api_key", "apikey",
                       "password", "authorization"})
SECRET_PATTERNS = (
    ("openai-style key", re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}")),
    ("aws access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("google api key", re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-]{12,}")),
    ("api_key", re.compile(r"(?i)\bapi[_-]?key\b")),
    ("named hex secret", re.compile(
        r"(?i)[\w-]*(?:key|secret|token|password)[\w-]*[\"']?\s*[:=]\s*[\"']?[0-9a-f]{24,}")),
)


# -- secrets -------------------------------------------------------------------------------
def find_secrets(text: str) -> list[str]:
    """The names of the key-like patterns found in ``text`` (empty when clean)."""
    return [name for name, rx in SECRET_PATTERNS if rx.search(text)]


def redact(text: str) -> str:
    """``text`` with every key-like string replaced by ``[redacted]``."""
    for _name, rx in SECRET_PATTERNS:
        text = rx.sub("[redacted]", text)
    return text


def _safe(value: Any) -> Any:
    """A JSON-able copy without dropped keys and with every string redacted."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items() if str(k).lower() not in DROP_KEYS}
    if isinstance(value, list | tuple | set):
        return [_safe(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


# -- the bundle ----------------------------------------------------------------------------
class _Writer:
    def __init__(self, root: Path) -> None:
        self.root = root

    def text(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(redact(text), encoding="utf-8")

    def json(self, rel: str, data: Any) -> None:
        self.text(rel, json.dumps(_safe(data), indent=2, ensure_ascii=False, sort_keys=True)
                  + "\n")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _deliverables(run: Run) -> list[dict[str, Any]]:
    from .views import current_deliverables

    rows = current_deliverables(run)
    names = [r["name"] for r in rows]
    for r in rows:
        clash = names.count(r["name"]) > 1
        r["bundle_path"] = f"deliverables/{r['unit']}-{r['name']}" if clash else \
            f"deliverables/{r['name']}"
    return rows


def _collect(run: Run) -> dict[str, Any]:
    """Every fact the bundle shows, read once."""
    from .approvals_flow import pending_approvals

    store = run.store
    status = run.status()
    records = run.facts_records()
    head = store.get_head(run.run_id, run.branch_id)
    cp = store.get_checkpoint(run.run_id, head.version, run.branch_id)
    check = store.verify_head(run.run_id, run.branch_id)
    units = {}
    for u in run.plan.units:
        view = status.units[u.id]
        rec = records.get(u.id)
        units[u.id] = {
            "title": u.title, "phase": u.phase, "kind": u.kind.value, "state": view.state,
            "attempts": view.attempts, "current_attempt": view.current_attempt,
            "reason": view.reason,
            "depends_on": [{"unit": d.unit, "edge": d.edge.value} for d in u.depends_on],
            "record": None if rec is None else {
                "state": rec.state.value, "attempt": rec.attempt, "plan": f"plan-v{rec.plan_n}",
                "validators_passed": rec.validators_passed, "facts": rec.facts,
                "outputs": {n: {"sha256": o.sha256, "path": o.path}
                            for n, o in sorted(rec.outputs.items())},
                "explanations": [e.render() for e in rec.explanations],
                "cutoff_note": rec.cutoff_note},
        }
    current = {(r.attempt, n) for r in records.values() if r.state.value == "succeeded"
               for n in r.outputs}
    artifacts = [e.model_dump(mode="json") for e in store.manifest(run.run_id)
                 if (e.attempt_id, e.name) in current]
    events = run.events(branch_id=run.branch_id)
    errors = [e for e in events if e.kind in ERROR_KINDS][-RECENT_ERRORS:]
    changes = [e for e in events if e.kind in ("decision.plan_change", "decision.input_change")]
    approvals = [a for a in store.approvals(run.run_id, branch_id=run.branch_id)]
    return {
        "status": status, "units": units, "artifacts": artifacts,
        "baseline": {"version": cp.version, "hash": cp.hash, "kind": cp.kind,
                     "state_hash": cp.state_hash, "parent_version": cp.parent_version,
                     "parent_hash": cp.parent_hash, "created_at": cp.created_at,
                     "unit": cp.unit, "attempt": cp.attempt, "schema_version": cp.schema_version,
                     "verified": check.ok,
                     "problems": [p.problem for p in check.problems]},
        "inputs": store.read_key(run.run_id, "inputs", run.branch_id) or {},
        "invalidations": {
            "current": {u: [e.model_dump(mode="json") | {"text": e.render()}
                            for e in r.explanations]
                        for u, r in records.items() if r.state.value == "invalidated"},
            "history": [{"seq": e.seq, "ts": e.ts, "kind": e.kind, **e.payload}
                        for e in changes]},
        "orphans": [o.model_dump(mode="json") | {"directory": str(Path(o.directory).relative_to(
            store.artifacts.root)) if Path(o.directory).is_relative_to(store.artifacts.root)
            else Path(o.directory).name} for o in store.orphaned_attempts(run.run_id)],
        "approvals": {"pending": pending_approvals(run),
                      "history": [a.model_dump(mode="json") for a in approvals
                                  if a.status != "requested"]},
        "errors": [{"seq": e.seq, "ts": e.ts, "kind": e.kind, "unit": e.unit,
                    "attempt": e.attempt_id,
                    "class": e.payload.get("error_class") or e.payload.get("kind"),
                    "message": e.payload.get("message") or e.payload.get("reason") or ""}
                   for e in errors],
        "recoveries": [{"seq": e.seq, "ts": e.ts, "kind": e.kind, **e.payload}
                       for e in events if e.kind.startswith("recovery.")
                       and e.kind != "recovery.orphan"],
    }


def _contract(run: Run) -> tuple[str, bool]:
    from .project_files import CONTRACT_FILE, load_contract

    path = run.project.root / CONTRACT_FILE
    text = path.read_text(encoding="utf-8") if path.is_file() else "(no contract.md)\n"
    try:
        same = load_contract(run.project.root).hash() == run.plan_info.get("contract_hash")
    except KeepstepError:
        same = False
    return text, same


def _plan_text(run: Run) -> str:
    snap = run.store.artifacts.root / run.plan_info.get("snapshot_path", "")
    if snap.is_file():
        return snap.read_text(encoding="utf-8")
    return (run.project.root / "plan.toml").read_text(encoding="utf-8")


def _prepare_target(out: Path) -> None:
    """Refuse to overwrite anything but an earlier handover bundle."""
    if not out.exists():
        return
    if out.is_dir():
        if not any(out.iterdir()):
            return
        if (out / MANIFEST).is_file() and _is_bundle_manifest((out / MANIFEST).read_bytes()):
            shutil.rmtree(out)
            return
    elif zipfile.is_zipfile(out):
        with zipfile.ZipFile(out) as zf:
            if MANIFEST in zf.namelist() and _is_bundle_manifest(zf.read(MANIFEST)):
                out.unlink()
                return
    raise KeepstepError(f"{out} exists and is not a keepstep handover bundle",
                        hint="pick a new path, or delete it first")


def _is_bundle_manifest(data: bytes) -> bool:
    try:
        return json.loads(data).get("format") == BUNDLE_FORMAT
    except (ValueError, AttributeError):
        return False


def export_handover(run: Run, out: str | Path) -> Path:
    """Write the handover bundle of ``run`` to ``out`` (a folder, or a zip if it ends in
    ``.zip``) and return its path. An earlier bundle at ``out`` is replaced; anything else
    there is refused. The narrative is checked against the state before it is written."""
    out = Path(out)
    _prepare_target(out)
    if out.suffix.lower() == ".zip":
        with tempfile.TemporaryDirectory(prefix="keepstep-handover-") as tmp:
            folder = _write_bundle(run, Path(tmp) / "bundle")
            out.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                    info = zipfile.ZipInfo(path.relative_to(folder).as_posix(),
                                           date_time=(1980, 1, 1, 0, 0, 0))
                    info.compress_type = zipfile.ZIP_DEFLATED
                    zf.writestr(info, path.read_bytes())
        return out
    return _write_bundle(run, out)


def _write_bundle(run: Run, out: Path) -> Path:
    from .dag_svg import run_dag_svg

    facts = _collect(run)
    out.mkdir(parents=True, exist_ok=True)
    w = _Writer(out)
    story = narrative(run)
    mismatches = check_narrative(run, story)
    contract, contract_current = _contract(run)
    st = facts["status"]
    w.text("narrative.md", story)
    w.text("contract.md", contract)
    w.text("plan.toml", _plan_text(run))
    svg = run_dag_svg(run)
    w.text("dag.svg", svg)
    w.json("state/baseline.json", facts["baseline"])
    w.json("state/status.json", st)
    w.json("state/units.json", facts["units"])
    w.json("state/inputs.json", {k: facts["inputs"].get(k) for k in
                                 ("label", "hash", "sources", "groups")})
    w.json("state/invalidations.json", facts["invalidations"])
    w.json("state/orphans.json", facts["orphans"])
    w.json("state/approvals.json", facts["approvals"])
    w.json("state/budget.json", st.budget)
    w.json("state/external_unknowns.json", st.external_unknown)
    w.json("state/recent_errors.json", facts["errors"])
    w.json("state/recoveries.json", facts["recoveries"])
    w.json("state/next_step.json", {"next_action": st.next_action, "decision": st.decision,
                                    "reasons": st.reasons})
    deliverables = _deliverables(run)
    for d in deliverables:
        target = out / d["bundle_path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(d["path"], target)
    by_attempt = {(d["unit"], d["name"]): d["bundle_path"] for d in deliverables}
    artifacts = [a | ({"bundle_path": by_attempt[(a["unit"], a["name"])]}
                      if (a["unit"], a["name"]) in by_attempt else {})
                 for a in facts["artifacts"]]
    w.text("index.html", _index_html(run, facts, deliverables, svg, story, contract_current,
                                     _listing(out)))
    manifest = {
        "format": BUNDLE_FORMAT, "run": run.run_id, "branch": run.branch_id,
        "plan_version": st.plan_version, "input_version": st.input_version,
        "baseline": {k: facts["baseline"][k] for k in ("version", "hash", "state_hash", "kind")},
        "decision": st.decision, "contract_matches_run": contract_current,
        "narrative_check": [m.render() for m in mismatches],
        "files": _listing(out), "artifacts": artifacts,
    }
    w.json(MANIFEST, manifest)
    return out


def _listing(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        data = path.read_bytes()
        rows.append({"path": rel, "sha256": _sha256(data), "size": len(data)})
    return rows


def _link(href: str, text: str | None = None) -> Raw:
    from html import escape

    return Raw(f'<a href="{escape(href)}">{escape(text or href)}</a>')


def _index_html(run: Run, facts: dict[str, Any], deliverables: list[dict[str, Any]], svg: str,
                story: str, contract_current: bool, files: list[dict[str, Any]]) -> str:
    from html import escape

    from markdown_it import MarkdownIt

    st, base = facts["status"], facts["baseline"]
    title = f"Handover: run {run.run_id} — {run.plan.plan.title or run.project.files.config.name}"
    summary = key_values([
        ("run", f"{run.run_id} ({run.branch_id})"),
        ("plan · inputs", f"{st.plan_version} · {st.input_version} "
         f"({len(facts['inputs'].get('sources', {}))} approved sources)"),
        ("baseline checkpoint", f"{base['version']} ({base['kind']}) · hash {base['hash'][:16]}… · "
         f"state {base['state_hash'][:16]}… · {base['created_at']} · "
         + ("verifies" if base["verified"] else "DOES NOT VERIFY: " + "; ".join(base["problems"]))),
        ("decision", Raw(f"<b>{escape(st.decision)}</b> — {escape('; '.join(st.reasons))}")),
        ("suggested next step", Raw(f"<b>{escape(st.next_action)}</b>")),
        ("contract", _link("contract.md") if contract_current else Raw(
            f"{_link('contract.md')} — edited since {escape(st.plan_version)}: the run has not "
            "seen this edit yet")),
        ("plan", _link("plan.toml")),
        ("narrative", _link("narrative.md")),
    ])
    sections = [("Summary", summary),
                ("Narrative", '<div class="narrative">'
                 + MarkdownIt("commonmark", {"html": False}).render(story) + "</div>"),
                ("DAG", f'<p>{_link("dag.svg")}</p>'
                 + svg.split("\n", 0)[0].replace('<?xml version="1.0"?>', ""))]
    units = facts["units"]
    sections.append(("Units", table(
        ["unit", "phase", "title", "state", "attempts", "current attempt", "reason / why"],
        [[u, v["phase"], v["title"], state_badge(v["state"]), v["attempts"],
          v["current_attempt"], v["reason"] or "; ".join((v["record"] or {}).get(
              "explanations", []))] for u, v in units.items()])))
    inv = facts["invalidations"]
    sections.append(("Invalidations", table(
        ["when", "change", "invalidated", "why", "reused"],
        [[h["ts"], "; ".join(c.get("detail", "") for c in h.get("changes", [])),
          ", ".join(sorted(h.get("invalidated", {}))),
          Raw("<br>".join(escape(t) for ts in h.get("invalidated", {}).values() for t in ts)),
          f"{len(h.get('reused', []))} units"] for h in inv["history"]])
        + ("" if not inv["current"] else table(
            ["unit", "invalidated now because"],
            [[u, Raw("<br>".join(escape(e["text"]) for e in es))]
             for u, es in inv["current"].items()]))))
    sections.append(("Orphans", table(
        ["attempt", "files (quarantined, never promoted)"],
        [[o["attempt_id"], ", ".join(o["files"])] for o in facts["orphans"]])))
    sections.append(("Pending approvals", table(
        ["gate", "unit", "question"],
        [[a.get("gate"), a.get("unit"), a.get("question")]
         for a in facts["approvals"]["pending"]])))
    sections.append(("Budget", table(["counter", "used", "limit", "left"],
                                     budget_rows(st.budget))))
    sections.append(("External unknowns", table(
        ["unit", "action", "status", "key"],
        [[e.get("unit"), e.get("action"), e.get("status"), e.get("idem_key")]
         for e in st.external_unknown])))
    sections.append(("Recent errors", table(
        ["when", "event", "unit", "attempt", "class", "message"],
        [[e["ts"], e["kind"], e["unit"], e["attempt"], e["class"], e["message"]]
         for e in facts["errors"]])))
    sections.append(("Deliverables", table(
        ["unit", "file", "sha256", "matches the manifest"],
        [[d["unit"], _link(d["bundle_path"], d["name"]), d["sha256"][:16] + "…",
          "yes" if d["matches"] else "NO"] for d in deliverables])))
    sections.append(("Files", "<p>Every file's sha256 is in "
                     f"{_link('manifest.json')}; check them with "
                     "<code>keepstep verify-bundle PATH</code>.</p>" + table(
                         ["file", "size", "sha256"],
                         [[_link(f["path"]), f["size"], f["sha256"][:16] + "…"] for f in files])))
    body = "".join(f'<h2 id="{escape(name.lower().replace(" ", "-"))}">{escape(name)}</h2>'
                   f"{html}" for name, html in sections)
    nav = " · ".join(f'<a href="#{escape(n.lower().replace(" ", "-"))}">{escape(n)}</a>'
                     for n, _ in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title><style>"
            "body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px;color:#1f2328}"
            "h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}"
            ".narrative{background:#f6f8fa;padding:4px 16px;border-radius:6px}"
            "svg{max-width:100%;height:auto}code{background:#f6f8fa}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{nav}</p>{body}"
            "<p><small>Generated by keepstep from the run's stored state. No model responses, "
            "source texts or keys are included.</small></p></body></html>\n")


# -- verification --------------------------------------------------------------------------
class FileProblem(BaseModel):
    path: str
    problem: str  # "missing" | "changed"
    expected_sha256: str = ""
    actual_sha256: str = ""


class BundleReport(BaseModel):
    path: str
    ok: bool
    checked: int = 0
    missing: list[str] = Field(default_factory=list)
    changed: list[FileProblem] = Field(default_factory=list)
    unlisted: list[str] = Field(default_factory=list)
    secrets: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)

    def render(self) -> str:
        head = (f"bundle OK: {self.checked} file(s) match manifest.json ({self.path})" if self.ok
                else f"bundle NOT OK ({self.path})")
        lines = [head]
        lines += [f"  missing: {m}" for m in self.missing]
        lines += [f"  changed: {c.path} (sha256 {c.actual_sha256[:12]}…, manifest says "
                  f"{c.expected_sha256[:12]}…)" for c in self.changed]
        lines += [f"  not in the manifest: {u}" for u in self.unlisted]
        lines += [f"  key-like string: {s}" for s in self.secrets]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def _reader(path: Path) -> tuple[list[str], Any]:
    if path.is_dir():
        names = [p.relative_to(path).as_posix() for p in sorted(path.rglob("*")) if p.is_file()]
        return names, lambda rel: (path / rel).read_bytes()
    zf = zipfile.ZipFile(path)
    return [n for n in zf.namelist() if not n.endswith("/")], zf.read


def verify_bundle(path: str | Path) -> BundleReport:
    """Check every file against manifest.json (folder or zip): missing and changed files,
    files the manifest does not list, key-like strings, and the deliverables' artifact hashes."""
    path = Path(path)
    report = BundleReport(path=str(path), ok=False)
    if not path.exists():
        report.problems.append("no such file or folder")
        return report
    try:
        names, read = _reader(path)
    except zipfile.BadZipFile:
        report.problems.append("not a folder and not a zip file")
        return report
    if MANIFEST not in names:
        report.problems.append("manifest.json is missing")
        return report
    try:
        manifest = json.loads(read(MANIFEST))
        files = {f["path"]: f for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        report.problems.append(f"manifest.json is unreadable: {exc}")
        return report
    if manifest.get("format") != BUNDLE_FORMAT:
        report.problems.append(f"unknown bundle format {manifest.get('format')!r}")
    present = set(names)
    for rel, entry in sorted(files.items()):
        if rel not in present:
            report.missing.append(rel)
            continue
        data = read(rel)
        report.checked += 1
        actual = _sha256(data)
        if actual != entry.get("sha256") or len(data) != entry.get("size"):
            report.changed.append(FileProblem(path=rel, problem="changed",
                                              expected_sha256=str(entry.get("sha256")),
                                              actual_sha256=actual))
    report.unlisted = sorted(n for n in present - set(files) - {MANIFEST}
                             if not n.split("/")[-1].startswith(".")
                             and not n.startswith("__MACOSX/"))
    for rel in sorted(present):
        try:
            text = read(rel).decode("utf-8")
        except UnicodeDecodeError:
            continue
        report.secrets += [f"{rel}: {name}" for name in find_secrets(text)]
    for row in manifest.get("artifacts", []):
        rel = row.get("bundle_path")
        if rel and rel in files and files[rel].get("sha256") != row.get("sha256"):
            report.problems.append(f"{rel} does not have the committed artifact's sha256")
    report.ok = not (report.missing or report.changed or report.unlisted or report.secrets
                     or report.problems)
    return report


def bundle_files(path: str | Path) -> Iterable[str]:
    """The file names inside a bundle (folder or zip)."""
    return _reader(Path(path))[0]


__all__ = ["BUNDLE_FORMAT", "BundleReport", "FileProblem", "bundle_files", "export_handover",
           "find_secrets", "narrative", "redact", "verify_bundle"]
