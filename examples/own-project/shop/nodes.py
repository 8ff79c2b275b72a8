"""The node functions of the shop's workflows. Workers import this module at start-up
(CONVEYOR_IMPORTS=shop.nodes), which registers each function under the name a definition's
``config.function`` uses."""

from __future__ import annotations

from typing import Any

import conveyor


@conveyor.node("shop.price_order")
def price_order(items: list[dict[str, Any]], vat: float = 0.2) -> dict[str, float]:
    """The order's total: the lines' quantity times unit price, plus VAT."""
    net = sum(float(item["quantity"]) * float(item["unit_price"]) for item in items)
    return {"net": round(net, 2), "total": round(net * (1 + vat), 2)}


@conveyor.node("shop.send_receipt")
def send_receipt(email: str, total: float, ctx: conveyor.NodeContext) -> dict[str, str]:
    """Send the receipt. A real one calls a mail service and passes ctx.idempotency_key along,
    so that a retried try never sends twice; this one only says what it would send."""
    return {"sent_to": email, "message": f"Thank you: {total:.2f} paid", "key": ctx.idempotency_key}
