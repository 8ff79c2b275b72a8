"""examples/map.yaml in Python: price each order of the input, 3 at a time, then total them."""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo


class Order(TypedDict):
    quantity: float
    unit_price: float


class Orders(TypedDict):
    orders: list[Order]


prices = conveyor.Flow(
    "map",
    input=Orders,
    description="Price each order of the input (a job each, 3 at a time), then total the prices.",
)

order = conveyor.item_of(prices.input["orders"])  # {{ item }}, typed as an Order
price = prices.call(
    demo.price,
    id="price",
    map=conveyor.Map(over=prices.input["orders"], concurrency=3),
    inputs={"quantity": order["quantity"], "unit_price": order["unit_price"]},
)
# Runs once, when every order has been priced; nodes.price is their outputs, in order.
total = prices.call(
    demo.total,
    id="total",
    after=[price],
    inputs={"values": "{{ nodes.price | map(attribute='value') | list }}"},
)
prices.returns({"orders": "{{ nodes.price | length }}", "total": total.out["value"]})
