"""The sandbox templates render in: Jinja's immutable sandbox with a budget.

Jinja's sandbox stops a template from reaching what it should not; it does not stop one from
working forever. A render here has three bounds (:class:`Budget`):

- **operations**: each loop iteration, call (a macro's too), filter and intercepted operator
  counts one; past the budget the render stops. The time is checked at every operation, so a
  render also stops at its deadline (the node's timeout, in a worker, when that comes first).
- **size**: no string, list or dict a template makes may be heavier than the budget (about
  its length as JSON: a string its characters, a list the sum of its items), nor nested
  deeper than ``MAX_DEPTH``; nor may the text it renders. Checked *before* a C-level
  operation runs where its result can be foreseen (``*``, ``**``, ``%``, ``+``, the filters
  and methods that grow text), since such an operation holds the GIL and cannot be stopped
  once started; and after a filter or call, on what it made. The weights are remembered
  per render, so that a value shared a million times (``[a, a, a]`` nested) weighs what it
  would print, not what it costs to hold, and is weighed once.
- **numbers**: an integer may have at most ``MAX_INT_BITS`` bits (``9 ** 9 ** 9`` would take
  minutes to compute and is refused before it starts).

Going over raises :class:`Blown`; :mod:`conveyor.engine.templates` names the template.
"""

from __future__ import annotations

import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextvars import ContextVar
from dataclasses import dataclass
from functools import wraps
from itertools import chain
from typing import Any, TypeVar

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum

T = TypeVar("T")

MAX_INT_BITS = 100_000  # about 30,000 decimal digits; Python prints at most 4,300
MAX_DEPTH = 100  # how deep a list or dict a template makes may nest
_JSON_INDENT = 16  # the widest tojson indent
_MAX_ROUND = MAX_INT_BITS // 4  # digits round() may go to


# A deadline sooner than the budget's time: monotonic seconds, and what it is ("the node's
# timeout of 30 s"), for the message.
Deadline = tuple[float, str]


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How much one render may do (CONVEYOR_TEMPLATE_* settings)."""

    seconds: float = 1.0  # CONVEYOR_TEMPLATE_TIMEOUT
    operations: int = 100_000  # CONVEYOR_TEMPLATE_MAX_OPERATIONS
    size: int = 1_000_000  # CONVEYOR_TEMPLATE_MAX_SIZE


class Blown(Exception):
    """A render went over its budget; the message says which bound and by what."""


class Meter:
    """One render's account: operations left, its deadline, the weights it has seen."""

    __slots__ = ("deadline", "kept", "left", "operations", "seconds", "size", "until", "weights")

    def __init__(self, budget: Budget, until: Deadline | None = None) -> None:
        self.operations = self.left = budget.operations
        self.size = budget.size
        self.seconds = budget.seconds
        self.deadline = time.monotonic() + budget.seconds
        self.until = until
        if until is not None and until[0] < self.deadline:
            self.deadline = until[0]
        else:
            self.until = None
        # id -> (the value, kept alive so that its id is not reused; its weight; its depth)
        self.weights: dict[int, tuple[Any, int, int]] = {}
        self.kept = 0  # the weight of what self.weights keeps alive

    def tick(self) -> None:
        self.charge(1)

    def charge(self, operations: int) -> None:
        self.left -= operations
        if self.left < 0:
            raise Blown(
                f"it did more than {self.operations:,} operations (loop iterations, calls, "
                f"filters), the budget CONVEYOR_TEMPLATE_MAX_OPERATIONS"
            )
        if time.monotonic() > self.deadline:
            budget = f"its time budget of {self.seconds:g} s (CONVEYOR_TEMPLATE_TIMEOUT)"
            raise Blown(f"it ran past {budget if self.until is None else self.until[1]}")
        if self.left & 15 == 0:
            time.sleep(0)  # let the process's other threads (other requests) have the GIL

    def allow(self, weight: int, what: str) -> None:
        """Refuse to make a value heavier than the size budget."""
        if weight > self.size:
            raise Blown(
                f"{what} would make a value of size {weight:,}, over the budget of "
                f"{self.size:,} (CONVEYOR_TEMPLATE_MAX_SIZE)"
            )

    def weigh(self, value: Any) -> int:
        """About the length of ``value`` as JSON; refused past the size or depth budget."""
        return self._weigh(value)[0]

    def _weigh(self, value: Any) -> tuple[int, int]:
        if isinstance(value, str | bytes):
            return len(value) + 2, 0
        if isinstance(value, int):
            return 1 + value.bit_length() // 3, 0
        if not isinstance(value, list | tuple | dict | set | frozenset):
            return 1, 0
        known = self.weights.get(id(value))
        if known is not None:
            return known[1], known[2]
        total, depth = 2, 0
        items: Iterable[Any] = (
            chain.from_iterable(value.items()) if isinstance(value, dict) else value
        )
        for item in items:
            weight, deep = self._weigh(item)
            total += weight + 1
            depth = max(depth, deep)
            if total > self.size:
                raise Blown(
                    f"it made a value bigger than the size budget of {self.size:,} "
                    f"(CONVEYOR_TEMPLATE_MAX_SIZE)"
                )
        if depth >= MAX_DEPTH:
            raise Blown(f"it made a list or dict nested deeper than {MAX_DEPTH} levels")
        self._remember(value, total, depth + 1)
        return total, depth + 1

    def _remember(self, value: Any, weight: int, depth: int) -> None:
        # What is remembered is kept alive: a loop making a big list each time would keep
        # them all. Past a few budgets' worth it is forgotten; weighing again is correct,
        # only slower (a walk stops past the size budget).
        self.kept += weight
        if self.kept > 4 * self.size:
            self.weights.clear()
            self.kept = weight
        self.weights[id(value)] = (value, weight, depth)

    def made(self, value: Any, known: tuple[int, int] | None = None) -> Any:
        """Account for a value a template made (its weight and depth, when known)."""
        if known is not None:
            self._remember(value, *known)
        elif isinstance(value, str | bytes):
            self.allow(len(value), "it")
        elif isinstance(value, list | tuple | dict | set | frozenset):
            self._weigh(value)
        return value


