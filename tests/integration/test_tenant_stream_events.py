"""The events of the tenant streams (stream_events, migration 0017), read as GET /v1/stream
reads them: on PostgreSQL an event whose transaction committed after a later one's is not
passed over; on SQLite the trigger writes them too."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from conveyor import migrations
from conveyor.api import tenant_stream
from conveyor.api.hub import PolledHub
from conveyor.api.stream import Admission, Streams
from conveyor.engine.records import Dispatch, TenantRef
from conveyor.engine.states import DEFAULT_TENANT
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import TooManyStreams
from conveyor.service import Conveyor
from conveyor.store import Database

HOLD = {"name": "hold", "nodes": [{"id": "wait", "type": "delay", "config": {"seconds": 600}}]}


def statuses(
    service: Conveyor, after: tuple[int, int]
) -> tuple[list[tuple[str, str]], tuple[int, int]]:
    with service.db.transaction() as store:
        found, cursor = store.stream_events(after, limit=100)
    return [(str(data["execution_id"]), str(data["status"])) for _, _, data in found], cursor


def test_an_event_committed_after_a_later_one_is_not_passed_over(
    conveyor_service: Conveyor,
) -> None:
    # Given two running executions, and where the events stand now
    conveyor_service.apply(parse_workflow(HOLD))
    first, second = (str(conveyor_service.trigger("hold", {})) for _ in range(2))
    with conveyor_service.db.transaction() as store:
        start = store.stream_horizon()
    engine = create_engine(conveyor_service.db.url)
    try:
        # When the first's change is written first but committed last
        with engine.connect() as slow, engine.begin() as fast:
            slow.execute(
                text("UPDATE executions SET status = 'cancelled' WHERE id = :id"), {"id": first}
            )
            fast.execute(
                text("UPDATE executions SET status = 'cancelled' WHERE id = :id"), {"id": second}
            )
            fast.commit()
            seen, cursor = statuses(conveyor_service, start)
            slow.commit()
    finally:
        engine.dispose()

    # Then a read while the first was open stopped before it: the second's change, made
    # later, waits too (ids alone would have sent it and passed over the first's for good)
    assert (first, "cancelled") not in seen and (second, "cancelled") not in seen
    # and reads from the cursor get both once the first commits, in the order they can be
    # seen (a transaction of anyone's still open on the server holds them back meanwhile)
    later: list[tuple[str, str]] = []
    deadline = time.monotonic() + 20
    while len([e for e in later if e[1] == "cancelled"]) < 2:
        assert time.monotonic() < deadline, later
        found, cursor = statuses(conveyor_service, cursor)
        later += found
        time.sleep(0.05)
    assert [e for e in seen + later if e[1] == "cancelled"] == [
        (first, "cancelled"),
        (second, "cancelled"),
    ]


class Dropped:
    def publish(self, dispatches: Sequence[Dispatch], *, batch: bool = True) -> None:
        pass


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Conveyor]:
    """A service on a fresh SQLite database (nothing runs its jobs), with the hold workflow."""
    url = f"sqlite:///{tmp_path / 'conveyor.db'}"
    migrations.upgrade(url)
    database = Database(url)
    service = Conveyor(database, Dropped())
    service.apply(parse_workflow(HOLD))
    yield service
    database.dispose()


def test_sqlite_writes_and_reads_the_events_in_order(embedded: Conveyor) -> None:
    # Given the embedded database, and an execution triggered and cancelled
    with embedded.db.transaction() as store:
        start = store.stream_horizon()
    execution_id = embedded.trigger("hold", {})
    embedded.cancel(execution_id)

    # Then its events are read after where they stood, in order, and the cursor moves past
    seen, cursor = statuses(embedded, start)
    assert seen == [(str(execution_id), "running"), (str(execution_id), "cancelled")]
    assert statuses(embedded, cursor)[0] == []


def test_tenant_streams_count_against_the_same_caps_as_execution_streams(
    conveyor_service: Conveyor,
) -> None:
    # Given a process whose tenants may hold two streams each, and a running execution
    conveyor_service.apply(parse_workflow(HOLD))
    execution_id = conveyor_service.trigger("hold", {})
    with conveyor_service.db.transaction() as store:
        acme = TenantRef(id=store.tenant_id(DEFAULT_TENANT), name=DEFAULT_TENANT)
    other = TenantRef(id=uuid.uuid4(), name="other")

    async def scenario() -> tuple[list[str], int, int]:
        poller = tenant_stream.Poller(
            lambda after: tenant_stream.read_events(conveyor_service, after, None, 100)
        )
        streams = Streams(
            PolledHub(lambda ids: {}), Admission(per_tenant=2, per_process=10), poller=poller
        )
        await poller.start()
        refusals: list[str] = []
        try:
            # When acme opens a tenant stream and an execution stream, then one more of each
            held = [
                await streams.open_tenant(
                    conveyor_service, acme, tenant_stream.Filters(acme.id), None
                ),
                await streams.open(conveyor_service, acme, execution_id),
            ]
            for extra in (
                streams.open_tenant(conveyor_service, acme, tenant_stream.Filters(acme.id), None),
                streams.open(conveyor_service, acme, execution_id),
            ):
                try:
                    await extra
                except TooManyStreams as exc:
                    refusals.append(str(exc))
            # and a Last-Event-ID that is no id, while another tenant opens one
            try:
                await streams.open_tenant(
                    conveyor_service, other, tenant_stream.Filters(other.id), "yesterday"
                )
            except ValueError as exc:
                refusals.append(str(exc))
            held.append(
                await streams.open_tenant(
                    conveyor_service, other, tenant_stream.Filters(other.id), None
                )
            )
            during = streams.admission.open
            for response in held:
                response._on_close()
            return refusals, during, streams.admission.open
        finally:
            await streams.close()

    refusals, during, after = asyncio.run(scenario())

    # Then both of acme's extra streams are refused naming the setting, the bad id is refused
    # before it takes a place, and every place is given back when the streams close
    assert len(refusals) == 3
    assert all("CONVEYOR_STREAMS_PER_TENANT" in r for r in refusals[:2])
    assert "Last-Event-ID 'yesterday'" in refusals[2]
    assert (during, after) == (3, 0)


def test_a_stream_that_finds_a_gap_in_the_spans_reads_what_it_missed(
    embedded: Conveyor,
) -> None:
    # Given a stream opened now, and two executions' events it was never handed (the spans
    # that carried them fell off its backlog)
    with embedded.db.transaction() as store:
        tenant_id = store.tenant_id(DEFAULT_TENANT)
    filters = tenant_stream.Filters(tenant_id)

    async def scenario() -> tuple[list[str], list[str]]:
        cursor, first = await tenant_stream.opening(embedded, filters, None)
        ids = [str(embedded.trigger("hold", {})) for _ in range(2)]
        with embedded.db.transaction() as store:
            now = store.stream_horizon()
        feed = tenant_stream.TenantFeed(tenant_id)
        # When the next span it gets starts after where it stopped
        feed.push(tenant_stream.Span(now, (0, now[1] + 1), []))
        chunks = tenant_stream.events(embedded, feed, filters, cursor, first, keepalive=60)
        sent = [await anext(chunks), await anext(chunks)]
        await chunks.aclose()
        return ids, [c.decode() for c in sent]

    ids, sent = asyncio.run(scenario())

    # Then it reads them itself and sends both, in order
    assert sent[0] == ": stream open\n\n"
    assert [i for i in ids if i in sent[1]] == ids
    assert sent[1].index(ids[0]) < sent[1].index(ids[1])


def test_a_resume_past_the_replay_bound_sends_reset_and_goes_on_from_now(
    embedded: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a resume point with more events since than a resume replays
    monkeypatch.setattr(tenant_stream, "REPLAY_MOST", 2)
    with embedded.db.transaction() as store:
        tenant_id = store.tenant_id(DEFAULT_TENANT)
        start = store.stream_horizon()
    for _ in range(3):
        embedded.trigger("hold", {})
    filters = tenant_stream.Filters(tenant_id)

    # When a client resumes from there, and from one event later
    far = asyncio.run(tenant_stream.opening(embedded, filters, tenant_stream.event_id(start)))
    near = asyncio.run(
        tenant_stream.opening(embedded, filters, tenant_stream.event_id((0, start[1] + 1)))
    )

    # Then the first gets one reset, at now; the second the two events since
    (cursor, (reset,)) = far
    assert reset.startswith(f"id: 0-{start[1] + 3}\nevent: reset\n".encode())
    assert cursor == (0, start[1] + 3)
    assert [c.split(b"\n")[1] for c in near[1]] == [b"event: execution"] * 2
