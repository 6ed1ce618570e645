"""Prompt templates: versioned, shipped with the package, overridable per project.

A prompt is a Markdown file with TOML front matter (``name``, ``version``, ``description``)
between ``+++`` lines, then a ``=== system ===`` and a ``=== user ===`` section rendered with
Jinja2 (undefined names are errors). ``<project>/prompts/<name>.md`` replaces the packaged
``engine/gateway/prompt_templates/<name>.md`` of the same name.

The user message carries the unit's inputs as ONE delimited block::

    INPUT
    ```json
    {...}
    ```

rendered by ``input_block`` (sorted keys, one value per line, so the block ends at the first
line that is exactly ```` ``` ````). A source text (the ``text`` input) is not sent as a JSON
string: it follows the INPUT block as a raw, delimited block, each paragraph opening with its
marker (``¶1``, ``¶2`` …; the markers are not part of the text, and cannot be read as a
source id such as ``P1``, an evidence id or a claim check's passage id)::

    SOURCE TEXT (raw; ...)
    <<<text END_OF_TEXT
    ¶1 # Title
    <BLANKLINE>
    ¶2 First paragraph ...
    END_OF_TEXT

The terminator never occurs in the text (a suffix is added when it would). Every model — the
offline heuristic included — reads the same blocks (``read_input_block`` returns the INPUT
object with each raw block's text, markers removed, under its key); there is no other
payload format.

Callers may rely on: ``Prompt.sha256`` being the hash of the file's bytes (what joins a
unit's fingerprint and what a prompt change compares); ``prompt_hashes`` listing every
prompt a project resolves, by name; rendering being deterministic.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from keepstep.engine.errors import ProjectError
from keepstep.engine.files.confine import project_file
from keepstep.storage.hashing import sha256_hex

PROJECT_PROMPTS_DIR = "prompts"
PACKAGE_DIR = "prompt_templates"
REVISE = "revise"
_SECTION_RE = re.compile(r"^=== (system|user) ===[ \t]*$", re.MULTILINE)
_INPUT_RE = re.compile(r"^INPUT[ \t]*\n```json[ \t]*\n(.*?)\n```[ \t]*$", re.DOTALL | re.MULTILINE)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


class Prompt(BaseModel):
    """One loaded template: where it came from, its version and hash, its two sections."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str
    description: str = ""
    origin: str  # "package" or the project file's path
    sha256: str
    system: str
    user: str

    @property
    def ref(self) -> str:
        """The unit input this prompt is: ``prompt:<name>``."""
        return f"prompt:{self.name}"


def _package_dir() -> Any:
    return files("keepstep.engine.gateway").joinpath(PACKAGE_DIR)


def packaged_names() -> list[str]:
    """The prompts shipped with keepstep, by name."""
    return sorted(p.name[:-3] for p in _package_dir().iterdir()
                  if p.name.endswith(".md") and not p.name.startswith("_"))


def _read(name: str, root: Path | None) -> tuple[bytes, str]:
    if not _NAME_RE.match(name):
        raise ProjectError(f"prompt name {name!r} is not valid",
                           hint="prompt names are lowercase words, e.g. extract or verify")
    if root is not None:
        own = project_file(root, PROJECT_PROMPTS_DIR, f"{name}.md", what="prompt")
        if own.is_file():
            return own.read_bytes(), str(own)
    shipped = _package_dir().joinpath(f"{name}.md")
    if not shipped.is_file():
        raise ProjectError(
            f"no prompt {name!r}: neither {PROJECT_PROMPTS_DIR}/{name}.md in the project nor a "
            "packaged one", hint=f"packaged prompts: {', '.join(packaged_names())}")
    return shipped.read_bytes(), "package"


def parse_prompt(name: str, blob: bytes, origin: str) -> Prompt:
    """Parse a template file; every problem names the file and what to do."""
    text = blob.decode("utf-8")
    where = origin if origin != "package" else f"packaged prompt {name}"
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "+++":
        raise ProjectError(f"{where}: no front matter",
                           hint='start it with "+++", name/version lines, then "+++"')
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "+++")
    except StopIteration:
        raise ProjectError(f"{where}: front matter is not closed",
                           hint='add a "+++" line after the fields') from None
    try:
        meta = tomllib.loads("".join(lines[1:end]))
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError(f"{where}: front matter is not valid TOML: {exc}") from None
    body = "".join(lines[end + 1:])
    parts = _SECTION_RE.split(body)
    sections = {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}
    if "user" not in sections:
        raise ProjectError(f"{where}: needs a '=== user ===' section (and usually a "
                           "'=== system ===' one)",
                           hint="see the packaged prompts (docs/config.md, Prompts)")
    if "version" not in meta:
        raise ProjectError(f"{where}: front matter needs a version",
                           hint='add e.g. version = "1" (bump it when you edit the prompt)')
    return Prompt(name=name, version=str(meta["version"]),
                  description=str(meta.get("description", "")), origin=origin,
                  sha256=sha256_hex(blob), system=sections.get("system", ""),
                  user=sections["user"])


