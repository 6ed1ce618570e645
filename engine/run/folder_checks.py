"""The plan's problems that need the project folder (``file_problems``): template files
that exist, template placeholders something fills, pack data files that parse, extract units
whose inputs select an approved source, deliver units whose adapter is configured, prompts
that load, ``[providers.X]`` and ``unit_models`` names that match. Each problem names the
unit (or file), the field and what to do.

Every validated open of a project runs these (``keepstep status`` included), so this module
stays light: it loads no kind and no model check (those are ``run.validation``'s, for
``keepstep validate``).
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from keepstep.engine.core.plan import (
    Plan,
    PlanProblem,
    UnitKind,
    outputs_of,
    plan_problem,
    unit_problem,
)
from keepstep.engine.core.presets import (
    PARTS,
    TABLE_COLUMNS,
    FillSpec,
    RenderParams,
    data_names,
    document_format,
)
from keepstep.engine.core.templates import layout, placeholders, syntax_error, table_columns
from keepstep.engine.errors import KeepstepError, ProjectError
from keepstep.engine.files.confine import confinement_problems, unsafe_file
from keepstep.engine.files.project import template_file
from keepstep.engine.gateway import keys
from keepstep.engine.gateway.prompts import load_prompt

TEMPLATES_DIR, DATA_DIR = "templates", "data"


def _contract_fields_of(plan: Plan, unit_id: str) -> set[str]:
    """The contract fields a render unit's contract dependency carries."""
    units = plan.unit_map()
    out: set[str] = set()
    for d in units[unit_id].depends_on:
        dep = units.get(d.unit)
        if dep is not None and "contract.json" in outputs_of(dep):
            out |= {f for f in dep.input_refs("contract") if f != "audience"}
    return out


def _project_contract_fields(root: Path) -> set[str]:
    """contract.md's front-matter fields: they reach any template that names them."""
    from keepstep.engine.files.project import load_contract

    try:
        return {str(k) for k in load_contract(root).fields}
    except KeepstepError:
        return set()  # reported by the contract's own check


def _render_problems(root: Path, plan: Plan, unit: Any) -> list[PlanProblem]:
    try:
        params = RenderParams.model_validate(unit.params)
    except ValidationError:
        return []  # reported by the plan's own checks
    out = []
    if unsafe_file(root, TEMPLATES_DIR, f"{params.template}.md"):  # confinement_problems says it
        return []
    path = template_file(root, params.template) or root / TEMPLATES_DIR / f"{params.template}.md"
    if not path.is_file():
        return [unit_problem(unit.id, "params.template", f"template file {TEMPLATES_DIR}/"
                             f"{params.template}.md is missing", "add the file, or name an "
                             "existing template", code="template_missing")]
    text = path.read_text(encoding="utf-8", errors="replace")
    for name, spec in params.fill.items():
        part = spec if isinstance(spec, str) else spec.part
        if part not in PARTS:
            out.append(unit_problem(unit.id, f"params.fill.{name}", f"fills {name!r} with "
                                    f"unknown part {part!r}", "use one of: "
                                    + ", ".join(sorted(PARTS)), code="unknown_part"))
        if isinstance(spec, FillSpec):
            missing = [u for u in spec.from_ if u not in {d.unit for d in unit.depends_on}]
            if missing:
                out.append(unit_problem(unit.id, f"params.fill.{name}.from", "names "
                                        f"{', '.join(missing)}, not among depends_on",
                                        "depend on them or fix the ids", code="fill_from"))
            if spec.data and f"data:{spec.data}" not in unit.inputs:
                out.append(unit_problem(unit.id, f"params.fill.{name}.data", f"data file "
                                        f"{spec.data!r} is not an input",
                                        f"add \"data:{spec.data}\" to inputs", code="data_input"))
    if document_format(unit) == "csv":
        bad = [c for c in table_columns(text) if c not in TABLE_COLUMNS]
        if bad:
            out.append(unit_problem(unit.id, "params.template", f"template {params.template} "
                                    f"lists unknown column(s) {', '.join(bad)}",
                                    f"use: {', '.join(TABLE_COLUMNS)}", code="template_columns"))
        return out
    error = syntax_error(text)
    if error:
        return out + [unit_problem(unit.id, "params.template", f"template {params.template} "
                                   f"is not valid Jinja2 ({error})", "fix the line it names",
                                   code="template_syntax")]
    known = set(PARTS) | set(params.fill) | _contract_fields_of(plan, unit.id) | \
        _project_contract_fields(root)
    unknown = [p for p in placeholders(text) if p not in known]
    if unknown:
        out.append(unit_problem(
            unit.id, "params.template", f"template {params.template} uses unknown "
            f"placeholder(s) {', '.join('{{ ' + u + ' }}' for u in unknown)}",
            "map each onto a part in params.fill (e.g. fill = { " + unknown[0] + " = "
            "\"findings\" }), add the field to contract.md's front matter (e.g. "
            + unknown[0] + " = \"...\"), or fix the name", code="template_placeholder"))
    if params.prose and params.prose not in placeholders(text):
        out.append(unit_problem(unit.id, "params.prose", f"{params.prose!r} is not a "
                                f"placeholder of template {params.template}",
                                "name one of its placeholders", code="prose"))
    dup = [s for s in {s for s in layout(text).section_ids
                       if layout(text).section_ids.count(s) > 1}]
    if dup:
        out.append(unit_problem(unit.id, "params.template", f"template {params.template} "
                                f"marks section(s) {', '.join(sorted(dup))} twice",
                                "give each <!-- section: id --> marker its own id",
                                code="template_sections"))
    return out


