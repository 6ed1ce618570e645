"""Document templates as text: their placeholders, their sections, and what kind of change an
edit is.

A template is Jinja2 text (``{{ name }}`` placeholders; loops and filters work too) whose
sections are marked by ``<!-- section: id -->`` lines. Its *layout* is the ordered list of
sections, each with the placeholders it uses (placeholders before the first marker belong to
a leading unnamed section): an edit that changes the layout — a section or placeholder added,
removed or moved — is a ``template`` change, and so is any change of the fixed text's
*substance* (``fixed_text``: a sentence, a figure, a link or a word added or removed outside the
headings). Only heading wording, whitespace, emphasis and list/table formatting are
``presentation``.

Pure: text in, values out. Callers may rely on ``layout_hash`` being equal for two texts
exactly when their layouts are equal.
"""

from __future__ import annotations

import re
from functools import lru_cache

from pydantic import BaseModel, Field

from keepstep.engine.core.hashing import canonical_json, sha256_hex

SECTION_RE = re.compile(r"^[ \t]*<!--\s*section:\s*([A-Za-z0-9_.-]+)\s*-->[ \t]*$", re.MULTILINE)


class TemplateSection(BaseModel):
    """One section of a template: its marker id ("" before the first marker) and the
    placeholders it uses, in order of first use."""

    id: str = Field(description="the section's marker id")
    placeholders: list[str] = Field(default_factory=list,
                                    description="the placeholders it uses, in order")


class TemplateLayout(BaseModel):
    """A template's sections and placeholders (what a ``template`` change changes)."""

    sections: list[TemplateSection] = Field(default_factory=list,
                                            description="sections in order")
    fixed_text: str = Field(default="", description="the template's fixed text outside the "
                            "headings, with whitespace, emphasis and list/table formatting "
                            "taken out (``fixed_text``): what a presentation edit keeps")
    headings: list[str] = Field(default_factory=list, description="the Markdown headings' "
                                "text in order (their wording is presentation)")
    error: str = Field(default="", description="why the text is not a valid Jinja2 template")

    @property
    def section_ids(self) -> list[str]:
        return [s.id for s in self.sections if s.id]

    @property
    def placeholders(self) -> list[str]:
        return list(dict.fromkeys(p for s in self.sections for p in s.placeholders))


def _env():  # noqa: ANN202 - jinja2 is imported lazily
    import jinja2

    return jinja2.Environment(keep_trailing_newline=True, autoescape=False)


@lru_cache(maxsize=256)
def _names(text: str) -> tuple[tuple[str, ...], str]:
    """The undeclared variables of ``text`` in order of first use, and a syntax error."""
    import jinja2
    from jinja2 import meta, nodes

    try:
        tree = _env().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return (), f"line {exc.lineno}: {exc.message}"
    undeclared = meta.find_undeclared_variables(tree)
    ordered = [n.name for n in tree.find_all(nodes.Name)
               if n.ctx == "load" and n.name in undeclared]
    return tuple(dict.fromkeys(ordered)), ""


def placeholders(text: str) -> list[str]:
    """The names a template reads (Jinja2's undeclared variables), in order of first use."""
    return list(_names(text)[0])


def syntax_error(text: str) -> str:
    """Why the text is not a valid Jinja2 template ("" when it is)."""
    return _names(text)[1]


def layout(text: str) -> TemplateLayout:
    """The sections of ``text`` with the placeholders each uses."""
    error = syntax_error(text)
    cuts = [(m.start(), m.group(1)) for m in SECTION_RE.finditer(text)]
    spans = [(0, "")] + cuts
    sections = []
    for n, (start, sid) in enumerate(spans):
        end = spans[n + 1][0] if n + 1 < len(spans) else len(text)
        part = text[start:end]
        # A section's text may not parse on its own (a loop crossing a marker): then the
        # placeholders are taken from a regex of the plain {{ name }} form.
        names, bad = _names(part)
        if bad:
            names = tuple(dict.fromkeys(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)", part)))
        if sid or names:
            sections.append(TemplateSection(id=sid, placeholders=list(names)))
    return TemplateLayout(sections=sections, fixed_text=fixed_text(text),
                          headings=headings(text), error=error)


_HEADING_RE = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)[ \t#]*$")
_SETEXT_RE = re.compile(r"^[ \t]{0,3}(=+|-+)[ \t]*$")
_TABLE_RULE_RE = re.compile(r"^[ \t]*\|?[ \t]*:?-{2,}:?[ \t]*(\|[ \t]*:?-{2,}:?[ \t]*)*\|?[ \t]*$")
_LIST_MARK_RE = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+")
_QUOTE_MARK_RE = re.compile(r"^[ \t]*>[ \t]?")
_RULE_RE = re.compile(r"^[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$")
_PLACEHOLDER_RE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.DOTALL)
# What a heading may not gain or lose in a presentation edit: figures, links, placeholders.
_HEADING_FACTS_RE = re.compile(r"\{\{.*?\}\}|https?://\S+|\]\([^)]*\)|\d[\d.,]*")
# Emphasis and inline-code marks: *, _, ~ and ` runs at a word's edge (snake_case survives).
_EMPHASIS_RE = re.compile(r"(?<![\w])[*_~`]+|[*_~`]+(?![\w])")