def load_prompt(name: str, root: Path | None = None) -> Prompt:
    """The prompt ``name``: the project's ``prompts/<name>.md`` if present, else the packaged
    one. Raises ProjectError (with a hint) for an unknown name or a malformed file."""
    blob, origin = _read(name, root)
    return parse_prompt(name, blob, origin)


def prompt_hashes(root: Path | None = None) -> dict[str, str]:
    """``{"prompt:<name>": sha256}`` for every packaged prompt and every project prompt."""
    names = set(packaged_names())
    own = Path(root) / PROJECT_PROMPTS_DIR if root is not None else None
    if own is not None and own.is_dir():
        names |= {p.stem for p in own.glob("*.md") if _NAME_RE.match(p.stem)}
    out = {}
    for name in sorted(names):
        blob, _origin = _read(name, root)
        out[f"prompt:{name}"] = sha256_hex(blob)
    return out


# --- rendering -------------------------------------------------------------------------------

# Inputs sent as raw delimited blocks after INPUT rather than as JSON strings inside it.
RAW_KEYS = ("text",)
# A paragraph's marker: a pilcrow and its number, which no source, evidence or passage id
# can be read as (source ids such as P1, P2 are common).
PARAGRAPH_MARK = "\u00b6"
_RAW_HEADING = ("SOURCE TEXT (the source's raw text, between the two marker lines; each "
                f"paragraph opens with its marker {PARAGRAPH_MARK}1, {PARAGRAPH_MARK}2 ... "
                "which is NOT part of the text: never copy a marker into a quote)")
_RAW_RE = re.compile(r"^<<<([a-z_]+) (END_OF_[A-Z]+(?:_\d+)?)[ \t]*\n(.*?)\n\2[ \t]*$",
                     re.DOTALL | re.MULTILINE)
_PARA = "\n\n"


def input_block(inputs: Mapping[str, Any]) -> str:
    """The delimited INPUT block of a user message, then a raw block per ``RAW_KEYS`` input
    that is a string (see the module doc)."""
    raw = {k: v for k, v in inputs.items() if k in RAW_KEYS and isinstance(v, str)}
    body = indented_json({k: v for k, v in inputs.items() if k not in raw}, ascii=False)
    out = f"INPUT\n```json\n{body}\n```"
    for key, text in raw.items():
        out += f"\n\n{_RAW_HEADING}\n" + raw_block(key, text)
    return out


def raw_block(key: str, text: str) -> str:
    """``text`` between ``<<<key END_OF_…`` and its terminator line, paragraphs marked."""
    end = f"END_OF_{key.upper()}"
    n = 0
    while end in text:
        n += 1
        end = f"END_OF_{key.upper()}_{n}"
    return f"<<<{key} {end}\n{mark_paragraphs(text)}\n{end}"


def mark_paragraphs(text: str) -> str:
    """Each blank-line-separated paragraph of ``text`` opened with its marker ``¶<n> ``
    (after any leading newlines); ``unmark_paragraphs`` gives the text back exactly."""
    pieces, n = text.split(_PARA), 0
    for i, piece in enumerate(pieces):
        if piece.strip():
            n += 1
            lead = len(piece) - len(piece.lstrip("\n"))
            pieces[i] = f"{piece[:lead]}{PARAGRAPH_MARK}{n} {piece[lead:]}"
    return _PARA.join(pieces)


def unmark_paragraphs(text: str) -> str:
    pieces, n = text.split(_PARA), 0
    for i, piece in enumerate(pieces):
        if piece.strip():
            n += 1
            lead = len(piece) - len(piece.lstrip("\n"))
            marker = f"{PARAGRAPH_MARK}{n} "
            if piece[lead:].startswith(marker):
                pieces[i] = piece[:lead] + piece[lead + len(marker):]
    return _PARA.join(pieces)


class _NotPlainJson(Exception):
    pass


def indented_json(value: Any, *, ascii: bool = True) -> str:
    """``json.dumps(value, indent=1, sort_keys=True, ensure_ascii=ascii)``, the same text.

    With an indent the standard library encodes in Python, not C, and a prompt's INPUT (the
    pack's topics, evidence lists) is rendered for every call: this writes the same text
    about three times faster. Anything but plain JSON values goes to ``json.dumps``."""
    from json.encoder import encode_basestring, encode_basestring_ascii

    quote = encode_basestring_ascii if ascii else encode_basestring
    out: list[str] = []
    append = out.append

    def write(v: Any, pad: str) -> None:
        if isinstance(v, str):
            append(quote(v))
        elif v is None:
            append("null")
        elif v is True:
            append("true")
        elif v is False:
            append("false")
        elif type(v) is int:
            append(int.__repr__(v))
        elif type(v) is float and v == v and v not in (float("inf"), float("-inf")):
            append(float.__repr__(v))
        elif isinstance(v, dict):
            if not v:
                append("{}")
                return
            inner = pad + " "
            first = True
            for key in sorted(v):
                if not isinstance(key, str):
                    raise _NotPlainJson
                append(("{\n" if first else ",\n") + inner + quote(key) + ": ")
                first = False
                write(v[key], inner)
            append("\n" + pad + "}")
        elif isinstance(v, list | tuple):
            if not v:
                append("[]")
                return
            inner = pad + " "
            for i, item in enumerate(v):
                append(("[\n" if i == 0 else ",\n") + inner)
                write(item, inner)
            append("\n" + pad + "]")
        else:
            raise _NotPlainJson

    try:
        write(value, "")
    except (_NotPlainJson, RecursionError):
        return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=ascii)
    return "".join(out)


