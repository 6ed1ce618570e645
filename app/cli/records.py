"""The ledgers and decisions of a run from the command line: ``calls``, ``events``,
``effects`` (list, settle, compensate), ``budget raise``, ``approvals``, ``approve``,
``revoke``, ``recovery reset`` and ``keys set`` (the other ``keys`` commands are in keys.py).

Every decision (a budget raise, an answer, a revocation) is recorded by the engine as a
decision event; nothing here edits the database by hand.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    EXIT_BLOCKED,
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    UsageProblem,
    WhoOpt,
    YesOpt,
    add_command,
    confirmed,
    existing_run,
    here,
    open_project_dir,
    shift,
    sub_app,
    who_or_login,
)

if TYPE_CHECKING:
    from keepstep.engine import Run
    from keepstep.engine.plan import Gate


# --- ledgers ---------------------------------------------------------------------------------
def calls(root: DirArg = None, run: RunOpt = None,
          unit: Annotated[str | None, typer.Option("--unit", help="Only this unit.")] = None,
          as_json: JsonOpt = False) -> None:
    """The model call ledger: unit, attempt, round, model, tokens, cost, outcome."""
    with open_project_dir(root, read_only=True) as project:
        the_run = existing_run(project, run)
        rows = [out.call_row(c) for c in the_run.calls() if unit is None or c.unit == unit]
        typer.echo(out.to_json(rows) if as_json else out.calls_text(rows))


def events(root: DirArg = None, run: RunOpt = None,
           kind: Annotated[str | None, typer.Option("--kind", help="Kind prefix, e.g. "
                                                    "'decision.' or 'recovery'.")] = None,
           unit: Annotated[str | None, typer.Option("--unit")] = None,
           limit: Annotated[int | None, typer.Option("--limit", min=1,
                                                     help="Only the newest N.")] = None,
           as_json: JsonOpt = False) -> None:
    """The run's event log, oldest first."""
    with open_project_dir(root, read_only=True) as project:
        the_run = existing_run(project, run)
        found = the_run.events(kind_prefix=kind, unit=unit, limit=limit,
                               newest_first=limit is not None)
        if limit is not None:
            found = list(reversed(found))
        if as_json:
            typer.echo(out.to_json([e.model_dump(mode="json") for e in found]))
        else:
            typer.echo(out.events_text(found))


# --- effects ---------------------------------------------------------------------------------
def effects_list(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
                 as_json: JsonOpt = False) -> None:
    """The side-effect ledger: key, unit, action, adapter, status, remote id.

    \b
    Example:
      keepstep effects --run ME-042
    """
    from keepstep.engine.views import EFFECT_FIELDS

    with open_project_dir(root, read_only=True) as project:
        the_run = existing_run(project, run, branch)
        rows = [r.model_dump(mode="json") for r in the_run.effects()]
        if as_json:
            typer.echo(out.to_json(rows))
            return
        if not rows:
            typer.echo(f"no external actions recorded for run {the_run.run_id} ({branch})")
            return
        typer.echo(out.table(EFFECT_FIELDS, [[r[k] for k in EFFECT_FIELDS] for r in rows]))
        unsettled = [r for r in rows if r["status"] in ("intent", "unknown")]
        typer.echo(f"{len(rows)} external action(s), {len(unsettled)} without a receipt")
        where = here(project.root)
        for r in unsettled:
            if r["needs_person"]:
                typer.echo(f"  {r['unit']} {r['action']}: waits for you ({r['reason']}); "
                           f"`keepstep effects settle {where}{r['key']} --run "
                           f"{the_run.run_id}` looks it up first, then records your decision")
        if any(not r["needs_person"] for r in unsettled):
            typer.echo("an intent without a receipt is asked about on the next resume "
                       f"(`keepstep resume {where}--run {the_run.run_id}`); if the adapter "
                       "cannot tell, its unit stays blocked for a person")


KeyArg = Annotated[str | None, typer.Argument(metavar="KEY", show_default=False,
                                              help="The idempotency key (see `keepstep "
                                              "effects`).")]


