"""What a fault-suite worker process runs: the real worker, plus a few test-only hooks.

``main(argv)`` strips the hook options below and hands the rest to
``keepstep.engine.drills.worker.main`` — the same code as
``python -m keepstep.engine.drills.worker``.
Crash points still come from ``KEEPSTEP_CRASH_AT`` in the environment.

Hooks (each one reproduces a fault no named crash point reaches):

``--call-rules JSON``  a list of ``{"unit", "call", "do", "seconds", "marker"}``: on the
    unit's ``call``-th provider call in this process (after the ledger reserved it), ``hold``
    (write the marker, then sleep ``seconds`` — the harness SIGKILLs the process mid-call),
    ``slow`` (sleep, then answer) or ``pause`` (write the marker, then SIGSTOP itself).
``--pause-at POINT[@n]``  SIGSTOP itself at a crash point (a zombie to be resumed later),
    after writing ``--marker``.
``--disk-full UNIT``  RLIMIT_FSIZE while the unit stages a file: the disk "fills" mid-write,
    leaving a partial temporary file, like ENOSPC would.
``--webhook URL``  the run's final unit (kind ``notes``) also delivers the pack to a webhook
    through the side-effect ledger, and recovery reconciles through the same adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

DISK_FULL_BYTES = 256
EFFECT_ACTION = "deliver-pack"


def _touch(marker: str | None) -> None:
    if marker:
        Path(marker).write_text(str(os.getpid()))


def install_call_rules(rules: list[dict[str, Any]]) -> None:
    from keepstep.engine.gateway.client import ModelGateway

    current = threading.local()
    seen: Counter[str] = Counter()
    complete, completion = ModelGateway.complete, ModelGateway._completion

    def traced_complete(self: Any, ctx: Any, request: Any, **estimates: Any) -> Any:
        current.unit = ctx.unit
        return complete(self, ctx, request, **estimates)

    def faulty_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Whatever the gateway hands its transport picker (the provider, since the offline
        # model got its own transport) goes through unchanged.
        fn = completion(self, *args, **kwargs)

        def call(**kwargs: Any) -> Any:
            unit = getattr(current, "unit", None)
            seen[unit] += 1
            for rule in rules:
                if rule["unit"] != unit or rule.get("call", seen[unit]) != seen[unit]:
                    continue
                if rule["do"] == "hold":
                    _touch(rule.get("marker"))
                    time.sleep(float(rule.get("seconds", 60)))
                elif rule["do"] == "slow":
                    time.sleep(float(rule["seconds"]))
                elif rule["do"] == "pause":
                    _touch(rule.get("marker"))
                    os.kill(os.getpid(), signal.SIGSTOP)
            return fn(**kwargs)

        return call

    ModelGateway.complete = traced_complete  # type: ignore[method-assign]
    ModelGateway._completion = faulty_completion  # type: ignore[method-assign]


def install_pause(spec: str, marker: str | None) -> None:
    import keepstep.engine.run.attempt as executor
    import keepstep.engine.run.effects as effects
    import keepstep.engine.run.loop as runner
    import keepstep.engine.run.runner as unit_runner
    import keepstep.storage.sqlite.checkpoints as sqlite_checkpoints
    import keepstep.storage.sqlite.claims as sqlite_claims
    from keepstep.storage.faults import crash_point

    target, _, nth = spec.partition("@")
    hits = Counter()

    def pausing_crash_point(name: str) -> None:
        if name == target:
            hits[name] += 1
            if hits[name] == int(nth or 1):
                _touch(marker)
                os.kill(os.getpid(), signal.SIGSTOP)
        crash_point(name)

    for module in (runner, unit_runner, executor, sqlite_checkpoints, sqlite_claims, effects):
        module.crash_point = pausing_crash_point  # type: ignore[attr-defined]


def install_disk_full(unit: str) -> None:
    from keepstep.storage.artifacts import ArtifactStore

    stage = ArtifactStore.stage

    def stage_on_a_full_disk(self: Any, run_id: str, attempt_id: str, name: str, data: bytes,
                             **kwargs: Any) -> Any:
        if attempt_id.partition("/")[0] != unit or len(data) <= DISK_FULL_BYTES:
            return stage(self, run_id, attempt_id, name, data, **kwargs)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (DISK_FULL_BYTES, hard))
        try:
            return stage(self, run_id, attempt_id, name, data, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    ArtifactStore.stage = stage_on_a_full_disk  # type: ignore[method-assign]


def install_webhook(url: str) -> None:
    from keepstep.engine import api as project_module
    from keepstep.engine.kinds.context import REGISTRY
    from keepstep.engine.run.adapters import WebhookAdapter
    from keepstep.engine.run.effects import perform_effect

    opener = project_module.open_project

    def open_with_adapters(path: Any, **kwargs: Any) -> Any:
        project = opener(path, **kwargs)
        project.effect_adapters = {"webhook": WebhookAdapter(url, timeout=2.0)}
        return project

    project_module.open_project = open_with_adapters  # type: ignore[assignment]
    spec, notes = REGISTRY["notes"]

    def notes_then_deliver(ctx: Any) -> Any:
        outcome = notes(ctx)
        # The request must not change within a plan version (it is hashed with the key).
        perform_effect(
            ctx.store, WebhookAdapter(url, timeout=2.0), run_id=ctx.run_id,
            branch_id=ctx.branch_id, unit=ctx.unit.id, attempt_id=ctx.attempt_id,
            action=EFFECT_ACTION, plan_n=ctx.plan_n, fencing_token=ctx.claim.fencing_token,
            request={"action": EFFECT_ACTION, "run": ctx.run_id, "unit": ctx.unit.id,
                     "plan": ctx.plan_n},
        )
        return outcome

    REGISTRY["notes"] = (spec, notes_then_deliver)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--call-rules")
    ap.add_argument("--pause-at")
    ap.add_argument("--marker")
    ap.add_argument("--disk-full")
    ap.add_argument("--webhook")
    hooks, rest = ap.parse_known_args(argv)
    if hooks.call_rules:
        install_call_rules(json.loads(hooks.call_rules))
    if hooks.pause_at:
        install_pause(hooks.pause_at, hooks.marker)
    if hooks.disk_full:
        install_disk_full(hooks.disk_full)
    if hooks.webhook:
        install_webhook(hooks.webhook)
    from keepstep.engine.drills.worker import main as worker_main

    return worker_main(rest)
