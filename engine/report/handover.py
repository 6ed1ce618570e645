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
    sources/*.html        each cited source's cited statements under their evidence ids and
                          locators (``sources="files"``: sources/files/* the files too)
    manifest.json         sha256 + size of every other file, and the artifact manifest rows
                          of the current outputs

Never bundled: model responses (``calls/*.json``), source text beyond the cited statements
(unless ``sources="files"``), approval token hashes, keys.
Every text is passed through ``redact`` and ``verify_bundle`` scans for key-like strings.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from keepstep.engine.errors import KeepstepError
from keepstep.engine.gateway.redaction import find_secrets, redact
from keepstep.engine.report.display import handover_index_html
from keepstep.engine.report.narrative import check_narrative, narrative
from keepstep.engine.report.narrative_history import gather
from keepstep.storage import ChainBroken, ChainReport

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run

BUNDLE_FORMAT = "keepstep-handover/1"
MANIFEST = "manifest.json"
RECENT_ERRORS = 50
BASELINE_FIELDS = ("version", "hash", "kind", "state_hash", "parent_version", "parent_hash",
                   "created_at", "unit", "attempt", "schema_version")
ERROR_KINDS = ("attempt.failed", "unit.blocked", "recovery.failed", "recovery.blocked",
               "attempt.fenced")
# Keys never written to a bundle, whatever their value.
DROP_KEYS = frozenset({"token_hash", "token", "resume_token", "secret", "api_key", "apikey",
                       "password", "authorization"})


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
        _private_dirs(self.root, path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(redact(text))

    def json(self, rel: str, data: Any) -> None:
        self.text(rel, json.dumps(_safe(data), indent=2, ensure_ascii=False, sort_keys=True)
                  + "\n")


def _private_dirs(root: Path, folder: Path) -> None:
    """Create ``folder`` (under ``root``) and any missing parents with mode 0700."""
    missing = []
    while folder != root and not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _deliverables(run: Run) -> list[dict[str, Any]]:
    from keepstep.engine.report.views import current_deliverables

    rows = [d.model_dump() for d in current_deliverables(run)]
    names = [r["name"] for r in rows]
    for r in rows:
        clash = names.count(r["name"]) > 1
        r["bundle_path"] = f"deliverables/{r['unit']}-{r['name']}" if clash else \
            f"deliverables/{r['name']}"
    return rows


def _collect(run: Run) -> dict[str, Any]:
    """Every fact the bundle shows, read once."""
    from keepstep.engine.run.gates import pending_approvals

    store = run.store
    facts = gather(run)
    status, records, cp = facts.status, facts.records, facts.baseline
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
    events = facts.events
    errors = [e for e in events if e.kind in ERROR_KINDS][-RECENT_ERRORS:]
    changes = [e for e in events if e.kind in ("decision.plan_change", "decision.input_change")]
    approvals = [a for a in store.approvals(run.run_id, branch_id=run.branch_id)]
    error_rows = [{"seq": e.seq, "ts": e.ts, "kind": e.kind, "unit": e.unit,
                   "attempt": e.attempt_id,
                   "class": e.payload.get("error_class") or e.payload.get("kind"),
                   "message": e.payload.get("message") or e.payload.get("reason") or ""}
                  for e in errors]
    return {
        "status": status, "units": units, "artifacts": artifacts,
        "error_groups": group_errors(error_rows, status),
        "baseline": {
            "head_version": status.head_version,
            "verified": cp is not None and cp.version == status.head_version,
            "verification": facts.verification,
            **({k: None for k in BASELINE_FIELDS} if cp is None else
               {k: getattr(cp, k) for k in BASELINE_FIELDS})},
        "inputs": store.read_key(run.run_id, "inputs", run.branch_id) or {},
        "invalidations": {
            "current": {u: [e.model_dump(mode="json") | {"text": e.render()}
                            for e in r.explanations]
                        for u, r in records.items() if r.state.value == "invalidated"},
            "history": [{"seq": e.seq, "ts": e.ts, "kind": e.kind, **e.payload}
                        for e in changes]},
        "orphans": [o.model_dump(mode="json") | {"directory": _relative(o.directory,
                                                                        store.artifacts.root)}
                    for o in store.orphaned_attempts(run.run_id)],
        "approvals": {"pending": [p.model_dump(mode="json") for p in pending_approvals(run)],
                      "history": [a.model_dump(mode="json") for a in approvals
                                  if a.status != "requested"]},
        "errors": error_rows,
        "models": list(status.models),
        "recoveries": [{"seq": e.seq, "ts": e.ts, "kind": e.kind, **e.payload}
                       for e in events if e.kind.startswith("recovery.")
                       and e.kind != "recovery.orphan"],
    }


# What to do about each cause of error, in one sentence (a cause not listed gets the
# generic advice: explain the unit, then retry it).
ERROR_ACTIONS = {
    "budget": "raise the budget with `keepstep budget raise`, then resume",
    "quota": "top up the provider account or switch the model, then resume",
    "auth": "store a valid key with `keepstep keys set` and the provider's name, then resume",
    "rate_limited": "wait, or lower the request rate; resume retries",
    "provider_outage": "check the provider's status or your network, then resume",
    "storage": "free disk space where the project lies, then resume",
    "effect": "settle the external action with `keepstep effects settle` and its key",
    "expert": "when the expert has looked, release the unit with a takeover rerun",
}


def group_errors(errors: list[dict[str, Any]], status: Any) -> list[dict[str, Any]]:
    """The recent errors grouped by cause (their class, or the event kind): how many, which
    units, the latest message and one action each, most frequent first."""
    groups: dict[str, dict[str, Any]] = {}
    for e in errors:
        cause = str(e.get("class") or e["kind"].split(".")[-1])
        g = groups.setdefault(cause, {"cause": cause, "count": 0, "units": [], "last": "",
                                      "message": ""})
        g["count"] += 1
        if e.get("unit") and e["unit"] not in g["units"]:
            g["units"].append(e["unit"])
        g["last"], g["message"] = e["ts"], e.get("message") or g["message"]
    needs = {n.unit: n for n in getattr(status, "needs", [])}
    units = getattr(status, "units", {}) or {}
    for g in groups.values():
        # An error of units that are all current again is history, not a thing to do.
        g["resolved"] = bool(g["units"]) and all(
            getattr(units.get(u), "state", "") in ("succeeded", "current") for u in g["units"])
        if g["resolved"]:
            g["action"] = f"nothing: {', '.join(g['units'])} current again (a later attempt " \
                "succeeded)"
            continue
        need = next((needs[u] for u in g["units"] if u in needs), None)
        first = g["units"][0] if g["units"] else None
        generic = (f"look at {first} (`keepstep explain --run {status.run_id} {first}`), then "
                   f"retry it (`keepstep retry --run {status.run_id} {first}`)" if first else
                   "look at the events (`keepstep events`), then resume")
        g["action"] = (f"{need.action} ({need.command})" if need is not None and need.command
                       else ERROR_ACTIONS.get(g["cause"], generic))
    return sorted(groups.values(), key=lambda g: (-g["count"], g["cause"]))


SOURCE_MODES = ("excerpts", "files", "none")
_EVIDENCE_ID = re.compile(r"(?<![\w-])([A-Za-z][\w.]*-e\d+)(?![\w-])")
_CITED = re.compile(r"\[([A-Za-z][\w.]*-e\d+(?:,\s*[A-Za-z][\w.]*-e\d+)*)\]")


def _recommendation(deliverables: list[dict[str, Any]]) -> str:
    """The section under the first heading that says "recommendation" in a Markdown
    deliverable (plan order), as Markdown; "" when none has one."""
    for d in deliverables:
        if not str(d["name"]).endswith(".md"):
            continue
        try:
            lines = Path(d["path"]).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for i, line in enumerate(lines):
            m = re.match(r"(#+)\s+(.*)", line)
            if m and "recommendation" in m.group(2).lower():
                body = []
                for nxt in lines[i + 1:]:
                    n = re.match(r"(#+)\s", nxt)
                    if n and len(n.group(1)) <= len(m.group(1)):
                        break
                    body.append(nxt)
                text = "\n".join(body).strip()
                if text:
                    return text
    return ""


def conclusions(run: Run, deliverables: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run concluded, for the page's first section: the recommendation (from a
    deliverable), the top risks, the open disagreements, and the evidence they cite."""
    from keepstep.engine.report.docx_export import _outputs, chart_data

    data = chart_data(run)
    conflicts = [c for doc in _outputs(run, "verified.json") if isinstance(doc, dict)
                 for c in doc.get("conflicts") or [] if isinstance(c, dict)]
    return {
        "recommendation": _recommendation(deliverables),
        "risks": sorted(data.risks, key=lambda r: -int(r.get("score") or 0))[:5],
        "disagreements": [c for c in conflicts if c.get("status") != "conflict-resolved"],
        "evidence": {str(e.get("id")): {"source_id": str(e.get("source_id", "")),
                                        "locator": str(e.get("locator") or ""),
                                        "quote": str(e.get("quote") or "")}
                     for e in data.evidence if e.get("id")},
    }


def _page_fragment(locator: str) -> str:
    m = re.match(r"p(?:age|p)?\.?\s*(\d+)", locator.strip(), re.I)
    return f"#page={m.group(1)}" if m else ""


def _write_sources(run: Run, w: _Writer, out: Path, evidence: dict[str, dict[str, Any]],
                   mode: str) -> dict[str, str]:
    """The sources the run cites, in ``sources/``: a page per cited source with each cited
    excerpt under its evidence id (an anchor) and locator; with ``mode`` "files" the
    approved source file too. Returns evidence id -> link (relative to the bundle)."""
    if mode == "none":
        return {}
    from html import escape

    by_source: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for eid, e in sorted(evidence.items()):
        by_source.setdefault(e["source_id"], []).append((eid, e))
    entries = {s.id: s for s in run.project.files.sources.sources}
    links = {}
    for sid, items in by_source.items():
        entry = entries.get(sid)
        if entry is None:
            continue
        file_link = ""
        if mode == "files":
            src = run.project.root / entry.path
            if src.is_file() and src.resolve().is_relative_to(run.project.root.resolve()):
                rel = f"sources/files/{Path(entry.path).name}"
                _private_dirs(out, (out / rel).parent)
                shutil.copyfile(src, out / rel)
                os.chmod(out / rel, 0o600)
                file_link = f"files/{Path(entry.path).name}"
        rows = []
        for eid, e in items:
            where = escape(e["locator"] or "(no locator)")
            if file_link:
                where = f'<a href="{escape(file_link + _page_fragment(e["locator"]))}">{where}</a>'
            rows.append(f'<section id="{escape(eid)}"><h2>{escape(eid)} · {where}</h2>'
                        f"<blockquote>{escape(e['quote'])}</blockquote></section>")
            links[eid] = f"sources/{sid}.html#{eid}"
        head = (f"<h1>{escape(sid)} · {escape(entry.title or entry.path)}</h1>"
                f"<p>{escape(entry.kind or '')} · group {escape(entry.group or '-')} · "
                + (f'<a href="{escape(file_link)}">the source file</a>' if file_link else
                   "the excerpts the run cites (the file itself is not in this bundle)")
                + "</p>")
        w.text(f"sources/{sid}.html",
               '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
               f"<title>{escape(sid)}</title><style>body{{font-family:system-ui,sans-serif;"
               "margin:24px;max-width:900px}section:target{background:#fff8c5}"
               "blockquote{border-left:4px solid #d0d7de;margin:0;padding:4px 12px}</style>"
               f'</head><body><p><a href="../index.html">← handover</a></p>{head}'
               + "".join(rows) + "</body></html>\n")
    return links


def link_citations(html: str, links: dict[str, str]) -> str:
    """Each evidence id inside a citation ``[A1-e2, B1-e1]`` of ``html`` as a link to its
    excerpt (ids without a link stay text)."""
    def one(m: re.Match[str]) -> str:
        return _EVIDENCE_ID.sub(lambda i: f'<a class="cite" href="{links[i.group(1)]}">'
                                f"{i.group(1)}</a>" if i.group(1) in links else i.group(1),
                                m.group(0))

    return _CITED.sub(one, html)


def _relative(path: str, root: Path) -> str:
    """A path under the artifact root, without the machine-specific prefix."""
    p = Path(path)
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else p.name


def _contract(run: Run) -> tuple[str, bool]:
    from keepstep.engine.files.project import CONTRACT_FILE, load_contract

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


def export_handover(run: Run, out: str | Path, *, require_verified: bool = False,
                    sources: str = "excerpts") -> Path:
    """Write the handover bundle of ``run`` to ``out`` (a folder, or a zip if it ends in
    ``.zip``) and return its path. An earlier bundle at ``out`` is replaced; anything else
    there is refused. The narrative is checked against the state before it is written.

    The whole checkpoint chain is verified first. A broken chain marks the bundle
    unverified (its manifest names the checkpoints; ``verify_bundle`` then reports it as not
    OK), or, with ``require_verified``, raises ChainBroken naming the version. The
    bundle is written under a temporary name, verified against its manifest, and only then
    moved to ``out``; one that does not verify is kept as ``<out>.failed`` and raises.
    Folders are created 0700 and files 0600: a bundle is as private as the run state.

    ``sources``: "excerpts" writes a page per cited source with each cited statement under
    its evidence id and locator, and index.html links every citation to it; "files" copies
    the approved source files too; "none" leaves sources out. The default, "excerpts", is
    `keepstep handover`'s too: a reader can check every citation.
    """
    if sources not in SOURCE_MODES:
        raise KeepstepError(f"unknown sources mode {sources!r}",
                            hint=f"choose from {', '.join(SOURCE_MODES)}")
    out = Path(out)
    _prepare_target(out)
    chain = run.store.verify_chain(run.run_id, run.branch_id)
    if not chain.ok and require_verified:
        where = "; ".join(f"checkpoint {p.version}: {p.problem}" for p in chain.problems[:3])
        raise ChainBroken(
            f"run {run.run_id} ({run.branch_id}): the checkpoint chain does not verify "
            f"({where}); a bundle would hand over state nobody can trust",
            hint=f"see where it breaks with `keepstep verify {run.project.root} --run "
            f"{run.run_id}` and restore from a backup (`keepstep restore`)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.partial-{secrets.token_hex(4)}")
    try:
        if out.suffix.lower() == ".zip":
            with tempfile.TemporaryDirectory(prefix="keepstep-handover-") as tmp:
                folder = _write_bundle(run, Path(tmp) / "bundle", chain, sources)
                fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as fh, \
                        zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                        info = zipfile.ZipInfo(path.relative_to(folder).as_posix(),
                                               date_time=(1980, 1, 1, 0, 0, 0))
                        info.compress_type = zipfile.ZIP_DEFLATED
                        info.external_attr = 0o600 << 16
                        zf.writestr(info, path.read_bytes())
        else:
            _write_bundle(run, staging, chain, sources)
        report = verify_bundle(staging)
        if not report.files_ok:
            failed = out.with_name(out.name + ".failed")
            _remove(failed)
            staging.rename(failed)
            raise KeepstepError(
                f"the handover bundle did not verify against its own manifest; kept as "
                f"{failed} for a look: " + "; ".join(report.render().splitlines()[1:4]),
                hint="nothing was handed over; export again, and if it fails again run "
                "`keepstep verify` on the run")
        staging.replace(out)
    finally:
        _remove(staging)
    return out


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _write_bundle(run: Run, out: Path, chain: ChainReport, sources: str = "excerpts"
                  ) -> Path:
    from keepstep.engine.report.dag_svg import run_dag_svg

    facts = _collect(run)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    w.json("state/errors_by_cause.json", facts["error_groups"])
    w.json("state/recoveries.json", facts["recoveries"])
    w.json("state/next_step.json", {"next_action": st.next_action, "decision": st.decision,
                                    "reasons": st.reasons})
    deliverables = _deliverables(run)
    for d in deliverables:
        target = out / d["bundle_path"]
        _private_dirs(out, target.parent)
        shutil.copyfile(d["path"], target)
        os.chmod(target, 0o600)
    by_attempt = {(d["unit"], d["name"]): d["bundle_path"] for d in deliverables}
    artifacts = [a | ({"bundle_path": by_attempt[(a["unit"], a["name"])]}
                      if (a["unit"], a["name"]) in by_attempt else {})
                 for a in facts["artifacts"]]
    found = conclusions(run, deliverables)
    links = _write_sources(run, w, out, found["evidence"], sources)
    title = f"Handover: run {run.run_id} — {run.plan.plan.title or run.project.files.config.name}"
    w.text("index.html", link_citations(handover_index_html(
        title=title, run_label=f"{run.run_id} ({run.branch_id})", facts=facts,
        deliverables=deliverables, svg=svg, story=story, contract_current=contract_current,
        files=_listing(out), conclusions=found), links))
    manifest = {
        "format": BUNDLE_FORMAT, "run": run.run_id, "branch": run.branch_id,
        "plan_version": st.plan_version, "input_version": st.input_version,
        "baseline": {k: facts["baseline"][k] for k in ("version", "hash", "state_hash", "kind")},
        "decision": st.decision, "contract_matches_run": contract_current,
        "narrative_check": [m.render() for m in mismatches],
        "chain": {"verified": chain.ok, "checked": chain.checked,
                  "problems": [f"checkpoint {p.version}: {p.problem}" for p in chain.problems]},
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
    # The run's checkpoints that did not verify when the bundle was exported: its files may
    # match their hashes, but the state they describe cannot be trusted.
    unverified_chain: list[str] = Field(default_factory=list)

    @property
    def files_ok(self) -> bool:
        """Every file is present, listed and unchanged (whatever the chain said)."""
        return not (self.missing or self.changed or self.unlisted or self.secrets
                    or self.problems)

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
        if self.unverified_chain:
            lines.append("  UNVERIFIED: the run's checkpoint chain did not verify when this "
                         "bundle was exported — " + "; ".join(self.unverified_chain[:3]))
        return "\n".join(lines)


# Bounds for a bundle received from someone else: verify_bundle never reads a file the
# manifest does not list, never reads more than the manifest declares for a file, and hashes
# in blocks, so a bomb costs neither time nor memory.
MANIFEST_LIMIT = 64 * 1024 * 1024
FILE_LIMIT = 1024 * 1024 * 1024  # one listed file
SCAN_LIMIT = 16 * 1024 * 1024  # a file larger than this is scanned for keys block by block
_BLOCK = 1024 * 1024


class _Bundle:
    """A bundle folder or zip: its files with their sizes (from the zip directory or lstat,
    no file read) and bounded streams over them. Symbolic links in a folder are not
    followed: they are listed as problems."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip: zipfile.ZipFile | None = None
        self.sizes: dict[str, int] = {}
        self.links: list[str] = []
        if path.is_dir():
            for folder, dirs, files in os.walk(path, followlinks=False):
                for name in dirs + files:
                    full = Path(folder) / name
                    rel = full.relative_to(path).as_posix()
                    st = full.lstat()
                    if full.is_symlink():
                        self.links.append(rel)
                    elif name in files and full.is_file():
                        self.sizes[rel] = st.st_size
            return
        self.zip = zipfile.ZipFile(path)
        for info in self.zip.infolist():
            if not info.is_dir():
                self.sizes[info.filename] = info.file_size

    def close(self) -> None:
        if self.zip is not None:
            self.zip.close()

    def open(self, rel: str):  # noqa: ANN201 - a binary stream
        if self.zip is not None:
            return self.zip.open(rel)
        return open(self.path / rel, "rb")  # noqa: SIM115 - the caller closes it

    def read(self, rel: str, limit: int) -> bytes:
        """At most ``limit`` bytes of ``rel`` (the caller checked the declared size)."""
        with self.open(rel) as fh:
            return fh.read(limit)

    def blocks(self, rel: str, limit: int) -> Iterator[bytes]:
        """``rel``'s bytes in blocks, stopping after ``limit`` + 1 bytes."""
        left = limit + 1
        with self.open(rel) as fh:
            while left > 0:
                block = fh.read(min(_BLOCK, left))
                if not block:
                    return
                left -= len(block)
                yield block


@contextmanager
def _opened(path: Path) -> Iterator[tuple[list[str], Callable[[str], bytes]]]:
    """(file names, read(name) -> bytes) of a bundle folder or zip (each read bounded)."""
    bundle = _Bundle(path)
    try:
        yield sorted(bundle.sizes), lambda rel: bundle.read(rel, FILE_LIMIT)
    finally:
        bundle.close()


def verify_bundle(path: str | Path) -> BundleReport:
    """Check every file against manifest.json (folder or zip): missing and changed files,
    files the manifest does not list, key-like strings, and the deliverables' artifact hashes.

    Safe on a bundle from anyone: a file the manifest does not list is reported without
    being read, a declared size (zip directory, or the file's size) that differs from the
    manifest's is a change found without reading, and listed files are hashed in blocks up
    to their declared size, so a zip bomb is refused in seconds with bounded memory."""
    path = Path(path)
    report = BundleReport(path=str(path), ok=False)
    if not path.exists():
        report.problems.append("no such file or folder")
        return report
    try:
        bundle = _Bundle(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        report.problems.append("not a folder and not a zip file")
        return report
    try:
        _check(report, bundle)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, EOFError,
            ValueError, NotImplementedError, RuntimeError) as exc:
        report.problems.append(f"the bundle is damaged ({type(exc).__name__})")
    finally:
        bundle.close()
    report.ok = report.files_ok and not report.unverified_chain
    return report


def _read_manifest(report: BundleReport, bundle: _Bundle) -> dict[str, Any] | None:
    size = bundle.sizes.get(MANIFEST)
    if size is None:
        report.problems.append("manifest.json is missing")
        return None
    if size > MANIFEST_LIMIT:
        report.problems.append(f"manifest.json declares {size} bytes, over the "
                               f"{MANIFEST_LIMIT // (1024 * 1024)} MB limit; not read")
        return None
    try:
        manifest = json.loads(bundle.read(MANIFEST, MANIFEST_LIMIT))
        manifest["files"] = {str(f["path"]): f for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        report.problems.append(f"manifest.json is unreadable: {exc}")
        return None
    return manifest


def _check(report: BundleReport, bundle: _Bundle) -> None:
    report.problems += [f"{rel} is a symbolic link (not followed)" for rel in bundle.links]
    manifest = _read_manifest(report, bundle)
    if manifest is None:
        return
    files: dict[str, dict[str, Any]] = manifest["files"]
    if manifest.get("format") != BUNDLE_FORMAT:
        report.problems.append(f"unknown bundle format {manifest.get('format')!r}")
    present = set(bundle.sizes)
    report.unlisted = sorted(n for n in present - set(files) - {MANIFEST}
                             if not n.split("/")[-1].startswith(".")
                             and not n.startswith("__MACOSX/"))
    for rel, entry in sorted(files.items()):
        if rel not in present:
            report.missing.append(rel)
            continue
        expected = entry.get("size")
        declared = bundle.sizes[rel]
        if not isinstance(expected, int) or declared != expected or declared > FILE_LIMIT:
            if isinstance(expected, int) and declared > FILE_LIMIT:
                report.problems.append(f"{rel} declares {declared} bytes, over the "
                                       f"{FILE_LIMIT // (1024 * 1024)} MB limit; not read")
            report.changed.append(FileProblem(
                path=rel, problem="changed", expected_sha256=str(entry.get("sha256")),
                actual_sha256=f"(not read: {declared} bytes, manifest says {expected})"))
            continue
        report.checked += 1
        actual, size, found = _hash_and_scan(bundle, rel, expected)
        report.secrets += [f"{rel}: {name}" for name in found]
        if actual != entry.get("sha256") or size != expected:
            report.changed.append(FileProblem(path=rel, problem="changed",
                                              expected_sha256=str(entry.get("sha256")),
                                              actual_sha256=actual))
    if MANIFEST in present:
        report.secrets += [f"{MANIFEST}: {name}"
                           for name in _scan(bundle.read(MANIFEST, MANIFEST_LIMIT))]
    chain = manifest.get("chain") or {}
    if chain.get("verified") is False:
        report.unverified_chain = [str(p) for p in chain.get("problems", [])] or ["(no detail)"]
    for row in manifest.get("artifacts", []):
        rel = row.get("bundle_path")
        if rel and rel in files and files[rel].get("sha256") != row.get("sha256"):
            report.problems.append(f"{rel} does not have the committed artifact's sha256")


def _hash_and_scan(bundle: _Bundle, rel: str, limit: int) -> tuple[str, int, list[str]]:
    """sha256 and size of ``rel`` read in blocks (at most ``limit`` + 1 bytes), and the
    key-like patterns in it (a small file as a whole, a large one block by block)."""
    h = hashlib.sha256()
    size = 0
    kept: list[bytes] = []
    found: set[str] = set()
    tail = b""
    for block in bundle.blocks(rel, limit):
        h.update(block)
        size += len(block)
        if limit <= SCAN_LIMIT:
            kept.append(block)
        else:
            found.update(_scan(tail + block, strict=False))
            tail = block[-4096:]
    if kept:
        found.update(_scan(b"".join(kept)))
    return h.hexdigest(), size, sorted(found)


def _scan(data: bytes, *, strict: bool = True) -> list[str]:
    """Key-like patterns in ``data`` as UTF-8 text (none for binary data when ``strict``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        if strict:
            return []
        text = data.decode("utf-8", errors="replace")
    return find_secrets(text)


def bundle_files(path: str | Path) -> list[str]:
    """The file names inside a bundle (folder or zip)."""
    with _opened(Path(path)) as (names, _read):
        return names


__all__ = ["BUNDLE_FORMAT", "SOURCE_MODES", "BundleReport", "conclusions", "link_citations",
           "FileProblem", "bundle_files", "export_handover", "find_secrets", "narrative", "redact",
           "verify_bundle"]
