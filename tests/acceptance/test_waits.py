"""Wait nodes with real `celery worker` processes: every worker SIGKILLed while 200 waits are
pending (and the successors of half of them running or queued), then restarted: every wait
still resumes, each with its own payload, and every execution completes. And the
order-payment example as its comments run it on the embedded default."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from sqlalchemy import func, select

from conveyor.engine.queues import ALL_QUEUES
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Job
from conveyor.service import Conveyor
from tests.acceptance.conftest import await_ready, examples_shell

StartWorker = Callable[..., Popen[str]]
WAITS = 200


def count(client: Conveyor, *where: Any) -> int:
    with client.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).where(*where)) or 0)


def until(check: Callable[[], bool], timeout: float, tick: Callable[[], Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "it did not happen in time"
        if tick is not None:
            tick()
        time.sleep(0.2)


def workers(start_worker: StartWorker, generation: str) -> list[Popen[str]]:
    started = [
        start_worker(",".join(ALL_QUEUES), concurrency=2, name=f"{generation}{i}", wait=False)
        for i in range(2)
    ]
    await_ready(*started)
    return started


@pytest.mark.timeout(400)
def test_every_wait_resumes_after_every_worker_is_killed_and_restarted(
    client: Conveyor, start_worker: StartWorker
) -> None:
    # Given 200 executions, each waiting on its own key, on two workers
    client.apply(parse_workflow({"name": "pay", "nodes": [
        {"id": "wait", "type": "wait", "config": {"event": "paid", "key": "{{ input.order }}"}},
        {"id": "got", "type": "python", "needs": ["wait"], "config": {"function": "test.add"},
         "inputs": {"a": "{{ nodes.wait.n }}", "b": 0}},
    ]}))  # fmt: skip
    first = workers(start_worker, "a")
    ids = {client.trigger("pay", {"order": f"o{i}"}): i for i in range(WAITS)}
    until(lambda: count(client, Job.status == JobStatus.WAITING_EVENT) == WAITS, timeout=120)

    # When half their events come and every worker is killed outright at once after
    half = list(ids.items())[: WAITS // 2]
    for _, i in half:
        assert len(client.send_event("paid", {"n": i}, key=f"o{i}").woke) == 1
    for process in first:
        os.killpg(process.pid, signal.SIGKILL)
    for process in first:
        process.wait()

    # and the rest come while no worker runs, then new workers start
    for _, i in list(ids.items())[WAITS // 2 :]:
        assert len(client.send_event("paid", {"n": i}, key=f"o{i}").woke) == 1
    workers(start_worker, "b")

    # Then (the recovery sweep retrying the successors the kill interrupted) every execution
    # completes, each wait's output its own event's payload
    def recover() -> None:
        client.recover(heartbeat_timeout=5, lost_after=5)

    active = (ExecutionStatus.PENDING, ExecutionStatus.RUNNING)
    until(lambda: count(client, Execution.status.in_(active)) == 0, timeout=240, tick=recover)
    assert count(client, Execution.status == ExecutionStatus.COMPLETED) == WAITS
    with client.db.transaction() as store:
        outputs = {
            execution_id: {n.node_id: n.output for n in store.execution_nodes(execution_id)}
            for execution_id in ids
        }
    assert {ids[e]: o["wait"]["n"] for e, o in outputs.items()} == {i: i for i in range(WAITS)}
    assert {ids[e]: o["got"]["sum"] for e, o in outputs.items()} == {i: i for i in range(WAITS)}
    assert count(client, Job.status == JobStatus.WAITING_EVENT) == 0


@pytest.mark.timeout(240)  # three `conveyor` processes in a row, each importing the CLI
def test_the_order_payment_example_completes_on_the_embedded_default_once_its_event_is_sent(
    tmp_path: Path,
) -> None:
    # Given a fresh directory with the examples, no CONVEYOR_* settings but the demo's nodes
    shell = examples_shell(tmp_path)

    # When the order runs as the example's comments say: it comes to its wait and returns
    run = shell(
        "conveyor run examples/order-payment.yaml "
        '--input "$(cat examples/order-payment.input.json)" --json'
    )
    assert run.returncode == 0, run.stdout + run.stderr
    started = json.loads(run.stdout)
    assert started["status"] == "running" and "waits for an event" in run.stderr

    # and its payment event is sent
    sent = shell(
        "conveyor events send payment.confirmed --key A-1001 --payload '{\"amount\": 42}' --json"
    )

    # Then the wait woke and the order completed, charged twice the amount (quantity 2)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    told = json.loads(sent.stdout)
    assert told["woke"] == [started["execution_id"]]
    assert told["statuses"] == {started["execution_id"]: "completed"}
    shown = shell(f"conveyor executions show {started['execution_id']} --json")
    view = json.loads(shown.stdout)
    assert view["output"] == {"charged": 84}
    assert {n["id"]: n["status"] for n in view["nodes"]} == {
        "payment": "completed", "charge": "completed", "remind": "skipped",
    }  # fmt: skip
