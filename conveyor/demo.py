"""The node functions of the workflows in ``examples/``, used by ``conveyor demo``.

Real workers serve them with ``CONVEYOR_IMPORTS=conveyor.demo``. They sleep a little so that
parallel nodes are visible, and they stop early when the execution is cancelled.
"""

from __future__ import annotations

from typing import Any

import conveyor
from conveyor.engine.node_types import NodeContext

PAUSE = 0.5

# What `conveyor demo` runs, in order, with the input of each run.
RUNS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("diamond", {"x": 3}),
    ("flaky", {}),
)


def _pause(ctx: NodeContext) -> None:
    ctx.cancel_event.wait(PAUSE)


@conveyor.node("demo.double")
def double(value: float) -> dict[str, float]:
    return {"value": value * 2}


@conveyor.node("demo.square")
def square(value: float, ctx: NodeContext) -> dict[str, float]:
    _pause(ctx)
    return {"value": value**2}


@conveyor.node("demo.add")
def add(value: float, amount: float, ctx: NodeContext) -> dict[str, float]:
    _pause(ctx)
    return {"value": value + amount}


@conveyor.node("demo.multiply")
def multiply(value: float, by: float, ctx: NodeContext) -> dict[str, float]:
    _pause(ctx)
    return {"value": value * by}


@conveyor.node("demo.price")
def price(quantity: float, unit_price: float, ctx: NodeContext) -> dict[str, float]:
    """One order of the map example: a try of its own (``ctx.index`` is its place in the list)."""
    _pause(ctx)
    return {"order": ctx.index or 0, "value": round(quantity * unit_price, 2)}


@conveyor.node("demo.sum")
def total(values: list[float]) -> dict[str, float]:
    return {"value": sum(values)}


@conveyor.node("demo.flaky")
def flaky(succeed_on: int, ctx: NodeContext) -> dict[str, int]:
    """Fail every try before try number ``succeed_on``: a deterministic outage."""
    if ctx.attempt < succeed_on:
        raise ConnectionError(f"simulated outage on try {ctx.attempt} (succeeds on {succeed_on})")
    return {"attempts": ctx.attempt}


@conveyor.node("demo.report")
def report(attempts: int) -> dict[str, str]:
    return {"message": f"fetched after {attempts} tries"}


@conveyor.node("demo.decide")
def decide(amount: float, reviewer: str) -> dict[str, Any]:
    return {"approved": amount <= 10_000, "by": reviewer}


@conveyor.node("demo.notify")
def notify(decision: dict[str, Any]) -> dict[str, str]:
    verdict = "approved" if decision["approved"] else "rejected"
    return {"message": f"{verdict} by {decision['by']}"}
