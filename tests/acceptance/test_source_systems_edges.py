"""Issue 27, items 3 and 4 against real services (real ``celery worker`` processes): a trigger
that starts at its ``run_at``, one cancelled before its time, a dead letter requeued for later;
per-trigger limits overriding the definition's. One worker set for every check."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from subprocess import Popen
from typing import Any

import pytest

from conveyor import views
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor, utcnow
from tests.acceptance.conftest import await_ready
from tests.acceptance.test_cli import conveyor
from tests.support.services import wait_for


def python_node(node_id: str, function: str, **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": function}, **fields}


def view(client: Conveyor, execution_id: uuid.UUID) -> views.ExecutionJson:
    with client.db.transaction() as store:
        return views.execution_view(store, execution_id)


def first_try_started(client: Conveyor, execution_id: uuid.UUID, node_id: str) -> datetime:
    (job,) = [j for j in view(client, execution_id)["jobs"] if j["node"] == node_id]
    return datetime.fromisoformat(job["attempts"][0]["started_at"])


def wait_status(client: Conveyor, execution_id: uuid.UUID, status: str) -> None:
    deadline = time.monotonic() + 30
    while (now := view(client, execution_id)["status"]) != status:
        assert time.monotonic() < deadline, f"still {now}, not {status}"
        time.sleep(0.05)


# The broker carries every run here: the same checks on Redis and RabbitMQ
@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_delays_at_the_edges_and_per_trigger_limits_on_real_workers(
    client: Conveyor,
    start_worker: Callable[..., Popen[str]],
    acceptance_env: dict[str, str],
    acceptance_broker: str,
) -> None:
    cli_env = {**acceptance_env, "CONVEYOR_BROKER_URL": acceptance_broker}  # the workers' broker
    await_ready(
        start_worker("workflow-execution", concurrency=1, name="exec", wait=False),
        start_worker("workflow-node", concurrency=2, name="node", wait=False),
    )
    client.apply(parse_workflow({"name": "later", "nodes": [
        python_node("add", "test.add", inputs={"a": "{{ input.a }}", "b": 1}),
    ]}))  # fmt: skip
    client.apply(parse_workflow({"name": "once", "nodes": [
        python_node("first", "test.fails_first_run"),
    ]}))  # fmt: skip
    # succeeds on its third attempt, which the definition's default policy (3) allows
    client.apply(parse_workflow({"name": "flaky", "nodes": [python_node(
        "shaky", "test.flaky", inputs={"failures": 2}, retry={"backoff": 0.05, "jitter": 0},
    )]}))  # fmt: skip
    # per-trigger limits, triggered first so that they run beside the checks below
    limited = client.trigger("flaky", max_attempts=2)
    default = client.trigger("flaky")

    # A trigger with run_at: stored at once, pending, its start time shown; it starts then
    run_at = utcnow() + timedelta(seconds=2)
    execution_id = client.trigger("later", {"a": 41}, run_at=run_at)
    shown = view(client, execution_id)
    assert (shown["status"], shown["scheduled_for"]) == ("pending", run_at.isoformat())
    # and another, cancelled before its time, never starts
    cancelled = client.trigger("later", {"a": 1}, delay=1.0)
    client.cancel(cancelled)

    finished = wait_for(client, execution_id)

    assert finished.status is ExecutionStatus.COMPLETED
    assert [n["output"] for n in view(client, execution_id)["nodes"]] == [{"sum": 42}]
    started = first_try_started(client, execution_id, "add")
    # the acceptance criterion: never before run_at, and within a second of it
    assert run_at <= started < run_at + timedelta(seconds=1), started - run_at
    time.sleep(0.5)  # past the cancelled one's time, promoted at 0.05 s intervals
    cancelled_view = view(client, cancelled)
    assert cancelled_view["status"] == "cancelled"
    assert [j["status"] for j in cancelled_view["jobs"]] == ["cancelled"]
    assert [j["attempts"] for j in cancelled_view["jobs"]] == [[]]

    # A dead letter requeued for later: its job waits until then, and the execution completes
    dead = client.trigger("once")
    wait_status(client, dead, "failed")
    (job,) = view(client, dead)["jobs"]
    resume_at = utcnow() + timedelta(seconds=1)
    assert client.requeue_dead_letters([uuid.UUID(job["id"])], run_at=resume_at) == {
        uuid.UUID(job["id"]): None
    }
    (waiting,) = view(client, dead)["jobs"]
    assert (waiting["status"], waiting["next_run_at"]) == ("scheduled", resume_at.isoformat())
    assert wait_for(client, dead).status is ExecutionStatus.COMPLETED
    (done,) = view(client, dead)["jobs"]
    assert datetime.fromisoformat(done["attempts"][1]["started_at"]) >= resume_at

    # Per-trigger limits: max_attempts=2 given at trigger time dead-letters the node that the
    # definition's three attempts let succeed
    assert wait_for(client, limited).status is ExecutionStatus.FAILED
    assert wait_for(client, default).status is ExecutionStatus.COMPLETED
    (dead_job,) = view(client, limited)["jobs"]
    assert (dead_job["status"], len(dead_job["attempts"])) == ("dead_letter", 2)
    assert "all 2 attempt(s) failed" in (dead_job["last_error"] or "")
    assert view(client, limited)["max_attempts"] == 2
    (done_job,) = view(client, default)["jobs"]
    assert (done_job["status"], len(done_job["attempts"])) == ("completed", 3)

    # The CLI: conveyor run --delay, its start time in executions show
    ran = conveyor("run", "later", "--input", '{"a": 1}', "--delay", "600", env=cli_env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    shown_cli = conveyor("executions", "show", ran.stdout.strip(), env=cli_env)
    assert "scheduled for" in shown_cli.stdout and "pending" in shown_cli.stdout, shown_cli
    client.cancel(uuid.UUID(ran.stdout.strip()))
