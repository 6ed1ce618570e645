"""Replay: re-execute a run from its recorded responses — no model is called.

The recorded responses are the ``calls/*.json`` artifacts of the source run's
committed attempts, keyed by request hash. A request the source run never made
stops the replayed unit with a clear message (the inputs have changed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from keepstep.engine.errors import KeepstepError
from keepstep.engine.run.loop import RunLoop
from keepstep.engine.run.recovery import recover
from keepstep.storage.hashing import sha256_hex

if TYPE_CHECKING:
    from keepstep.engine.run.runtime import Run


def recorded_responses(run: Run) -> dict[str, str]:
    """request hash -> the recorded response, from the committed ``calls/*.json`` artifacts.

    Raises KeepstepError naming the file when a recorded response no longer matches its
    manifest hash: a replay never uses altered bytes."""
    out: dict[str, str] = {}
    for entry in run.store.manifest(run.run_id):
        if not entry.name.startswith("calls/"):
            continue
        path = run.store.artifacts.path_of(entry)
        if not path.is_file():  # removed by retention (gc): that response cannot be replayed
            continue
        blob = path.read_bytes()
        if sha256_hex(blob) != entry.sha256:
            raise KeepstepError(
                f"replay refused: {path} does not match its manifest hash "
                f"(recorded sha256 {entry.sha256[:12]}…, file {sha256_hex(blob)[:12]}…)",
                hint="the recorded response was changed after it was committed; restore the "
                "file from a backup (`keepstep restore`), or `keepstep resume` the run, which "
                "redoes the unit whose response changed")
        data = json.loads(blob)
        out.setdefault(data["request_hash"], data["content"])
    return out


def replay_run(source: Run, new_run_id: str, **kwargs: Any) -> Run:

    responses = recorded_responses(source)
    project = source.project
    new = project.start_run(new_run_id)
    project.store.append_event(new_run_id, "decision.replay",
                               payload={"source_run": source.run_id,
                                        "recorded_responses": len(responses)})
    recover(new)
    approve = kwargs.pop("approve", None) or _recorded_choices(source)
    RunLoop(new, approve=approve, replay=responses, **kwargs).loop()
    return new


def _recorded_choices(run: Run) -> dict[str, str]:
    choices: dict[str, str] = {}
    for ev in run.store.events(run.run_id, kinds=["approval.decided"]):
        gate = ev.payload.get("gate") or ev.payload.get("gate_id")
        if gate and ev.payload.get("choice"):
            choices[gate] = ev.payload["choice"]
    return choices
