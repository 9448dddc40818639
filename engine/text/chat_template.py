"""Jinja2 rendering of HF chat templates, with the environment transformers uses.

Same sandbox and options (``trim_blocks``, ``lstrip_blocks``, loop controls), the same extras
(``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text, and a
``{% generation %}`` block that renders its body), and the special tokens in the context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """raise_exception() called by the template, or a template that does not parse."""


class _GenerationBlock(Extension):
    """``{% generation %} ... {% endgeneration %}``: renders the body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it an instance attribute)

    def parse(self, parser: Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse: {exc}") from exc


@lru_cache(maxsize=16)
def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads from its context (``tools``: it renders tool definitions
    itself, as Hugging Face templates with tool support do)."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(source)))
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse: {exc}") from exc


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def render_chat(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: dict[str, str | None],
    **extra: Any,
) -> str:
    template = compile_template(source)
    return template.render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        **special_tokens,
        **extra,
    )
