"""The hot path's statements on the driver's connection (store.postgres_statements), against
real PostgreSQL: errors come out as SQLAlchemy's with the parameters hidden, a connection lost
under them is replaced and the work run again, the connection is kept between uses and goes
back to transactions when handed back, and the statements keep to indexes as the tables grow."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DataError, DBAPIError

from conveyor.engine import triggering
from conveyor.engine.records import Dispatch
from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor, utcnow
from conveyor.store import Database
from conveyor.store import postgres_statements as hot
from tests.conftest import PG_ADMIN_URL, TEST_DB
from tests.support import services

ONE = {"name": "one", "nodes": [{"id": "n", "type": "python", "config": {"function": "test.add"},
                                 "inputs": {"a": 1, "b": 2}}]}  # fmt: skip
APP = "conveyor-hot-path-test"


class Held:
    """A dispatcher that keeps what it is given: the test runs the jobs itself."""

    def __init__(self) -> None:
        self.dispatches: list[Dispatch] = []

    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        self.dispatches.extend(dispatches)


@pytest.fixture
def own(conveyor_service: Conveyor, database_url: str) -> Iterator[Conveyor]:
    """A service over its own engine (named, so that its connections can be found) and a
    dispatcher that publishes nothing."""
    db = Database(f"{database_url}?application_name={APP}")
    service = Conveyor(db, Held())
    service.apply(parse_workflow(ONE))
    yield service
    db.dispose()


def run_all(service: Conveyor) -> None:
    held = service.dispatcher
    assert isinstance(held, Held)
    while held.dispatches:
        service.run_node(held.dispatches.pop().job_id)


def status(service: Conveyor, execution_id: uuid.UUID) -> ExecutionStatus | None:
    with service.db.transaction() as store:
        return store.execution_status(execution_id)


def test_a_connection_lost_under_the_hot_path_is_replaced_and_the_work_run_again(
    own: Conveyor, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    own.trigger("one")
    run_all(own)  # the pool now holds used connections
    admin = create_engine(database_url)
    with admin.begin() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :app"
            ),
            {"app": APP},
        ).scalar()
    admin.dispose()
    assert killed and killed >= 1

    with caplog.at_level(logging.WARNING, logger="conveyor.store.unit_of_work"):
        execution_id = own.trigger("one")  # its statement fails once, then runs again
        run_all(own)

    assert status(own, execution_id) == ExecutionStatus.COMPLETED
    assert any("retrying" in r.getMessage() for r in caplog.records), caplog.text


def test_a_database_error_is_sqlalchemy_s_and_does_not_show_the_parameters(
    own: Conveyor,
) -> None:
    secret = "do-not-log-me"  # a node's output, say: data the logs must not carry

    def bad(store: object) -> object:
        driver = store._driver  # type: ignore[attr-defined]
        return driver.rows(
            hot.COMPLETE_NODE,
            {"id": uuid.uuid4(), "execution_id": uuid.uuid4(), "node_id": "n",
             "attempt": 2**40, "output": {"k": secret}, "branch": None, "now": utcnow(),
             "duration": 0.0},
        )  # fmt: skip

    with pytest.raises(DBAPIError) as raised:
        own.db.autocommit(bad)

    assert isinstance(raised.value, DataError), type(raised.value)  # the caller's catch
    assert raised.value.orig is not None and raised.value.orig.sqlstate is not None  # type: ignore[attr-defined]
    assert secret not in str(raised.value)


def test_the_pooled_connection_goes_back_to_transactions(own: Conveyor) -> None:
    own.trigger("one")  # the process knows the workflow: the next trigger is one statement
    own.db.dispose()
    own.db.autocommit(lambda s: triggering.trigger(s, workflow_name="one", tenant="default",
                                               input={}, now=utcnow()))  # fmt: skip
    assert own.db.engine.pool.checkedin() == 0  # type: ignore[attr-defined]  # kept
    own.db.put_back_kept()
    assert own.db.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    # The transaction below is on the connection the trigger ran on.

    with pytest.raises(RuntimeError), own.db.transaction() as store:
        store.create_tenant("rolled-back")
        raise RuntimeError("roll it back")

    with own.db.transaction() as store:
        assert "rolled-back" not in store.tenant_names()


def test_a_connection_already_gone_fails_as_sqlalchemy_s_and_is_reported_lost(
    own: Conveyor, database_url: str
) -> None:
    connection = psycopg.connect(database_url.replace("postgresql+psycopg", "postgresql"))
    connection.close()
    reported: list[BaseException] = []
    driver = hot.Driver(connection, own.db.engine.dialect, reported.append)

    with pytest.raises(DBAPIError) as raised:
        driver.set_autocommit(True)

    assert raised.value.connection_invalidated and len(reported) == 1


HOT_TABLES = ("executions", "jobs", "job_attempts", "node_states")


@pytest.fixture
def alone(database_url: str) -> Iterator[tuple[Conveyor, str]]:
    """A service on a database of its own, which no worker's maintenance reads."""
    import tests.support.nodes  # noqa: F401  (registers test.add)

    name = f"{TEST_DB}_plans"
    services.create_database(PG_ADMIN_URL, name)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    services.prepare_schema(url)
    admin = create_engine(url)
    with admin.begin() as conn:  # its statistics are the tests' to make, wherever they run
        for table in HOT_TABLES:
            conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
    admin.dispose()
    db = Database(url)
    service = Conveyor(db, Held())
    service.apply(parse_workflow(ONE))
    yield service, url
    db.dispose()
    services.drop_database(PG_ADMIN_URL, name)


