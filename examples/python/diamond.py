"""examples/diamond.yaml in Python: one node fans out to three that run in parallel, then join.

conveyor workflow apply --module examples.python.diamond
"""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo


class DiamondInput(TypedDict):
    x: float


class DiamondOutput(TypedDict):
    x: float
    total: float


diamond = conveyor.Flow(
    "diamond",
    input=DiamondInput,
    output=DiamondOutput,
    description="Double x, then square it, add 10 and triple it in parallel, then sum the three.",
)

start = diamond.call(demo.double, id="start", inputs={"value": diamond.input["x"]})
# These three need only `start` (each reads its output), so they run at the same time.
square = diamond.call(demo.square, id="square", inputs={"value": start.out["value"]})
add_ten = diamond.call(demo.add, id="add_ten", inputs={"value": start.out["value"], "amount": 10})
triple = diamond.call(demo.multiply, id="triple", inputs={"value": start.out["value"], "by": 3})
# The join starts once, when all three have finished.
join = diamond.call(
    demo.total,
    id="join",
    inputs={"values": [square.out["value"], add_ten.out["value"], triple.out["value"]]},
)
diamond.returns({"x": diamond.input["x"], "total": join.out["value"]})
