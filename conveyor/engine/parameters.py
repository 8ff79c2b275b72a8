"""A python node's inputs checked against its function's parameters, before it ever runs.

Inputs arrive as keyword arguments (a parameter named ``ctx`` receives the node's context), so a
definition whose inputs the function cannot take fails every try. Validation asks a port,
:class:`FunctionParameters`, for what a function takes; the process that registered the function
answers (:func:`conveyor.nodes.function_parameters`), and one that did not answers None: such a
node is checked when it runs. Pure: names in, sentences out.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

CONTEXT = "ctx"  # the parameter that receives the NodeContext, never an input


@dataclass(frozen=True, kw_only=True)
class Parameters:
    """What a registered function accepts by keyword, read from its signature."""

    function: str  # the registered name
    shown: str  # its parameters as a reader would write them, e.g. "amount, currency='EUR', ctx"
    named: tuple[str, ...]  # the names an input may have, in order (ctx excluded)
    required: frozenset[str]  # the named ones without a default
    any_keyword: bool  # it takes **kwargs: any name is accepted
    takes_context: bool  # it has a ctx parameter
    unreachable: tuple[str, ...] = ()  # positional-only, no default: no input can give them


class FunctionParameters(Protocol):
    """The parameters of the function registered under ``name``; None when this process has no
    such function registered (its inputs are then not checked)."""

    def __call__(self, name: str) -> Parameters | None: ...


def input_problems(inputs: Mapping[str, Any], parameters: Parameters) -> list[str]:
    """Each input the function cannot take and each parameter no input gives, as sentences
    naming the input and what the function takes."""
    takes = f"function {parameters.function!r} takes ({parameters.shown})"
    errors = []
    if parameters.takes_context and CONTEXT in inputs:
        errors.append(
            f"inputs.{CONTEXT}: {takes}; its ctx receives the node's context, which an input "
            f"cannot replace; rename the input"
        )
    if not parameters.any_keyword:
        for name in inputs:
            if name in parameters.named or (name == CONTEXT and parameters.takes_context):
                continue
            close = difflib.get_close_matches(name, parameters.named, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; rename or remove it"
            errors.append(f"inputs.{name} is not a parameter: {takes}{hint}")
    for name in sorted(parameters.required - set(inputs)):
        errors.append(f"{takes}: {name!r} has no default, so inputs.{name} is required; add it")
    for name in parameters.unreachable:
        errors.append(
            f"{takes}: {name!r} is positional-only without a default, and inputs are passed by "
            f"name; make it a keyword parameter or give it a default"
        )
    return errors
