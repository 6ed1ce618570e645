"""Jinja2 for templates and prompts that come with a project: sandboxed and bounded.

A project's ``templates/*.md`` and ``prompts/*.md`` are untrusted input (a pack received from a
colleague). A plain ``jinja2.Environment`` lets a template reach Python itself —
``{{ cycler.__init__.__globals__.os.popen('id').read() }}`` runs a command — so every
template keepstep renders goes through ``ImmutableSandboxedEnvironment`` (no private
attributes, no mutation of values), with ``*`` and ``**`` bounded so ``{{ 'x' * 10**10 }}``
is refused instead of allocating gigabytes, and ``render_bounded`` stops an output past
``MAX_OUTPUT_CHARS``. Every refusal is a ``TemplateRefused`` naming the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from keepstep.engine.errors import ProjectError

MAX_OUTPUT_CHARS = 16 * 1024 * 1024  # a rendered document or prompt
MAX_REPEAT = 1_000_000  # the length of a string or list made by ``*``
MAX_EXPONENT = 256


class TemplateRefused(ProjectError):
    """A template tried something the sandbox does not allow, or grew past the bounds."""


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with ``*`` and ``**`` checked before they run."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"the exponent {right} is over the limit of {MAX_EXPONENT}")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and \
                        len(seq) * n > MAX_REPEAT:
                    raise SecurityError(f"repeating a value {n} times makes more than "
                                        f"{MAX_REPEAT} items")
        return super().call_binop(context, operator, left, right)


def template_env(**options: Any) -> jinja2.Environment:
    """A bounded sandbox with ``options`` (``undefined``, ``keep_trailing_newline``...)."""
    options.setdefault("autoescape", False)
    return BoundedSandbox(**options)


def render_bounded(template: jinja2.Template, values: Mapping[str, Any], *,
                   what: str) -> str:
    """``template`` rendered with ``values``; TemplateRefused naming ``what`` when the
    sandbox refuses an operation or the output passes MAX_OUTPUT_CHARS."""
    parts: list[str] = []
    size = 0
    try:
        for chunk in template.generate(**values):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise TemplateRefused(
                    f"{what} renders to more than {MAX_OUTPUT_CHARS:,} characters; refused",
                    hint="a template that grows without bound is likely hostile; check it")
            parts.append(chunk)
    except SecurityError as exc:
        raise TemplateRefused(f"{what} tried something templates may not do ({exc}); refused",
                              hint="templates fill placeholders; they may not reach Python "
                              "objects or build huge values — check where the template "
                              "came from") from None
    return "".join(parts)


__all__ = ["MAX_OUTPUT_CHARS", "BoundedSandbox", "TemplateRefused", "render_bounded",
           "template_env"]
