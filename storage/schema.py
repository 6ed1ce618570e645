"""The database schema, built only by sqlite-utils Migrations.

Rules: a migration is never edited after it ships; each new one is appended
and bumps SCHEMA_VERSION (stored in PRAGMA user_version as well, so a newer
database can be recognised with one read-only query).
"""

from __future__ import annotations

from sqlite_utils import Database, Migrations

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


# Bumped with every appended migration; each migration stamps PRAGMA user_version
# with its own number. tests/test_storage_schema.py checks the two agree.
SCHEMA_VERSION = 2
