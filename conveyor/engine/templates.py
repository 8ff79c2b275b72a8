"""Node inputs may refer to the workflow input and to predecessors' outputs.

Templates are Jinja2 in its immutable sandbox: attribute and item access, arithmetic, filters,
comparisons — never Python's ``eval``. A string that is exactly one ``{{ expression }}`` yields
the expression's native value (a number stays a number, a dict a dict); any other string with
``{{ }}`` renders to text. The names in scope are ``input`` (the execution's input), ``nodes``
(``nodes.<id>`` is that predecessor's output) and ``execution`` (``execution.id``, and
``execution.scheduled_for``: the slot of a run a schedule started, or the start time of one
triggered to start later).

Every render runs under a budget of operations, time and size (:mod:`conveyor.engine.sandbox`);
going over it is a :class:`TemplateBudgetExceeded` naming the budget and the template.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import Template, Undefined, meta, nodes
from jinja2.environment import TemplateExpression
from jinja2.exceptions import SecurityError
from jinja2.exceptions import TemplateError as JinjaTemplateError

from conveyor.engine import sandbox, template_budget
from conveyor.exceptions import TemplateBudgetExceeded, TemplateError

_ENV = sandbox.BudgetedEnvironment()
# The longest template: compiling one takes time in proportion to its ``{{ }}``, outside any
# budget, in the process that renders it first (docs/benchmarks.md).
MAX_TEMPLATE_CHARS = 65_536
# What fails the same way every time it renders: reported as the template's error.
_FAILURES = (
    JinjaTemplateError,
    SecurityError,
    TypeError,
    ValueError,
    ArithmeticError,
    LookupError,
)
# What a template that asked for too much ends with: reported as over its budget.
_OVER = (template_budget.Blown, RecursionError, MemoryError)
_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.DOTALL)


def is_template(value: str) -> bool:
    return "{{" in value or "{%" in value


def render_value(
    value: Any, context: Mapping[str, Any], *, deadline: template_budget.Deadline | None = None
) -> Any:
    """Render every template string inside ``value`` (recursively through lists and dicts),
    all of them within one budget; ``deadline`` (monotonic time, and what it is) stops the
    render sooner than the budget's time would."""
    if isinstance(value, str):
        if not is_template(value):
            return value
    elif not value or not isinstance(value, list | dict):
        return value  # nothing to render: no meter
    return template_budget.within(deadline, _render, value, context)


def _render(value: Any, context: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _render_string(value, context)
    if isinstance(value, list):
        return [_render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, context) for k, v in value.items()}
    return value


def evaluate(
    expression: str, context: Mapping[str, Any], *, deadline: template_budget.Deadline | None = None
) -> Any:
    """Evaluate one sandboxed expression (as used by condition nodes), within a budget."""
    return template_budget.within(deadline, _evaluate, expression, context)


def _evaluate(expression: str, context: Mapping[str, Any]) -> Any:
    _check_length("expression", expression)
    try:
        value = _expression(expression)(**context)
        if isinstance(value, Undefined):
            value._fail_with_undefined_error()  # an unknown name, or an attribute the sandbox hides
    except _FAILURES as exc:
        raise TemplateError(f"expression {expression!r} failed: {exc}") from exc
    except _OVER as exc:
        raise _over_budget("expression", expression, exc) from exc
    return value


def _over_budget(kind: str, text: str, exc: BaseException) -> TemplateBudgetExceeded:
    shown = text if len(text) <= 200 else f"{text[:200]}…"
    if isinstance(exc, template_budget.Blown):
        why = str(exc)
    elif isinstance(exc, MemoryError):
        why = "it made a value larger than memory holds"
    else:
        why = "it nests or recurses too deep"
    fix = "make it do less, or raise that setting" if "CONVEYOR_" in why else "make it do less"
    return TemplateBudgetExceeded(f"{kind} {shown!r} went over its budget: {why}; {fix}")


# Compiling a template (parse, generate, compile() the Python) costs far more than rendering
# it, and a definition has a fixed set of them: each is compiled once per process.
# A compiled template is immutable: threads share it.
@lru_cache(maxsize=4096)
def _expression(expression: str) -> TemplateExpression:
    return _ENV.compile_expression(expression, undefined_to_none=False)


@lru_cache(maxsize=4096)
def _template(text: str) -> Template:
    return _ENV.from_string(text)


def _check_length(kind: str, text: str) -> None:
    if len(text) > MAX_TEMPLATE_CHARS:
        raise _over_budget(kind, text, template_budget.Blown(_too_long(text)))


def _too_long(text: str) -> str:
    return f"it is {len(text):,} characters long, over {MAX_TEMPLATE_CHARS:,}; split it"


def _render_string(value: str, context: Mapping[str, Any]) -> Any:
    if not is_template(value):
        return value
    whole = _WHOLE.match(value)
    if whole and "}}" not in whole.group("expr"):
        return _evaluate(whole.group("expr"), context)
    _check_length("template", value)
    try:
        return _template(value).render(**context)
    except _FAILURES as exc:
        raise TemplateError(f"template {value!r} failed: {exc}") from exc
    except _OVER as exc:
        raise _over_budget("template", value, exc) from exc


@dataclass(frozen=True)
class Reading:
    """What validation needs of one template, from one parse: why it does not parse (None:
    it does), and the node ids it reads as ``nodes.<id>`` or ``nodes['<id>']``."""

    problem: str | None
    nodes: frozenset[str]


def read(text: str, *, expression: bool = False) -> Reading:
    """One template (or expression) parsed once: its problem, or the nodes it reads."""
    if len(text) > MAX_TEMPLATE_CHARS:
        return Reading(_too_long(text), frozenset())
    try:
        tree = _parse(text, expression=expression)
    except JinjaTemplateError as exc:
        return Reading(str(exc), frozenset())
    except RecursionError:
        why = "it nests too deep to parse (brackets or blocks inside one another); simplify it"
        return Reading(why, frozenset())
    found = {a.attr for a in tree.find_all(nodes.Getattr) if _is_nodes_name(a.node)}
    for item in tree.find_all(nodes.Getitem):
        arg = item.arg
        if _is_nodes_name(item.node) and isinstance(arg, nodes.Const):
            found.update([arg.value] if isinstance(arg.value, str) else [])
    return Reading(None, frozenset(found))


def syntax_error(value: str, *, expression: bool = False) -> str | None:
    """The syntax error in a template or expression, or None when it parses."""
    return read(value, expression=expression).problem


def referenced_nodes(value: Any, *, expression: bool = False) -> set[str]:
    """The node ids the templates in ``value`` refer to (those that parse)."""
    found: set[str] = set()
    for text in _strings(value):
        if expression or is_template(text):
            found |= read(text, expression=expression).nodes
    return found


def may_read(value: Any, name: str) -> bool:
    """Whether a template inside ``value`` may read the name ``name`` of the context
    (``input``, ``nodes``, ``execution``); one that does not parse, or is too long to, may."""
    for text in _strings(value):
        if not is_template(text):
            continue
        if len(text) > MAX_TEMPLATE_CHARS:
            return True
        try:
            tree = _parse(text, expression=False)
        except (JinjaTemplateError, RecursionError):
            return True
        if name in meta.find_undeclared_variables(tree):
            return True
    return False


def _is_nodes_name(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "nodes"


def _parse(text: str, *, expression: bool) -> nodes.Template:
    return _ENV.parse("{{ " + text + " }}" if expression else text)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
