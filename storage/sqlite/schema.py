"""The database schema, built only by sqlite-utils Migrations.

Rules: a migration is never edited after it ships; each new one is appended
and bumps SCHEMA_VERSION (stored in PRAGMA user_version as well, so a newer
database can be recognised with one read-only query).
"""

from __future__ import annotations

import json

from keepstep.storage.sqlite.sqlite_lib import Database, Migrations

MIGRATION_SET = "keepstep"
migrations = Migrations(MIGRATION_SET)


@migrations()
def m001_initial(db: Database) -> None:
    db.executescript(
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            created_at TEXT NOT NULL,
            meta TEXT NOT NULL DEFAULT '{}'
        );
        CREATE TABLE branches (
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            branch_id TEXT NOT NULL,
            head_version INTEGER NOT NULL,
            head_hash TEXT NOT NULL,
            forked_from TEXT,
            forked_at INTEGER,
            created_at TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id)
        );
        CREATE TABLE checkpoints (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            parent_branch TEXT,
            parent_version INTEGER,
            parent_hash TEXT NOT NULL,
            kind TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            unit TEXT,
            attempt TEXT,
            fencing_token INTEGER,
            delta TEXT NOT NULL,
            state_hash TEXT NOT NULL,
            created_at TEXT NOT NULL,
            hash TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id, version),
            FOREIGN KEY (run_id, branch_id) REFERENCES branches(run_id, branch_id)
        );
        CREATE TABLE current_state (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id, key)
        ) WITHOUT ROWID;
        CREATE TABLE state_meta (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            state_hash TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id)
        );
        CREATE TABLE attempts (
            attempt_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_no INTEGER NOT NULL,
            executor TEXT NOT NULL,
            fencing_token INTEGER NOT NULL,
            status TEXT NOT NULL,
            claimed_at_version INTEGER NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            error_class TEXT,
            message TEXT,
            PRIMARY KEY (run_id, attempt_id)
        );
        CREATE INDEX attempts_unit ON attempts(run_id, unit);
        CREATE TABLE leases (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            fencing_token INTEGER NOT NULL,
            expires_at REAL NOT NULL,
            renewed_at REAL NOT NULL,
            progress TEXT,
            progress_at REAL NOT NULL,
            PRIMARY KEY (run_id, branch_id, unit)
        );
        CREATE TABLE fencing (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            last_token INTEGER NOT NULL
        );
        INSERT INTO fencing (id, last_token) VALUES (1, 0);
        CREATE TABLE unit_status (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            status TEXT NOT NULL,
            reason TEXT NOT NULL,
            details TEXT NOT NULL DEFAULT '{}',
            updated_at TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id, unit)
        );
        CREATE TABLE artifacts (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            name TEXT NOT NULL,
            path TEXT NOT NULL,
            media_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            source_ids TEXT NOT NULL DEFAULT '[]',
            validators TEXT NOT NULL DEFAULT '{}',
            producer_version TEXT NOT NULL,
            created_at TEXT NOT NULL,
            checkpoint_version INTEGER NOT NULL,
            PRIMARY KEY (run_id, attempt_id, name)
        );
        CREATE INDEX artifacts_unit ON artifacts(run_id, unit);
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            ts TEXT NOT NULL,
            kind TEXT NOT NULL,
            unit TEXT,
            attempt_id TEXT,
            payload TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX events_run ON events(run_id, seq);
        CREATE TRIGGER events_no_delete BEFORE DELETE ON events
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        -- retention may strip a payload down to '{}' (metadata stays); nothing else changes
        CREATE TRIGGER events_no_update BEFORE UPDATE ON events
            WHEN NEW.payload != '{}' OR NEW.kind != OLD.kind OR NEW.ts != OLD.ts
              OR NEW.run_id != OLD.run_id OR NEW.seq != OLD.seq
              OR NEW.branch_id != OLD.branch_id
              OR NEW.unit IS NOT OLD.unit OR NEW.attempt_id IS NOT OLD.attempt_id
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        CREATE TABLE model_calls (
            call_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            round INTEGER NOT NULL,
            model TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            status TEXT NOT NULL,
            tokens_in INTEGER NOT NULL DEFAULT 0,
            tokens_out INTEGER NOT NULL DEFAULT 0,
            cost REAL NOT NULL DEFAULT 0,
            latency_ms INTEGER NOT NULL DEFAULT 0,
            outcome TEXT,
            error_class TEXT,
            safe_message TEXT,
            response_artifact TEXT,
            reserved_at TEXT NOT NULL,
            settled_at TEXT
        );
        CREATE INDEX model_calls_run ON model_calls(run_id, unit);
        CREATE TABLE budgets (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            limits TEXT NOT NULL DEFAULT '{}',
            used TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (run_id, branch_id)
        );
        """
    )
    db.execute("PRAGMA user_version = 1")


@migrations()
def m002_approvals_effects(db: Database) -> None:
    # One statement per execute(): executescript() would COMMIT the migration's
    # transaction half-way, and a failure could then leave half a schema behind.
    for statement in (
        """
        CREATE TABLE approvals (
            request_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            gate_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            question TEXT NOT NULL,
            options TEXT NOT NULL DEFAULT '[]',
            status TEXT NOT NULL CHECK (status IN
                ('requested', 'decided', 'revoked', 'expired', 'superseded')),
            created_at TEXT NOT NULL,
            bound_object TEXT NOT NULL DEFAULT '{}',
            choice TEXT,
            decided_by TEXT,
            decided_at TEXT,
            scope TEXT,
            expires_at REAL,
            revoked_by TEXT,
            revoked_at TEXT,
            revoke_reason TEXT,
            token_hash TEXT UNIQUE,
            token_expires_at REAL,
            token_used_at REAL
        )
        """,
        "CREATE INDEX approvals_gate ON approvals(run_id, gate_id, status)",
        """
        CREATE TABLE side_effects (
            idem_key TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT,
            action TEXT NOT NULL,
            adapter TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            fencing_token INTEGER,
            plan_n INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('intent', 'committed', 'unknown', 'failed',
                'compensated', 'compensation-intent')),
            remote_id TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            compensates TEXT REFERENCES side_effects(idem_key),
            detail TEXT NOT NULL DEFAULT '{}'
        )
        """,
        "CREATE INDEX side_effects_run ON side_effects(run_id, status)",
        "PRAGMA user_version = 2",
    ):
        db.execute(statement)


@migrations()
def m003_history_counters(db: Database) -> None:
    """What status and the next action read without walking the history: indexes for
    "attempts not committed" and "newest events of a kind", and counters kept by the
    writers (attempts per unit by ``claim``, commits per kind by ``commit_checkpoint``),
    backfilled here from the rows already present."""
    for statement in (
        "CREATE INDEX attempts_status ON attempts(run_id, status)",
        "CREATE INDEX events_kind ON events(run_id, kind, seq)",
        # attempts claimed for a unit, across branches (= its highest attempt_no: attempt
        # numbers are per run and unit, and attempt rows are never deleted)
        """
        CREATE TABLE attempt_counters (
            run_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (run_id, unit)
        ) WITHOUT ROWID
        """,
        "INSERT INTO attempt_counters (run_id, unit, n) "
        "SELECT run_id, unit, MAX(attempt_no) FROM attempts GROUP BY run_id, unit",
        # checkpoint commits by kind along a branch's whole lineage (genesis excluded): a
        # fork starts with its ancestors' counts up to the fork point
        """
        CREATE TABLE checkpoint_counts (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (run_id, branch_id, kind)
        ) WITHOUT ROWID
        """,
    ):
        db.execute(statement)
    forks = {(r[0], r[1]): (r[2], r[3]) for r in db.execute(
        "SELECT run_id, branch_id, forked_from, forked_at FROM branches").fetchall()}
    for (run_id, branch_id) in forks:
        counts: dict[str, int] = {}
        b: str | None = branch_id
        upto: int | None = None
        while b is not None:
            sql = ("SELECT kind, COUNT(*) FROM checkpoints WHERE run_id = ? AND branch_id = ? "
                   "AND kind != 'genesis'")
            params: list[object] = [run_id, b]
            if upto is not None:
                sql += " AND version <= ?"
                params.append(upto)
            for kind, n in db.execute(sql + " GROUP BY kind", params).fetchall():
                counts[kind] = counts.get(kind, 0) + n
            b, upto = forks.get((run_id, b), (None, None))
        for kind, n in counts.items():
            db.execute("INSERT INTO checkpoint_counts (run_id, branch_id, kind, n) "
                       "VALUES (?, ?, ?, ?)", [run_id, branch_id, kind, n])
    db.execute("PRAGMA user_version = 3")


@migrations()
def m004_current_pointers_and_verified_chain(db: Database) -> None:
    """Current pointers as the store's own fact (which attempt of each unit is current,
    stated by the engine in each commit), their history per checkpoint, and the newest
    checkpoint verified by ``verify_since_last`` per branch."""
    for statement in (
        # unit -> its current attempt on a branch (no row: the unit has none)
        """
        CREATE TABLE current_attempts (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id, unit)
        ) WITHOUT ROWID
        """,
        # each change of a pointer, owned by the branch that owns the checkpoint row (as
        # checkpoints are): a fork reads its ancestors' changes up to the fork point
        """
        CREATE TABLE current_changes (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            unit TEXT NOT NULL,
            attempt_id TEXT,
            PRIMARY KEY (run_id, branch_id, version, unit)
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE chain_verified (
            run_id TEXT NOT NULL,
            branch_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            hash TEXT NOT NULL,
            PRIMARY KEY (run_id, branch_id)
        )
        """,
    ):
        db.execute(statement)
    # The backfill is the one place storage reads the engine's record format, once: a
    # ``unit:<id>`` key whose value says ``"state": "succeeded"`` points at its ``attempt``;
    # any other value (or a deleted key) means no current attempt. From here on the engine
    # states the pointers itself (commit_checkpoint's ``current``).
    def pointer(value: object) -> str | None:
        attempt = value.get("attempt") if isinstance(value, dict) else None
        if isinstance(value, dict) and value.get("state") == "succeeded" \
                and isinstance(attempt, str):
            return attempt
        return None

    changes = []
    for run_id, branch_id, version, delta in db.execute(
            "SELECT run_id, branch_id, version, delta FROM checkpoints ORDER BY run_id, "
            "branch_id, version").fetchall():
        for key, value in json.loads(delta).items():
            if key.startswith("unit:"):
                changes.append((run_id, branch_id, version, key[5:], pointer(value)))
    db.conn.executemany("INSERT INTO current_changes (run_id, branch_id, version, unit, "
                        "attempt_id) VALUES (?, ?, ?, ?, ?)", changes)
    current = []
    for run_id, branch_id, key, value in db.execute(
            "SELECT run_id, branch_id, key, value FROM current_state "
            "WHERE key >= 'unit:' AND key < 'unit;'").fetchall():
        attempt = pointer(json.loads(value))
        if attempt is not None:
            current.append((run_id, branch_id, key[5:], attempt))
    db.conn.executemany("INSERT INTO current_attempts (run_id, branch_id, unit, attempt_id) "
                        "VALUES (?, ?, ?, ?)", current)
    db.execute("PRAGMA user_version = 4")


# Bumped with every appended migration; each migration stamps PRAGMA user_version
# with its own number. tests/test_storage_schema.py checks the two agree.
SCHEMA_VERSION = 4
