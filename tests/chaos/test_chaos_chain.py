"""Long chains while node workers are SIGKILLed or restarted with SIGTERM, the broker is
flushed, or PostgreSQL restarts: 20 chains of 50 steps, continuations on (a worker claims the
step its success made ready and runs it next, no message: CONVEYOR_CONTINUE_STEPS) and off
(every step published). Every chain completes and every step's effect (``chaos_effects``,
keyed by ``ctx.idempotency_key``, a re-run counted in ``runs``) exists exactly once, and no
permit is left held (docs/guarantees.md#continuations).

A continuation is a claim made in its predecessor's success's transaction: a worker killed
while it runs one, or before it starts it, leaves a processing job whose heartbeat stops, for
the heartbeat reclaim, exactly as a job claimed from a message; a flushed broker loses no
continuation (it has no message), and a PostgreSQL restart rolls back a success and its
claim together.

The SIGKILL scenario runs on RabbitMQ too, with continuations off (every step a message: the
broker carries the whole chain) and fewer chains (the Redis runs keep the volume). The flushed
broker's RabbitMQ twin is the purged queue of tests/acceptance/test_rabbitmq_faults.py."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.chaos.conftest import CHAOS_DB_URL, CHAOS_REDIS, Spawn, processes
from tests.chaos.test_chaos import (
    AMQP_KILLS,
    Cluster,
    _assert_no_permit_held,
    _unfinished,
    restart_postgresql,
)

pytestmark = pytest.mark.timeout(420)

CHAINS = 20
AMQP_CHAINS = 8
STEPS = 50
STEP_SECONDS = 0.02


def long_chain() -> dict:
    return {
        "name": "long_chain",
        "concurrency": 50,
        "defaults": {"retry": {"max_attempts": 10, "backoff": 0.2, "jitter": 0.1}},
        "nodes": [
            {"id": f"s{i}", "type": "python", "config": {"function": "test.chaos_effect"},
             "needs": [f"s{i - 1}"] if i else [], "inputs": {"seconds": STEP_SECONDS}}
            for i in range(STEPS)
        ],
    }  # fmt: skip


@pytest.fixture(params=["16", "0"], ids=["continuations-on", "continuations-off"])
def chain_spawn(request: pytest.FixtureRequest, chaos_env: dict[str, str], chaos_broker: str,
                tmp_path: Path) -> Iterator[Spawn]:  # fmt: skip
    """Workers on the scenario's broker with continuations on (16 steps in a row at most) or
    off."""
    env = {**chaos_env, "CONVEYOR_BROKER_URL": chaos_broker,
           "CONVEYOR_CONTINUE_STEPS": request.param}  # fmt: skip
    with processes(env, tmp_path) as spawn:
        yield spawn


def start_chains(client: Conveyor, chains: int = CHAINS) -> list[uuid.UUID]:
    client.apply(parse_workflow(long_chain()))
    return [client.trigger("long_chain", {"n": i}) for i in range(chains)]


def assert_each_step_once(client: Conveyor, ids: list[uuid.UUID]) -> None:
    deadline = time.monotonic() + 240
    while (unfinished := _unfinished(client, ids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not unfinished, f"{len(unfinished)} chains unfinished, e.g. {unfinished[:3]}"
    with client.db.transaction() as store:
        assert {store.execution(i).status for i in ids} == {ExecutionStatus.COMPLETED}
    engine = create_engine(CHAOS_DB_URL)
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT key FROM chaos_effects")).scalars().all()
    engine.dispose()
    assert set(keys) == {f"{i}:s{n}" for i in ids for n in range(STEPS)}
    assert len(keys) == len(ids) * STEPS
    _assert_no_permit_held()


@pytest.mark.parametrize(
    ("chaos_broker", "chain_spawn"),
    [("redis", "16"), ("redis", "0"), ("amqp", "0")],
    ids=["continuations-on", "continuations-off", "amqp-continuations-off"],
    indirect=True,
)
def test_long_chains_lose_nothing_when_node_workers_are_sigkilled(
    chaos_client: Conveyor, chain_spawn: Spawn, chaos_broker: str
) -> None:
    on_redis = chaos_broker == CHAOS_REDIS
    cluster = Cluster(chain_spawn)
    ids = start_chains(chaos_client, CHAINS if on_redis else AMQP_CHAINS)

    # mid-chain: a worker killed outright, pool and all, another started
    for _ in range(4 if on_redis else AMQP_KILLS):
        time.sleep(1.5)
        cluster.replace(cluster.nodes[0], signal.SIGKILL)

    assert_each_step_once(chaos_client, ids)


def test_long_chains_lose_nothing_across_sigterm_restarts(
    chaos_client: Conveyor, chain_spawn: Spawn
) -> None:
    cluster = Cluster(chain_spawn)
    ids = start_chains(chaos_client)

    for _ in range(3):  # warm shutdowns, as a deploy does them, mid-chain
        time.sleep(1.0)
        cluster.replace(cluster.nodes[0], signal.SIGTERM)

    assert_each_step_once(chaos_client, ids)


def test_long_chains_lose_nothing_when_the_broker_is_flushed(
    chaos_client: Conveyor, chain_spawn: Spawn
) -> None:
    Cluster(chain_spawn)
    ids = start_chains(chaos_client)
    client = redis.Redis.from_url(CHAOS_REDIS)

    time.sleep(1.0)
    client.flushdb()  # every waiting and reserved message, and every permit: gone
    client.close()

    assert_each_step_once(chaos_client, ids)


@pytest.mark.alone  # restarts the PostgreSQL every tier uses
def test_long_chains_lose_nothing_across_a_postgresql_restart(
    chaos_client: Conveyor, chain_spawn: Spawn
) -> None:
    Cluster(chain_spawn)
    ids = start_chains(chaos_client)

    time.sleep(1.5)  # mid-chain: every connection of every process is cut
    restart_postgresql()

    assert_each_step_once(chaos_client, ids)
