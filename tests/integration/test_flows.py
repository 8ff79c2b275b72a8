"""Workflows written in Python, run end to end (real PostgreSQL, Redis broker and the
in-process worker): `conveyor workflow apply --module` stores them, the client starts, waits
for, reads and cancels their executions, and an allowed Celery task runs as a node."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from celery import Celery
from typer.testing import CliRunner

import conveyor
from conveyor.cli import app
from conveyor.engine.states import ExecutionStatus
from conveyor.exceptions import ExecutionFailed, WaitTimeout
from conveyor.service import Conveyor
from examples.python.diamond import diamond
from examples.python.order_payment import order_payment

celery_app = Celery("billing", set_as_current=False)
calls: list[dict[str, Any]] = []


@celery_app.task(name="billing.charge")
def charge(amount: float, currency: str = "EUR") -> dict[str, Any]:
    """An application's Celery task, as it is, that fails its first call."""
    calls.append({"amount": amount})
    if len(calls) == 1:
        raise ConnectionError("the card service is away")
    return {"charged": amount, "currency": currency}


conveyor.celery_task(charge)

billing = conveyor.Flow("billing")
charged = billing.call(
    charge,
    id="charge",
    inputs={"amount": billing.input["amount"]},
    retry=conveyor.RetryPolicy(max_attempts=2, backoff=0.1, jitter=0),
)
billing.returns({"charged": charged.out["charged"]})

slow = conveyor.Flow("slow")
slow.delay("hold", 3600)


def test_apply_module_stores_every_flow_the_module_declares(conveyor_service: Conveyor) -> None:
    result = CliRunner().invoke(
        app, ["workflow", "apply", "--module", "examples.python.child"], terminal_width=200
    )

    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["diamond: stored version 1", "child: stored version 1"]
    with conveyor_service.db.transaction() as store:
        stored = {w.name: w for w in store.list_workflows(store.tenant_id("default"))}
    assert stored["diamond"].digest == diamond.definition().digest()


def test_apply_module_names_a_module_without_flows() -> None:
    result = CliRunner().invoke(app, ["workflow", "apply", "--module", "conveyor.demo"])

    assert result.exit_code == 1
    assert "declares no conveyor.Flow at its top level" in result.output


def test_the_client_starts_waits_for_and_reads_a_typed_result(conveyor_service: Conveyor) -> None:
    client = conveyor.Client(conveyor_service)
    client.apply(diamond)

    run = client.start(diamond, {"x": 3}, idempotency_key="order-7")
    result = client.wait(run, timeout=60)
    again = client.start(diamond, {"x": 3}, idempotency_key="order-7")

    assert result == {"x": 3, "total": 36 + 16 + 18}  # (2x)², 2x+10, 3·2x
    assert client.status(run) is ExecutionStatus.COMPLETED
    assert (again.id, again.replayed) == (run.id, True)


def test_the_client_cancels_and_a_wait_says_why_there_is_no_result(
    conveyor_service: Conveyor,
) -> None:
    client = conveyor.Client(conveyor_service)
    client.apply(slow)
    run = client.start(slow, None, dedupe_key="one-at-a-time")

    with pytest.raises(WaitTimeout, match=r"did not finish within 0.2 s; it goes on running"):
        client.wait(run, timeout=0.2)
    client.cancel(run)

    assert client.status(run) is ExecutionStatus.CANCELLED
    with pytest.raises(ExecutionFailed, match=f"execution {run.id} of 'slow' is cancelled"):
        client.wait(run, timeout=10)


def test_the_async_client_runs_a_flow_to_its_result(conveyor_service: Conveyor) -> None:
    async def main() -> dict[str, float]:
        client = conveyor.AsyncClient(conveyor.Client(conveyor_service))
        await client.apply(diamond)
        run = await client.start(diamond, {"x": 1}, priority=conveyor.Priority.HIGH)
        assert await client.status(run) in (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
        return dict(await client.wait(run, timeout=60))

    assert asyncio.run(main()) == {"x": 1, "total": 4 + 12 + 6}


def test_an_allowed_celery_task_runs_as_a_node_under_conveyors_retries(
    conveyor_service: Conveyor,
) -> None:
    calls.clear()
    client = conveyor.Client(conveyor_service)
    client.apply(billing)

    result = client.run(billing, {"amount": 12.5}, timeout=60)

    assert result == {"charged": 12.5}
    assert calls == [{"amount": 12.5}, {"amount": 12.5}]  # the first failed; Conveyor retried
    assert billing.definition().node("charge").config == {"function": "billing.charge"}


def test_a_celery_task_not_allowed_cannot_run(conveyor_service: Conveyor) -> None:
    # Given a flow naming a Celery task the application never allowed (a name only)
    sneaky = conveyor.Flow("sneaky")
    sneaky.call("billing.refund_everyone", id="refund")
    client = conveyor.Client(conveyor_service)
    client.apply(sneaky)

    # Then its node fails, not retried, naming what to do
    with pytest.raises(ExecutionFailed, match=r"'billing\.refund_everyone' is not registered"):
        client.run(sneaky, None, timeout=60)


def test_the_client_sends_the_event_a_flow_waits_for_and_gets_its_result(
    conveyor_service: Conveyor,
) -> None:
    # Given an order flow waiting for its payment (examples/python/order_payment.py)
    client = conveyor.Client(conveyor_service)
    client.apply(order_payment)
    run = client.start(order_payment, {"order_id": "B-7", "quantity": 3})
    with pytest.raises(WaitTimeout):
        client.wait(run, timeout=0.5)

    # When the application sends the payment's event, and one for another order
    other = client.send_event("payment.confirmed", {"amount": 1}, key="B-8")
    sent = client.send_event("payment.confirmed", {"amount": 14}, key="B-7")

    # Then only this order's wait woke, and the flow's result is charged from the payload
    assert (other.woke, sent.woke) == ([], [run.id])
    assert client.wait(run, timeout=60) == {"charged": 42}
