"""The unit kinds as presets over a few general mechanisms, and their params.

Pure data: what each kind of plan.toml is (a model step, a document render, an audit, a
deliver step or bookkeeping), which params it takes (pydantic models, every field described
— docs/plan-format.md is generated from them), which outputs it writes by default, which
prompts and pack data files it reads implicitly, and whether it produces evidence.

Callers may rely on: ``PRESETS[kind]`` for every ``UnitKind``; ``params_model(kind)`` being
None only for kinds whose params are not checked here (extract, whose params the source
converters own); ``implicit_refs(unit)`` listing the ``prompt:``/``data:`` inputs a unit reads
through its kind, in a stable order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Mechanism = Literal["model step", "document render", "audit", "deliver", "bookkeeping"]
ANSWERS = ("claims", "risks")
REVISE_PROMPT = "revise"
# The pack data files a kind reads when the pack has them (data/<name>.toml): the topics
# evidence is filed under, per-audience reading orders, the risk checklist.
TOPICS, AUDIENCES, RISKS = "topics", "audiences", "risks"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --- bookkeeping ------------------------------------------------------------------------------
class IntakeParams(_Params):
    """``kind = "intake"``: one bookkeeping step before any model call."""

    step: Literal["inventory", "contract", "questions", "schema"] = Field(
        description="inventory: the approved sources the unit names (id, group, title, kind, "
        "and sha256 when it reads their content; header lines only when its source inputs "
        "are structure edges); contract: the contract fields it names; questions: research "
        "questions framed from the inventory and contract dependencies; schema: the "
        "evidence item schema the extraction units follow")


class NotesParams(_Params):
    """``kind = "notes"``: change notes written from the run's decision events (no params)."""


# --- model steps ------------------------------------------------------------------------------
class VerifyParams(_Params):
    """``kind = "verify"``: rule checks, then a model claim check of every statement of the
    evidence-producing dependencies."""

    min_supported: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="the share of checked statements that must be supported for the "
        "claim_check validator to pass")


class SynthesizeParams(_Params):
    """``kind = "synthesize"``: the model step with answer ``claims``."""

    question: str = Field(default="", description="the question the findings answer (default: "
                          "the unit's title)")
    prompt: str = Field(default="synthesize", description="the prompt template "
                        "(prompts/<name>.md in the pack, else the packaged one)")


class _Ranked(_Params):
    """What a step that ranks things (a rank unit, a model step answering risks) declares."""

    ranks: str = Field(default="risks", description="what is ranked: risks (scored likelihood "
                       "x impact), or options, vendors, price points ... (scored on the "
                       "criteria); the documents' table is a table of these")
    criteria: list[str] = Field(default_factory=list, description="the criteria each ranked "
                                "item is given a value for (the table's columns); a ranking "
                                "of anything but risks also gives 1-5 points per criterion, "
                                "and code computes the score from them (their sum): the model "
                                "never states a total")
    weights: dict[str, int] = Field(default_factory=dict, description="options (not risks): an "
                                    "integer weight per criterion ({ \"hull price\" = 2 }; 1 "
                                    "for a criterion not named): the score is the sum of weight "
                                    "x points")
    ask: list[Literal["likelihood", "impact", "rationale", "owner", "mitigation"]] = Field(
        default_factory=list, description="further fields each ranked item must carry")


class RankParams(_Ranked):
    """``kind = "rank"``: the bounded loop generate -> check -> revise, answer ``risks``."""

    question: str = Field(default="", description="the question the ranking answers")
    prompt: str = Field(default="rank", description="the prompt of the generate step")
    check_prompt: str = Field(default="check", description="the prompt of the claim check")