def effects_settle(
    root: DirArg = None, key: KeyArg = None, run: RunOpt = None,
    sent: Annotated[bool | None, typer.Option(
        "--sent/--not-sent", show_default=False,
        help="Your decision when the adapter cannot tell: it was sent (give --ref), or it "
        "was not (the next resume sends it again with the same key).")] = None,
    ref: Annotated[str | None, typer.Option("--ref", help="The remote reference of a sent "
                                            "action (e.g. the receipt id).")] = None,
    reason: Annotated[str, typer.Option("--reason", help="How you know (recorded).")] = "",
    branch: BranchOpt = "main", who: WhoOpt = None, as_json: JsonOpt = False,
) -> None:
    """Settle an external action whose outcome is unknown: look it up by key first; when the
    adapter cannot tell, record your decision (--sent --ref R, or --not-sent) with a reason.

    Exit 3 when the lookup cannot tell and no decision was given (nothing is recorded).

    \b
    Example:
      keepstep effects settle ks-me-042-u41-notify-p1-0a1b2c3d4e5f6a7b
      keepstep effects settle KEY --sent --ref evt-18 --reason "the client confirmed"
      keepstep effects settle KEY --not-sent --reason "their server log shows nothing"
    """
    root, key = shift(root, key)
    if key is None:
        raise UsageProblem("name the effect's key", "list them with `keepstep effects`")
    if ref is not None and sent is not True:
        raise UsageProblem("--ref goes with --sent", "pass --sent --ref REF")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        result = the_run.settle_effect(key, sent=sent, who=who_or_login(who), reason=reason,
                                       reference=ref)
        if as_json:
            typer.echo(out.to_json(result.model_dump(mode="json", exclude={"effect"})))
        elif result.outcome == "unknown":
            typer.echo(f"{key}: the lookup cannot tell ({result.reason}); nothing recorded")
            typer.echo("decide it: --sent --ref REF --reason '...' (it happened), or "
                       "--not-sent --reason '...' (the next resume sends it again, same key)")
        else:
            typer.echo(f"{key}: settled as {result.outcome} by {result.by} ({result.reason})"
                       + (f"; reference {result.remote_id}" if result.remote_id else ""))
            typer.echo(f"continue with `keepstep resume {here(project.root)}--run "
                       f"{the_run.run_id}`")
    if result.outcome == "unknown":
        raise typer.Exit(EXIT_BLOCKED)


def effects_compensate(
    root: DirArg = None, key: KeyArg = None, run: RunOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why it is undone (recorded).")] = "",
    branch: BranchOpt = "main", who: WhoOpt = None, yes: YesOpt = False,
) -> None:
    """Undo a committed external action: shows what it undoes and the ledger entry it writes,
    then asks; the undo is a recorded decision with its own key, intent and receipt.

    \b
    Example:
      keepstep effects compensate KEY --reason "sent to the wrong client"
    """
    root, key = shift(root, key)
    if key is None:
        raise UsageProblem("name the effect's key", "list them with `keepstep effects`")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        preview = the_run.compensation_preview(key)
        typer.echo(preview.render())
        if preview.problems:
            raise UsageProblem(f"{key} cannot be undone here", preview.problems[0])
        if not reason.strip():
            raise UsageProblem("a compensation needs a reason", "pass --reason '...'")
        if not confirmed(f"Undo {preview.action} of {preview.unit}?", yes):
            return
        row = the_run.compensate_effect(key, who=who_or_login(who), reason=reason)
        typer.echo(f"recorded: {key} is {row.status} (undo entry {preview.undo_key})")


AdapterArg = Annotated[str | None, typer.Argument(metavar="ADAPTER", show_default=False,
                                                  help="An [adapters.NAME] of keepstep.toml.")]


def effects_test(root: DirArg = None, adapter: AdapterArg = None, as_json: JsonOpt = False
                 ) -> None:
    """Check an adapter's receiver: send one small test document under a fresh key, then
    look that key up (must be found) and a key never used (must be not found).

    Exit 1 when the receiver fails either. The protocol is in docs/delivery.md.

    \b
    Example:
      keepstep effects test client-webhook
    """
    from keepstep.engine.exports import test_effect_adapter

    root, adapter = shift(root, adapter)
    if adapter is None:
        raise UsageProblem("name the adapter to test", "e.g. `keepstep effects test webhook` "
                           "(the [adapters.NAME] tables of keepstep.toml)")
    with open_project_dir(root) as project:
        check = test_effect_adapter(project.root, adapter)
    if as_json:
        typer.echo(out.to_json(check.model_dump(mode="json")))
    else:
        typer.echo(f"{adapter}: test delivery {'accepted' if check.delivered else 'FAILED'}"
                   + (f" (remote id {check.remote_id})" if check.remote_id else ""))
        answers = {True: "found", False: "not found", None: "cannot tell"}
        if check.delivered and not check.notes:
            typer.echo(f"  lookup of the test key {check.key}: {answers[check.found_after]}")
            typer.echo(f"  lookup of a key never used: {answers[check.unknown_key]}")
        for note in check.notes:
            typer.echo(f"  note: {note}")
        for problem in check.problems:
            typer.echo(f"  problem: {problem}")
        typer.echo("OK: the receiver answers both" if check.ok and not check.notes else
                   "OK: delivered (no lookup to check)" if check.ok else
                   "the receiver does not follow the protocol: see docs/delivery.md")
    if not check.ok:
        raise typer.Exit(1)


