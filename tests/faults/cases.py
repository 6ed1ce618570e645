"""The fault table: 48 cases as data. One harness (faults/harness.py) runs every row.

The plan (faults/plan.toml) schedules U01 U02 U04 U05 U06 U07 U17 U18 U27 U28 U31 U32 U33 U34
U35 U36, so ``@6`` on a per-unit crash point lands in U07, and its model calls are 1-4 U05,
5-8 U06, 9-12 U07 (sources C1-C4), 13 U17, 14 U18, 15 U27, 16-17 U28 (rank, check).

Every case ends with a worker process, and every check reads stored facts: the call ledger,
attempts, checkpoints, the manifest, approvals, the side-effect ledger — plus, for remote
effects, what the local webhook server or provider saw.
"""

from __future__ import annotations

from .steps import NEW_AUDIENCE, Case, Pre, Rule, Worker, do

FRESH = Pre("fresh")
DONE = Pre("done")
AT_GATE = Pre("fresh", max_units=8)  # U01-U18 done; the gate's approval recorded, U27 not run
BEFORE_U07 = Pre("fresh", max_units=5)  # U01-U06 done: U07 is the next unit

DB, DISK, REMOTE = "db", "disk", "remote"
C1 = {"task": "extract", "source_id": "C1"}  # U07's first model call
DOWNSTREAM_OF_A = frozenset({"U01", "U05", "U17", "U27", "U28", "U31", "U32", "U33", "U34",
                             "U35", "U36"})
# Wide enough that a second worker started under heavy CI load still overlaps the first.
SLOW_EXTRACTS = tuple(Rule(u, "slow", seconds=0.8) for u in ("U05", "U06", "U07"))
AUDIENCE_REDO = frozenset({"U27", "U28", "U31", "U33", "U35", "U36"})


def killed_at(point: str) -> Worker:
    return Worker(crash_at=point, expect="killed")


def _commit_window(n: int, point: str, what: str, reexec: frozenset[str],
                   checks: tuple[str, ...] = ("orphan:U07/a1",)) -> Case:
    return Case(
        id=f"F{n:02d}", group="commit protocol", what=what, pre=FRESH,
        injection=f"KEEPSTEP_CRASH_AT={point} (U07)", observe=(DB, DISK),
        steps=(killed_at(point), Worker()), expect="done", reexec=reexec,
        no_dup=("commit:U07", "commits:*"), checks=checks)