class ModelParams(_Ranked):
    """``kind = "model"``: a general model step — any prompt template, one of the answer
    schemas, the schema's rules as validators."""

    prompt: str = Field(description="the prompt template: prompts/<name>.md in the pack (or a "
                        "packaged one); it must show the INPUT block ({{ input }})")
    answer: Literal["claims", "risks"] = Field(
        default="claims", description="the output schema: claims (findings citing evidence "
        "ids, written to synthesis.json/.md) or risks (a ranking, written to ranking.json/.md; "
        "with max_rounds it is a bounded loop with a claim check)")
    question: str = Field(default="", description="the question the answer addresses")
    check_prompt: str = Field(default="check", description="answer = risks: the prompt of the "
                              "claim check")


# --- document render ------------------------------------------------------------------------------
class FillSpec(_Params):
    """What one template placeholder is filled with: a named part drawn from the unit's
    dependencies (see ``PARTS``)."""

    part: str = Field(description="the part's name (docs/plan-format.md lists them)")
    from_: list[str] = Field(default_factory=list, alias="from", description="draw only from "
                             "these dependencies (unit ids); default: every dependency")
    n: int | None = Field(default=None, ge=1, description="how many items (top_risks, "
                          "evidence); default: the part's own")
    topic: list[str] = Field(default_factory=list, description="evidence parts: only "
                             "statements filed under these topics")
    data: str | None = Field(default=None, description="rule-based parts (recommendation): "
                             "the pack data file holding the rules, declared as a data:<name> "
                             "input")
    of: list[Literal["findings", "rankings", "conflicts", "gaps", "evidence"]] = Field(
        default_factory=list, description="part = section: what the written section is made "
        "of (drawn from the from units); a language model writes it for the audience from "
        "these inputs only, the offline heuristic composes it by rule")
    words: int | None = Field(default=None, ge=10, description="part = section: the section's "
                              "word budget; the writer is asked for it and a section more "
                              "than a quarter over it is sent back (the offline heuristic's "
                              "rule-based section is not cut)")
    repeat: bool = Field(default=False, description="may repeat findings or ranked items an "
                         "earlier placeholder of the document already shows (default: each "
                         "appears once)")


class RowsSpec(_Params):
    """Which verified statements a CSV table document lists."""

    cited_by: list[str] = Field(default_factory=list, description="only statements these "
                                "dependencies (syntheses, rankings) cite")
    topic: list[str] = Field(default_factory=list, description="only statements filed under "
                             "these topics")


class RenderParams(_Params):
    """``kind = "render"``: any template into any named document; no model unless ``prose``
    names a placeholder a language model writes."""

    document: str = Field(description="the document's name, unique in the plan; audits and "
                          "deliveries name documents by it")
    template: str = Field(description="templates/<name>.md, declared as a template:<name> "
                          "input; Jinja2 placeholders ({{ name }}), sections marked "
                          "<!-- section: id -->")
    output: str | None = Field(default=None, description="the file written (default: the "
                               "unit's single declared output, else <document>.md or .csv)")
    format: Literal["markdown", "csv"] | None = Field(
        default=None, description="markdown fills the template; csv writes a table of "
        "verified statements whose columns are the template's list items (default: csv when "
        "the output ends in .csv)")
    fill: dict[str, str | FillSpec] = Field(
        default_factory=dict, description="placeholder -> the part that fills it (a part name, "
        "or a table with part/from/n/topic/data): the template's own names mapped onto "
        "keepstep's parts")
    prose: str | None = Field(default=None, description="a placeholder that a language model "
                              "writes (the render prompt) when the unit's model is not the "
                              "offline heuristic; the rule-based part is kept offline")
    rows: RowsSpec | None = Field(default=None, description="format = csv: which statements "
                                  "the table lists (default: every verified statement)")


# --- audit ------------------------------------------------------------------------------
class _Check(_Params):
    name: str | None = Field(default=None, description="the check's name in audit.json "
                             "(default: <check>:<document>)")


class PresentCheck(_Check):
    """Every named document was rendered by a dependency and is not empty."""

    check: Literal["present"] = Field(description="present")
    documents: list[str] = Field(description="document names")