# --- budget ----------------------------------------------------------------------------------
def budget_raise(
    root: DirArg = None, run: RunOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the decision).")]
    = "",
    calls: Annotated[float | None, typer.Option("--calls", min=0)] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", min=0)] = None,
    cost: Annotated[float | None, typer.Option("--cost", min=0)] = None,
    recoveries: Annotated[float | None, typer.Option("--recoveries", min=0)] = None,
    branch: BranchOpt = "main", who: WhoOpt = None,
) -> None:
    """Raise budget limits (a recorded decision); units blocked by the budget are released.

    \b
    Example:
      keepstep budget raise --calls 200 --reason "client approved more calls"
    """
    if not reason.strip():
        raise UsageProblem("a budget raise needs a reason", "pass --reason '...'")
    limits = {k: v for k, v in {"calls": calls, "tokens": tokens, "cost": cost,
                                "recoveries": recoveries}.items() if v is not None}
    if not limits:
        raise UsageProblem("no limit given", "pass at least one of --calls, --tokens, --cost, "
                           "--recoveries (the new limit, not an increment)")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        budget = the_run.raise_budget(reason=reason, who=who_or_login(who), **limits)
        for k, v in limits.items():
            used = budget.used.get(k, 0)
            if k == "cost":
                typer.echo(f"cost: limit now ${v:,.2f} (used ${used:,.4f})")
            else:
                typer.echo(f"{k}: limit now {v:,g} (used {used:,g})")
        typer.echo(f"recorded as a budget decision by {who_or_login(who)}: {reason}")
        typer.echo(f"continue with `keepstep resume {here(project.root)}--run "
                   f"{the_run.run_id}`")


# --- approvals -------------------------------------------------------------------------------
GateArg = Annotated[str | None, typer.Argument(metavar="GATE", show_default=False,
                                               help="The gate id, e.g. audience.")]


def _gate(run: Run, gate: str) -> Gate:
    gates = {g.id: g for g in run.plan.gates}
    if gate not in gates:
        raise UsageProblem(f"no gate {gate!r} in {run.plan_info.get('label', 'the plan')}",
                           "gates: " + (", ".join(gates) or "none"))
    return gates[gate]


def approvals(root: DirArg = None, run: RunOpt = None, branch: BranchOpt = "main",
              new_token: Annotated[bool, typer.Option(
                  "--new-token", help="Issue a fresh resume token for each open request and "
                  "show it once (a token issued before stops working).")] = False,
              as_json: JsonOpt = False) -> None:
    """Pending approval requests, with what each option reuses and redoes.

    A local `keepstep approve` needs no token. A resume token lets someone who has only the
    token (not this project) answer the gate once: it is shown once, when the run reaches
    the gate (`keepstep run`), or here with --new-token; keepstep keeps only its sha256.

    \b
    Example:
      keepstep approvals --run ME-042
      keepstep approvals --new-token
    """
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        if new_token:
            for req in the_run.pending_approvals():
                the_run.issue_resume_token(req.gate)
        pending = [p.model_dump(mode="json") for p in the_run.pending_approvals()]
        tokens = dict(the_run.resume_tokens)
        if as_json:
            typer.echo(out.to_json([p | ({"resume_token": tokens[p["gate"]]}
                                         if p["gate"] in tokens else {}) for p in pending]))
            return
        typer.echo(out.approvals_text(pending, the_run.run_id, here(project.root).strip()))
        for gate, token in tokens.items():
            typer.echo(f"resume token for gate {gate} (shown once, valid 24 h, single use): "
                       f"{token}")
        if pending and not tokens:
            typer.echo("answering here needs no token; `--new-token` issues one for someone "
                       "who has only the token")


def approve(root: DirArg = None, gate: GateArg = None, run: RunOpt = None,
            choice: Annotated[str, typer.Option("--choice", help="One of the gate's options.")]
            = "",
            token: Annotated[str | None, typer.Option(
                "--token", help="A resume token, when you were sent one instead of access to "
                "the project (single use).")] = None,
            branch: BranchOpt = "main", who: WhoOpt = None) -> None:
    """Answer an approval gate (bound to the current plan version and contract).

    \b
    Example:
      keepstep approve audience --choice "product team"
    """
    root, gate = shift(root, gate)
    if gate is None:
        raise UsageProblem("name the gate", "e.g. keepstep approve audience --choice ...")
    if not choice:
        raise UsageProblem("give your answer with --choice",
                           "see the options with `keepstep approvals`")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        the_run.approve(_gate(the_run, gate).id, choice, who=who_or_login(who), token=token)
        typer.echo(f"recorded: gate {gate} = {choice!r} (by {who_or_login(who)})")
        typer.echo(f"continue with `keepstep resume {here(project.root)}--run "
                   f"{the_run.run_id}`")