def table_counts(service: Conveyor, url: str, column: str) -> dict[str, int]:
    """A column of ``pg_stat_user_tables`` (``seq_tup_read``: rows read by sequential scans)
    for the hot path's tables so far. A backend reports its counts at the end of a
    transaction at most once a second (an idle one only ten seconds later): wait out that
    second, then run one more execution (on the same kept connection) and a statement on every
    pooled connection, so that everything before is counted."""
    return _statistics(
        service, url, f"SELECT relname, {column} FROM pg_stat_user_tables WHERE relname = ANY(:t)",
        {"t": list(HOT_TABLES)},
    )  # fmt: skip


def index_scans(service: Conveyor, url: str, table: str) -> dict[str, int]:
    """How many times each index of ``table`` was scanned so far (as table_counts counts)."""
    return _statistics(
        service, url, "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = :t",
        {"t": table},
    )  # fmt: skip


def _statistics(service: Conveyor, url: str, query: str, params: dict[str, Any]) -> dict[str, int]:
    time.sleep(1.2)
    service.trigger("one")
    run_all(service)
    engine = service.db.engine
    idle = [engine.connect() for _ in range(engine.pool.checkedin())]  # type: ignore[attr-defined]
    for conn in idle:
        conn.execute(text("SELECT 1"))
        conn.close()
    admin = create_engine(url)
    with admin.connect() as conn:
        found = conn.execute(text(query), params).all()
    admin.dispose()
    return {name: int(count) for name, count in found}


def test_the_hot_statements_keep_to_indexes_when_planned_on_small_tables(
    alone: tuple[Conveyor, str],
) -> None:
    """psycopg prepares a statement at its fifth run, and PostgreSQL keeps the plan it then
    made for as long as nothing invalidates it (no ANALYZE where autovacuum is off). A plan
    made while a table was small must still find its rows by index, not read the whole table
    on every node: the try's update once did, through a semi-join on its job."""
    service, url = alone
    for _ in range(12):  # prepared and planned while the tables hold a few rows
        service.trigger("one")
        run_all(service)
    before = table_counts(service, url, "seq_tup_read")

    for _ in range(60):
        service.trigger("one")
        run_all(service)
    after = table_counts(service, url, "seq_tup_read")

    assert {t: after[t] - before[t] for t in HOT_TABLES} == dict.fromkeys(HOT_TABLES, 0)


