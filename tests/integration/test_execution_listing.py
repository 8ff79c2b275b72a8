"""Finding executions (GET /v1/executions with its filters and keyset pages, and the status
view GET /v1/executions/summary) over real HTTP, PostgreSQL and the in-process worker; and the
listing's statements keep to the indexes made for them on a table of many executions."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, event, text

from conveyor.engine.states import ExecutionStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor, utcnow
from conveyor.store import Database
from conveyor.store.listing import ExecutionFilter
from tests.conftest import PG_ADMIN_URL, TEST_DB
from tests.support import services
from tests.support.services import wait_for

MakeKey = Callable[[str], str]
SUM = {"name": "sum", "nodes": [{"id": "add", "type": "python", "config": {"function": "test.add"},
                                 "inputs": {"a": 1, "b": 1}}]}  # fmt: skip
DOOMED = {"name": "doomed", "defaults": {"retry": {"max_attempts": 2, "backoff": 0.01}},
          "nodes": [{"id": "f", "type": "python", "config": {"function": "test.fail"},
                     "inputs": {"message": "no"}}]}  # fmt: skip


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [e["id"] for e in answer.json()]


def test_executions_are_found_by_workflow_status_node_status_time_and_keys_page_by_page(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given three sums (one with a dedupe key, one with an idempotency key) and a failed run
    key = make_key("finder")
    http = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert http.post("/v1/workflows", json=SUM).status_code == 201
    assert http.post("/v1/workflows", json=DOOMED).status_code == 201
    before = utcnow()
    plain = http.post("/v1/workflows/sum/executions").json()["id"]
    deduped = http.post("/v1/workflows/sum/executions", json={"dedupe_key": "doc-7"}).json()["id"]
    keyed = http.post("/v1/workflows/sum/executions", headers={"Idempotency-Key": "pay-1"}).json()[
        "id"
    ]
    failed = http.post("/v1/workflows/doomed/executions").json()["id"]
    for started in (plain, deduped, keyed, failed):
        wait_for(conveyor_service, uuid.UUID(started))
    after = utcnow()
    sums = [keyed, deduped, plain]  # newest first

    # Then each filter finds what it names, within the tenant
    assert ids(http.get("/v1/executions", params={"workflow": "sum"})) == sums
    assert ids(http.get("/v1/executions", params={"status": "failed"})) == [failed]
    assert ids(http.get("/v1/executions", params={"node_status": "failed"})) == [failed]
    assert ids(http.get("/v1/executions", params={"node_status": "completed"})) == sums
    assert ids(http.get("/v1/executions", params={"dedupe_key": "doc-7"})) == [deduped]
    assert ids(http.get("/v1/executions", params={"idempotency_key": "pay-1"})) == [keyed]
    window = {"created_after": before.isoformat(), "created_before": after.isoformat()}
    assert len(ids(http.get("/v1/executions", params=window))) == 4
    assert ids(http.get("/v1/executions", params={"created_after": after.isoformat()})) == []
    assert ids(http.get("/v1/executions", params={"workflow": "sum", "status": "failed"})) == []
    # ... and pages follow one another by the last id, none repeated or skipped
    first = ids(http.get("/v1/executions", params={"limit": 2}))
    second = ids(http.get("/v1/executions", params={"limit": 2, "after": first[-1]}))
    assert first + second == [failed, *sums]
    assert ids(http.get("/v1/executions", params={"after": second[-1]})) == []
    lost = http.get("/v1/executions", params={"after": str(uuid.uuid4())})
    assert lost.status_code == 404 and "last id of a page" in lost.json()["detail"]
    bad = http.get("/v1/executions", params={"node_status": "sleeping"})
    assert bad.status_code == 422 and "node_status" in bad.text

    # And the status view counts them by workflow and status, with their tries
    summary = http.get("/v1/executions/summary").json()
    assert [(r["workflow"], r["status"], r["count"], r["average_attempts"]) for r in summary] == [
        ("doomed", "failed", 1, 2.0),
        ("sum", "completed", 3, 1.0),
    ]
    sum_row = summary[1]
    assert sum_row["oldest"] <= sum_row["newest"]
    narrowed = http.get("/v1/executions/summary", params={"workflow": "doomed"}).json()
    assert [r["workflow"] for r in narrowed] == ["doomed"]
    http.close()


# -- plans at scale ----------------------------------------------------------------------------

MANY = 20_000


@pytest.fixture
def many(database_url: str) -> Iterator[tuple[Database, uuid.UUID]]:
    """A database of its own holding MANY executions of two workflows, mostly completed (a
    few running, a few with a failed node, one in a hundred with a dedupe key), analysed."""
    name = f"{TEST_DB}_listing"
    services.create_database(PG_ADMIN_URL, name)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    services.prepare_schema(url)
    db = Database(url)
    service = Conveyor(db, None)  # type: ignore[arg-type]  # nothing is triggered
    service.apply(parse_workflow(SUM))
    service.apply(parse_workflow(DOOMED))
    admin = create_engine(url)
    with admin.begin() as conn:
        tenant, sum_id, doomed_id = conn.execute(text(
            "SELECT w1.tenant_id, w1.id, w2.id FROM workflows w1, workflows w2 "
            "WHERE w1.name = 'sum' AND w2.name = 'doomed'"
        )).one()  # fmt: skip
        conn.execute(text("""
            INSERT INTO executions (id, tenant_id, workflow_id, status, priority, trigger, input,
                                    remaining_nodes, dedupe_key, idempotency_key, created_at)
            SELECT gen_random_uuid(), :tenant, CASE WHEN i % 2 = 0 THEN :sum ELSE :doomed END,
                   (CASE WHEN i % 200 = 0 THEN 'running' WHEN i % 150 = 0 THEN 'failed'
                         ELSE 'completed' END),
                   'normal', 'api', '{}', 0,
                   CASE WHEN i % 100 = 0 THEN 'doc-' || i END, 'idem-' || i,
                   now() - make_interval(secs => i)
            FROM generate_series(1, :many) AS i"""),
            {"tenant": tenant, "sum": sum_id, "doomed": doomed_id, "many": MANY},
        )  # fmt: skip
        conn.execute(text("""
            INSERT INTO node_states (execution_id, node_id, status, waiting_on)
            SELECT id, 'n', (CASE status WHEN 'failed' THEN 'failed' WHEN 'running'
                             THEN 'running' ELSE 'completed' END), 0
            FROM executions"""))  # fmt: skip
    with admin.connect() as conn:
        conn.execute(text("ANALYZE"))
    admin.dispose()
    yield db, tenant
    db.dispose()
    services.drop_database(PG_ADMIN_URL, name)


def plan(db: Database, run: Callable[[Any], object]) -> list[dict[str, Any]]:
    """Every plan node of the statements ``run`` makes on the store (EXPLAIN, not timed)."""
    seen: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        seen.append((statement, params))

    event.listen(db.engine, "before_cursor_execute", keep)
    try:
        with db.transaction() as store:
            run(store)
    finally:
        event.remove(db.engine, "before_cursor_execute", keep)
    nodes: list[dict[str, Any]] = []
    raw = db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, params in seen:
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
            found = cursor.fetchone()[0]
            stack = [(found if isinstance(found, list) else json.loads(found))[0]["Plan"]]
            while stack:
                node = stack.pop()
                nodes.append(node)
                stack.extend(node.get("Plans", []))
    finally:
        raw.close()
    return nodes


def scans(nodes: list[dict[str, Any]]) -> set[str]:
    """The indexes read, and "Seq Scan" if executions or node_states were read whole."""
    found = set()
    for node in nodes:
        if "Index Name" in node:
            found.add(node["Index Name"])
        elif node.get("Relation Name") in ("executions", "node_states"):
            found.add(node["Node Type"])
    return found


@pytest.mark.parametrize(
    ("where", "index"),
    [
        (ExecutionFilter(status=ExecutionStatus.RUNNING), "ix_executions_tenant_status_created"),
        (ExecutionFilter(dedupe_key="doc-500"), "ix_executions_tenant_dedupe"),
        (ExecutionFilter(idempotency_key="idem-77"), "uq_executions_idempotency"),
        (ExecutionFilter(node_status=NodeStatus.RUNNING), "ix_node_states_unsettled"),
    ],
)
def test_each_filter_of_the_listing_reads_its_index_not_the_whole_table(
    many: tuple[Database, uuid.UUID], where: ExecutionFilter, index: str
) -> None:
    db, tenant = many

    nodes = plan(db, lambda store: store.list_executions(tenant, where=where, limit=50))

    assert index in scans(nodes) and "Seq Scan" not in scans(nodes), scans(nodes)


def test_the_workflow_filter_the_time_window_and_pages_keep_to_indexes(
    many: tuple[Database, uuid.UUID],
) -> None:
    db, tenant = many
    now = utcnow()
    window = ExecutionFilter(created_after=now - timedelta(hours=1), created_before=now)
    with db.transaction() as store:
        last = store.list_executions(tenant, limit=50)[-1][0].id

    for where, after in [
        (ExecutionFilter(workflow="sum"), None),
        (window, None),
        (ExecutionFilter(workflow="doomed", status=ExecutionStatus.FAILED), last),
    ]:
        nodes = plan(
            db,
            lambda store, w=where, a=after: store.list_executions(
                tenant, where=w, after=a, limit=50
            ),
        )
        assert "Seq Scan" not in scans(nodes), (where, scans(nodes))
