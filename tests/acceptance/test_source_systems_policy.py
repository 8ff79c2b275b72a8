"""Issue 27, item 2 against real services (real ``celery worker`` processes): a deduplication
key receiving ten updates while its execution is active, under each dedupe policy. keep_first:
the first input wins (the documented behaviour); replace: the run not started yet runs with the
tenth input; follow_up: one follow-up, started when the active run finished, runs with the
tenth; and the CLI's answer. One worker set for all."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from subprocess import Popen
from typing import Any

import pytest

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor, utcnow
from conveyor.store.listing import ExecutionFilter
from tests.acceptance.conftest import await_ready
from tests.acceptance.test_cli import conveyor
from tests.support.services import wait_for


def sync_workflow(name: str, policy: str) -> dict[str, Any]:
    """One node that takes a second to apply the update's value, as a source system's sync."""
    node = {
        "id": "apply", "type": "python", "config": {"function": "test.sleep_add"},
        "inputs": {"a": "{{ input.v }}", "b": 0, "seconds": 1},
    }  # fmt: skip
    return {"name": name, "nodes": [node], "dedupe": {"policy": policy}}


def runs_of(client: Conveyor, key: str) -> list[tuple[uuid.UUID, ExecutionStatus, Any]]:
    """The executions with this dedupe key, oldest first: (id, status, input)."""
    with client.db.transaction() as store:
        rows = store.list_executions(None, where=ExecutionFilter(dedupe_key=key), limit=50)
        return [(e.id, e.status, e.input) for e, _, _ in reversed(rows)]


def sum_of(client: Conveyor, execution_id: uuid.UUID) -> Any:
    finished = wait_for(client, execution_id)
    assert finished.status is ExecutionStatus.COMPLETED, finished.error
    return finished.output["apply"]["sum"] if finished.output else None


def settled(client: Conveyor, key: str, count: int) -> list[tuple[uuid.UUID, ExecutionStatus, Any]]:
    """Wait until ``count`` executions with the key exist and all finished."""
    deadline = time.monotonic() + 60
    while True:
        runs = runs_of(client, key)
        if len(runs) >= count and all(status.finished for _, status, _ in runs):
            return runs
        assert time.monotonic() < deadline, runs
        time.sleep(0.1)


# The broker carries every run here: the same checks on Redis and RabbitMQ
@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_ten_updates_for_an_active_key_under_each_dedupe_policy(
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
    for name, policy in (("first", "keep_first"), ("latest", "replace"), ("each", "follow_up")):
        client.apply(parse_workflow(sync_workflow(name, policy)))

    # keep_first: ten updates, one execution, which runs with the first input
    keep = [client.submit("first", {"v": v}, dedupe_key="doc-k") for v in range(1, 11)]
    # replace: the run waits (run_at in 3 s), and each update replaces its input meanwhile
    run_at = utcnow() + timedelta(seconds=3)
    replace = [client.submit("latest", {"v": 1}, dedupe_key="doc-r", run_at=run_at)]
    replace += [client.submit("latest", {"v": v}, dedupe_key="doc-r") for v in range(2, 11)]
    # follow_up: the first run starts at once; the other nine leave one follow-up
    follow = [client.submit("each", {"v": v}, dedupe_key="doc-f") for v in range(1, 11)]

    assert [m.dedupe for m in keep] == [None] + ["deduplicated"] * 9
    assert len({m.execution_id for m in keep}) == 1
    assert [m.dedupe for m in replace] == [None] + ["replaced"] * 9
    assert len({m.execution_id for m in replace}) == 1
    assert [m.dedupe for m in follow] == [None] + ["follow_up"] * 9
    assert len({m.execution_id for m in follow}) == 1

    # keep_first: the documented behaviour, the first input wins
    assert sum_of(client, keep[0].execution_id) == 1
    assert [run[2] for run in settled(client, "doc-k", 1)] == [{"v": 1}]
    # replace: the run that had not started ran with the tenth input, and only it ran
    assert sum_of(client, replace[0].execution_id) == 10
    assert [run[2] for run in settled(client, "doc-r", 1)] == [{"v": 10}]
    # follow_up: the active run with the first input, then one follow-up with the tenth
    runs = settled(client, "doc-f", 2)
    assert [run[2] for run in runs] == [{"v": 1}, {"v": 10}]
    assert [sum_of(client, run[0]) for run in runs] == [1, 10]

    # The CLI's answer: the id of the active execution, and on stderr what became of the input
    cli = ("run", "latest", "--dedupe-key", "doc-c", "--json")
    first = conveyor(*cli, "-i", '{"v": 1}', "--delay", "600", env=cli_env)
    again = conveyor(*cli[:-1], "-i", '{"v": 2}', env=cli_env)
    assert first.returncode == 0, first.stderr
    execution_id = json.loads(first.stdout)["execution_id"]
    assert (again.returncode, again.stdout.strip()) == (0, execution_id), again.stderr
    assert "replaced" in again.stderr
    assert runs_of(client, "doc-c")[0][2] == {"v": 2}
    client.cancel(uuid.UUID(execution_id))
