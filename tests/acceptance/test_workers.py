"""Real worker processes, one pool per queue, as an operator runs them in production."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from subprocess import Popen

from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, await_ready
from tests.support.services import effects, wait_for


def python_node(node_id: str, function: str, needs: list[str], **inputs: object) -> dict:
    return {
        "id": node_id,
        "type": "python",
        "config": {"function": function},
        "needs": needs,
        "inputs": inputs,
    }


def test_separate_worker_pools_run_a_diamond_with_a_flaky_branch(
    client: Conveyor, start_worker: Callable[..., Popen[str]]
) -> None:
    # Given one pool for planning and one prefork pool for nodes
    await_ready(
        start_worker("workflow-execution", concurrency=1, name="exec", wait=False),
        start_worker("workflow-node", concurrency=3, name="node", wait=False),
    )
    flaky = python_node("shaky", "test.flaky", ["start"], failures=1)
    flaky["retry"] = {"backoff": 0.2, "jitter": 0}
    client.apply(
        parse_workflow(
            {
                "name": "diamond",
                "nodes": [
                    python_node("start", "test.add", [], a="{{ input.x }}", b=1),
                    python_node(
                        "left",
                        "test.sleep_add",
                        ["start"],
                        a="{{ nodes.start.sum }}",
                        b=1,
                        seconds=0.2,
                    ),
                    flaky,
                    python_node(
                        "join",
                        "test.add",
                        ["left", "shaky"],
                        a="{{ nodes.left.sum }}",
                        b="{{ nodes.shaky.succeeded_on }}",
                    ),
                ],
            }
        )
    )

    # When an application triggers it
    execution_id = client.trigger("diamond", {"x": 1})
    row = wait_for(client, execution_id, timeout=60)

    # Then it completes, the flaky node having been retried by the worker's promoter
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"join": {"sum": 5}}
    with client.db.transaction() as store:
        jobs = {j.node_id: (j, a) for j, a in store.execution_jobs(execution_id)}
    assert jobs["shaky"][0].status is JobStatus.COMPLETED and len(jobs["shaky"][1]) == 2
    assert None not in jobs  # a small execution is planned by its trigger: no start job
    assert all(a.worker for _, attempts in jobs.values() for a in attempts)  # run by the pool
    assert [e["node_id"] for e in effects(ACCEPTANCE_DB_URL)].count("join") == 1


def test_sigterm_lets_a_running_node_finish_before_the_worker_exits(
    client: Conveyor, start_worker: Callable[..., Popen[str]]
) -> None:
    # Given a node worker in the middle of a two-second node
    node_worker = start_worker("workflow-node", concurrency=1, name="node", wait=False)
    await_ready(start_worker("workflow-execution", concurrency=1, name="exec", wait=False))
    await_ready(node_worker)
    client.apply(parse_workflow({"name": "long", "nodes": [
        python_node("nap", "test.sleep", [], seconds=2)]}))  # fmt: skip
    execution_id = client.trigger("long")
    deadline = time.monotonic() + 20
    while not _running(client, execution_id):
        assert time.monotonic() < deadline
        time.sleep(0.05)

    # When the operator stops it with SIGTERM (a deploy, a scale-down)
    node_worker.send_signal(signal.SIGTERM)

    # Then the node finishes, its outcome is recorded, and the worker exits cleanly
    assert node_worker.wait(timeout=30) == 0
    done = wait_for(client, execution_id, timeout=5)
    assert done.status is ExecutionStatus.COMPLETED
    assert done.output == {"nap": {"cancelled": False}}


def _running(client: Conveyor, execution_id: object) -> bool:
    with client.db.transaction() as store:
        return any(
            job.status is JobStatus.PROCESSING
            for job, _ in store.execution_jobs(execution_id)  # type: ignore[arg-type]
            if job.node_id
        )
