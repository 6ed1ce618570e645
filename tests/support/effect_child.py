"""Subprocess for tests/test_effects.py: claim a unit, then perform one webhook effect.

Usage: python effect_child.py ROOT RUN UNIT ACTION PLAN_N URL

Prints flushed lines so the parent knows how far it got:

    claimed <attempt_id> <fencing_token>
    committed <key> <remote_id>

Crash points come from KEEPSTEP_CRASH_AT (``effect.after_intent``,
``effect.after_send``): the process SIGKILLs itself there, like a power cut.
"""

from __future__ import annotations

import sys
from pathlib import Path

from keepstep.engine.run.adapters import WebhookAdapter
from keepstep.engine.run.effects import perform_effect
from keepstep.storage import SQLiteStore


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(map(str, parts)) + "\n")
    sys.stdout.flush()


def main() -> int:
    root, run, unit, action, plan_n, url = sys.argv[1:7]
    store = SQLiteStore(Path(root))
    head = store.get_head(run).version
    claim = store.claim(run, "main", unit, expected_version=head, owner="effect-child",
                        lease_seconds=600)
    say("claimed", claim.attempt_id, claim.fencing_token)
    outcome = perform_effect(
        store, WebhookAdapter(url, timeout=5), run_id=run, branch_id="main", unit=unit,
        attempt_id=claim.attempt_id, action=action,
        request={"action": action, "unit": unit, "note": "pack ready for review"},
        plan_n=int(plan_n), fencing_token=claim.fencing_token,
    )
    say("committed", outcome.key, outcome.remote_id)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