class SectionsCheck(_Check):
    """The document holds every section of its template (``<!-- section: id -->`` markers),
    in order, and the ``required`` ones."""

    check: Literal["sections"] = Field(description="sections")
    document: str = Field(description="the document checked")
    template: str | None = Field(default=None, description="compare with this template's "
                                 "sections (declare it as a template:<name> input, edges = "
                                 "[\"template\"])")
    required: list[str] = Field(default_factory=list, description="section ids that must be "
                                "there whatever the template says")


class CitedIdsCheck(_Check):
    """Every evidence id the documents cite exists in ``against``."""

    check: Literal["cited_ids"] = Field(description="cited_ids")
    documents: list[str] = Field(description="documents whose citations are checked")
    against: str = Field(default="evidence", description="evidence (the verified evidence of "
                         "the audit's dependencies) or a CSV table document with an id column")
    require: bool = Field(default=True, description="each document must cite at least one id")


class CitedSourcesCheck(_Check):
    """Every source the documents cite (``(sources: …)``, a table's source_id column) is in
    the source inventory of an intake dependency."""

    check: Literal["cited_sources"] = Field(description="cited_sources")
    documents: list[str] = Field(description="documents whose cited sources are checked")


class ListsSourcesCheck(_Check):
    """The document lists every source of a table document (a ``| S |`` table cell)."""

    check: Literal["lists_sources"] = Field(description="lists_sources")
    document: str = Field(description="the document that must list them")
    of: str = Field(description="the CSV table document whose source_id column is listed")


class FiguresCheck(_Check):
    """Every figure stated in the document (or one section of it) occurs in ``against``."""

    check: Literal["figures"] = Field(description="figures")
    document: str = Field(description="the document whose figures are checked")
    section: str | None = Field(default=None, description="only this section (its marker id)")
    against: str = Field(default="evidence", description="evidence (each line's figures in the "
                         "quotes it cites) or another document (its text)")


class CitesGroupsCheck(_Check):
    """A section cites at least ``min_sources`` sources from at least ``min_groups`` groups."""

    check: Literal["cites_groups"] = Field(description="cites_groups")
    document: str = Field(description="the document")
    section: str | None = Field(default=None, description="the section (default: the whole "
                                "document)")
    min_sources: int = Field(default=2, ge=1, description="distinct sources cited at least")
    min_groups: int = Field(default=2, ge=1, description="distinct source groups at least")


class ConflictsCheck(_Check):
    """The documents are honest about disagreements between sources: none says none were
    found when some were, none states a value of an unexplained disagreement as fact (a
    line citing it without saying it is disputed), and none offers the sides of a settled
    one as open ("confirm which applies") instead of saying which holds. Reads the
    disagreements of the audit's dependencies that write synthesis.json, ranking.json or
    verified.json."""

    check: Literal["conflicts"] = Field(description="conflicts")
    documents: list[str] = Field(description="the documents checked")
    settled: bool = Field(default=True, description="also fail a line that offers the sides "
                          "of a settled (superseded or out-of-date) disagreement as open "
                          "alternatives without saying which holds")


AuditCheck = Annotated[
    PresentCheck | SectionsCheck | CitedIdsCheck | CitedSourcesCheck | ListsSourcesCheck
    | FiguresCheck | CitesGroupsCheck | ConflictsCheck, Field(discriminator="check")]
CHECK_KINDS = ("present", "sections", "cited_ids", "cited_sources", "lists_sources", "figures",
               "cites_groups", "conflicts")


class AuditParams(_Params):
    """``kind = "audit"``: declarative checks over the documents its dependencies rendered;
    it commits its verdict (audit.json) even when a check fails, and a failed verdict holds
    every deliver unit downstream."""

    checks: list[AuditCheck] = Field(
        default_factory=list, description="the checks, in order; none given: every document "
        "of the dependencies present, and every evidence id a Markdown document cites in the "
        "dependencies' verified evidence")