PLANS = hot.Statement(
    text("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
)


def test_a_one_node_execution_s_statements_are_planned_once_not_at_every_run(
    alone: tuple[Conveyor, str],
) -> None:
    """A statement that unnests an array parameter is planned again at every run (its generic
    plan's estimate counts on a hundred names, a custom one on the actual few): the claim and
    the success of a node with no needs and no successors take none."""
    service, _ = alone
    for _ in range(30):
        service.trigger("one")
        run_all(service)

    plans = service.db.autocommit(lambda s: s._driver.rows(PLANS, {}))  # type: ignore[attr-defined]

    # the trigger, the claim and the success, prepared at their fifth run (the first five
    # planned for their values), one plan since
    assert len(plans) >= 3
    assert [(p[0][:70], p[1], p[2]) for p in plans if p[1] < 20 or p[2] > 5] == []


BACKEND = hot.Statement(text("SELECT pg_backend_pid()"))


def backend_of_hot_path(service: Conveyor) -> int:
    return int(service.db.autocommit(lambda s: s._driver.rows(BACKEND, {}))[0][0])  # type: ignore[attr-defined]


def test_the_hot_path_keeps_its_connection_between_uses(own: Conveyor) -> None:
    first = backend_of_hot_path(own)
    assert own.db.engine.pool.checkedout() == 1  # type: ignore[attr-defined]

    assert backend_of_hot_path(own) == first
    assert own.db.engine.pool.checkedout() == 1  # type: ignore[attr-defined]


def test_a_kept_connection_whose_server_went_away_while_idle_is_replaced_at_once(
    own: Conveyor, database_url: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr("conveyor.store.unit_of_work.PING_IDLE_AFTER", 0.0)  # always pinged
    gone = backend_of_hot_path(own)
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": gone})
    admin.dispose()

    with caplog.at_level(logging.WARNING, logger="conveyor.store.unit_of_work"):
        replaced = backend_of_hot_path(own)

    assert replaced != gone
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]  # no failed try


def test_a_forked_child_takes_a_connection_of_its_own(
    own: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    parents = backend_of_hot_path(own)  # kept by this process
    real = os.getpid()
    monkeypatch.setattr("conveyor.store.unit_of_work.os.getpid", lambda: real + 1)  # a child

    childs = backend_of_hot_path(own)

    assert childs != parents  # the parent's socket is never used by the child
    own.db.put_back_kept()  # the child's own, as its dispose would
    monkeypatch.setattr("conveyor.store.unit_of_work.os.getpid", lambda: real)
    assert backend_of_hot_path(own) == parents  # still the parent's, untouched


def test_a_wide_fan_out_reads_each_node_s_state_not_all_of_them_for_each_node(
    alone: tuple[Conveyor, str],
) -> None:
    """A member's claim reads its need's output, its success locks its successor: one row
    each, found by the (execution, node) index. As ``node_id = ANY(:names)`` the plan kept
    for the prepared statement took all the execution's rows and filtered them by name, so
    a fan-out of N read N x N rows."""
    service, url = alone
    width = 90  # planned by the trigger (triggering.INLINE_PLAN_NODES)
    members = [f"m{i}" for i in range(width)]
    add = {"function": "test.add"}
    service.apply(parse_workflow({"name": "wide", "nodes": [
        {"id": "root", "type": "python", "config": add, "inputs": {"a": 1, "b": 2}},
        *({"id": m, "type": "python", "needs": ["root"], "config": add,
           "inputs": {"a": 1, "b": 2}} for m in members),
        {"id": "join", "type": "python", "needs": members, "config": add,
         "inputs": {"a": 1, "b": 2}},
    ]}))  # fmt: skip
    service.trigger("wide")  # its statements prepared, their plans made
    run_all(service)
    before = table_counts(service, url, "idx_tup_fetch")["node_states"]

    execution_id = service.trigger("wide")
    run_all(service)
    fetched = table_counts(service, url, "idx_tup_fetch")["node_states"] - before

    assert status(service, execution_id) == ExecutionStatus.COMPLETED
    # The root's settle and the join's claim and success read every member's row a few
    # times; each member reads a few rows of its own: ~10 a node in all, 919 here (469 at
    # width 45). All of them for each member: 2 x 90 x 92 more (17,022 were read so).
    assert fetched < 12 * (width + 2), fetched


ADD = {"function": "test.add"}
FAN = {"name": "fan", "nodes": [
    {"id": "root", "type": "python", "config": ADD, "inputs": {"a": 1, "b": 2}},
    *({"id": f"m{i}", "type": "python", "config": ADD, "needs": ["root"],
       "inputs": {"a": "{{ nodes.root.sum }}", "b": i}} for i in range(4)),
    {"id": "join", "type": "python", "config": ADD, "needs": [f"m{i}" for i in range(4)],
     "inputs": {"a": "{{ nodes.m3.sum }}", "b": 1}},
]}  # fmt: skip


def test_a_fan_out_member_s_claim_and_success_are_planned_once_not_at_every_run(
    alone: tuple[Conveyor, str],
) -> None:
    """A fan-out's members (as a chain's) need one node and come before one: their claim
    reads that need's output and their success locks that successor by name, with no array
    parameter, so each is planned once (with an array: 0 generic plans, 145 custom)."""
    service, _ = alone
    service.apply(parse_workflow(FAN))
    held = service.dispatcher
    assert isinstance(held, Held)
    executions = []
    for _ in range(30):
        executions.append(service.trigger("fan"))
        while held.dispatches:  # with the message's hints, as a worker runs it
            dispatch = held.dispatches.pop()
            service.run_node(dispatch.job_id, dispatch.hints)
    with service.db.transaction() as store:
        rows = [store.execution_row(e) for e in executions]
    assert {r.status for r in rows} == {ExecutionStatus.COMPLETED}
    assert all(r.output == {"join": {"sum": 7}} for r in rows)  # root 3, m3 3 + 3, join 6 + 1

    plans = service.db.autocommit(lambda s: s._driver.rows(PLANS, {}))  # type: ignore[attr-defined]

    def runs(*markers: str) -> tuple[int, int]:
        """The generic and custom plans of the one statement with all the markers."""
        found = [(p[1], p[2]) for p in plans if all(m in p[0] for m in markers)]
        assert len(found) == 1, markers
        return found[0]

    # 120 claims and successes of members, prepared at their fifth run, one plan since
    claim = runs("jsonb_build_object", "UPDATE jobs SET status = 'processing'")
    success = runs("FOR UPDATE", "AND s.node_id = $")
    assert claim[0] >= 100 and claim[1] <= 5
    assert success[0] >= 100 and success[1] <= 5


COUNTS = ("idx_tup_fetch", "seq_tup_read")


def test_a_job_is_found_by_its_key_in_a_backlog_by_statements_planned_while_none_was_queued(
    alone: tuple[Conveyor, str],
) -> None:
    """The claim and the success find their job by key, whatever the statistics say of its
    status when they were planned. Planned after an ANALYZE that saw no job queued or
    processing (a server at rest), they took the job by a status index and filtered it by
    id: each claim of a later backlog of 400 read 202 jobs."""
    service, url = alone
    for _ in range(300):  # finished jobs, as a server at rest holds
        service.trigger("one")
        run_all(service)
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("VACUUM ANALYZE jobs, executions, node_states, job_attempts"))
    admin.dispose()
    for _ in range(30):  # the claim and the success prepared, planned on those statistics
        service.trigger("one")
        run_all(service)
    before = index_scans(service, url, "jobs")
    fetched, sequential = (table_counts(service, url, c)["jobs"] for c in COUNTS)

    for _ in range(400):  # a backlog
        service.trigger("one")
    run_all(service)
    used = index_scans(service, url, "jobs")
    read = [table_counts(service, url, c)["jobs"] for c in COUNTS]

    scanned = {name: used[name] - before[name] for name in used}
    # by the primary key alone: the claim, the try's foreign key, the success
    assert {name for name, count in scanned.items() if count} == {"pk_jobs"}, scanned
    assert scanned["pk_jobs"] >= 3 * 400, scanned
    # a job each (and the counts' own executions), not the backlog's; no job by a scan
    assert read[0] - fetched < 5 * 405, read[0] - fetched
    assert read[1] == sequential


MAP = {"name": "mapped", "nodes": [{"id": "m", "type": "python",
                                    "config": {"function": "test.noop"},
                                    "map": {"over": "{{ input.rows }}"}}]}  # fmt: skip


def index_reads(service: Conveyor, url: str) -> dict[str, int]:
    """How many entries each index of ``jobs`` gave scans so far (as table_counts counts)."""
    return _statistics(
        service, url,
        "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'jobs'", {},
    )  # fmt: skip


def test_a_map_s_settled_items_release_the_held_ones_by_key_on_statistics_taken_with_none_held(
    alone: tuple[Conveyor, str],
) -> None:
    """Held is a map's passing status: statistics taken at rest count no held job, and a
    planner that believes none are held finds the lowest held item of a map by the status
    index, reading every held job of every map at each settle (a map of 100,000 items ran
    five of them a second). An item that settles finds the one it releases by the map's key."""
    # Given tables analyzed with jobs in them, none held, and a map window of 10
    service, url = alone
    service.map_window = 10
    service.apply(parse_workflow(MAP))
    for _ in range(12):
        service.trigger("one")
        run_all(service)
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"ANALYZE {', '.join(HOT_TABLES)}"))
    admin.dispose()
    before = index_reads(service, url)

    # When a map of 600 items runs, 590 of them held at first
    made = service.trigger("mapped", {"rows": list(range(600))})
    run_all(service)

    # Then it completed, its settles reading a few index entries an item, not the held ones
    assert status(service, made) is ExecutionStatus.COMPLETED
    after = index_reads(service, url)
    read = {name: after[name] - before[name] for name in after}
    assert sum(read.values()) < 20 * 600, read


