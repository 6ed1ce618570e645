"""The plan format written down: docs/plan-format.md, generated from the plan's pydantic models.

``plan_format_markdown()`` returns the reference as Markdown — every plan.toml table and field
(from the models' field descriptions), every kind preset and its params, the input prefixes
and what each emits, the edge types and change kinds, the gate bindings, the render parts a
template placeholder can be filled with, the audit checks. ``described_models()`` lists every
model the reference covers (a test checks each field has a description). Pure: builds a
string; ``python -m keepstep.engine.core.plan_reference > docs/plan-format.md`` rewrites the
file, and tests/test_plan_format.py fails when the file is out of date.
"""

from __future__ import annotations

import textwrap
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from keepstep.engine.core.plan import (
    INPUT_PREFIXES,
    MAX_ROUNDS_CAP,
    ROOT_EDGES,
    Dependency,
    EdgeType,
    Gate,
    InputRef,
    Plan,
    PlanHeader,
    Unit,
)
from keepstep.engine.core.presets import (
    PARTS,
    PRESETS,
    TABLE_COLUMNS,
    CitedIdsCheck,
    CitedSourcesCheck,
    CitesGroupsCheck,
    ConflictsCheck,
    FiguresCheck,
    FillSpec,
    ListsSourcesCheck,
    PresentCheck,
    RowsSpec,
    SectionsCheck,
)

# What each input prefix names (what it emits comes from ROOT_EDGES).
PREFIXES: dict[str, str] = {
    "source": "one approved source of sources.toml, by id",
    "group": "every approved source of a source group",
    "contract": "contract.md: a field (contract:audience, contract:goal, ...) or the whole "
                "contract; contract:audience emits audience, every other field policy",
    "template": "templates/<name>.md",
    "policy": "a policy value of keepstep.toml",
    "data": "a pack data file, data/<name>.toml (topics, audiences, risks, recommendation "
            "rules, ...)",
    "prompt": "a prompt template, prompts/<name>.md (read implicitly by model kinds)",
}

# What each change kind (= edge type) means where it starts and between units.
CHANGE_KINDS: dict[str, str] = {
    "content": "a source file's body changed, a data file or prompt changed, or (between "
               "units) a dependency's output changed in any other way than presentation",
    "structure": "a source was added, removed or renamed, or its header lines (title, type, "
                 "date) changed",
    "policy": "a contract field other than audience (goal, scope, deliverables, the body), "
              "or a policy value, changed",
    "audience": "contract.md's audience changed",
    "template": "a template's sections or placeholders were added, removed or reordered "
                "(sections keyed by <!-- section: id --> markers)",
    "presentation": "only a template's heading wording or formatting changed; between units: "
                    "a unit invalidated only through presentation edges emits presentation",
}

# The pack data files the kinds read (data/<name>.toml); a pack without one gets neutral
# defaults. The sample packs' files are worked examples, each with a comment on its format.
# What a user of the offline default must know about rank units (validate checks it).
OFFLINE_RANK_NOTE = (
    "With the offline model (the default), a rank unit finds a risk only where a verified "
    "statement uses one of `data/risks.toml`'s keywords — or, without that file, a generic risk "
    "word (delay, shortage, risk, …). `keepstep validate` reports a rank unit whose approved "
    "sources use none of them, with what to do: put the words your sources use in the keywords. "
    "A ranking of something else (`ranks = \"options\"`, vendors, …) ranks, offline, the "
    "courses of action the sources recommend (statements with a figure and \"should\", "
    "\"recommend\", \"advises\" …), each criterion's value taken from the statements that "
    "name it. "
    "A pack from `keepstep init` ships a commented `data/risks.toml` and a README.md that walks "
    "from your own sources (`keepstep sources remove` / `sources add`) to a finished run and "
    "Word deliverables (`keepstep export --format docx`).")

DATA_FILES: dict[str, str] = {
    "topics": "`[[topic]]` tables (name, keywords): the topics evidence is filed under; the "
              "offline model files a statement under the topic with the most keyword hits",
    "audiences": "`[default]` and one table per audience: `order` (the topics' reading order), "
                 "the heading each finding gets, and the risks that weigh more for that "
                 "audience",
    "risks": "`[[risk]]` tables (key, title, keywords, impact 1-5): the risk checklist a "
             "ranking scores (likelihood from the verified statements showing it, at most 5)",
    "recommendation": "`[[rule]]` tables (min_score, text with {title}, {score}, {top_n}), "
                      "`none` and `note`: the first rule the top risk's score reaches gives "
                      "the recommendation part (named by a fill's `data`)",
}