CASES: list[Case] = [
    # -- the commit protocol: a SIGKILL in every window --------------------------------------
    _commit_window(1, "claim.before@6", "killed before claiming U07: nothing in flight",
                   frozenset(), checks=()),
    _commit_window(2, "claim.after@6", "killed right after claiming U07: a live lease, no work; "
                   "recovery fences the dead owner's lease", frozenset(), checks=(
                       "stale_refused:U07/a1",)),
    Case(id="F03", group="commit protocol", what="killed in the middle of U07's first model "
         "call: the ledger keeps the reserved call, U07 is redone",
         pre=FRESH, injection="SIGKILL while the provider call is in flight",
         steps=(Worker(name="A", rules=(Rule("U07", "hold"),), expect="killed"),
                do("kill_when_marked", "A"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"), checks=("reserved_call:U07/a1",)),
    Case(id="F04", group="commit protocol", what="killed after U28's first rank call returned, "
         "before its answer was staged: the bounded loop starts over as a2",
         pre=FRESH, injection="KEEPSTEP_CRASH_AT=unit.after_call@17 (U28 round 1; call 16 is "
         "U27's support check)",
         steps=(killed_at("unit.after_call@17"), Worker()), observe=(DB, DISK), expect="done",
         reexec=frozenset({"U28"}), no_dup=("commit:U28", "commits:*")),
    Case(id="F05", group="commit protocol", what="killed mid staging: truncated temporary "
         "files in U07/a1 are quarantined, never promoted",
         pre=FRESH, injection="KEEPSTEP_CRASH_AT=unit.after_call@10 + truncated *.tmp planted",
         steps=(killed_at("unit.after_call@10"), do("plant_partial", "U07"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"),
         checks=("orphan:U07/a1", "partial_quarantined:U07/a1")),
    _commit_window(6, "unit.after_stage:U07", "killed after U07 staged, before verify "
                   "(ME-042 interruption 1)", frozenset({"U07"})),
    _commit_window(7, "unit.after_verify@6", "killed after U07 verified, before commit",
                   frozenset({"U07"})),
    _commit_window(8, "commit.inside_txn@6", "killed inside U07's commit transaction: the "
                   "journal rolls it back", frozenset({"U07"})),
    _commit_window(9, "commit.before_commit@6", "killed after every write of U07's commit, "
                   "before COMMIT", frozenset({"U07"})),
    _commit_window(10, "commit.after_commit@6", "killed after U07's commit landed, before the "
                   "executor heard back: U07 is current, not redone", frozenset(), checks=()),
    Case(id="F11", group="commit protocol", what="killed while the heartbeat renews U07's lease "
         "during a slow model call",
         pre=BEFORE_U07, injection="KEEPSTEP_CRASH_AT=heartbeat.renew, U07's call takes 2 s",
         steps=(Worker(crash_at="heartbeat.renew", lease=1.5, rules=(Rule("U07", "slow",
                seconds=2.0),), expect="killed"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"), checks=("reserved_call:U07/a1",)),

    # -- provider faults (litellm over HTTP to tests/support/fake_provider.py) -------------
    Case(id="F12", group="provider", what="the provider is slower than U07's time limit: "
         "stopped at a safe point, retried as a new attempt",
         pre=FRESH, injection="U07 timeout_minutes=0.02 (1.2 s), its first call takes 2 s",
         setup=(do("unit_field", "U07", "timeout_minutes", 0.02),),
         provider=(), steps=(Worker(rules=(Rule("U07", "slow", seconds=2.0),)),),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("provider_charges_in_ledger",)),
    Case(id="F13", group="provider", what="HTTP 500 once: the gateway retries inside the "
         "attempt", pre=FRESH, injection="provider: 500 on C1 once",
         provider=({"match": C1, "do": "server_error", "times": 1},), steps=(Worker(),),
         observe=(DB, REMOTE), expect="done", no_dup=("calls:U07", "commits:*"),
         checks=("same_attempt_retry:U07/transient", "provider_charges_in_ledger")),
    Case(id="F14", group="provider", what="HTTP 429 with Retry-After: 1: waited for, retried "
         "inside the attempt", pre=FRESH, injection="provider: 429 Retry-After 1 on C1 once",
         provider=({"match": C1, "do": "rate_limited", "times": 1},), steps=(Worker(),),
         observe=(DB, REMOTE), expect="done", no_dup=("calls:U07", "commits:*"),
         checks=("same_attempt_retry:U07/rate_limited", "retry_after_honoured:U07",
                 "provider_charges_in_ledger")),
    Case(id="F15", group="provider", what="insufficient quota: U07 blocked (not failed), "
         "nothing retried while blocked; a person's retry finishes the run",
         pre=FRESH, injection="provider: 429 insufficient_quota on C1 once",
         provider=({"match": C1, "do": "insufficient_quota", "times": 1},),
         steps=(Worker(), do("expect", "blocked:quota"), do("snapshot"), Worker(),
                do("expect", "blocked:quota"), do("expect_no_new_calls"), do("retry", "U07"),
                Worker()),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("provider_charges_in_ledger",)),
    Case(id="F16", group="provider", what="a bad API key (401): U07 blocked for a person, "
         "nothing retried while blocked", pre=FRESH, injection="provider: 401 on C1 once",
         provider=({"match": C1, "do": "unauthorized", "times": 1},),
         steps=(Worker(), do("expect", "blocked:auth"), do("snapshot"), Worker(),
                do("expect", "blocked:auth"), do("expect_no_new_calls"), do("retry", "U07"),
                Worker()),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("provider_charges_in_ledger",)),
    Case(id="F17", group="provider", what="malformed output (not JSON) in every round of C1's "
         "step: the attempt fails as invalid output and U07 is retried as a2", pre=FRESH,
         injection="provider: non-JSON content for C1's first ask and both revise rounds",
         provider=({"match": C1, "do": "malformed", "times": 3},), steps=(Worker(),),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("provider_charges_in_ledger",)),
    Case(id="F18", group="provider", what="U28's claim check fails in every allowed round: "
         "3 rounds per attempt, 3 attempts, then U28 failed; nothing downstream runs",
         pre=FRESH, injection="provider: every claim check reports a problem",
         provider=({"match": {"task": "check"}, "do": "check_fails", "times": None},),
         steps=(Worker(),), observe=(DB, REMOTE), expect="failed:U28",
         reexec=frozenset({"U28"}), no_dup=("commit:U07",),
         checks=("downstream_not_run:U28", "provider_charges_in_ledger")),
    Case(id="F19", group="provider", what="a call the provider charged whose answer was lost "
         "with the process: the ledger keeps it, the budget is not given back",
         pre=FRESH, injection="KEEPSTEP_CRASH_AT=unit.after_call@9 (U07, C1 answered)",
         provider=(), steps=(killed_at("unit.after_call@9"), do("snapshot"), Worker()),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("provider_charges_in_ledger", "budget_kept:U07/a1")),

    # -- executors -----------------------------------------------------------------------------
    Case(id="F20", group="executors", what="two executors start the same fresh run at once: "
         "each unit is claimed and committed once", pre=FRESH,
         injection="two worker processes started together (extraction calls slowed to "
         "0.8 s so that they overlap)",
         steps=(Worker(name="A", rules=SLOW_EXTRACTS), Worker(name="B", rules=SLOW_EXTRACTS),
                do("join", "A"), do("join", "B"), Worker()),
         observe=(DB,), expect="done", no_dup=("commits:*",), checks=("executors:2",)),
    Case(id="F21", group="executors", what="a zombie: U07's executor stops after staging, its "
         "lease expires, another takes over; woken, the zombie cannot commit",
         pre=FRESH, injection="SIGSTOP at unit.after_stage:U07, lease 1 s, takeover, SIGCONT",
         steps=(Worker(name="A", lease=1.0, pause_at="unit.after_stage:U07"),
                do("wait_stopped", "A"), do("wait_lease_expiry"), Worker(),
                do("wake", "A"), do("join", "A"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"),
         checks=("stale_refused:U07/a1", "orphan:U07/a1")),
    Case(id="F22", group="executors", what="U07's lease expires during a long model call (the "
         "process is stopped); the taken-over executor notices at its next safe point",
         pre=FRESH, injection="SIGSTOP inside U07's first call, lease 1 s, takeover, SIGCONT",
         steps=(Worker(name="A", lease=1.0, rules=(Rule("U07", "pause"),)),
                do("wait_stopped", "A"), do("wait_lease_expiry"), Worker(),
                do("wake", "A"), do("join", "A"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"), checks=("stale_refused:U07/a1",)),
    Case(id="F23", group="executors", what="two front ends resume the same interrupted run at "
         "once: recovery twice is harmless, U07 redone once", pre=FRESH,
         injection="killed at unit.after_stage:U07, then two resumes together",
         steps=(killed_at("unit.after_stage:U07"), Worker(name="A"), Worker(name="B"),
                do("join", "A"), do("join", "B"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07", "commits:*"), checks=("orphan:U07/a1",)),

    # -- storage ---------------------------------------------------------------------------------
    Case(id="F24", group="storage", what="a committed artifact is deleted: recovery repairs "
         "U05; its byte-identical redo keeps everything downstream current (early cut-off)",
         pre=DONE, injection="delete U05's evidence.json",
         steps=(do("delete_artifact", "U05", "evidence.json"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U05"}),
         checks=("repair_committed",)),
    Case(id="F25", group="storage", what="one byte of a committed artifact changes: U17 is "
         "redone, the rest kept", pre=DONE, injection="flip a byte in U17's verified.json",
         steps=(do("flip_byte", "U17", "verified.json"), Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U17"}),
         checks=("repair_committed",)),
    Case(id="F26", group="storage", what="a stray attempt folder (an orphan) is found: listed, "
         "quarantined, never promoted; nothing redone", pre=DONE,
         injection="plant U05/a9 with files no manifest references",
         steps=(do("plant_orphan", "U05", "a9"), do("snapshot"), Worker()),
         observe=(DB, DISK), expect="done",
         checks=("orphan:U05/a9", "no_commit_since_snapshot")),
    Case(id="F27", group="storage", what="the head checkpoint's parent hash is broken: recovery "
         "refuses and asks for a person; nothing runs or commits", pre=DONE,
         injection="UPDATE checkpoints SET parent_hash (head)",
         steps=(do("break_parent_hash"), do("snapshot"), Worker()),
         observe=(DB,), expect="refused:recovery", message="does not verify", chain_ok=False,
         checks=("no_commit_since_snapshot",)),
    Case(id="F28", group="storage", what="a database from a newer keepstep: the worker refuses "
         "with a message and leaves the file untouched", pre=DONE,
         injection="PRAGMA user_version = SCHEMA_VERSION + 1",
         steps=(do("stamp_newer_schema"), Worker(expect="error")),
         observe=(DB,), expect="refused:schema", message="upgrade keepstep",
         checks=("db_untouched",)),
    Case(id="F29", group="storage", what="a database from an older keepstep (schema 1, mid-run): "
         "backed up, migrated, the run continues", pre=AT_GATE,
         injection="drop the schema-2 tables, user_version = 1",
         steps=(do("downgrade_schema"), Worker()),
         observe=(DB, DISK), expect="done", checks=("backup_kept",)),
    Case(id="F30", group="storage", what="the disk fills while U07 stages: blocked for a person "
         "(not a crash), the partial file never promoted; retried once space is back",
         pre=FRESH, injection="RLIMIT_FSIZE = 256 bytes while U07 stages",
         steps=(Worker(disk_full="U07"), do("expect", "blocked:storage"), do("retry", "U07"),
                Worker()),
         observe=(DB, DISK), expect="done", reexec=frozenset({"U07"}),
         no_dup=("commit:U07",), checks=("partial_quarantined:U07/a1",
                                         "disk_full_advice:U07/a1")),

    # -- changes -----------------------------------------------------------------------------
    Case(id="F31", group="changes", what="source A2's content changes: what reads group A is "
         "redone, groups B and C are reused", pre=DONE, injection="edit source A2",
         steps=(do("edit_source", "A2"), Worker()), observe=(DB, DISK), expect="done",
         reexec=DOWNSTREAM_OF_A),
    Case(id="F32", group="changes", what="source A3 is removed (revoked)", pre=DONE,
         injection="sources.toml: A3 approved = false",
         steps=(do("revoke_source", "A3"), Worker()), observe=(DB, DISK), expect="done",
         reexec=DOWNSTREAM_OF_A),
    Case(id="F33", group="changes", what="source C5 is added to group C", pre=DONE,
         injection="add sources/C5-*.md to group C",
         steps=(do("add_source", "C5", "C"), Worker()), observe=(DB, DISK), expect="done",
         reexec=frozenset({"U01", "U07", "U18", "U27", "U28", "U31", "U32", "U33", "U34",
                           "U35", "U36"})),
    Case(id="F34", group="changes", what="the audience changes: plan-v2, the old approval no "
         "longer applies (the gate asks again), only the audience units and what cites them "
         "are redone", pre=DONE, injection="contract.md audience = investment committee",
         steps=(do("set_contract", "audience", NEW_AUDIENCE), do("snapshot"),
                Worker(approve=None), do("expect", "blocked:approval"),
                do("expect_not_run", "U27"), Worker(approve=NEW_AUDIENCE)),
         observe=(DB,), expect="done", reexec=AUDIENCE_REDO, checks=("approval:superseded",)),
    Case(id="F35", group="changes", what="a typo fixed in a heading of the appendix "
         "template (heading wording only, a presentation change): only the appendix is "
         "redone; the audit, which checks its content, is kept", pre=DONE,
         injection="edit a heading of templates/appendix.md",
         steps=(do("edit_template", "appendix"), Worker()), observe=(DB, DISK),
         expect="done", reexec=frozenset({"U34"})),
    Case(id="F36", group="changes", what="U28's claim set changes (content): the report that "
         "cites it and the brief that embeds it are redone", pre=DONE,
         injection="record a content change of U28's output",
         steps=(do("record_output_change", "U28", "content"), Worker()),
         observe=(DB,), expect="done", reexec=frozenset({"U31", "U33"})),
    Case(id="F37", group="changes", what="U28's format changes only (presentation): only the "
         "brief that embeds it is redone", pre=DONE,
         injection="record a presentation change of U28's output",
         steps=(do("record_output_change", "U28", "presentation"), Worker()),
         observe=(DB,), expect="done", reexec=frozenset({"U33"})),
    Case(id="F38", group="changes", what="the gate's approval is revoked before U27 runs: the "
         "gate asks again, the revoked decision is not reused", pre=AT_GATE,
         injection="revoke the audience approval",
         steps=(do("snapshot"), do("revoke_approval"), Worker(approve=None),
                do("expect", "blocked:approval"), do("expect_not_run", "U27"), Worker()),
         observe=(DB,), expect="done", checks=("approval:revoked",)),
    Case(id="F39", group="changes", what="the gate's approval expires before U27 runs: the gate "
         "asks again", pre=AT_GATE, setup=(do("gate_expires_days", 1e-5),),
         injection="gate expires_days = 1e-5 (0.9 s), wait 1 s",
         steps=(do("snapshot"), do("sleep", 1.0), Worker(approve=None),
                do("expect", "blocked:approval"), do("expect_not_run", "U27"), Worker()),
         observe=(DB,), expect="done", checks=("approval:expired",)),
    Case(id="F40", group="changes", what="the approval's bound object changes (the contract's "
         "goal, so plan-v2): U02 redone, the gate asks again", pre=AT_GATE,
         injection="contract.md goal edited",
         steps=(do("set_contract", "goal", "Decide whether to enter Norvania in 2027"),
                do("snapshot"), Worker(approve=None), do("expect", "blocked:approval"),
                do("expect_not_run", "U27"), Worker()),
         observe=(DB,), expect="done", reexec=frozenset({"U02"}),
         checks=("approval:superseded",)),

    # -- side effects (U36 delivers the pack to tests/support/webhook_server.py) ----------
    Case(id="F41", group="side effects", what="killed after the intent, before sending: "
         "recovery asks the webhook (404, safe), sends once with the same key",
         pre=FRESH, webhook=True, injection="KEEPSTEP_CRASH_AT=effect.after_intent",
         steps=(killed_at("effect.after_intent"), Worker()), observe=(DB, REMOTE),
         expect="done", reexec=frozenset({"U36"}), no_dup=("webhook", "commit:U36")),
    Case(id="F42", group="side effects", what="killed after sending, before the receipt: "
         "recovery finds the key remotely and records the receipt; no second POST",
         pre=FRESH, webhook=True, injection="KEEPSTEP_CRASH_AT=effect.after_send",
         steps=(killed_at("effect.after_send"), Worker()), observe=(DB, REMOTE),
         expect="done", reexec=frozenset({"U36"}), no_dup=("webhook", "commit:U36")),
    Case(id="F43", group="side effects", what="the webhook is unreachable during "
         "reconciliation: U36 blocked for a person, never resent blindly; a recheck settles it",
         pre=FRESH, webhook=True,
         injection="killed at effect.after_send, server down for two resumes",
         steps=(killed_at("effect.after_send"), do("webhook_down"), Worker(),
                do("expect", "blocked:effect"), do("snapshot"), Worker(),
                do("expect", "blocked:effect"), do("expect_no_new_calls"), do("webhook_up"),
                do("decide_effect", "recheck"), Worker()),
         observe=(DB, REMOTE), expect="done", reexec=frozenset({"U36"}),
         no_dup=("webhook", "commit:U36")),
    Case(id="F44", group="side effects", what="a new plan version re-delivers under a new "
         "idempotency key; the old key is not reused or resent", pre=FRESH, webhook=True,
         injection="run to the end, then change the audience (plan-v2)",
         steps=(Worker(), do("set_contract", "audience", NEW_AUDIENCE),
                Worker(approve=NEW_AUDIENCE)),
         observe=(DB, REMOTE), expect="done", reexec=AUDIENCE_REDO,
         no_dup=("webhook",), checks=("webhook_keys:2",)),

    # -- budget ----------------------------------------------------------------------------------
    Case(id="F45", group="budget", what="the call budget runs out before U17's call: blocked "
         "(not failed), nothing retried while blocked; a raise finishes the run",
         pre=FRESH, setup=(do("budget", "calls", 12),), injection="budget calls = 12",
         steps=(Worker(), do("expect", "blocked:budget"), do("snapshot"), Worker(),
                do("expect", "blocked:budget"), do("expect_no_new_calls"),
                do("raise_budget", "calls", 100), Worker()),
         observe=(DB,), expect="done", no_dup=("commits:*",), checks=("budget_decision",)),
    Case(id="F46", group="budget", what="budget counters survive a kill and a resume: never "
         "reset, the killed attempt's calls still counted", pre=FRESH,
         injection="KEEPSTEP_CRASH_AT=unit.after_call@10 (U07)",
         steps=(killed_at("unit.after_call@10"), do("snapshot"), Worker()),
         observe=(DB,), expect="done", reexec=frozenset({"U07"}),
         checks=("budget_kept:U07/a1",)),
    Case(id="F47", group="budget", what="only a recorded raise decision moves a limit: a lower "
         "limit and a raise without a reason are refused, the run stays blocked until the "
         "decision", pre=FRESH, setup=(do("budget", "calls", 14),),
         injection="budget calls = 14 (U27 blocked), refused raises, then a raise",
         steps=(Worker(), do("expect", "blocked:budget"),
                do("refused_raise", "calls", 10, "fewer calls", "would lower"),
                do("refused_raise", "calls", 60, "  ", "needs a reason"), do("snapshot"),
                Worker(), do("expect", "blocked:budget"), do("expect_no_new_calls"),
                do("raise_budget", "calls", 60), Worker()),
         observe=(DB,), expect="done", no_dup=("commits:*",), checks=("budget_decision",)),
    Case(id="F48", group="budget", what="the recovery circuit breaker: after 2 failed "
         "recoveries the next resume is refused without trying", pre=DONE,
         setup=(do("policy", "max_recoveries", 2), do("policy", "recovery_cooldown_s", 0.0)),
         injection="a broken parent hash, three resumes",
         steps=(do("break_parent_hash"), do("snapshot"), Worker(),
                do("expect", "refused:recovery"), Worker(), Worker()),
         observe=(DB,), expect="refused:recovery", message="circuit breaker is open",
         chain_ok=False, checks=("breaker:2", "no_commit_since_snapshot")),
]

assert len(CASES) == 48 and len({c.id for c in CASES}) == 48
