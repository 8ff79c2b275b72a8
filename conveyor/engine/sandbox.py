"""The sandbox templates render in: Jinja's immutable sandbox, metered.

Jinja's sandbox stops a template from reaching what it should not; it does not stop one from
working forever. This environment charges every loop, call and filter to the render's meter
(:mod:`conveyor.engine.template_budget`), refuses the operations that would grow a value past
the size budget before they run (:mod:`conveyor.engine.template_growth`), and weighs the
lists, tuples and dicts a template writes and the text it renders.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sized
from functools import wraps
from typing import Any

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from conveyor.engine import template_growth as growth
from conveyor.engine.template_budget import current


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
_AT_ONCE = 128  # a loop over at most this many items is charged when it starts


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, metered: see the module's docstring."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False)
        self.filters = {name: growth.budgeted_filter(name, fn) for name, fn in self.filters.items()}
        self.filters[_COUNTED] = self.counted
        self.globals["lipsum"] = growth.lipsum
        self.globals["range"] = growth.budgeted_range

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
        """A loop's iterable, charged an operation an item: a short list at once; a long one
        (or a generator) sixteen items at a time, the clock read each time, since one
        iteration may copy a string of the budget's size."""
        if isinstance(iterable, Sized) and len(iterable) <= _AT_ONCE:
            current().charge(len(iterable))
            return iterable
        return self._by_sixteen(iterable)

    def _by_sixteen(self, iterable: Iterable[Any]) -> Iterator[Any]:
        meter, n = current(), 0
        for n, item in enumerate(iterable, 1):
            if not n & 15:
                meter.charge(16)
            yield item
        meter.charge(n & 15)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        # An operator's result is foreseen and refused before it is made. Operators are not
        # counted: only loops and calls repeat work.
        if type(left) in growth.NUMBERS and type(right) in growth.NUMBERS:
            if operator == "**":
                growth.check_power(left, right)
            elif operator == "*" and type(left) is int and type(right) is int:
                growth.check_bits(left.bit_length() + right.bit_length(), "*")
            return self.binop_table[operator](left, right)
        return growth.OPERATORS[operator](current(), left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = current()
        meter.tick()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (__self.counted(args[0]), *args[1:])
        elif (
            isinstance(owner := getattr(__obj, "__self__", None), str | bytes | int)
            and getattr(__obj, "__name__", None) in growth.METHODS
        ):
            # By its owner and name, not its type: Markup's methods (|safe, |e) are Python
            # functions wrapping str's, and would build the text before it is weighed.
            args = growth.METHODS[__obj.__name__](meter, owner, args, kwargs)
        return meter.made(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        found = super().wrap_str_format(value)
        if found is None:
            return None
        text: str = value.__self__
        is_map = value.__name__ == "format_map"

        @wraps(value)
        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map and (kwargs or len(args) != 1):
                return found(*args, **kwargs)  # raises format_map's own TypeError
            fields = args[0] if is_map else kwargs
            formatter = (
                growth.EscapeFormatter(self, escape=text.escape)
                if isinstance(text, Markup)
                else growth.Formatter(self)
            )
            made: str = type(text)(formatter.vformat(text, () if is_map else args, fields))
            return made

        return bounded