def read_input_block(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The INPUT object of the first user message that carries one, else None."""
    for message in messages:
        if message.get("role") != "user":
            continue
        found = _INPUT_RE.search(message_text(message.get("content")))
        if found is None:
            continue
        try:
            value = json.loads(found.group(1))
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        rest = message_text(message.get("content"))[found.end():]
        for raw in _RAW_RE.finditer(rest):
            value.setdefault(raw.group(1), unmark_paragraphs(raw.group(3)))
        return value
    return None


# A problem line of a revise round, as ``Problem.line()`` writes it: "claims[0].text [rule]: ...".
_PROBLEM_LINE_RE = re.compile(r"^- ([A-Za-z_][\w.\[\]]*) \[([\w:.-]+)\]: (.*)$", re.MULTILINE)


def read_revise_problems(messages: list[dict[str, Any]]) -> list[list[dict[str, str]]]:
    """The problems each revise round named, in order (``field``, ``rule``, ``message``):
    every user message after an assistant's answer; empty for a first round. What a model
    reads as feedback, a rule-based answerer reads the same way."""
    rounds = []
    answered = False
    for message in messages:
        if message.get("role") == "assistant":
            answered = True
        elif message.get("role") == "user" and answered:
            rounds.append([{"field": m.group(1), "rule": m.group(2), "message": m.group(3)}
                           for m in _PROBLEM_LINE_RE.finditer(
                               message_text(message.get("content")))])
    return rounds


def message_text(content: Any) -> str:
    """The text of a chat message's content (OpenAI-style content may be a list of parts)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


@functools.lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    from keepstep.engine.files.sandbox import template_env  # a project's prompt is untrusted

    return template_env(undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                        trim_blocks=True, lstrip_blocks=True)


@functools.lru_cache(maxsize=128)
def _compiled(source: str) -> Any:
    # Compiling a template costs far more than rendering it, and every model call renders
    # one: a prompt's text is compiled once per process (an edited prompt is new text).
    return _env().from_string(source)


def _render(prompt: Prompt, section: str, values: Mapping[str, Any]) -> str:
    import jinja2

    from keepstep.engine.files.sandbox import render_bounded

    try:
        return render_bounded(_compiled(getattr(prompt, section)), values,
                              what=f"{prompt.origin}: the {section} section").strip() + "\n"
    except jinja2.TemplateError as exc:
        where = prompt.origin if prompt.origin != "package" else f"packaged prompt {prompt.name}"
        raise ProjectError(f"{where}: the {section} section does not render: {exc}",
                           hint="the names a prompt may use are listed in docs/config.md "
                           "(Prompts)") from None


def render_messages(prompt: Prompt, *, inputs: Mapping[str, Any], contract: Mapping[str, str],
                    unit: Mapping[str, str], schema: dict[str, Any] | None) -> list[dict[str, str]]:
    """``[system, user]`` for one call. ``schema`` (the answer's JSON Schema) is written into
    the user message only when given — for providers without structured output."""
    values = {
        "contract": dict(contract), "unit": dict(unit), "input": input_block(inputs),
        "schema": indented_json(schema) if schema else "",
    }
    return [{"role": "system", "content": _render(prompt, "system", values)},
            {"role": "user", "content": _render(prompt, "user", values)}]


def revise_messages(revise: Prompt, messages: list[dict[str, str]], answer: str,
                    problems: list[str]) -> list[dict[str, str]]:
    """The next round's messages: the earlier ones, the rejected answer, then the feedback
    naming each problem (rendered from the ``revise`` prompt)."""
    values = {"problems": list(problems), "count": len(problems)}
    feedback = _render(revise, "user", values)
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": feedback}]


__all__ = ["PARAGRAPH_MARK", "PROJECT_PROMPTS_DIR", "RAW_KEYS", "Prompt", "input_block",
           "mark_paragraphs", "raw_block", "unmark_paragraphs", "load_prompt", "message_text",
           "packaged_names", "parse_prompt", "prompt_hashes", "read_input_block",
           "read_revise_problems",
           "render_messages", "revise_messages"]
