"""deliver: hand committed deliverables to an external system, each at most once (no model).

``params.adapter`` names an ``[adapters.NAME]`` table of keepstep.toml; ``params.files``
lists ``"<unit>:<output name>"`` of declared dependencies, e.g. ``["U31:report.md"]``.
Every file is read and hash-checked first; then each is delivered by one effect through
the side-effect ledger (``ctx.effect``). The request kept in the ledger is metadata only —
``unit``, ``name``, ``sha256``, ``size``, ``media_type`` and ``path`` (the artifact's place
under the artifact root) — never the content, never source text, never a secret. The
adapter reads the bytes from ``path`` and checks them against ``sha256`` when it sends: a
webhook POSTs the bytes, a folder writes them, an email attaches them (docs/delivery.md).
``delivery.json`` records, per file, the idempotency key, the remote id and the status.
"""

from __future__ import annotations

import mimetypes
from typing import Any

from keepstep.engine.errors import KeepstepError
from keepstep.engine.kinds.common import JSON, dump_json, result
from keepstep.engine.kinds.context import KindOutcome, KindSpec, UnitContext, register
from keepstep.storage.hashing import sha256_hex

SPEC = KindSpec(
    name="deliver",
    uses_model=False,
    validators=["delivered"],
    default_outputs=["delivery.json"],
    description="Deliver dependencies' committed files through a configured adapter "
    "(webhook, folder, email, file drop), each at most once, with a receipt in the "
    "side-effect ledger.",
)


def media_type_of(name: str) -> str:
    """The media type a receiver is told (text types as UTF-8)."""
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    known = {"md": "text/markdown", "csv": "text/csv", "json": "application/json",
             "txt": "text/plain", "html": "text/html", "pdf": "application/pdf"}
    media = known.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return f"{media}; charset=utf-8" if media.startswith("text/") else media


def _bad_params(ctx: UnitContext, problem: str) -> KeepstepError:
    return KeepstepError(
        f"{ctx.unit.id}: deliver params: {problem}",
        hint='use params = {adapter = "<name from [adapters]>", files = ["U31:report.md"]}, '
        "each file from a unit listed in depends_on")


def _wanted(ctx: UnitContext) -> tuple[str, list[tuple[str, str]]]:
    """(adapter, [(unit, name)]) from the params, checked before anything is sent."""
    adapter = ctx.unit.params.get("adapter")
    files = ctx.unit.params.get("files")
    if not isinstance(adapter, str) or not adapter:
        raise _bad_params(ctx, "adapter is missing")
    if not isinstance(files, list) or not files:
        raise _bad_params(ctx, "files is missing or empty")
    deps = {d.unit for d in ctx.unit.depends_on}
    out: list[tuple[str, str]] = []
    for ref in files:
        unit, _, name = str(ref).partition(":")
        if not unit or not name:
            raise _bad_params(ctx, f"{ref!r} is not of the form <unit>:<output name>")
        if unit not in deps:
            raise _bad_params(ctx, f"{ref!r}: {unit} is not in depends_on")
        if any(name == seen for _, seen in out):
            raise _bad_params(ctx, f"{name!r} is listed twice (names are what the other side "
                              "sees; deliver each once)")
        out.append((unit, name))
    return adapter, out


@register(SPEC)
def run(ctx: UnitContext) -> KindOutcome:
    adapter, wanted = _wanted(ctx)
    requests: list[dict[str, Any]] = []
    for unit, name in wanted:
        data = ctx.dep_bytes(unit, name)  # hash-checked against the committed record
        requests.append({"unit": unit, "name": name, "size": len(data),
                         "sha256": sha256_hex(data), "media_type": media_type_of(name),
                         "path": ctx.dep_path(unit, name)})
    rows: list[dict[str, Any]] = []
    for req in requests:
        # Keyed by destination + content hash (ctx.effect's content): an unchanged file is
        # never sent twice to one destination, a changed one goes under a new key.
        action = f"deliver:{req['name']}@{req['sha256'][:12]}"
        outcome = ctx.effect(adapter, action, req, content=req["sha256"])
        rows.append({"file": f"{req['unit']}:{req['name']}", "unit": req["unit"],
                     "name": req["name"], "sha256": req["sha256"], "size": req["size"],
                     "action": action, "key": outcome.key, "remote_id": outcome.remote_id,
                     "status": outcome.status, "sent": bool(outcome.performed)})
    ctx.write("delivery.json", dump_json({"adapter": adapter, "files": rows}), media_type=JSON)
    problems = [f"{r['file']} is {r['status']}" for r in rows if r["status"] != "committed"]
    sent = sum(r["sent"] for r in rows)
    return KindOutcome(
        validators=[result("delivered", problems, ok=f"{len(rows)} file(s) delivered via "
                           f"{adapter} ({sent} sent now, {len(rows) - sent} already there)")],
        facts={"delivered": sum(r["status"] == "committed" for r in rows), "sent": sent},
    )
