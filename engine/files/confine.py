"""Confinement of every path a project names to the project folder.

A pack received from someone else is untrusted: a ``templates/report.md`` that is a symbolic
link to ``/etc/passwd``, a template named ``../../secrets``, an output called ``/tmp/x`` or
``a;rm -rf ~`` must never pull an outside file into a report or write outside the project.
``project_file`` resolves a named file (following symbolic links) and refuses it unless it
stays inside the resolved project folder; ``unsafe_name`` says why a name a plan gives (an
output, a deliverable, a template, a data file) is not a plain relative file name.
``confinement_problems`` runs both over a whole project at ``validate``; the places that
read or write at use call ``project_file`` again, because the folder may change in between.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from keepstep.engine.errors import ProjectError

TEMPLATES_DIR, DATA_DIR, PROMPTS_DIR = "templates", "data", "prompts"
# Characters a shell or a file manager would treat specially; a plain name needs none.
_SHELL_CHARS = set("$`;|&<>*?!{}[]()'\"\\~#%\n\r\t\x00")
_NAME_PART = re.compile(r"[^/]+")
# A name that is certainly plain: parts that start with a letter, digit or "_" and hold only
# those and ". + = , @ -" (no shell character, no empty, "." or ".." part, no leading "-").
# Checked first: the full checks cost ~15 µs a name, 0.15 s on a 10,000-unit plan.
_PLAIN_NAME = re.compile(r"\w[\w.+=,@-]*(?:/\w[\w.+=,@-]*)*")


class UnsafePathError(ProjectError):
    """A file or name the project gives leaves the project folder or is not a plain name."""

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "keep every template, data file, prompt and "
                         "output inside the project folder, as a plain relative name")
        self.path = path


def unsafe_name(name: str) -> str:
    """Why ``name`` is not a safe relative file name ("" when it is): absolute, ``..``,
    empty parts, or characters a shell would interpret."""
    text = str(name)
    return "" if _PLAIN_NAME.fullmatch(text) else _unsafe_name_checks(text)


def _unsafe_name_checks(text: str) -> str:
    """``unsafe_name`` without its shortcut for plain names."""
    if not text.strip():
        return "is empty"
    if text.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", text):
        return "is an absolute path"
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if ".." in parts or any(p in ("", ".") for p in text.replace("\\", "/").split("/")):
        return "climbs out of its folder (../)" if ".." in parts else "has an empty or '.' part"
    bad = sorted({c for c in text if c in _SHELL_CHARS or ord(c) < 32})
    if bad:
        return "contains shell characters " + " ".join(repr(c) for c in bad)
    if text.startswith("-"):
        return "starts with '-' (it would read as an option)"
    return ""


def check_name(name: str, what: str) -> str:
    """``name`` when safe; UnsafePathError naming it otherwise."""
    why = unsafe_name(name)
    if why:
        raise UnsafePathError(f"{what} {name!r} {why}: refused as an unsafe name", path=str(name),
                              hint="use a plain relative name such as report.md")
    return str(name)


def project_file(root: Path | str, *parts: str, what: str = "file") -> Path:
    """The resolved path of ``root/parts...``; UnsafePathError when, after following
    symbolic links, it is not inside the resolved project folder (or a part is unsafe)."""
    rel = "/".join(parts)
    base = Path(root).resolve()
    joined = Path(root).joinpath(*parts)
    try:
        resolved = joined.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UnsafePathError(f"{what} {rel} cannot be resolved ({exc})", path=rel) from None
    if resolved != base and base not in resolved.parents:
        link = " (a symbolic link)" if _is_link_on_the_way(Path(root), parts) else ""
        raise UnsafePathError(
            f"{what} {rel}{link} leads outside the project folder (to {resolved}); refused",
            path=rel, hint="copy the file into the project instead of linking to it")
    return resolved


def _is_link_on_the_way(root: Path, parts: tuple[str, ...]) -> bool:
    path = root
    for part in parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


def unsafe_file(root: Path | str, *parts: str, what: str = "file") -> str:
    """Why ``root/parts...`` may not be read ("" when it may)."""
    try:
        project_file(root, *parts, what=what)
    except UnsafePathError as exc:
        return str(exc).splitlines()[0]
    return ""


def confinement_problems(files: Any) -> list[Any]:
    """Every file or name the project's plan and config give that is unsafe: templates,
    data files and prompts leading outside the project (after following symbolic links),
    sources likewise, and output, document and deliverable names that are not plain
    relative names. ``files`` is a ``ProjectFiles``; the result is ``PlanProblem`` values."""
    from keepstep.engine.core.plan import outputs_of, plan_problem, unit_problem

    root = Path(files.root)
    out: list[Any] = []
    seen: set[tuple[str, str]] = set()

    def check(uid: str, field: str, folder: str, name: str, suffix: str, what: str) -> None:
        if (folder, name) in seen:
            return
        seen.add((folder, name))
        why = unsafe_file(root, folder, f"{name}{suffix}", what=what)
        if why:
            out.append(unit_problem(uid, field, why, "keep the file inside the project folder "
                                    "(a copy, not a link) under a plain name",
                                    code="unsafe_path"))

    for unit in files.plan.units:
        for ref in unit.inputs:
            prefix, _, name = str(ref).partition(":")
            if prefix == "template":
                check(unit.id, "inputs", TEMPLATES_DIR, name, ".md", "template")
            elif prefix == "data":
                check(unit.id, "inputs", DATA_DIR, name, ".toml", "data file")
        params = unit.params or {}
        if isinstance(params.get("template"), str):
            check(unit.id, "params.template", TEMPLATES_DIR, params["template"], ".md",
                  "template")
        if isinstance(params.get("prompt"), str):
            check(unit.id, "params.prompt", PROMPTS_DIR, params["prompt"], ".md", "prompt")
        for n, name in enumerate(outputs_of(unit)):
            why = unsafe_name(name)
            if why:
                out.append(unit_problem(unit.id, f"outputs[{n}]", f"output name {name!r} {why}:"
                                        " refused as an unsafe name", "use a plain file name "
                                        "such as report.md", code="unsafe_name"))
        for key in ("output", "document"):
            value = params.get(key)
            if isinstance(value, str) and unsafe_name(value):
                out.append(unit_problem(unit.id, f"params.{key}", f"{key} name {value!r} "
                                        f"{unsafe_name(value)}: refused as an unsafe name",
                                        "use a plain file name such as report.md",
                                        code="unsafe_name"))
    for s in files.sources.sources:
        why = unsafe_file(root, str(s.path), what=f"source {s.id}") if s.path else ""
        if why:
            out.append(plan_problem(why, "keep sources inside the project (sources/...), "
                                    "as copies, not links", code="unsafe_path"))
    for name in _deliverable_names(files.plan):
        why = unsafe_name(name)
        if why:
            out.append(plan_problem(f"deliverable name {name!r} {why}: refused as an unsafe "
                                    "name", "use a plain file name", code="unsafe_name"))
    return out


def _deliverable_names(plan: Any) -> list[str]:
    return [str(d) for d in getattr(getattr(plan, "plan", None), "deliverables", None) or []]


__all__ = ["DATA_DIR", "PROMPTS_DIR", "TEMPLATES_DIR", "UnsafePathError", "check_name",
           "confinement_problems", "project_file", "unsafe_file", "unsafe_name"]