def test_a_claim_s_own_transaction_commits_without_waiting_for_its_flush(
    own: Conveyor,
) -> None:
    # Given a node job queued (the trigger plans a one-node execution itself)
    own.trigger("one")
    held = own.dispatcher
    assert isinstance(held, Held)
    (node_job,) = held.dispatches
    # When it is claimed inside a transaction that reads the setting after the claim
    with own.db.transaction() as store:
        before = store.session.execute(text("SHOW synchronous_commit")).scalar_one()
        assert store.claim_node_job(node_job.job_id, utcnow(), "w") is not None
        during = store.session.execute(text("SHOW synchronous_commit")).scalar_one()
    # Then the claim relaxed its own transaction's commit, and only that transaction's
    with own.db.transaction() as store:
        after = store.session.execute(text("SHOW synchronous_commit")).scalar_one()
    assert (before, during, after) == ("on", "off", "on")


def test_a_continuation_s_claim_leaves_its_transaction_s_commit_flushed(own: Conveyor) -> None:
    # Given a node job queued
    own.trigger("one")
    held = own.dispatcher
    assert isinstance(held, Held)
    (node_job,) = held.dispatches
    # When it is claimed as a continuation, inside a transaction (a join's success's)
    with own.db.transaction() as store:
        claimed = store.claim_continuation(
            node_job.job_id, utcnow(), "w", queue=node_job.queue, priority=node_job.priority
        )
        during = store.session.execute(text("SHOW synchronous_commit")).scalar_one()
    # Then it was claimed, and the transaction's commit (the success's) still waits its flush
    assert claimed is not None and during == "on"
