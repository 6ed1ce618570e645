"""Subprocess for tests/test_storage_crash.py: claim → stage → commit, forever, until killed.

Usage: python crash_child.py ROOT RUN [LEASE_SECONDS [MAX_ITERATIONS]]

Prints one flushed line per step, so the parent knows what was acknowledged:

    ready <head>
    claimed <attempt_id> <expected_version>
    staged <attempt_id>
    committed <version> <attempt_id>

Imports only keepstep.storage so that it starts fast. Crash points come from
KEEPSTEP_CRASH_AT in the environment (see keepstep.storage.faults).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from keepstep.storage import SQLiteStore


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(map(str, parts)) + "\n")
    sys.stdout.flush()


def main() -> int:
    root, run = Path(sys.argv[1]), sys.argv[2]
    lease_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    max_iterations = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000
    store = SQLiteStore(root)
    # A killed predecessor's lease is short; wait it out so every claim below succeeds
    # first time and crash-point counts (@n) map exactly to iterations.
    for lease in store.leases(run):
        time.sleep(max(0.0, lease.expires_at - store.now()) + 0.001)
    say("ready", store.get_head(run).version)
    owner = f"crash-child:{os.getpid()}"
    for _ in range(max_iterations):
        head = store.get_head(run).version
        unit = f"U{head + 1:04d}"
        claim = store.claim(run, "main", unit, expected_version=head, owner=owner,
                            lease_seconds=lease_seconds)
        say("claimed", claim.attempt_id, head)
        entry = store.artifacts.stage(
            run, claim.attempt_id, "out.json",
            (f'{{"attempt":"{claim.attempt_id}"}}' * 64).encode(),
            media_type="application/json", producer_version="crash-child",
            created_at="2024-01-01T00:00:00+00:00",
        )
        say("staged", claim.attempt_id)
        version = store.commit_checkpoint(
            run, "main", head,
            {f"unit/{unit}": {"attempt": claim.attempt_id, "sha256": entry.sha256}},
            [entry], claim.fencing_token, unit=unit, attempt_id=claim.attempt_id,
        )
        store.artifacts.seal([entry])
        say("committed", version, claim.attempt_id)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