BINDINGS: dict[str, str] = {
    "contract:<field>": "that contract field's value (an audience gate binds contract:audience "
                        "only: other edits do not ask again)",
    "artifact:<unit>": "the unit's output hashes (a release gate asks again when the bytes "
                       "change)",
    "verdict:<unit>": "the unit's validators' verdict (an audit's pass/fail and failing "
                      "checks, shown in the request)",
    "plan": "the plan version",
    "contract": "the plan version and the whole contract's hash (the default)",
}

CHECKS: tuple[type[BaseModel], ...] = (PresentCheck, SectionsCheck, CitedIdsCheck,
                                       CitedSourcesCheck, ListsSourcesCheck, FiguresCheck,
                                       CitesGroupsCheck, ConflictsCheck)


def described_models() -> list[type[BaseModel]]:
    """Every model whose fields the reference lists."""
    params = [p.params for p in PRESETS.values() if p.params is not None]
    return [Plan, PlanHeader, Unit, Dependency, InputRef, Gate, *params, FillSpec, RowsSpec,
            *CHECKS]


def _name(tp: Any) -> str:
    """A field's type as a reader writes it (an audit check list is "list[check]")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        inner = typing.get_args(args[0]) or (args[0],)
        return "check" if all(a in CHECKS for a in inner) else _name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_name(a) for a in args)}]"
    if tp is Any:
        return "any"
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _type(info: FieldInfo) -> str:
    return _name(info.annotation).replace("|", "\\|")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is None:
        return "none"
    if hasattr(value, "value"):
        value = value.value
    return f"`{value!r}`" if value not in ([], {}, "") else "empty"


def _md(text: str, *, cell: bool = True) -> str:
    """Docstring text as Markdown on one line: ``x`` -> `x`; a <name> outside code is escaped
    (a bare one would read as an HTML tag); pipes escaped in a table ``cell``."""
    parts = " ".join(text.replace("``", "`").split()).split("`")
    for n in range(0, len(parts), 2):  # outside code spans
        parts[n] = parts[n].replace("<", "\\<").replace(">", "\\>")
    joined = "`".join(parts)
    return joined.replace("|", "\\|") if cell else joined


def _fields(model: type[BaseModel], *, skip: tuple[str, ...] = ()) -> list[str]:
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        shown = info.alias or name
        text = _md(info.description or "")
        rows.append(f"| `{shown}` | {_type(info)} | {_default(info)} | {text} |")
    return rows


def _doc(model: type[BaseModel]) -> str:
    return _md(model.__doc__ or "", cell=False)


def plan_format_markdown() -> str:
    """docs/plan-format.md's text."""
    out = [
        "# The plan format (plan.toml)",
        "",
        "<!-- generated by `python -m keepstep.engine.core.plan_reference > "
        "docs/plan-format.md` from the field descriptions in engine/core/plan.py and "
        "engine/core/presets.py; tests/test_plan_format.py fails when it is out of date -->",
        "",
        "A pack is a folder: keepstep.toml (models, budgets, adapters: docs/config.md), "
        "contract.md (front matter fields, then the body), sources.toml (the approved "
        "sources and their groups), plan.toml (this page), templates/<name>.md, optional "
        "prompts/<name>.md and data/<name>.toml. `keepstep validate` checks all of it against "
        "this page and names unit, field and what to do for every problem (`--json` too).",
        "",
        "## Tables",
        "",
        f"`[plan]` — {_doc(PlanHeader)}",
        "",
        *_fields(PlanHeader),
        "",
        f"`[[unit]]` — {_doc(Unit)}",
        "",
        *_fields(Unit, skip=("input_edges",)),
        "",
        f"A dependency in `depends_on` — {_doc(Dependency)}",
        "",
        *_fields(Dependency),
        "",
        f"The long form of an input — {_doc(InputRef)}",
        "",
        *_fields(InputRef),
        "",
        f"`[[gate]]` — {_doc(Gate)}",
        "",
        *_fields(Gate),
        "",
        "## Input prefixes",
        "",
        "An input is `<prefix>:<name>`. A plain input reads every change its prefix emits; "
        "`{ ref = \"group:A\", edges = [\"structure\"] }` reads only the edge types listed "
        "(a header-only inventory reads its sources through structure edges only).",
        "",
        "| prefix | names | emits |",
        "|---|---|---|",
    ]
    for prefix in (*INPUT_PREFIXES, "prompt"):
        emits = ", ".join(e.value for e in ROOT_EDGES[prefix])
        out.append(f"| `{prefix}:` | {_md(PREFIXES[prefix])} | {emits} |")
    out += [
        "",
        "## Edge types and change kinds",
        "",
        "A change reaches a unit through an edge of its own type: a root input's change "
        "through the unit's inputs, a dependency's through `depends_on` edges. An invalidated "
        "unit emits `presentation` when only presentation edges fired into it, otherwise "
        "`content`. A re-run that writes byte-identical outputs keeps its dependents current "
        "(early cut-off, explained in the preview).",
        "",
        "| type | the change |",
        "|---|---|",
        *[f"| `{e.value}` | {_md(CHANGE_KINDS[e.value])} |" for e in EdgeType],
        "",
        "## Gate bindings (`binds`)",
        "",
        "A decision applies while what it binds is unchanged; the request shows each bound "
        "value (and a verdict's failing checks) and, per option, what is reused and redone.",
        "",
        "| binding | what the decision is about |",
        "|---|---|",
        *[f"| `{b}` | {_md(t)} |" for b, t in BINDINGS.items()],
        "",
        "## Kinds",
        "",
        "Each kind is a preset over one mechanism. `params` are checked by `keepstep "
        "validate`; unknown params are errors.",
        "",
        "| kind | mechanism | what it does | default outputs | prompts | data files |",
        "|---|---|---|---|---|---|",
    ]
    for p in PRESETS.values():
        out.append(f"| `{p.kind}` | {p.mechanism} | {_md(p.summary)} | "
                   f"{', '.join(p.outputs) or '—'} | {', '.join(p.prompts) or '—'} | "
                   f"{', '.join(p.data) or '—'} |")
    out.append("")
    for p in PRESETS.values():
        out += [f"### `{p.kind}` params", ""]
        if p.params is None:
            out += ["Its params belong to the source converters (none are required).", ""]
            continue
        out += [_doc(p.params), ""]
        out += (_fields(p.params) if p.params.model_fields else ["(no params)"]) + [""]
    out += [
        f"Loops (`rank`, or `model` with `answer = \"risks\"`) need `max_rounds` (1 to "
        f"{MAX_ROUNDS_CAP}); `on_last_round` says what happens when the last round still "
        "fails its check.",
        "",
        "### A placeholder's fill (`params.fill.<placeholder>` as a table)",
        "",
        _doc(FillSpec),
        "",
        *_fields(FillSpec),
        "",
        "### A table's rows (`params.rows`)",
        "",
        _doc(RowsSpec),
        "",
        *_fields(RowsSpec),
        "",
        "## Template placeholders (render parts)",
        "",
        "A render template is Jinja2: `{{ name }}` is filled with the part of that name, or "
        "with the part `params.fill` maps it onto; contract fields a contract intake "
        "dependency declares fill their own names. Any other placeholder is a validation "
        "error. Sections are marked `<!-- section: id -->`; audits and change typing match "
        "sections by id.",
        "",
        "| part | what it holds |",
        "|---|---|",
        *[f"| `{name}` | {_md(text)} |" for name, text in PARTS.items()],
        "",
        "A CSV table document (`format = \"csv\"`) lists the template's list items as "
        "columns, each one of:",
        "",
        "| column | what it holds |",
        "|---|---|",
        *[f"| `{name}` | {_md(text)} |" for name, text in TABLE_COLUMNS.items()],
        "",
        "## Pack data files",
        "",
        "Declared as `data:<name>` inputs (a change is a content change); the kinds read "
        "these names:",
        "",
        "| file | format |",
        "|---|---|",
        *[f"| `data/{name}.toml` | {_md(text)} |" for name, text in DATA_FILES.items()],
        "",
        *textwrap.wrap(OFFLINE_RANK_NOTE, 99),
        "",
        "## Audit checks (`[[unit.params.checks]]`)",
        "",
    ]
    for model in CHECKS:
        check = typing.get_args(model.model_fields["check"].annotation)[0]
        out += [f"### `check = \"{check}\"`", "", _doc(model), "",
                *_fields(model, skip=("check",)), ""]
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(plan_format_markdown(), end="")