class _Idle(Meter):
    """Outside a render (Jinja folds constant expressions when it compiles): sizes are
    checked, operations and time are not counted."""

    def charge(self, operations: int) -> None:
        return None

    def _remember(self, value: Any, weight: int, depth: int) -> None:
        return None  # it lives as long as the process: it keeps nothing


_BUDGET = Budget()
_IDLE = _Idle(_BUDGET)
# In a render: its meter, or (until its first operation; most renders never count one) the
# deadline it will have, or _START for none.
_START = "start"
_CURRENT: ContextVar[Meter | Deadline | str | None] = ContextVar(
    "conveyor_template_meter", default=None
)


def configure(budget: Budget) -> None:
    """Set the process's budget (the composition root does, from the settings)."""
    global _BUDGET, _IDLE
    _BUDGET, _IDLE = budget, _Idle(budget)


def budget() -> Budget:
    return _BUDGET


def current() -> Meter:
    """The meter of the render under way (made at its first use)."""
    found = _CURRENT.get()
    if isinstance(found, Meter):
        return found
    if found is None:
        return _IDLE
    meter = Meter(_BUDGET, None if found is _START else found)  # type: ignore[arg-type]
    _CURRENT.set(meter)  # within()'s reset restores what was there before it
    return meter


def within(deadline: Deadline | None, render: Callable[..., T], *args: Any) -> T:
    """``render(*args)`` under a meter of its own; a render inside another shares the
    outer one's."""
    if _CURRENT.get() is not None:
        return render(*args)
    token = _CURRENT.set(_START if deadline is None else deadline)
    try:
        return render(*args)
    finally:
        _CURRENT.reset(token)


# -- what the compiled templates call ----------------------------------------------------------