def file_problems(files: Any) -> list[PlanProblem]:
    """The plan's problems that need the project folder (``files``: ``ProjectFiles``)."""
    root, plan, config = Path(files.root), files.plan, files.config
    out: list[PlanProblem] = confinement_problems(files)
    approved = files.approved_sources()
    data_seen: set[str] = set()
    for unit in plan.units:
        for ref in unit.inputs:
            prefix, _, name = ref.partition(":")
            if prefix == "template" and not unsafe_file(root, TEMPLATES_DIR, f"{name}.md") \
                    and template_file(root, name) is None \
                    and not (unit.kind == UnitKind.render and unit.params.get("template") == name):
                out.append(unit_problem(unit.id, "inputs", f"template file {TEMPLATES_DIR}/"
                                        f"{name}.md is missing", "add the file or remove the "
                                        "input", code="template_missing"))
            if prefix == "data":
                data_seen.add(name)
                if not (root / DATA_DIR / f"{name}.toml").is_file():
                    out.append(unit_problem(unit.id, "inputs", f"data file {DATA_DIR}/"
                                            f"{name}.toml is missing", "add the file or remove "
                                            "the input", code="data_missing"))
        data_seen |= set(data_names(unit))
        if unit.kind == UnitKind.render:
            out += _render_problems(root, plan, unit)
        if unit.kind == UnitKind.extract:
            wanted = set(unit.input_refs("source"))
            named = [s for s in approved.values()
                     if s.id in wanted or (s.group and s.group in set(unit.input_refs("group")))]
            if (unit.input_refs("source") or unit.input_refs("group")) and not named:
                out.append(unit_problem(unit.id, "inputs", "an extract unit whose inputs name "
                                        "no approved source", "approve a source of its groups "
                                        "or fix the inputs", code="extract_sources"))
        if unit.kind == UnitKind.deliver:
            adapter = unit.params.get("adapter")
            if isinstance(adapter, str) and adapter not in config.adapters:
                known = ", ".join(sorted(config.adapters)) or "none"
                out.append(unit_problem(unit.id, "params.adapter", f"names adapter {adapter!r}, "
                                        f"which keepstep.toml does not configure (configured: "
                                        f"{known})", f"add an [adapters.{adapter}] table or name "
                                        "a configured one", code="adapter"))
        if unit.kind == UnitKind.model and unit.params.get("prompt"):
            out += _prompt_problems(root, unit)
    for name in sorted(data_seen):
        path = root / DATA_DIR / f"{name}.toml"
        if path.is_file() and not unsafe_file(root, DATA_DIR, f"{name}.toml"):
            try:
                tomllib.loads(path.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                out.append(plan_problem(f"data file {DATA_DIR}/{name}.toml is not valid TOML: "
                                        f"{exc}", "fix the line it names", code="data_toml"))
    ids = {u.id for u in plan.units}
    for uid in sorted(set(config.unit_models) - ids):
        out.append(plan_problem(f"keepstep.toml unit_models names unit {uid!r}, which the plan "
                                "does not have", "fix the id or remove the entry",
                                code="unit_models"))
    out += _provider_problems(config)
    return out


def _prompt_problems(root: Path, unit: Any) -> list[PlanProblem]:

    try:
        load_prompt(str(unit.params["prompt"]), root)
    except ProjectError as exc:
        return [unit_problem(unit.id, "params.prompt", str(exc).splitlines()[0],
                             "add prompts/<name>.md to the pack (copy a packaged one to start)",
                             code="prompt")]
    return []


def _provider_problems(config: Any) -> list[PlanProblem]:
    """``[providers.X]`` names that no model of the project uses: a misspelling leaves the
    limits unapplied."""

    models = {config.default_model, *config.models.values(), *config.unit_models.values()}
    used = {m.split("/", 1)[0] for m in models if "/" in m}
    known = set(keys.known_providers()) | set(keys.KEYLESS_PROVIDERS) | used
    out = []
    for name in sorted(config.providers):
        if name in used:
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = (f"did you mean [providers.{near[0]}]?" if near else
                f"the project's models use: {', '.join(sorted(used)) or 'none'}")
        out.append(plan_problem(f"keepstep.toml [providers.{name}] names a provider no model of "
                                "the project uses, so its limits never apply", hint,
                                code="provider"))
    return out


__all__ = ["DATA_DIR", "TEMPLATES_DIR", "file_problems"]
