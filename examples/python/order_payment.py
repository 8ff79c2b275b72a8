"""examples/order-payment.yaml in Python: an order waits for its payment event, up to an hour."""

from __future__ import annotations

from typing import TypedDict

import conveyor
from conveyor import demo


class Order(TypedDict):
    order_id: str
    quantity: float


order_payment = conveyor.Flow(
    "order-payment",
    input=Order,
    description="Wait up to an hour for the order's payment, then charge it; else remind.",
)

# It holds no worker while it waits; its output is the event's payload. No event within the
# hour (3600 s): the on_timeout branch runs; without one, the node would fail.
payment = order_payment.wait(
    "payment", "payment.confirmed", key=order_payment.input["order_id"], within=3600
)
charge = order_payment.call(
    demo.multiply,
    id="charge",
    after=[payment.on_event],
    inputs={"value": "{{ nodes.payment.amount }}", "by": order_payment.input["quantity"]},
)
remind = order_payment.call(
    demo.double,
    id="remind",
    after=[payment.on_timeout],
    inputs={"value": order_payment.input["quantity"]},
)
order_payment.returns({"charged": "{{ nodes.charge.value if nodes.charge else none }}"})