def revoke(root: DirArg = None, gate: GateArg = None, run: RunOpt = None,
           reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the "
                                               "decision).")] = "",
           branch: BranchOpt = "main", who: WhoOpt = None) -> None:
    """Revoke a gate's decision (a recorded decision); the gate asks again on resume."""
    root, gate = shift(root, gate)
    if gate is None:
        raise UsageProblem("name the gate", "e.g. keepstep revoke audience --reason ...")
    if not reason.strip():
        raise UsageProblem("a revocation needs a reason", "pass --reason '...'")
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        found = _gate(the_run, gate)
        record = the_run.revoke(found.id, who=who_or_login(who), reason=reason)
        typer.echo(f"revoked: gate {gate} = {record.choice!r} (by {who_or_login(who)}: "
                   f"{reason})")
        unit = found.unit
        state = the_run.status().units.get(unit)
        where = here(project.root)
        if state is not None and state.state == "succeeded":
            typer.echo(f"{unit} already ran under that decision and stays current; to redo it, "
                       f"`keepstep takeover {where}rerun {unit} --run {the_run.run_id}`")
        else:
            typer.echo(f"the gate asks again when the run reaches {unit}: "
                       f"`keepstep resume {where}--run {the_run.run_id}`")


# --- keys ------------------------------------------------------------------------------------
def keys_set(provider: Annotated[str, typer.Argument(help="e.g. openai, anthropic.")]) -> None:
    """Store a provider's API key in the OS keyring (read with a hidden prompt)."""
    from keepstep.engine.keys import env_var_name, require_keyring, set_api_key

    if sys.stdin is not None and sys.stdin.isatty():
        # Refuse before asking: typing a key that then cannot be stored is a trap.
        require_keyring(provider)
        key = typer.prompt(f"API key for {provider} (input hidden)", hide_input=True,
                           default="", show_default=False)
    else:
        # Piped in (`... | keepstep keys set openai`): nothing was asked, so the key is read
        # first and an empty one reported as such; set_api_key then refuses a missing backend.
        key = sys.stdin.readline() if sys.stdin is not None else ""
    if not key.strip():
        raise UsageProblem("no key entered", f"or set the environment variable "
                           f"{env_var_name(provider)} instead")
    set_api_key(provider, key)
    typer.echo(f"stored the key for {provider} in the OS keyring (service 'keepstep'); "
               f"{env_var_name(provider)}, when set, takes precedence")


def recovery_reset(root: DirArg = None, run: RunOpt = None,
                   reason: Annotated[str, typer.Option("--reason",
                                                       help="What a person checked.")] = "",
                   who: WhoOpt = None, branch: BranchOpt = "main") -> None:
    """Close recovery's circuit breaker after looking (a recorded decision); then resume."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        the_run.reset_recovery(reason=reason, who=who_or_login(who))
        typer.echo(f"recovery reset recorded for run {the_run.run_id}; resume with "
                   f"`keepstep resume {here(project.root)}--run {the_run.run_id}`")


def register(app: typer.Typer) -> None:
    add_command(app, calls, "calls")
    add_command(app, events, "events")
    effects_app = sub_app("The side-effect ledger, and settling or undoing an external "
                          "action.\n\n`keepstep effects` alone lists the ledger.",
                          default="list")
    add_command(effects_app, effects_list, "list")
    add_command(effects_app, effects_settle, "settle")
    add_command(effects_app, effects_compensate, "compensate")
    add_command(effects_app, effects_test, "test")
    app.add_typer(effects_app, name="effects")
    budget_app = sub_app("Budget decisions.")
    add_command(budget_app, budget_raise, "raise")
    app.add_typer(budget_app, name="budget")
    add_command(app, approvals, "approvals")
    add_command(app, approve, "approve")
    add_command(app, revoke, "revoke")
    recovery_app = sub_app("Recovery decisions.")
    add_command(recovery_app, recovery_reset, "reset")
    app.add_typer(recovery_app, name="recovery")
    from keepstep.app.cli.keys import register_keys

    keys_app = sub_app("API keys: environment or OS keyring, and where each provider is called.")
    add_command(keys_app, keys_set, "set")
    register_keys(keys_app)
    app.add_typer(keys_app, name="keys")
