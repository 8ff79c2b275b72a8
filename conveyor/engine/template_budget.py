"""A template render's budget: operations, time and size, and the meter that keeps account.

- **operations**: each loop iteration, call (a macro's too) and filter counts one; past the
  budget the render stops. The clock is read at each charge, so a render also stops at its
  deadline (in a worker, the node's timeout when that comes first). A render running longer
  than 2 ms gives up the GIL every 2 ms, so that the other threads of its process (other
  requests, heartbeats) run meanwhile.
- **size**: no string, list or dict a template makes may be heavier than the budget (about
  its length as JSON: a string its characters, a list the sum of its items, shared parts
  counted each time they appear), nor nested deeper than ``MAX_DEPTH``; nor may its text.
  Weights are remembered per render, so that a value shared a million times (``[a, a, a]``
  nested) weighs what it would print, not what it costs to hold, and is weighed once.
- **numbers**: an integer may have at most ``MAX_INT_BITS`` bits.

Going over raises :class:`Blown`; :mod:`conveyor.engine.templates` names the template.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

T = TypeVar("T")

MAX_INT_BITS = 100_000  # about 30,000 decimal digits; Python prints at most 4,300
MAX_DEPTH = 100  # how deep a list or dict a template makes may nest
# A render that runs longer gives up the GIL this often (seconds): a typical render is done
# well within it, and so never pays for the system call.
_YIELD_EVERY = 0.002


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

    __slots__ = (
        "deadline", "kept", "left", "operations", "seconds", "size", "until", "weights", "yielded",
    )  # fmt: skip

    def __init__(self, budget: Budget, until: Deadline | None = None) -> None:
        self.operations = self.left = budget.operations
        self.size = budget.size
        self.seconds = budget.seconds
        self.yielded = time.monotonic()  # when it last gave up the GIL (or started)
        self.deadline = self.yielded + budget.seconds
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
        now = time.monotonic()
        if now > self.deadline:
            budget = f"its time budget of {self.seconds:g} s (CONVEYOR_TEMPLATE_TIMEOUT)"
            raise Blown(f"it ran past {budget if self.until is None else self.until[1]}")
        if now - self.yielded > _YIELD_EVERY:
            time.sleep(0)  # the process's other threads (other requests) take the GIL
            self.yielded = now

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
