"""The size and shape bounds every input meets (pure): request bodies, definitions, node
outputs and delays. Each bound is a ``CONVEYOR_*`` setting (``Settings.bounds``) except the
delay's, a fixed maximum; every message names the bound, its setting and the fix.

The JSON depth bound is what keeps a stored value readable: pydantic serializes at most 255
levels, Python's ``json`` about 1,000, so a value accepted deeper than that would fail every
read of it afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DELAY_SECONDS = 365 * 86_400  # a delay node waits at most a year
# Characters of templates in one definition: validating parses each on a thread of the API,
# so their total bounds how long an apply holds it (docs/benchmarks.md); 1 MiB is 10,000
# nodes of 100 characters of templates each.
MAX_TEMPLATE_TEXT = 1_048_576


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """The bounds in force; the defaults are the settings' defaults."""

    input_bytes: int = 1_048_576  # a trigger's body (its input)
    event_bytes: int = 1_048_576  # an application event's body (its payload)
    definition_bytes: int = 4_194_304  # a definition: a file, or the body that applies it
    nodes: int = 10_000  # nodes in one definition
    needs: int = 10_000  # needs of one node
    json_depth: int = 64  # nesting of any JSON value: input, payload, definition, output
    output_bytes: int = 1_048_576  # one node's output, as JSON (a map's: its items')
    map_items: int = 100_000  # items in one map's list
    children: int = 1_000  # child executions one execution may start, in all


def too_large(
    what: str, size: int | None, limit: int, setting: str | None, fix: str = "send less"
) -> str:
    """The message of a value over a byte bound (``size`` None: found over it before its end
    was read; ``setting`` None: a fixed bound)."""
    measured = f"is {size} bytes, over" if size is not None else "is over"
    if setting is None:
        return f"{what} {measured} the limit of {limit} bytes; {fix}"
    return f"{what} {measured} the limit of {limit} bytes ({setting}); {fix}, or raise {setting}"


def too_deep(what: str, limit: int) -> str:
    """The message of a value nested past the depth bound."""
    return (
        f"{what} is nested more than {limit} levels deep (CONVEYOR_MAX_JSON_DEPTH); "
        f"flatten it, or raise CONVEYOR_MAX_JSON_DEPTH"
    )


def deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests lists and mappings more than ``limit`` levels
    (a scalar is depth 0, ``{"a": 1}`` depth 1). Iterative: a value of any depth is measured
    without recursion, and the walk stops at the first container past the limit."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children if _container(child))
    return False


def _container(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple)


def text_deeper_than(text: str | bytes, value: Any, limit: int) -> bool:
    """:func:`deeper_than` for a value whose JSON text is at hand: a text with at most
    ``limit`` opening brackets (most are) cannot nest deeper, and is not walked."""
    if isinstance(text, bytes):
        opened = text.count(b"[") + text.count(b"{")
    else:
        opened = text.count("[") + text.count("{")
    return opened > limit and deeper_than(value, limit)


def delay_problem(seconds: float) -> str | None:
    """Why a number of seconds cannot be a delay, or None when it can."""
    if isinstance(seconds, float) and not math.isfinite(seconds):
        return f"delay seconds {seconds} is not a finite number"
    shown = f"{seconds:g}" if isinstance(seconds, float) else _digits(seconds)
    if seconds < 0:
        return f"delay seconds {shown} is negative"
    if seconds > MAX_DELAY_SECONDS:
        return f"delay seconds {shown} is over the maximum of {MAX_DELAY_SECONDS} (a year)"
    return None


def _digits(number: int) -> str:
    # str() of an int past 4,300 digits raises; its size says enough
    if abs(number) < 10**30:
        return str(number)
    return f"{'-' if number < 0 else ''}1e{int(abs(number).bit_length() * 0.30103)} or so"


def shown(value: Any) -> str:
    """A value as a message shows it: at most about 60 characters, whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _digits(value)
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."
