"""The ledgers and decisions of a run from the command line: ``calls``, ``events``,
``effects``, ``budget raise``, ``approvals``, ``approve``, ``revoke`` and ``keys set`` (the
other ``keys`` commands are in keys.py).

Every decision (a budget raise, an answer, a revocation) is recorded by the engine as a
decision event; nothing here edits the database by hand.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from keepstep.app.cli import output as out
from keepstep.app.cli.common import (
    BranchOpt,
    DirArg,
    JsonOpt,
    RunOpt,
    UsageProblem,
    WhoOpt,
    add_command,
    existing_run,
    open_project_dir,
    sub_app,
    who_or_login,
)

if TYPE_CHECKING:
    from keepstep.engine import Gate, Run


# --- ledgers ---------------------------------------------------------------------------------
def calls(root: DirArg, run: RunOpt,
          unit: Annotated[str | None, typer.Option("--unit", help="Only this unit.")] = None,
          as_json: JsonOpt = False) -> None:
    """The model call ledger: unit, attempt, round, model, tokens, cost, outcome."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run)
        rows = [out.call_row(c) for c in the_run.calls() if unit is None or c.unit == unit]
        typer.echo(out.to_json(rows) if as_json else out.calls_text(rows))


def events(root: DirArg, run: RunOpt,
           kind: Annotated[str | None, typer.Option("--kind", help="Kind prefix, e.g. "
                                                    "'decision.' or 'recovery'.")] = None,
           unit: Annotated[str | None, typer.Option("--unit")] = None,
           limit: Annotated[int | None, typer.Option("--limit", min=1,
                                                     help="Only the newest N.")] = None,
           as_json: JsonOpt = False) -> None:
    """The run's event log, oldest first."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run)
        found = the_run.events(kind_prefix=kind, unit=unit, limit=limit,
                               newest_first=limit is not None)
        if limit is not None:
            found = list(reversed(found))
        if as_json:
            typer.echo(out.to_json([e.model_dump(mode="json") for e in found]))
        else:
            typer.echo(out.events_text(found))


def effects(root: DirArg, run: RunOpt, branch: BranchOpt = "main",
            as_json: JsonOpt = False) -> None:
    """The side-effect ledger: key, unit, action, adapter, status, remote id."""
    from keepstep.engine import EFFECT_FIELDS

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        rows = [r.model_dump(mode="json") for r in the_run.effects()]
        if as_json:
            typer.echo(out.to_json(rows))
            return
        if not rows:
            typer.echo(f"no external actions recorded for run {run} ({branch})")
            return
        typer.echo(out.table(EFFECT_FIELDS, [[r[k] for k in EFFECT_FIELDS] for r in rows]))
        unsettled = [r for r in rows if r["status"] in ("intent", "unknown")]
        typer.echo(f"{len(rows)} external action(s), {len(unsettled)} without a receipt")
        if unsettled:
            typer.echo("an intent without a receipt is asked about on the next resume "
                       f"(`keepstep resume {root} --run {run}`); if the adapter cannot tell, "
                       "its unit stays blocked for a person")


# --- budget ----------------------------------------------------------------------------------
def budget_raise(
    root: DirArg, run: RunOpt,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the decision).")],
    calls: Annotated[float | None, typer.Option("--calls", min=0)] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", min=0)] = None,
    cost: Annotated[float | None, typer.Option("--cost", min=0)] = None,
    recoveries: Annotated[float | None, typer.Option("--recoveries", min=0)] = None,
    branch: BranchOpt = "main", who: WhoOpt = None,
) -> None:
    """Raise budget limits (a recorded decision); units blocked by the budget are released."""
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
            typer.echo(f"{k}: limit now {v:g} (used {used:g})")
        typer.echo(f"recorded as a budget decision by {who_or_login(who)}: {reason}")
        typer.echo(f"continue with `keepstep resume {root} --run {run}`")


# --- approvals -------------------------------------------------------------------------------
GateArg = Annotated[str, typer.Argument(help="The gate id, e.g. audience.")]


def _gate(run: Run, gate: str) -> Gate:
    gates = {g.id: g for g in run.plan.gates}
    if gate not in gates:
        raise UsageProblem(f"no gate {gate!r} in {run.plan_info.get('label', 'the plan')}",
                           "gates: " + (", ".join(gates) or "none"))
    return gates[gate]


def approvals(root: DirArg, run: RunOpt, branch: BranchOpt = "main",
              as_json: JsonOpt = False) -> None:
    """Pending approval requests, with what each option reuses and redoes."""

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        pending = [p.model_dump(mode="json") for p in the_run.pending_approvals()]
        typer.echo(out.to_json(pending) if as_json else
                   out.approvals_text(pending, run, str(root)))


def approve(root: DirArg, run: RunOpt, gate: GateArg,
            choice: Annotated[str, typer.Option("--choice", help="One of the gate's options.")],
            token: Annotated[str | None, typer.Option("--token", help="A resume token, when "
                                                      "the request came with one.")] = None,
            branch: BranchOpt = "main", who: WhoOpt = None) -> None:
    """Answer an approval gate (bound to the current plan version and contract)."""

    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        the_run.approve(_gate(the_run, gate).id, choice, who=who_or_login(who), token=token)
        typer.echo(f"recorded: gate {gate} = {choice!r} (by {who_or_login(who)})")
        typer.echo(f"continue with `keepstep resume {root} --run {run}`")


def revoke(root: DirArg, run: RunOpt, gate: GateArg,
           reason: Annotated[str, typer.Option("--reason", help="Why (recorded with the "
                                               "decision).")],
           branch: BranchOpt = "main", who: WhoOpt = None) -> None:
    """Revoke a gate's decision (a recorded decision); the gate asks again on resume."""

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
        if state is not None and state.state == "succeeded":
            typer.echo(f"{unit} already ran under that decision and stays current; to redo it, "
                       f"`keepstep takeover {root} --run {run} rerun {unit}`")
        else:
            typer.echo(f"the gate asks again when the run reaches {unit}: "
                       f"`keepstep resume {root} --run {run}`")


# --- keys ------------------------------------------------------------------------------------
def keys_set(provider: Annotated[str, typer.Argument(help="e.g. openai, anthropic.")]) -> None:
    """Store a provider's API key in the OS keyring (read with a hidden prompt)."""
    from keepstep.engine import env_var_name, require_keyring, set_api_key

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


def recovery_reset(root: DirArg, run: RunOpt,
                   reason: Annotated[str, typer.Option("--reason", help="What a person checked.")],
                   who: WhoOpt = None, branch: BranchOpt = "main") -> None:
    """Close recovery's circuit breaker after looking (a recorded decision); then resume."""
    with open_project_dir(root) as project:
        the_run = existing_run(project, run, branch)
        the_run.reset_recovery(reason=reason, who=who_or_login(who))
        typer.echo(f"recovery reset recorded for run {run}; resume with "
                   f"`keepstep resume {root} --run {run}`")


def register(app: typer.Typer) -> None:
    add_command(app, calls, "calls")
    add_command(app, events, "events")
    add_command(app, effects, "effects")
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
