"""A trigger announces its root jobs before its commit (store.hot.Driver.rows_announced),
against real PostgreSQL and Redis: the message goes out while the execution's statement runs,
a worker that finds the job missing waits for the commit and then claims it (or parks it),
nothing is stored when the message cannot be published, and a worker gives up on a trigger
that holds its lock too long (the recovery sweep's case)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from conveyor.engine import runner
from conveyor.engine.limits import Limits, PermitRequest
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobStatus, Priority
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import DispatchError
from conveyor.limiter import RedisLimiter
from conveyor.models import Execution, Job
from conveyor.service import Conveyor, utcnow
from conveyor.store import Database, core, hot
from tests.conftest import REDIS_URL

ONE = {"name": "one", "nodes": [{"id": "n", "type": "python", "config": {"function": "test.add"},
                                 "inputs": {"a": 1, "b": 2}}]}  # fmt: skip


class Probe:
    """A dispatcher that runs ``on_publish`` with what it is given, where a broker would take
    the messages: the test plays the worker that receives them."""

    def __init__(self, on_publish: Callable[[Sequence[Dispatch]], None]) -> None:
        self.on_publish = on_publish
        self.published: list[Dispatch] = []

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        self.on_publish(dispatches)
        self.published.extend(dispatches)


class Behind(threading.Thread):
    """Worker-side work started from inside the publish, on a database of its own."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.ended_at = time.monotonic()


@pytest.fixture
def worker_db(conveyor_service: Conveyor, database_url: str) -> Iterator[Database]:
    db = Database(database_url)
    yield db
    db.dispose()


def visible(service: Conveyor, job_id: uuid.UUID) -> bool:
    with service.db.transaction() as store:
        return store.session.get(Job, job_id) is not None


def executions(service: Conveyor) -> int:
    with service.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).select_from(Execution)) or 0)


def test_the_message_goes_out_before_the_commit_and_a_worker_that_finds_the_job_waits(
    conveyor_service: Conveyor, worker_db: Database
) -> None:
    conveyor_service.apply(parse_workflow(ONE))
    seen: dict[str, Any] = {}

    def on_publish(dispatches: Sequence[Dispatch]) -> None:
        (d,) = dispatches
        seen["visible"] = visible(conveyor_service, d.job_id)
        claim = Behind(
            lambda: worker_db.autocommit(
                lambda s: runner.claim_node(s, d.job_id, utcnow(), "probe", d.hints)
            )
        )
        claim.start()
        time.sleep(0.3)
        seen["claim"], seen["waited"] = claim, claim.is_alive()
        seen["committing"] = time.monotonic()

    probe = Probe(on_publish)
    made = Conveyor(conveyor_service.db, probe).trigger("one")

    claim = seen["claim"]
    claim.join(10)
    assert seen["visible"] is False  # published before the commit
    assert seen["waited"] is True  # the claim waited for it
    assert claim.error is None and claim.result is not None
    assert claim.result.execution.id == made and claim.ended_at >= seen["committing"]
    assert len(probe.published) == 1  # and nothing published again after the commit


def test_a_trigger_whose_message_cannot_be_published_stores_nothing(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(ONE))
    before = executions(conveyor_service)

    def down(dispatches: Sequence[Dispatch]) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(DispatchError, match=r"not stored.*broker down"):
        Conveyor(conveyor_service.db, Probe(down)).trigger("one")

    assert executions(conveyor_service) == before
    # and the connection it ran on is fit for the next trigger
    assert Conveyor(conveyor_service.db, Probe(lambda d: None)).trigger("one")
    assert executions(conveyor_service) == before + 1


def test_a_worker_refused_a_permit_parks_the_announced_job_once_it_is_committed(
    conveyor_service: Conveyor, worker_db: Database
) -> None:
    # A worker whose limiter has the one global permit taken: the job must be read and parked
    conveyor_service.apply(parse_workflow(ONE))
    client = redis.Redis.from_url(REDIS_URL)
    limiter = RedisLimiter(client, lease=30, prefix=f"test:announce:{uuid.uuid4().hex[:6]}")
    tight = Limits(global_=1, tenant=10, workflow=10)
    worker = Conveyor(worker_db, Probe(lambda d: None), limiter=limiter, limits=tight, lease=30)
    taken = limiter.acquire(
        PermitRequest(
            job_id=uuid.uuid4(), tenant_id=uuid.uuid4(), workflow_name="other",
            priority=Priority.NORMAL, limits=tight, enqueued_at_ms=0,
        )
    )  # fmt: skip
    assert taken.permit is not None
    seen: dict[str, Any] = {}

    def on_publish(dispatches: Sequence[Dispatch]) -> None:
        (d,) = dispatches
        seen["job"] = d.job_id
        seen["admit"] = admit = Behind(lambda: worker.run_node(d.job_id, d.hints))
        admit.start()
        time.sleep(0.2)

    Conveyor(conveyor_service.db, Probe(on_publish)).trigger("one")

    seen["admit"].join(10)
    assert seen["admit"].error is None
    with conveyor_service.db.transaction() as store:
        job = store.session.get(Job, seen["job"])
        assert job is not None and job.status is JobStatus.PARKED
    limiter.release(taken.permit)
    client.close()


def test_a_worker_gives_up_on_a_trigger_that_holds_its_lock_too_long(
    conveyor_service: Conveyor,
    worker_db: Database,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(core, "ANNOUNCE_WAIT", 0.2)
    conveyor_service.apply(parse_workflow(ONE))
    seen: dict[str, Any] = {}

    def slow(dispatches: Sequence[Dispatch]) -> None:
        (d,) = dispatches
        seen["job"] = d.job_id
        seen["claim"] = claim = Behind(
            lambda: worker_db.autocommit(
                lambda s: runner.claim_node(s, d.job_id, utcnow(), "probe", d.hints)
            )
        )
        claim.start()
        claim.join(5)  # the publish takes longer than the worker waits

    with caplog.at_level(logging.WARNING, logger="conveyor.store.core"):
        Conveyor(conveyor_service.db, Probe(slow)).trigger("one")

    claim = seen["claim"]
    assert not claim.is_alive() and claim.error is None and claim.result is None
    assert "had not committed after" in caplog.text
    with conveyor_service.db.transaction() as store:
        job = store.session.get(Job, seen["job"])
        assert job is not None and job.status is JobStatus.QUEUED  # the sweep's to re-publish


def test_announce_keys_are_32_bit_signed_and_spread_by_the_ids_random_bits() -> None:
    from conveyor.ids import new_id

    keys = {hot.announce_key(new_id()) for _ in range(1000)}
    assert len(keys) == 1000
    assert all(-(2**31) <= k < 2**31 for k in keys)
    assert hot.announce_key(uuid.UUID(int=0xFFFFFFFF)) == -1
