"""Recovery after a broker outage is proportionate (real PostgreSQL and Redis, no worker): a job
whose message or limiter line was lost is re-sent once a lapse by one of the processes that
sweep, not by every process at every sweep. The jobs here are parked or queued rows of a
database of this file's own (an in-process worker's sweeps would otherwise claim them too);
what each "process" publishes is recorded instead of sent."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest
import redis
from sqlalchemy import update

from conveyor.engine import triggering
from conveyor.engine.limits import Limits
from conveyor.engine.records import Dispatch
from conveyor.engine.states import JobStatus, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.limiter import RedisLimiter
from conveyor.limiter.gate import Gate
from conveyor.models import Job
from conveyor.service import Conveyor, utcnow
from conveyor.store import Database
from tests.conftest import PG_ADMIN_URL, REDIS_URL, RUN_ID
from tests.support import services

RESEND_DB = f"conveyor_resend_{RUN_ID}"
RESEND_DB_URL = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + RESEND_DB
PROCESSES = 4
WIDTH = 12


class Recorded:
    """A dispatcher that keeps what it was asked to publish: one sweeping process's output."""

    def __init__(self) -> None:
        self.sent: list[Dispatch] = []
        self._lock = threading.Lock()

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        with self._lock:
            self.sent.extend(dispatches)


@pytest.fixture(scope="module")
def resend_db() -> Iterator[Database]:
    services.create_database(PG_ADMIN_URL, RESEND_DB)
    services.prepare_schema(RESEND_DB_URL)
    database = Database(RESEND_DB_URL)
    yield database
    database.dispose()
    services.drop_database(PG_ADMIN_URL, RESEND_DB)


@pytest.fixture
def db(resend_db: Database) -> Database:
    services.truncate(RESEND_DB_URL)
    return resend_db


@pytest.fixture
def empty_limiter() -> Iterator[RedisLimiter]:
    """A limiter on keys of its own that knows nothing: Redis came back empty."""
    client = redis.Redis.from_url(REDIS_URL)
    yield RedisLimiter(client, prefix=f"conveyor:resend-test:{uuid.uuid4().hex}")
    client.close()


def waiting_jobs(db: Database, status: JobStatus, width: int = WIDTH) -> list[uuid.UUID]:
    """A fan-out's node jobs, committed and then left ``status`` with no message anywhere."""
    nodes = [{"id": f"n{i}", "type": "python", "config": {"function": "test.sleep_add"},
              "inputs": {"a": 1, "b": 2, "seconds": 0}} for i in range(width)]  # fmt: skip
    service = Conveyor(db, Recorded())
    service.apply(parse_workflow({"name": "wide", "nodes": nodes}))
    made = db.run(
        lambda s: triggering.trigger(s, workflow_name="wide", tenant="default", input={},
                                 now=utcnow(), source=TriggerSource.API)
    )  # fmt: skip
    job_ids = [d.job_id for d in made.dispatches]
    with db.transaction() as store:
        store.session.execute(
            update(Job)
            .where(Job.id.in_(job_ids))
            .values(status=status, enqueued_at=utcnow() - timedelta(minutes=5))
        )
    return job_ids


def gate(db: Database, limiter: RedisLimiter, out: Recorded, resend_after: float) -> Gate:
    return Gate(
        db,
        limiter,
        defaults=Limits(global_=100, tenant=10, workflow=5),
        lease=30,
        publish=out.publish,
        resend_after=resend_after,
    )


def sent_ids(processes: Sequence[Recorded]) -> list[uuid.UUID]:
    return [d.job_id for p in processes for d in p.sent]


def age_resends(db: Database, seconds: float) -> None:
    with db.transaction() as store:
        store.session.execute(update(Job).values(resent_at=utcnow() - timedelta(seconds=seconds)))


