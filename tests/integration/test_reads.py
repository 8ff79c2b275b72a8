"""What an application reads through the service (conveyor.service.reads), on PostgreSQL with
the in-process worker: one execution, the executions found by filters page by page, and the
status view, each the JSON the REST API answers and scoped to one tenant as it is; and a
tenant's stream read as an iterator, which sees executions triggered after it was opened,
keeps to its filters and resumes after an event's id. Then `conveyor executions watch` on the
embedded default (SQLite)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from conveyor import migrations
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import ExecutionNotFound, InvalidQuery, TenantNotFound
from conveyor.service import Conveyor, TenantEvent, utcnow
from conveyor.store import Database
from tests.integration.test_api import MakeKey, client
from tests.integration.test_tenant_stream_events import Dropped
from tests.support.services import wait_for
from tests.support.watch import Watch, finished

SUM = {"name": "sum", "nodes": [{"id": "add", "type": "python", "config": {"function": "test.add"},
                                 "inputs": {"a": 1, "b": 1}}]}  # fmt: skip
DOOMED = {"name": "doomed", "defaults": {"retry": {"max_attempts": 2, "backoff": 0.01}},
          "nodes": [{"id": "f", "type": "python", "config": {"function": "test.fail"},
                     "inputs": {"message": "no"}}]}  # fmt: skip
HOLD = {"name": "hold", "nodes": [{"id": "wait", "type": "delay", "config": {"seconds": 600}}]}


def test_python_reads_answer_what_the_api_answers_for_the_same_tenant(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a tenant's finished runs (a sum with a dedupe key, one with an idempotency key, a
    # failure) and another tenant's run
    service = conveyor_service
    key = make_key("acme")
    make_key("other")
    for flow in (SUM, DOOMED):
        service.apply(parse_workflow(flow), "acme")
    service.apply(parse_workflow(SUM), "other")
    before = utcnow()
    deduped = service.submit("sum", tenant="acme", dedupe_key="doc-1").execution_id
    keyed = service.start("sum", tenant="acme", idempotency_key="pay-1")[0]
    failed = service.trigger("doomed", tenant="acme")
    theirs = service.trigger("sum", tenant="other")
    for started in (deduped, keyed, failed, theirs):
        wait_for(service, started)
    ours = [str(failed), str(keyed), str(deduped)]  # newest first

    with client(api_url, key) as http:

        def api(path: str, **params: Any) -> Any:
            answer = http.get(path, params=params)
            assert answer.status_code == 200, answer.text
            return answer.json()

        # Then one execution is the API's view of it
        assert service.execution(failed, tenant="acme") == api(f"/v1/executions/{failed}")
        assert service.execution(str(keyed), tenant="acme")["status"] == "completed"
        # ... the listing is the API's, filter by filter and page by page
        assert service.executions(tenant="acme") == api("/v1/executions")
        assert [e["id"] for e in service.executions(tenant="acme")] == ours
        for params in ({"workflow": "sum"}, {"status": "failed"}, {"node_status": "failed"},
                       {"dedupe_key": "doc-1"}, {"idempotency_key": "pay-1"}):  # fmt: skip
            found = service.executions(tenant="acme", **params)
            assert found == api("/v1/executions", **params) and len(found) >= 1, params
        page = service.executions(tenant="acme", limit=2)
        assert [e["id"] for e in page] == ours[:2]
        rest = service.executions(tenant="acme", after=page[-1]["id"])
        assert [e["id"] for e in rest] == ours[2:]
        assert service.executions(tenant="acme", created_after=utcnow()) == []
        naive = (before - timedelta(seconds=1)).replace(tzinfo=None)  # taken as UTC
        assert len(service.executions(tenant="acme", created_after=naive)) == 3
        # ... and the status view is the API's
        counts = service.status_counts(tenant="acme")
        assert counts == api("/v1/executions/summary")
        assert [(c["workflow"], c["status"], c["count"]) for c in counts] == [
            ("doomed", "failed", 1), ("sum", "completed", 2),
        ]  # fmt: skip
        assert service.status_counts(tenant="acme", workflow="sum", status="failed") == []

    # And another tenant's execution is not found, an unknown tenant is named, bad input too
    with pytest.raises(ExecutionNotFound, match="tenant 'acme' has no execution"):
        service.execution(theirs, tenant="acme")
    assert [e["id"] for e in service.executions(tenant="other")] == [str(theirs)]
    with pytest.raises(TenantNotFound, match="conveyor tenants create nobody"):
        service.executions(tenant="nobody")
    with pytest.raises(ExecutionNotFound, match="last id of a page"):
        service.executions(tenant="acme", after=theirs)
    with pytest.raises(InvalidQuery, match="status 'done' is none of pending, running"):
        service.executions(tenant="acme", status="done")
    with pytest.raises(InvalidQuery, match="limit 0 is out of bounds"):
        service.executions(tenant="acme", limit=0)
    with pytest.raises(InvalidQuery, match="'doc-1' is not an execution id"):
        service.execution("doc-1", tenant="acme")


def statuses(events: list[TenantEvent]) -> list[tuple[str, str]]:
    return [(e.data["execution_id"], e.data["status"]) for e in events]


def take(events: Iterator[TenantEvent], count: int) -> list[TenantEvent]:
    """The next ``count`` events (each read blocks until the stream has one)."""
    return list(islice(events, count))


def test_the_stream_iterator_sees_later_executions_keeps_to_its_filters_and_resumes(
    conveyor_service: Conveyor,
) -> None:
    # Given two tenants with the hold workflow, and a stream of one document's runs opened
    # before any exists
    service = conveyor_service
    for tenant in ("acme", "other"):
        with service.db.transaction() as store:
            store.create_tenant(tenant)
        service.apply(parse_workflow(HOLD), tenant)
    stream = service.stream("acme", workflow="hold", dedupe_key="doc-1", poll=0.05)

    # When runs are triggered and cancelled: the document's, another document's, the other
    # tenant's with the same key
    first = service.submit("hold", tenant="acme", dedupe_key="doc-1").execution_id
    other_doc = service.submit("hold", tenant="acme", dedupe_key="doc-2").execution_id
    other_tenant = service.submit("hold", tenant="other", dedupe_key="doc-1").execution_id
    for execution_id in (first, other_doc, other_tenant):
        service.cancel(execution_id)

    # Then it yields the document's run, each status in order, as GET /v1/stream sends it
    seen = take(stream, 2)
    assert statuses(seen) == [(str(first), "running"), (str(first), "cancelled")]
    assert {
        (e.kind, e.data["workflow"], e.data["version"], e.data["dedupe_key"]) for e in seen
    } == {("execution", "hold", 1, "doc-1")}
    stream.close()  # the caller stops

    # When another run of the document happens while nobody reads
    second = service.submit("hold", tenant="acme", dedupe_key="doc-1").execution_id
    service.cancel(second)

    # Then a stream resumed after the last id read yields it, and nothing twice
    resumed = service.stream("acme", workflow="hold", dedupe_key="doc-1", after=seen[-1].id)
    assert statuses(take(resumed, 2)) == [(str(second), "running"), (str(second), "cancelled")]
    resumed.close()
    # ... and one resumed after the first event yields all since, the other tenant's never
    everything = service.stream("acme", after=seen[0].id, poll=0.05)
    assert statuses(take(everything, 5)) == [
        (str(other_doc), "running"), (str(first), "cancelled"), (str(other_doc), "cancelled"),
        (str(second), "running"), (str(second), "cancelled"),
    ]  # fmt: skip
    everything.close()

    # And a bad id or an unknown tenant is refused when the stream is asked for
    with pytest.raises(InvalidQuery, match="after 'yesterday' is not an event id"):
        service.stream("acme", after="yesterday")
    with pytest.raises(TenantNotFound):
        service.stream("nobody")


@pytest.fixture
def embedded_home(tmp_path: Path) -> Iterator[tuple[Conveyor, dict[str, str]]]:
    """A directory whose embedded database (./.conveyor/conveyor.db) a service writes (nothing
    runs its jobs), and the environment of a `conveyor` run there: no CONVEYOR_* setting."""
    (tmp_path / ".conveyor").mkdir()
    url = f"sqlite:///{tmp_path / '.conveyor' / 'conveyor.db'}"
    migrations.upgrade(url)
    database = Database(url)
    service = Conveyor(database, Dropped())
    service.apply(parse_workflow(HOLD))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    yield service, env
    database.dispose()


def test_conveyor_executions_watch_prints_each_event_on_the_embedded_default(
    embedded_home: tuple[Conveyor, dict[str, str]], tmp_path: Path
) -> None:
    # Given `conveyor executions watch --json` on the embedded default, one key's runs only
    service, env = embedded_home
    watch = Watch("--dedupe-key", "doc-1", env=env, cwd=tmp_path)
    try:
        # When runs are triggered and cancelled (one with another key)
        first = service.submit("hold", dedupe_key="doc-1").execution_id
        service.submit("hold", dedupe_key="doc-2")
        service.cancel(first)

        # Then it prints the key's run's events, one JSON object a line
        got = watch.collect(finished(str(first), "cancelled"))
    finally:
        code = watch.stop()
    assert code == 0, watch.stderr  # Ctrl-C ends it
    assert [(e["kind"], e["data"]["execution_id"], e["data"]["status"]) for e in got] == [
        ("execution", str(first), "running"), ("execution", str(first), "cancelled"),
    ]  # fmt: skip
    assert {e["id"] for e in got} == {f"0-{n}" for n in (1, 3)}  # SQLite: 0-<row id>

    # And a watch resumed after the first event prints the second first
    again = Watch("--after", got[0]["id"], "--dedupe-key", "doc-1", env=env, cwd=tmp_path)
    try:
        assert again.collect(lambda events: len(events) == 1) == got[1:]
    finally:
        assert again.stop() == 0, again.stderr


def test_conveyor_executions_watch_refuses_a_bad_after_and_an_unknown_tenant(
    embedded_home: tuple[Conveyor, dict[str, str]], tmp_path: Path
) -> None:
    _, env = embedded_home
    for args, code, says in (
        (["--after", "yesterday"], 2, "--after 'yesterday' is not an event id"),
        (["--tenant", "nobody"], 1, "conveyor tenants create nobody"),
    ):
        done = Watch.run(*args, env=env, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (code, ""), done.stderr
        assert says in done.stderr
