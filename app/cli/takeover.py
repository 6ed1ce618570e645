"""``keepstep takeover DIR --run ID ACTION …``: take a run over from the command line.

Actions: ``narrow`` (drop units from the required scope), ``rerun UNIT``, ``branch``,
``cancel``, ``expert UNIT``. Each prints its preview first — what it reuses, invalidates or
holds back, and the estimated cost (``engine.takeover_preview``) — then asks. ``--yes``
records without asking; without a terminal and without ``--yes`` nothing is recorded and the
command exits 0 after the preview. Recording goes through ``engine.takeover`` (or
``Run.branch``) as a decision event — never a hand edit of the database.

One command with an ACTION argument rather than a command group, so that options may
follow the action (``rerun U07 --yes``): a click group stops parsing its own options at
the first positional.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from keepstep.app.cli.common import (
    BranchOpt,
    DirArg,
    RunOpt,
    UsageProblem,
    WhoOpt,
    add_command,
    check_dir,
    check_unit,
    confirmed,
    existing_run,
    here,
    open_project_dir,
    run_id_of,
    who_or_login,
)

if TYPE_CHECKING:
    from keepstep.engine import Run
    from keepstep.engine.takeover import TakeoverPreview


def takeover_text(preview: TakeoverPreview) -> str:
    """A takeover preview as text: summary, then each list that is not empty."""
    from keepstep.engine.plan import compact_ids

    def ids(units: list[str]) -> str:
        return compact_ids(units) or "none"

    lines = [f"Preview: {preview.action}", f"  {preview.summary}"]
    if preview.invalidated:
        lines.append(f"Invalidated ({len(preview.invalidated)})")
        for uid, explanations in preview.invalidated.items():
            lines.append(f"  {uid}")
            lines += [f"    {e.render()}" for e in explanations]
    else:
        lines.append("Invalidated: none")
    if preview.held:
        lines.append(f"Held back ({len(preview.held)}): {ids(preview.held)}")
    if preview.waiting:
        lines.append(f"Waiting behind it ({len(preview.waiting)}): {ids(preview.waiting)}")
    if preview.to_run:
        lines.append(f"To run ({len(preview.to_run)}): {ids(preview.to_run)}")
    lines.append(f"Reused ({len(preview.reused)}): {ids(preview.reused)}")
    est = preview.estimate
    lines.append(f"Estimated cost: ~{est.calls} call(s), ~{est.tokens} tokens, "
                 f"${est.cost:.2f}")
    lines += [f"  - {note}" for note in preview.notes]
    lines.append(f"Will record: {preview.records}")
    return "\n".join(lines)


class Action(StrEnum):
    narrow = "narrow"
    rerun = "rerun"
    branch = "branch"
    cancel = "cancel"
    expert = "expert"


def _take_over(root: Path, run_id: str, branch: str, question: str, yes: bool,
               preview: Callable[[Run], TakeoverPreview], record: Callable[[Run], str]) -> None:
    """Print the preview; with confirmation, record and say what was recorded and what next."""
    with open_project_dir(root) as project:
        run = existing_run(project, run_id, branch)
        typer.echo(takeover_text(preview(run)))
        if not confirmed(question, yes):
            return
        typer.echo(record(run))


def _positionals(root: Path | None, action: str | None,
                 unit: str | None) -> tuple[Path | None, str | None, str | None]:
    """``takeover [DIR] ACTION [UNIT]``: when the first word is an action, DIR was left out."""
    if root is not None and str(root) in {a.value for a in Action} and \
            not (root / "keepstep.toml").is_file():
        return None, str(root), action
    return root, action, unit


def _unit_list(values: list[str] | None) -> list[str]:
    return [u for v in values or [] for u in v.replace(",", " ").split()]


def _only(action: Action, given: dict[str, object]) -> None:
    extra = [name for name, value in given.items() if value not in (None, [], "")]
    if extra:
        raise UsageProblem(f"{', '.join(extra)} does not apply to `takeover {action.value}`",
                           "see `keepstep takeover --help`")


def takeover(
    root: DirArg = None,
    action_word: Annotated[str | None, typer.Argument(
        metavar="ACTION", help="narrow, rerun, branch, cancel or expert.", show_default=False)]
    = None,
    unit: Annotated[str | None, typer.Argument(
        metavar="[UNIT]", help="The unit, for rerun and expert.", show_default=False)] = None,
    run: RunOpt = None,
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="U31,U32", help="narrow: units to drop from the required scope "
        "(what depends on them goes too).")] = None,
    keep: Annotated[list[str] | None, typer.Option(
        "--keep", metavar="U33", help="narrow: or the units to keep (with what they need).")]
    = None,
    at: Annotated[int | None, typer.Option("--at", min=0, help="branch: the checkpoint.")]
    = None,
    as_: Annotated[str | None, typer.Option("--as", help="branch: the new branch id.")] = None,
    note: Annotated[str, typer.Option("--note", help="A note kept with the decision (expert: "
                                      "what to look at).")] = "",
    branch: BranchOpt = "main", who: WhoOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Record without asking.")] = False,
) -> None:
    """Take a run over: each action previews what it reuses, invalidates or holds back and
    what it costs, then records a decision (asks first; --yes records at once; without a
    terminal and without --yes only the preview is printed).

    \b
    Example:
      keepstep takeover rerun U07 --run ME-042
      keepstep takeover narrow --drop U31,U32 --yes
    \b
      narrow --drop U31,U32    the run can finish without these units
      rerun UNIT               run UNIT again (it and what uses its content are invalidated)
      branch --at V --as NAME  fork the run at checkpoint V
      cancel                   record the decision to stop the run here
      expert UNIT --note TEXT  hold UNIT for an expert; what depends on it waits
    """
    root, action_word, unit = _positionals(root, action_word, unit)
    try:
        action = Action(action_word or "")
    except ValueError:
        raise UsageProblem(f"no takeover action {action_word!r}" if action_word else
                           "name the takeover action",
                           "one of: " + ", ".join(a.value for a in Action)) from None
    root = check_dir(root)
    who_name = who_or_login(who)
    with open_project_dir(root) as project:
        run = run_id_of(project, run)
    where = here(root)
    hint = f"continue with `keepstep resume {where}--run {run}" + (
        f" --branch {branch}`" if branch != "main" else "`")
    args: dict[str, Any] = {"root": root, "run_id": run, "branch": branch, "yes": yes}
    if action in (Action.rerun, Action.expert):
        if unit is None:
            raise UsageProblem(f"`takeover {action.value}` needs a unit",
                               f"e.g. keepstep takeover {where}{action.value} U07 --run {run}")
        args["unit"] = unit
    elif unit is not None:
        raise UsageProblem(f"`takeover {action.value}` takes no unit ({unit!r})")
    if action == Action.narrow:
        _only(action, {"--at": at, "--as": as_})
        _narrow(**args, drop=_unit_list(drop), keep=_unit_list(keep), note=note, who=who_name,
                hint=hint)
    elif action == Action.rerun:
        _only(action, {"--drop": drop, "--keep": keep, "--at": at, "--as": as_})
        _rerun(**args, note=note, who=who_name, hint=hint)
    elif action == Action.branch:
        _only(action, {"--drop": drop, "--keep": keep, "--note": note})
        if at is None or not as_:
            raise UsageProblem("`takeover branch` needs --at V and --as NAME")
        _branch(**args, at=at, name=as_)
    elif action == Action.cancel:
        _only(action, {"--drop": drop, "--keep": keep, "--at": at, "--as": as_})
        _cancel(**args, note=note, who=who_name)
    else:
        _only(action, {"--drop": drop, "--keep": keep, "--at": at, "--as": as_})
        if not note.strip():
            raise UsageProblem("say what the expert should look at", "pass --note '...'")
        _expert(**args, note=note, who=who_name)


def _narrow(root: Path, run_id: str, branch: str, yes: bool, *, drop: list[str],
            keep: list[str], note: str, who: str, hint: str) -> None:
    from keepstep.engine.takeover import keep_for_drop, narrow_scope, preview_narrow

    if bool(drop) == bool(keep):
        raise UsageProblem("name the units to drop or to keep (one of the two)",
                           "e.g. --drop U31,U32")

    def kept(run: Run) -> list[str]:
        for uid in drop or keep:
            check_unit(run, uid)
        return keep_for_drop(run.plan, drop) if drop else keep

    def record(run: Run) -> str:
        held = narrow_scope(run, kept(run), who=who, note=note)
        return (f"recorded: scope narrowed ({len(held)} unit(s) held back: "
                f"{', '.join(held) or 'none'})\n{hint}")

    _take_over(root, run_id, branch, "Narrow the scope?", yes,
               lambda run: preview_narrow(run, kept(run)), record)


def _rerun(root: Path, run_id: str, branch: str, yes: bool, *, unit: str, note: str, who: str,
           hint: str) -> None:
    from keepstep.engine.takeover import preview_rerun, rerun_unit

    def preview(run: Run) -> TakeoverPreview:
        check_unit(run, unit)
        return preview_rerun(run, unit, who=who)

    def record(run: Run) -> str:
        invalidated = rerun_unit(run, unit, who=who, note=note)
        what = f"invalidated {', '.join(invalidated)}" if invalidated else "nothing invalidated"
        return f"recorded: rerun of {unit} ({what})\n{hint}"

    _take_over(root, run_id, branch, f"Rerun {unit}?", yes, preview, record)


def _branch(root: Path, run_id: str, branch: str, yes: bool, *, at: int, name: str) -> None:
    from keepstep.engine.takeover import preview_branch

    def preview(run: Run) -> TakeoverPreview:
        head = run.head().version
        if at > head:
            raise UsageProblem(f"checkpoint {at} is past the head of {run.run_id}/"
                               f"{run.branch_id} ({head})", f"pick a version from 0 to {head}")
        return preview_branch(run, at, name)

    def record(run: Run) -> str:
        new = run.branch(at, name)
        return (f"recorded: branch {new.branch_id} of run {run.run_id} forked at checkpoint "
                f"{at}\ncontinue it with `keepstep resume {here(root)}--run {run.run_id} "
                f"--branch {new.branch_id}`")

    _take_over(root, run_id, branch, f"Fork at checkpoint {at} as {name}?", yes, preview,
               record)


def _cancel(root: Path, run_id: str, branch: str, yes: bool, *, note: str, who: str) -> None:
    from keepstep.engine.takeover import preview_cancel, record_takeover

    def record(run: Run) -> str:
        record_takeover(run, "cancel", who=who, note=note)
        return f"recorded: run {run.run_id} ({run.branch_id}) cancelled by {who}"

    _take_over(root, run_id, branch, "Cancel the run?", yes, preview_cancel, record)


def _expert(root: Path, run_id: str, branch: str, yes: bool, *, unit: str, note: str,
            who: str) -> None:
    from keepstep.engine.takeover import mark_for_expert, preview_expert

    def preview(run: Run) -> TakeoverPreview:
        check_unit(run, unit)
        return preview_expert(run, unit)

    def record(run: Run) -> str:
        mark_for_expert(run, unit, note, who=who)
        return (f"recorded: {unit} marked for an expert ({note})\nrelease it with "
                f"`keepstep takeover {here(root)}rerun {unit} --run {run.run_id}`")

    _take_over(root, run_id, branch, f"Hold {unit} for an expert?", yes, preview, record)


def register(app: typer.Typer) -> None:
    add_command(app, takeover, "takeover")


__all__ = ["register", "takeover_text"]
