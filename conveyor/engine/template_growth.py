"""What an operation in a template will make, foreseen before it runs.

One C-level operation (``9 ** (9 ** 9)``, ``'x' * 10 ** 10``, ``'%999999999d' % 1``) holds the
GIL until it is done and cannot be interrupted: every thread of the process waits, a worker's
heartbeats too. So the operators, filters and methods whose result can grow past its inputs
have that result's size foreseen here and refused (:class:`Blown`) past the budget; what
they made is weighed after (:meth:`Meter.made`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import wraps
from typing import Any

from jinja2 import Environment
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum

from conveyor.engine.template_budget import MAX_INT_BITS, Blown, Meter, current

_JSON_INDENT = 16  # the widest tojson indent
_MAX_ROUND = MAX_INT_BITS // 4  # digits round() may go to

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


class Formatter(SandboxedFormatter):
    """``str.format`` in templates: no field wider than the size budget, and the whole
    string at most that size."""

    def __init__(self, env: Environment, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        meter = current()
        for digits in _DIGITS.findall(format_spec):
            meter.allow(int(digits), f"a format width of {digits}")
        text = super().format_field(value, format_spec)
        self._made += len(text)
        meter.allow(self._made, "str.format")
        return text


class EscapeFormatter(Formatter, SandboxedEscapeFormatter):
    """The same, for a ``Markup`` string: its fields are escaped, as Jinja's own do."""


# -- the operators ------------------------------------------------------------------------------


def check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = exponent * base.bit_length() if exponent < 1 << 40 else 1 << 40
        if bits > MAX_INT_BITS:
            raise Blown(
                f"** would make a number of about {bits:,} bits; a template's numbers have "
                f"at most {MAX_INT_BITS:,}"
            )


def check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise Blown(
            f"{what} would make a number of about {bits:,} bits; a template's numbers have "
            f"at most {MAX_INT_BITS:,}"
        )


NUMBERS = frozenset({int, float, bool})


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
    check_power(left, right)
    return left**right


OPERATORS: dict[str, Callable[[Meter, Any, Any], Any]] = {
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


METHODS: dict[str, Callable[[Meter, Any, _Args, dict[str, Any]], _Args]] = {
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


def budgeted_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
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


def budgeted_range(*args: int) -> range:
    """range(), at most as long as the operations budget: iterating it costs one an item."""
    found, meter = range(*args), current()
    if len(found) > meter.operations:
        raise Blown(
            f"range() of {len(found):,} numbers is longer than the operations budget of "
            f"{meter.operations:,} (CONVEYOR_TEMPLATE_MAX_OPERATIONS)"
        )
    return found


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    meter = current()
    meter.tick()
    if isinstance(n, int) and isinstance(max, int):
        meter.allow(n * max * 10, f"lipsum(n={n:,}, max={max:,})")
    return str(meter.made(generate_lorem_ipsum(n=n, html=html, min=min, max=max)))