def test_parked_jobs_a_flushed_limiter_lost_are_resent_once_among_all_sweeping_processes(
    db: Database, empty_limiter: RedisLimiter
) -> None:
    # Given parked jobs Redis no longer knows, and four worker processes sweeping at once
    parked = waiting_jobs(db, JobStatus.PARKED)
    outs = [Recorded() for _ in range(PROCESSES)]
    gates = [gate(db, empty_limiter, out, resend_after=60) for out in outs]
    go = threading.Barrier(PROCESSES)

    def sweep_often(g: Gate) -> None:
        go.wait()
        for _ in range(5):  # as a duty that found work runs again at once
            g.sweep(age_after=300)

    # When each sweeps five times, all together
    threads = [threading.Thread(target=sweep_often, args=(g,)) for g in gates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    # Then each parked job was re-sent exactly once, by one process or another
    assert sorted(sent_ids(outs)) == sorted(parked)
    with db.transaction() as store:
        assert store.recovery_counts()["lost_parked"] == WIDTH


def test_a_parked_job_still_lost_after_the_lapse_is_resent_once_more(
    db: Database, empty_limiter: RedisLimiter
) -> None:
    # Given parked jobs re-sent once, whose messages never arrived
    parked = waiting_jobs(db, JobStatus.PARKED)
    outs = [Recorded() for _ in range(2)]
    gates = [gate(db, empty_limiter, out, resend_after=60) for out in outs]
    gates[0].sweep(age_after=300)

    # When sweeps run within the lapse, and then once it has passed
    gates[1].sweep(age_after=300)
    within = len(sent_ids(outs))
    age_resends(db, 61)
    gates[1].sweep(age_after=300)
    gates[0].sweep(age_after=300)

    # Then nothing more within the lapse, and each job once more after it
    assert within == WIDTH
    assert sorted(sent_ids(outs)) == sorted(parked + parked)


def test_parked_jobs_are_not_resent_while_the_node_queue_may_still_hold_their_messages(
    db: Database, empty_limiter: RedisLimiter
) -> None:
    # Given parked jobs the limiter lost, and a broker whose node queue holds their messages
    parked = waiting_jobs(db, JobStatus.PARKED)
    out = Recorded()
    g = gate(db, empty_limiter, out, resend_after=0.001)
    holds = {"workflow-node": WIDTH}
    g.broker_holds = lambda: holds

    # When the sweep runs while the messages wait, and again once they were taken and lost
    g.sweep(age_after=300)
    waiting = list(out.sent)
    holds = {"workflow-node": WIDTH - 1}
    g.sweep(age_after=300)

    # Then nothing is re-sent while they may be waiting; each once when they cannot be
    assert waiting == []
    assert sorted(sent_ids([out])) == sorted(parked)


def test_a_parked_job_the_limiter_knows_is_never_resent(
    db: Database, empty_limiter: RedisLimiter
) -> None:
    # Given parked jobs that really wait in the limiter's lines (their permits refused)
    parked = waiting_jobs(db, JobStatus.PARKED, width=3)
    out = Recorded()
    g = gate(db, empty_limiter, out, resend_after=0.001)
    g.defaults = Limits(global_=100, tenant=10, workflow=1)
    assert g.admit(parked[0]) is not None  # the one permit, held by a job now running
    with db.transaction() as store:
        store.session.execute(
            update(Job).where(Job.id == parked[0]).values(status=JobStatus.PROCESSING)
        )
    assert [g.admit(j) for j in parked[1:]] == [None, None]

    # When the sweep runs, again and again, with a lapse of a millisecond
    for _ in range(3):
        g.sweep(age_after=300)

    # Then the jobs waiting in line are not re-sent: their line still holds them
    assert out.sent == []


def test_claims_on_the_same_jobs_at_once_give_each_job_to_one_claimant(db: Database) -> None:
    parked = waiting_jobs(db, JobStatus.PARKED, width=40)
    won: list[set[uuid.UUID]] = []
    go = threading.Barrier(PROCESSES)
    now = utcnow()

    def claim() -> None:
        go.wait()
        mine = db.run(
            lambda s: s.claim_resend(parked, JobStatus.PARKED, now, now - timedelta(seconds=60))
        )
        won.append(mine)

    threads = [threading.Thread(target=claim) for _ in range(PROCESSES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert sum(len(w) for w in won) == len(parked)
    assert set().union(*won) == set(parked)


def test_a_job_that_moved_on_is_not_claimed_for_a_resend(db: Database) -> None:
    # Given jobs taken for lost while parked, that a worker has since claimed
    jobs = waiting_jobs(db, JobStatus.PROCESSING, width=2)
    now = utcnow()

    claimed = db.run(
        lambda s: s.claim_resend(jobs, JobStatus.PARKED, now, now - timedelta(seconds=60))
    )

    assert claimed == set()


def test_lost_queued_messages_are_resent_once_a_lapse_however_many_recovery_sweeps_run(
    db: Database,
) -> None:
    # Given queued jobs whose messages an emptied broker lost, and two processes' sweeps
    queued = waiting_jobs(db, JobStatus.QUEUED)
    outs = [Recorded() for _ in range(2)]
    services_ = [Conveyor(db, out) for out in outs]

    def sweep(service: Conveyor) -> dict[str, int]:
        return service.recover(heartbeat_timeout=60, lost_after=60, broker_holds=dict)

    # When both sweep, twice each, within the lapse; and again once the lapse has passed
    done = [sweep(s) for s in services_ + services_]
    within = sorted(sent_ids(outs))
    age_resends(db, 61)
    later = [sweep(s) for s in services_]

    # Then each lost message was re-sent once within the lapse, and once after it
    assert within == sorted(queued)
    assert [d["republished"] for d in done] == [WIDTH, 0, 0, 0]
    assert [d["republished"] for d in later] == [WIDTH, 0]
    with db.transaction() as store:
        assert store.recovery_counts()["republished"] == 2 * WIDTH