# --- deliver ------------------------------------------------------------------------------
class DeliverParams(_Params):
    """``kind = "deliver"``: hand committed files to an external system, each set of bytes at
    most once per destination."""

    adapter: str = Field(description="an [adapters.NAME] table of keepstep.toml")
    files: list[str] = Field(min_length=1, description="\"<unit>:<output name>\" of units in "
                             "depends_on, e.g. [\"D01:memo.md\"]")


# The parts a render template's placeholders are filled with (kinds.parts makes them;
# docs/plan-format.md lists them from here).
PARTS: dict[str, str] = {
    "title": "the contract's title (from a contract intake dependency)",
    "client": "the contract's client",
    "goal": "the contract's goal",
    "scope": "the contract's scope",
    "audience": "the audience the syntheses and rankings were written for",
    "notice": "a line naming the model that produced the findings (the offline heuristic "
              "says so)",
    "executive_summary": "the lead finding of each synthesis and the top risk, as a list",
    "findings": "every synthesis: its title and numbered findings (then its gaps as a list, "
                "unless the template has a gaps section)",
    "supporting_findings": "the lead finding of each synthesis, as a list",
    "risks": "the ranking as a table (rank 1, 2, ..., what it ranks, its criteria, score, "
             "evidence) with a line saying the score's scale and how it is formed",
    "top_risks": "the n highest-scoring risks (n = 3 unless given)",
    "recommendation": "a recommendation chosen by the pack's rule on the top risk's score "
                      "(data file, see Pack data files)",
    "questions": "the research questions framed by a questions intake dependency",
    "inventory": "the source inventory as a table (header lines for a header-only inventory)",
    "verification": "per verification unit: statements checked, supported and rejected",
    "schema_fields": "the evidence schema's required and optional fields",
    "evidence_table_columns": "the columns of a CSV table dependency, each described",
    "evidence": "the verified statements as a table (filter with topic, n)",
    "conflicts": "every disagreement between sources the verification units found — over a "
                 "figure or over advice: each side's value (or advice, quoted) and evidence, "
                 "its class and the value (or advice) the documents use",
    "gaps": "what the syntheses say the sources do not answer",
    "sources": "the sources the document rests on as a table: id, title, kind, date, "
               "publisher, and whether each came from the source register (sources.toml) or "
               "the document itself",
    "section": "a section written from what fill's `of` names (findings, rankings, "
               "conflicts, gaps, evidence) of the `from` units: by the model, checked claim "
               "by claim, or by rule offline",
    "audit": "the verdict of an audit dependency and each of its checks",
    "unconverged": "the loops that went forward unconverged, with their open problems",
}
# What each column of a CSV table document holds.
TABLE_COLUMNS = {
    "id": "evidence id: <source id>-e<n>",
    "source_id": "the approved source the quote comes from",
    "group": "the source group",
    "topic": "the topic the statement was filed under",
    "figures": "the figures in the quote, separated by '; '",
    "quote": "the statement, verbatim from the source",
    "locator": "where in the source the statement is (a page, a sheet, a table), when known",
    "models": "the models that answered for the statement (from the units' call records)",
    "stated_before": "for a figure whose period had not ended at its source's date: "
                     "'stated <the source's date>' (added whenever one has)",
}