def headings(text: str) -> list[str]:
    """The ATX (``## Findings``) headings' text, in order."""
    out = []
    for line in text.splitlines():
        m = _HEADING_RE.match(line)
        if m:
            out.append(m.group(1).strip())
    return out


def fixed_text(text: str) -> str:
    """The substance of a template's (or a rendered document's) fixed text: every line but
    headings (of which only figures, links and placeholders count), section markers,
    horizontal rules and table rule rows, with list/quote markers, table pipes, emphasis and
    whitespace taken out, joined with single spaces. Two templates whose edit is only heading
    wording, whitespace, emphasis or list/table formatting give the same string; a sentence,
    figure, link, placeholder or word added or removed changes it."""
    kept: list[str] = []
    lines = text.splitlines()
    for n, line in enumerate(lines):
        heading = _HEADING_RE.match(line)
        if heading:
            # A heading's wording is presentation, but not a figure, link or placeholder in it.
            facts = _HEADING_FACTS_RE.findall(heading.group(1))
            if facts:
                kept.append("#[" + " ".join(re.sub(r"\s+", "", f) for f in facts) + "]")
            continue
        if SECTION_RE.match(line) or _TABLE_RULE_RE.match(line):
            continue
        if _RULE_RE.match(line) or _SETEXT_RE.match(line):
            continue
        if n + 1 < len(lines) and _SETEXT_RE.match(lines[n + 1]) and line.strip() \
                and not _RULE_RE.match(lines[n + 1]):
            continue  # a setext heading's text (``Findings`` over ``====``)
        line = _QUOTE_MARK_RE.sub("", line)
        line = _LIST_MARK_RE.sub("", line)
        line = _PLACEHOLDER_RE.sub(lambda m: "{{" + re.sub(r"\s+", "", m.group(1)) + "}}", line)
        line = line.replace("|", " ")
        line = _EMPHASIS_RE.sub("", line)
        kept.append(line)
    return " ".join(" ".join(kept).split())


def layout_hash(text: str) -> str:
    """Equal for two texts exactly when their sections, placeholders and fixed text's
    substance are equal (headings' wording is left out: renaming one is presentation)."""
    return sha256_hex(canonical_json(layout(text).model_dump(
        mode="json", exclude={"error", "headings"})))


def section_ids(text: str) -> list[str]:
    """The section marker ids of a template or a rendered document, in order."""
    return SECTION_RE.findall(text)


_JINJA_RE = re.compile(r"\{\{|\{%|\{#")


def _anchors(template: str) -> dict[str, str]:
    """Each section's anchor: the first non-blank line after its marker, when that line is
    fixed text (no placeholder or tag), stripped. A document rendered from the template
    carries the anchor line as it is, so the section is found by it once the marker is gone."""
    out: dict[str, str] = {}
    lines = template.splitlines()
    for n, line in enumerate(lines):
        m = SECTION_RE.match(line)
        if not m:
            continue
        nxt = next((x.strip() for x in lines[n + 1:] if x.strip()), "")
        if nxt and not _JINJA_RE.search(nxt) and not SECTION_RE.match(nxt):
            out[m.group(1)] = nxt
    return out


def strip_sections(rendered: str, template: str) -> str:
    """A rendered document without the template's ``<!-- section: id -->`` markers (they are
    production artefacts, not for a reader). A marker is kept only when its section starts
    with no fixed line to be found by (``rendered_sections`` could not find it otherwise)."""
    anchored = _anchors(template)
    lines = rendered.splitlines(keepends=True)
    out: list[str] = []
    for line in lines:
        m = SECTION_RE.match(line.rstrip("\r\n"))
        if m and m.group(1) in anchored:
            continue
        out.append(line)
    return "".join(out)


def rendered_sections(text: str, template: str | None = None) -> dict[str, str]:
    """The sections of a rendered document by id, in order: by its markers where it kept
    them, else by each template section's anchor line (its heading), searched in order."""
    cuts = [(m.start(), m.end(), m.group(1)) for m in SECTION_RE.finditer(text)]
    if template:
        kept = {sid for _, _, sid in cuts}
        anchors = _anchors(template)
        pos = 0
        order = section_ids(template)
        for sid in order:
            if sid in kept or sid not in anchors:
                continue
            m = re.search(r"^[ \t]*" + re.escape(anchors[sid]) + r"[ \t]*$", text[pos:],
                          re.MULTILINE)
            if m:
                cuts.append((pos + m.start(), pos + m.start(), sid))
                pos += m.end()
        rank = {sid: n for n, sid in enumerate(order)}
        cuts.sort(key=lambda c: (c[0], rank.get(c[2], 0)))
    out: dict[str, str] = {}
    for n, (_start, end, sid) in enumerate(cuts):
        stop = cuts[n + 1][0] if n + 1 < len(cuts) else len(text)
        out.setdefault(sid, text[end:stop])
    return out


# A column of a table template: a list item such as "- source_id" or "- `quote`".
_COLUMN_ITEM_RE = re.compile(r"^\s*[-*+]\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*$", re.MULTILINE)


def table_columns(template: str) -> list[str]:
    """A table document's columns: the template's Markdown list items, in order."""
    return [m.group(1) for m in _COLUMN_ITEM_RE.finditer(template)]


__all__ = ["SECTION_RE", "TemplateLayout", "TemplateSection", "fixed_text", "headings",
           "layout", "layout_hash", "placeholders", "rendered_sections", "section_ids",
           "strip_sections", "syntax_error", "table_columns"]
