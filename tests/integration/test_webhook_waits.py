"""A signed webhook wakes waits: an endpoint made with a key template (and an event name)
turns each delivery into an application event, so a payment provider's webhook resumes the
order that waits for it. Real services, the API served over HTTP, deliveries signed by the
standardwebhooks library."""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from conveyor.engine.credentials import new_webhook_secret
from conveyor.engine.states import DeliveryStatus, ExecutionStatus, SignatureScheme
from conveyor.models import WebhookDelivery
from conveyor.service import Conveyor, utcnow
from tests.conftest import TEST_DB_URL
from tests.integration.test_api import MakeKey, signed
from tests.integration.test_waits import apply, count_waiting, got, until, wait_node
from tests.support.services import effects, wait_for


def waking_endpoint(service: Conveyor, tenant: str, **wakes: Any) -> tuple[Any, str]:
    secret = new_webhook_secret(SignatureScheme.STANDARD)
    with service.db.transaction() as store:
        made = store.add_endpoint(store.tenant_id(tenant), "payments", SignatureScheme.STANDARD,
                                  secret, utcnow(), **wakes)  # fmt: skip
    return made.id, secret


def statuses(service: Conveyor) -> list[DeliveryStatus]:
    with service.db.transaction() as store:
        return list(store.session.scalars(select(WebhookDelivery.status)))


def test_a_signed_delivery_wakes_the_wait_its_key_template_names_and_no_other(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given two orders waiting for "paid", and an endpoint whose deliveries of type
    # payment.succeeded wake the wait keyed by the order id in their body
    service = conveyor_service
    make_key("acme")
    apply(service, "pay", wait_node("wait"), got("wait"), tenant="acme")
    first = service.trigger("pay", {"order": "o-1"}, tenant="acme")
    second = service.trigger("pay", {"order": "o-2"}, tenant="acme")
    until(lambda: count_waiting(service) == 2)
    endpoint_id, secret = waking_endpoint(
        service, "acme", wakes_event="{{ 'paid' if event == 'payment.succeeded' else event }}",
        wakes_key="{{ payload.data.order_id }}",
    )  # fmt: skip
    url = f"{api_url}/webhooks/{endpoint_id}"

    # When the provider posts a failed payment for o-1, then a successful one, signed
    failed = json.dumps({"type": "payment.failed", "data": {"order_id": "o-1"}, "n": 0}).encode()
    paid = json.dumps({"type": "payment.succeeded", "data": {"order_id": "o-1"}, "n": 3}).encode()
    answers = [
        httpx.post(url, content=failed, headers=signed(secret, failed, "msg_f")),
        httpx.post(url, content=paid, headers=signed(secret, paid, "msg_p")),
    ]

    # Then only the success woke o-1's wait, its output the delivery's body; o-2 still waits
    assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
    done = wait_for(service, first)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    with service.db.transaction() as store:
        outputs = {n.node_id: n.output for n in store.execution_nodes(first)}
        assert store.execution(second).status is ExecutionStatus.RUNNING
    assert outputs["wait"] == {"type": "payment.succeeded", "data": {"order_id": "o-1"}, "n": 3}
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["got"]
    assert count_waiting(service) == 1
    until(lambda: statuses(service) == [DeliveryStatus.PROCESSED] * 2)


def test_a_delivery_that_came_before_its_wait_began_is_kept_for_it(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given an endpoint that wakes "paid" waits (no event name: the delivery's type)
    service = conveyor_service
    make_key("acme")
    apply(service, "pay",
          {"id": "first", "type": "delay", "config": {"seconds": 1}},
          wait_node("wait", "first"), got("wait"), tenant="acme")  # fmt: skip
    endpoint_id, secret = waking_endpoint(service, "acme", wakes_key="{{ payload.order }}")

    # When the order starts, and its payment's delivery arrives while it is still delayed
    execution_id = service.trigger("pay", {"order": "o-9"}, tenant="acme")
    body = json.dumps({"type": "paid", "order": "o-9", "n": 4}).encode()
    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                        headers=signed(secret, body))  # fmt: skip

    # Then the wait takes the kept event when it begins, and the order completes
    assert answer.status_code == 202, answer.text
    until(lambda: statuses(service) == [DeliveryStatus.PROCESSED], tick=service.promote_due)
    until(lambda: service.execution(execution_id, tenant="acme")["status"] == "completed",
          tick=service.promote_due)  # fmt: skip
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["got"]