# --- the presets ------------------------------------------------------------------------------
class Preset(BaseModel):
    """One built-in kind: the mechanism it sets up and how."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    kind: str
    mechanism: Mechanism
    summary: str
    params: type[BaseModel] | None
    outputs: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    evidence: str | None = None  # the output holding an "evidence" list
    verified: str | None = None  # the output holding verified evidence


PRESETS: dict[str, Preset] = {p.kind: p for p in (
    Preset(kind="intake", mechanism="bookkeeping", params=IntakeParams,
           summary="inventory, contract, questions or the evidence schema (params.step)"),
    Preset(kind="extract", mechanism="model step", params=None, prompts=("extract",),
           data=(TOPICS,), outputs=("evidence.json",), evidence="evidence.json",
           summary="candidate evidence from each approved source the unit names"),
    Preset(kind="verify", mechanism="model step", params=VerifyParams, prompts=("verify",),
           outputs=("verified.json",), verified="verified.json",
           summary="rule checks then a claim check of the evidence-producing dependencies"),
    Preset(kind="synthesize", mechanism="model step", params=SynthesizeParams,
           prompts=("synthesize",), data=(TOPICS, AUDIENCES),
           outputs=("synthesis.json", "synthesis.md"),
           summary="findings over the verified evidence of the dependencies (answer claims)"),
    Preset(kind="rank", mechanism="model step", params=RankParams, prompts=("rank", "check"),
           data=(RISKS, AUDIENCES), outputs=("ranking.json", "ranking.md"),
           summary="a bounded loop: rank risks, check their claims, revise (answer risks)"),
    Preset(kind="model", mechanism="model step", params=ModelParams,
           data=(TOPICS, AUDIENCES, RISKS),
           summary="any prompt template with one of the answer schemas (claims, risks)"),
    Preset(kind="render", mechanism="document render", params=RenderParams,
           summary="any template into any named document, placeholders filled from parts"),
    Preset(kind="audit", mechanism="audit", params=AuditParams, outputs=("audit.json",),
           summary="declarative checks over named documents; the verdict gates deliveries"),
    Preset(kind="notes", mechanism="bookkeeping", params=NotesParams,
           outputs=("change-notes.md",),
           summary="change notes written from the run's decision events"),
    Preset(kind="deliver", mechanism="deliver", params=DeliverParams,
           outputs=("delivery.json",),
           summary="committed files to a configured adapter, once per destination and bytes"),
)}

INTAKE_OUTPUTS = {"inventory": "inventory.json", "contract": "contract.json",
                  "questions": "questions.json", "schema": "evidence-schema.json"}
ANSWER_OUTPUTS = {"claims": ("synthesis.json", "synthesis.md"),
                  "risks": ("ranking.json", "ranking.md")}


def params_model(kind: str) -> type[BaseModel] | None:
    preset = PRESETS.get(kind)
    return preset.params if preset else None


def parse_params(kind: str, params: dict[str, Any]) -> Any:
    """The unit's params as its preset's model (raises pydantic's ValidationError); None for
    a kind whose params are not modelled here."""
    model = params_model(kind)
    return None if model is None else model.model_validate(params)


def _params(unit: Any) -> dict[str, Any]:
    return dict(getattr(unit, "params", {}) or {})


def answer_of(unit: Any) -> str:
    """``claims`` or ``risks``: what a model-step unit answers."""
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    if kind == "rank":
        return "risks"
    if kind == "model":
        return str(_params(unit).get("answer", "claims"))
    return "claims"


def document_output(unit: Any) -> str:
    """The file a render unit writes (see ``RenderParams.output``)."""
    p = _params(unit)
    if p.get("output"):
        return str(p["output"])
    outputs = list(getattr(unit, "outputs", []) or [])
    if len(outputs) == 1:
        return outputs[0]
    ext = ".csv" if p.get("format") == "csv" else ".md"
    return f"{p.get('document', unit.id)}{ext}"


def document_format(unit: Any) -> str:
    p = _params(unit)
    if p.get("format"):
        return str(p["format"])
    return "csv" if document_output(unit).endswith(".csv") else "markdown"


def default_outputs(unit: Any) -> list[str]:
    """The artifact names a unit of this kind and these params writes (sorted)."""
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    p = _params(unit)
    if kind == "intake":
        name = INTAKE_OUTPUTS.get(str(p.get("step", "")))
        return [name] if name else []
    if kind == "render":
        return [document_output(unit)]
    if kind in ("model", "synthesize", "rank"):
        return sorted(ANSWER_OUTPUTS[answer_of(unit)] if answer_of(unit) in ANSWER_OUTPUTS
                      else ())
    preset = PRESETS.get(kind)
    return sorted(preset.outputs) if preset else []


def prompt_names(unit: Any) -> tuple[str, ...]:
    """The prompts a unit's model steps use, ``revise`` (every step's feedback) last; empty for
    a unit that calls no model."""
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    p = _params(unit)
    if kind == "render":
        names: tuple[str, ...] = ("render",) if p.get("prose") else ()
    elif kind == "synthesize":
        names = (str(p.get("prompt") or "synthesize"),)
    elif kind == "rank":
        names = (str(p.get("prompt") or "rank"), str(p.get("check_prompt") or "check"))
    elif kind == "model":
        names = (str(p.get("prompt") or ""),)
        if answer_of(unit) == "risks" and getattr(unit, "max_rounds", None):
            names += (str(p.get("check_prompt") or "check"),)
        names = tuple(n for n in names if n)
    else:
        preset = PRESETS.get(kind)
        names = preset.prompts if preset else ()
    return (*names, REVISE_PROMPT) if names else ()


def data_names(unit: Any) -> tuple[str, ...]:
    """The pack data files a unit reads through its kind (``data/<name>.toml``)."""
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    if kind == "model":
        return (TOPICS, AUDIENCES) if answer_of(unit) == "claims" else (RISKS, AUDIENCES)
    preset = PRESETS.get(kind)
    return preset.data if preset else ()


def implicit_refs(unit: Any) -> list[str]:
    """``prompt:<name>`` and ``data:<name>`` inputs read through the kind, in order."""
    return [*(f"prompt:{n}" for n in prompt_names(unit)), *(f"data:{n}" for n in data_names(unit))]


def evidence_output(unit: Any) -> str | None:
    """The output holding an ``evidence`` list, when the unit produces evidence."""
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    preset = PRESETS.get(kind)
    if preset and preset.evidence:
        return preset.evidence
    return "evidence.json" if "evidence.json" in (getattr(unit, "outputs", []) or []) else None


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def evidence_sources(unit: Any, units: Mapping[str, Any]) -> list[Any]:
    """The evidence-producing units a unit reaches through its dependencies: each direct
    dependency that produces evidence, else the first evidence producers on every path
    through it (a verify unit over two verify units reaches their extract units), in id
    order without repeats."""
    found: dict[str, Any] = {}
    seen: set[str] = set()
    stack = [d.unit for d in getattr(unit, "depends_on", [])]
    while stack:
        uid = stack.pop()
        if uid in seen or uid not in units:
            continue
        seen.add(uid)
        dep = units[uid]
        if evidence_output(dep):
            found[uid] = dep
        else:
            stack.extend(d.unit for d in dep.depends_on)
    return [found[k] for k in sorted(found, key=_natural)]


def verified_output(unit: Any) -> str | None:
    kind = unit.kind.value if hasattr(unit.kind, "value") else str(unit.kind)
    preset = PRESETS.get(kind)
    if preset and preset.verified:
        return preset.verified
    return "verified.json" if "verified.json" in (getattr(unit, "outputs", []) or []) else None


__all__ = ["ANSWERS", "CHECK_KINDS", "PARTS", "PRESETS", "TABLE_COLUMNS", "AuditCheck",
           "AuditParams", "CitedIdsCheck", "CitedSourcesCheck", "CitesGroupsCheck",
           "ConflictsCheck",
           "DeliverParams", "FiguresCheck", "FillSpec",
           "IntakeParams", "ListsSourcesCheck", "ModelParams", "NotesParams", "Preset",
           "PresentCheck", "RankParams", "RenderParams", "RowsSpec", "SectionsCheck",
           "SynthesizeParams", "VerifyParams", "answer_of", "data_names", "default_outputs",
           "document_format", "document_output", "evidence_output", "implicit_refs",
           "params_model", "parse_params", "prompt_names", "verified_output"]
