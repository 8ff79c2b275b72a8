"""examples/map-of-children.yaml in Python: the diamond as a child per x, 2 at a time."""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo
from examples.python.diamond import diamond


class Xs(TypedDict):
    xs: list[float]


children = conveyor.Flow(
    "map-of-children",
    input=Xs,
    description="Run the diamond as a child for each x of the input, then total the "
    "children's totals.",
)

each = children.child(
    "each",
    diamond,
    map=conveyor.Map(
        over=children.input["xs"], concurrency=2, on_item_failure=conveyor.ItemFailure.FAIL_FAST
    ),
    inputs={"x": conveyor.item_of(children.input["xs"])},
)
totals = "{{ nodes.each | map(attribute='total') | list }}"
total = children.call(demo.total, id="total", after=[each], inputs={"values": totals})
children.returns({"totals": totals, "total": total.out["value"]})
