"""Continuations with real `celery worker` processes: the node worker running chains (each
step claimed by the worker whose success made it ready, and run next without a message) is
SIGKILLed mid-chain, then a new one starts: every step's effect exists exactly once, and
every chain completes (docs/guarantees.md#continuations)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from subprocess import Popen

import pytest

from conveyor.engine.states import AttemptStatus, ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, await_ready
from tests.support.services import effects

StartWorker = Callable[..., Popen[str]]
CHAINS = 4
STEPS = 50
FAST = {"CONVEYOR_HEARTBEAT_INTERVAL": "0.3", "CONVEYOR_CONTINUE_STEPS": "16"}


def chain() -> dict:
    """``STEPS`` nodes in a line, each recording its effect (a row a run) as it runs."""
    return {
        "name": "long",
        "defaults": {"retry": {"max_attempts": 5, "backoff": 0.1, "jitter": 0.0}},
        "nodes": [
            {"id": f"s{i}", "type": "python", "config": {"function": "test.sleep_add"},
             "needs": [f"s{i - 1}"] if i else [], "inputs": {"a": i, "b": 0, "seconds": 0.02}}
            for i in range(STEPS)
        ],
    }  # fmt: skip


def unfinished(client: Conveyor, ids: list) -> list:
    with client.db.transaction() as store:
        return [i for i in ids if not store.execution(i).status.finished]


@pytest.mark.timeout(240)
def test_a_worker_sigkilled_mid_chain_leaves_each_steps_effect_exactly_once(
    client: Conveyor, start_worker: StartWorker
) -> None:
    # Given chains of 50 running on one node worker, which continues from step to step
    plan = start_worker("workflow-execution", concurrency=1, name="plan", env=FAST, wait=False)
    doomed = start_worker("workflow-node", concurrency=2, name="doomed", env=FAST, wait=False)
    await_ready(plan, doomed)
    client.apply(parse_workflow(chain()))
    ids = [client.trigger("long", {}) for _ in range(CHAINS)]

    # When it is killed outright, pool and all, mid-chain
    deadline = time.monotonic() + 60
    while len(effects(ACCEPTANCE_DB_URL)) < CHAINS * STEPS // 4:
        assert time.monotonic() < deadline, "the chains did not get going"
        time.sleep(0.05)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    with client.db.transaction() as store:
        claimed = [
            job for i in ids for job, _ in store.execution_jobs(i)
            if job.status is JobStatus.PROCESSING
        ]  # fmt: skip
    assert claimed, "no step was claimed when the worker died"

    # and a new worker starts, the recovery sweep reclaiming what the dead one held
    start_worker("workflow-node", concurrency=2, name="heir", env=FAST)
    deadline = time.monotonic() + 180
    while unfinished(client, ids):
        assert time.monotonic() < deadline, unfinished(client, ids)
        client.recover(heartbeat_timeout=2, lost_after=2)
        time.sleep(0.3)

    # Then every chain completed, every step's effect exists once per execution (keyed by
    # its idempotency key: a step the kill interrupted ran again, under the same key), and
    # each step's job completed with exactly one succeeded try
    with client.db.transaction() as store:
        assert {store.execution(i).status for i in ids} == {ExecutionStatus.COMPLETED}
        pairs = [pair for i in ids for pair in store.execution_jobs(i) if pair[0].node_id]
    keys = Counter(e["idempotency_key"] for e in effects(ACCEPTANCE_DB_URL))
    assert set(keys) == {f"{i}:s{n}" for i in ids for n in range(STEPS)}
    assert sum(keys.values()) - len(keys) <= len(claimed)  # re-runs: only the interrupted
    assert len(pairs) == CHAINS * STEPS
    for job, attempts in pairs:
        assert job.status is JobStatus.COMPLETED, job
        assert [a.status for a in attempts].count(AttemptStatus.SUCCEEDED) == 1, job