class _Generator(CodeGenerator):
    """Jinja's code generator, with the lists, tuples and dicts a template writes and its
    ``~`` concatenations measured."""

    def visit_List(self, node: nodes.List, frame: Frame) -> None:  # noqa: N802 - Jinja's name
        self.write("environment.made(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:  # noqa: N802 - Jinja's name
        self.write("environment.made(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:  # noqa: N802 - Jinja's name
        if node.ctx != "load":  # an assignment's target: nothing is made
            super().visit_Tuple(node, frame)
            return
        self.write("environment.made(")
        super().visit_Tuple(node, frame)
        self.write(")")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 - Jinja's name
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


_COUNTED = "_conveyor_counted"


_PRINTF = re.compile(
    rb"%(?:\((?P<key>[^)]*)\))?[#0\- +]*(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d+))?"
    rb"[hlL]?(?P<kind>[a-zA-Z%])"
)
_DIGITS = re.compile(r"\d+")


def _printf_weight(meter: Meter, text: str | bytes, args: Any) -> int:
    """What ``text % args`` may weigh, before it is made."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if b"%" not in raw:
        return len(raw)
    specs = list(_PRINTF.finditer(raw))
    if any(b"*" in (m.group("width") or b"") + (m.group("precision") or b"") for m in specs):
        raise Blown("a % format takes its width from an argument (*); write the width")
    widths = sum(int(m.group("width") or 0) + int(m.group("precision") or 0) for m in specs)
    if isinstance(args, Mapping):
        values: Iterable[Any] = list(args.values()) if len(args) < 1000 else [args]
    elif isinstance(args, tuple):
        values = args
    else:
        values = (args,)
    widest = max((meter.weigh(v) for v in values), default=0)
    return len(raw) + widths + len(specs) * widest


class _Formatter(SandboxedFormatter):
    """``str.format`` in templates: no field wider than the size budget, and the whole
    string at most that size."""

    def __init__(self, env: BudgetedEnvironment) -> None:
        super().__init__(env)
        self._made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        meter = current()
        for digits in _DIGITS.findall(format_spec):
            meter.allow(int(digits), f"a format width of {digits}")
        text = super().format_field(value, format_spec)
        self._made += len(text)
        meter.allow(self._made, "str.format")
        return text


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, metered: see the module's docstring."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False)
        self.filters = {name: _filter(name, fn) for name, fn in self.filters.items()}
        self.filters[_COUNTED] = self.counted
        self.globals["lipsum"] = _lipsum
        self.globals["range"] = _range

    def _generate(
        self, source: nodes.Template, name: str | None, filename: str | None,
        defer_init: bool = False,
    ) -> str:  # fmt: skip
        # Every loop's iterable goes through a filter of ours, which counts it (Jinja allows
        # no new kind of node, and the generator lists the filters before it visits a loop).
        for loop in source.find_all(nodes.For):
            if not (isinstance(loop.iter, nodes.Filter) and loop.iter.name == _COUNTED):
                loop.iter = nodes.Filter(
                    loop.iter, _COUNTED, [], [], None, None, lineno=loop.lineno
                )
        return super()._generate(source, name, filename, defer_init)

    # Every compiled template's text is joined by this (renders, macros, {% set %} blocks).
    def concat(self, parts: Iterable[str]) -> str:
        kept = list(parts)
        current().allow(sum(map(len, kept)), "its text")
        return "".join(kept)

    def joined(self, parts: tuple[Any, ...]) -> str:
        """``a ~ b``: each part as text, at most the size budget together."""
        texts = [p if isinstance(p, str) else str(p) for p in parts]
        current().allow(sum(map(len, texts)), "~")
        return "".join(texts)

    def made(self, value: Any) -> Any:
        return current().made(value)

    def counted(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """A loop's iterable: charged its length at once, or an operation an item."""
        if isinstance(iterable, Sized):
            current().charge(len(iterable))
            return iterable
        return self._one_by_one(iterable)

    def _one_by_one(self, iterable: Iterable[Any]) -> Iterator[Any]:
        meter = current()
        for item in iterable:
            meter.tick()
            yield item

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        # An operator's result is foreseen and refused before it is made. Operators are not
        # counted: only loops and calls repeat work.
        if type(left) in _NUMBERS and type(right) in _NUMBERS:
            if operator == "**":
                _check_power(left, right)
            elif operator == "*" and type(left) is int and type(right) is int:
                _check_bits(left.bit_length() + right.bit_length(), "*")
            return self.binop_table[operator](left, right)
        return _OPERATORS[operator](current(), left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = current()
        meter.tick()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (__self.counted(args[0]), *args[1:])
        elif isinstance(__obj, types.BuiltinMethodType) and __obj.__name__ in _METHODS:
            args = _METHODS[__obj.__name__](meter, __obj.__self__, args, kwargs)
        return meter.made(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        found = super().wrap_str_format(value)
        if found is None:
            return None
        text, is_map = value.__self__, value.__name__ == "format_map"

        @wraps(value)
        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map and (kwargs or len(args) != 1):
                return found(*args, **kwargs)  # raises format_map's own TypeError
            fields = args[0] if is_map else kwargs
            return str(_Formatter(self).vformat(text, () if is_map else args, fields))

        return bounded


# -- the operators ------------------------------------------------------------------------------


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = exponent * base.bit_length() if exponent < 1 << 40 else 1 << 40
        if bits > MAX_INT_BITS:
            raise Blown(
                f"** would make a number of about {bits:,} bits; a template's numbers have "
                f"at most {MAX_INT_BITS:,}"
            )


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise Blown(
            f"{what} would make a number of about {bits:,} bits; a template's numbers have "
            f"at most {MAX_INT_BITS:,}"
        )


_NUMBERS = frozenset({int, float, bool})


def _times(meter: Meter, left: Any, right: Any) -> Any:
    seq, times = (right, left) if isinstance(left, int) else (left, right)
    if isinstance(times, int) and isinstance(seq, str | bytes):
        meter.allow(len(seq) * times, f"repeating a string {times:,} times")
    elif isinstance(times, int) and isinstance(seq, list | tuple):
        unit, depth = meter._weigh(seq)
        weight = unit * max(times, 0)
        meter.allow(weight, f"repeating a {type(seq).__name__} {times:,} times")
        return meter.made(seq * times, (weight, depth))
    return left * right


def _plus(meter: Meter, left: Any, right: Any) -> Any:
    if isinstance(left, str | bytes) and isinstance(right, str | bytes):
        meter.allow(len(left) + len(right), "+")
    elif type(left) is type(right) and isinstance(left, list | tuple):
        (one, deep), (other, deeper) = meter._weigh(left), meter._weigh(right)
        meter.allow(one + other, "+")
        return meter.made(left + right, (one + other, max(deep, deeper)))
    return left + right


def _modulo(meter: Meter, left: Any, right: Any) -> Any:
    if isinstance(left, str | bytes):
        meter.allow(_printf_weight(meter, left, right), "%")
    return left % right


def _power(meter: Meter, left: Any, right: Any) -> Any:
    _check_power(left, right)
    return left**right


_OPERATORS: dict[str, Callable[[Meter, Any, Any], Any]] = {
    "*": _times,
    "+": _plus,
    "%": _modulo,
    "**": _power,
}


# -- methods that grow text ---------------------------------------------------------------------

_Args = tuple[Any, ...]


def _arg(args: _Args, kwargs: dict[str, Any], index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _width(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    width = _arg(args, kwargs, 0, "width", 0)
    if isinstance(width, int):
        meter.allow(width, f"a width of {width:,}")
    return args


def _to_bytes(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    length = _arg(args, kwargs, 0, "length", 1)
    if isinstance(length, int):
        meter.allow(length, f"to_bytes({length:,})")
    return args


def _expandtabs(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    size = _arg(args, kwargs, 0, "tabsize", 8)
    if isinstance(size, int) and isinstance(owner, str | bytes):
        tab = "\t" if isinstance(owner, str) else b"\t"
        meter.allow(len(owner) + owner.count(tab) * max(size, 0), "expandtabs")  # type: ignore[arg-type]
    return args


def _replace_weight(text: str | bytes, old: Any, new: Any, count: Any) -> int:
    if not isinstance(old, str | bytes) or not isinstance(new, str | bytes):
        return len(text)
    found = len(text) + 1 if not old else text.count(old)  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new) - len(old), 0)


def _replace(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    old, new = _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", "")
    count = _arg(args, kwargs, 2, "count", -1)
    meter.allow(_replace_weight(owner, old, new, count), "replace")
    return args


def _join_weight(meter: Meter, items: Any, glue: int) -> tuple[Any, int]:
    """What joining ``items`` with ``glue`` characters between weighs (a string: its
    characters; anything else is listed once, then joined)."""
    if isinstance(items, str):
        return items, len(items) * (1 + glue)
    items = list(items)
    return items, sum(meter.weigh(i) for i in items) + max(len(items) - 1, 0) * glue


def _join(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    if not args:
        return args
    items, weight = _join_weight(meter, args[0], len(owner))
    meter.allow(weight, "join")
    return (items, *args[1:])


def _translate(meter: Meter, owner: Any, args: _Args, kwargs: dict[str, Any]) -> _Args:
    table = _arg(args, kwargs, 0, "table", None)
    if isinstance(table, Mapping):
        widest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
        meter.allow(len(owner) * widest, "translate")
    return args


_METHODS: dict[str, Callable[[Meter, Any, _Args, dict[str, Any]], _Args]] = {
    "center": _width,
    "ljust": _width,
    "rjust": _width,
    "zfill": _width,
    "to_bytes": _to_bytes,
    "expandtabs": _expandtabs,
    "replace": _replace,
    "join": _join,
    "translate": _translate,
}


# -- filters ------------------------------------------------------------------------------------

_Check = Callable[[Meter, _Args, dict[str, Any]], _Args]


def _filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` counted as an operation, checked before (when it can grow text) and after."""
    check = _FILTER_CHECKS.get(name)
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # context/environment

    @wraps(fn)  # keeps jinja_pass_arg
    def budgeted(*args: Any, **kwargs: Any) -> Any:
        meter = current()
        meter.tick()
        if check is not None:
            args = (*args[:skip], *check(meter, args[skip:], kwargs))
        return meter.made(fn(*args, **kwargs))

    return budgeted


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _center(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    width = _arg(args, kwargs, 1, "width", 80)
    if isinstance(width, int):
        meter.allow(width, f"center({width:,})")
    return args


def _indent(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    text, width = _text(args[0]), _arg(args, kwargs, 1, "width", 4)
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    meter.allow(len(text) + (text.count("\n") + 1) * pad, "indent")
    return (text, *args[1:])


def _wordwrap(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    text, wrap = _text(args[0]), _arg(args, kwargs, 4, "wrapstring", None)
    meter.allow(len(text) * (1 + (len(wrap) if isinstance(wrap, str) else 1)), "wordwrap")
    return (text, *args[1:])


def _format(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    text = _text(args[0])
    meter.allow(_printf_weight(meter, text, kwargs or tuple(args[1:])), "format")
    return (text, *args[1:])


def _replace_filter(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    text = _text(args[0])
    old, new = _arg(args, kwargs, 1, "old", ""), _arg(args, kwargs, 2, "new", "")
    count = _arg(args, kwargs, 3, "count", None)
    meter.allow(_replace_weight(text, _text(old), _text(new), count), "replace")
    return (text, *args[1:])


def _join_filter(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    glue = _text(_arg(args, kwargs, 1, "d", ""))
    items, weight = _join_weight(meter, args[0], len(glue))
    meter.allow(weight, "join")
    return (items, *args[1:])


def _count_arg(position: int, name: str) -> _Check:
    def check(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
        count = _arg(args, kwargs, position, name, 0)
        if isinstance(count, int):
            meter.allow(count, f"{name} of {count:,}")
        return args

    return check


def _sum(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    start = _arg(args, kwargs, 2, "start", 0)
    if isinstance(start, list | tuple):  # adding lists copies them: n lists, n copies
        items = list(args[0])
        weight = meter.weigh(start) + sum(meter.weigh(i) for i in items)
        meter.allow(weight, "sum")
        meter.allow(len(items) * weight // 8, "sum (adding lists copies them each time)")
        return (items, *args[1:])
    return args


def _urlize(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    text = _text(args[0])
    target, rel = _arg(args, kwargs, 3, "target", None), _arg(args, kwargs, 4, "rel", None)
    extra = sum(len(v) for v in (target, rel) if isinstance(v, str)) + 40
    meter.allow(3 * len(text) + (len(text) // 4 + 1) * extra, "urlize")
    return (text, *args[1:])


def _tojson(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    indent = _arg(args, kwargs, 1, "indent", None)
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if width > _JSON_INDENT:
        raise Blown(f"tojson's indent is at most {_JSON_INDENT}")
    weight, depth = meter._weigh(args[0])
    meter.allow(weight * (1 + width * depth), "tojson")
    return args


def _pprint(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    weight, depth = meter._weigh(args[0])
    meter.allow(weight * (1 + depth), "pprint")
    return args


def _round(meter: Meter, args: _Args, kwargs: dict[str, Any]) -> _Args:
    # round() computes 10 ** precision (an integer's, to a negative one): 17 digits is all a
    # float has, and an integer's are bounded like every number's.
    precision = _arg(args, kwargs, 1, "precision", 0)
    if isinstance(precision, int) and abs(precision) > _MAX_ROUND:
        raise Blown(f"round() to {precision:,} digits; at most {_MAX_ROUND:,} either way")
    return args


_FILTER_CHECKS: dict[str, _Check] = {
    "round": _round,
    "center": _center,
    "indent": _indent,
    "wordwrap": _wordwrap,
    "format": _format,
    "replace": _replace_filter,
    "join": _join_filter,
    "batch": _count_arg(1, "linecount"),
    "slice": _count_arg(1, "slices"),
    "sum": _sum,
    "urlize": _urlize,
    "tojson": _tojson,
    "pprint": _pprint,
}


def _range(*args: int) -> range:
    """range(), at most as long as the operations budget: iterating it costs one an item."""
    found, meter = range(*args), current()
    if len(found) > meter.operations:
        raise Blown(
            f"range() of {len(found):,} numbers is longer than the operations budget of "
            f"{meter.operations:,} (CONVEYOR_TEMPLATE_MAX_OPERATIONS)"
        )
    return found


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    meter = current()
    meter.tick()
    if isinstance(n, int) and isinstance(max, int):
        meter.allow(n * max * 10, f"lipsum(n={n:,}, max={max:,})")
    return str(meter.made(generate_lorem_ipsum(n=n, html=html, min=min, max=max)))
