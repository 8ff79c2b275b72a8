"""Abuse of the live status streams (issue 24): many streams, one tenant hogging them, clients
that vanish, a database connection that drops, a shutdown. Each runs an API server of its own
(the one `conveyor api` runs, over real HTTP) on the real PostgreSQL, with the in-process
worker; the SQLite (embedded) polling fallback under the same caps at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from sqlalchemy import text

from conveyor.api import create_app, hub
from conveyor.api.hub import APPLICATION_NAME
from conveyor.api.server import ApiServer
from conveyor.api.stream import Admission, Streams, channel, refused
from conveyor.config import Settings, get_settings
from conveyor.engine import triggering
from conveyor.engine.records import Dispatch, TenantRef
from conveyor.engine.states import TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import StreamsUnavailable
from conveyor.service import Conveyor, utcnow
from tests.conftest import PG_ADMIN_URL, TEST_DB

MakeKey = Callable[[str], str]
TEST_CONNINFO = PG_ADMIN_URL.replace("postgresql+psycopg", "postgresql").rsplit("/", 1)[0] + (
    f"/{TEST_DB}"
)
ONE_NODE = {
    "name": "sum",
    "nodes": [{"id": "add", "type": "python", "config": {"function": "test.add"},
               "inputs": {"a": 1, "b": 1}}],
}  # fmt: skip


@contextlib.contextmanager
def api_server(service: Conveyor, **settings: str) -> Iterator[tuple[str, ApiServer]]:
    """The API (as `conveyor api` serves it) on a free port, with these CONVEYOR_* settings."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in settings.items():
            env.setenv(f"CONVEYOR_{name.upper()}", value)
        get_settings.cache_clear()
        server = ApiServer(
            uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning")
        )
        thread = threading.Thread(target=server.run, name="api-streams", daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
            time.sleep(0.02)
    get_settings.cache_clear()
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        assert not thread.is_alive(), "the API did not shut down"


def held(service: Conveyor, tenant: str = "acme") -> tuple[uuid.UUID, list[Dispatch]]:
    """An execution planned and running, its root node's message not yet published."""
    made = service.db.run(
        lambda s: triggering.trigger(s, workflow_name="sum", tenant=tenant, input={}, now=utcnow(),
                                 source=TriggerSource.API)
    )  # fmt: skip
    return made.execution_id, list(made.dispatches)


def database(query: str, *args: Any) -> Any:
    with psycopg.connect(TEST_CONNINFO, autocommit=True) as conn:
        return conn.execute(query, args).fetchone()[0]


def connections(conn: psycopg.Connection[Any] | None = None) -> tuple[int, int]:
    """Connections to the test database (besides the one asking), and the streams' hub's."""
    with contextlib.ExitStack() as stack:
        if conn is None:
            conn = stack.enter_context(psycopg.connect(TEST_CONNINFO, autocommit=True))
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE application_name = %s) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            (APPLICATION_NAME,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


HUB_PID = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s"
)


def registered() -> int:
    return int(database("SELECT count(*) FROM stream_listeners"))


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


async def follow(http: httpx.AsyncClient, execution_id: uuid.UUID, opened: Callable[[], None]
                 ) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    seen: list[tuple[str, dict[str, Any]]] = []
    async with http.stream("GET", f"/v1/executions/{execution_id}/events") as answer:
        assert answer.status_code == 200, await answer.aread()
        kind = ""
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                seen.append((kind, json.loads(line.removeprefix("data: "))))
                if len(seen) == 1:
                    opened()
    return seen


def test_five_hundred_streams_share_one_database_connection_and_each_hears_its_execution(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given 250 running executions, each watched by two of 500 concurrent streams of acme's,
    # and another tenant going about its business
    key, other_key = make_key("acme"), make_key("globex")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "globex")
    executions = [held(conveyor_service) for _ in range(250)]
    others, _ = held(conveyor_service, "globex")
    # (another API server of this test run, on this database, may hold a LISTEN connection)
    before, hubs_before = connections()
    samples: list[tuple[int, int]] = []

    async def globex_meanwhile(api: str) -> None:
        async with httpx.AsyncClient(
            base_url=api, headers={"Authorization": f"Bearer {other_key}"}, timeout=30
        ) as other:
            for _ in range(20):
                assert (await other.get("/v1/executions")).status_code == 200
            async with other.stream("GET", f"/v1/executions/{others}/events") as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    assert line == "event: execution"
                    break

    async def watch_all(api: str) -> list[list[tuple[str, dict[str, Any]]]]:
        opened = 0
        all_open = asyncio.Event()

        def one_opened() -> None:
            nonlocal opened
            opened += 1
            if opened == 500:
                all_open.set()

        async with httpx.AsyncClient(
            base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=120,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        ) as http:  # fmt: skip
            streams = [
                asyncio.create_task(follow(http, execution_id, one_opened))
                for execution_id, _ in executions
                for _copy in range(2)
            ]
            async with asyncio.timeout(60):
                await all_open.wait()
            samples.append(await asyncio.to_thread(connections))
            samples.append((await asyncio.to_thread(registered), 0))
            await globex_meanwhile(api)
            # The other tenant's calls were answered, and its stream opened, while all 500
            # streams were open: none has ended (each ends after its execution, not run yet).
            # The issue saw its calls time out after 20 s, every connection taken.
            assert not any(stream.done() for stream in streams)

            # When every execution's node runs
            for _, dispatches in executions:
                await asyncio.to_thread(conveyor_service.dispatcher.publish, dispatches)
            async with asyncio.timeout(90):
                return await asyncio.gather(*streams)

    with api_server(conveyor_service, streams_per_tenant="1000") as (api, _server):
        heard = asyncio.run(watch_all(api))
        # the last stream on each execution took its registration away
        eventually(lambda: registered() == 0, within=5)

    # Then 500 streams held one LISTEN connection, not 500, and registered each execution once
    (during, hubs), (rows, _) = samples
    assert hubs == hubs_before + 1
    assert during <= before + 31, (before, during)  # the pool's most (10 + 20 overflow) + hub
    assert rows == 250
    # and each stream showed its execution running, its node's progress, and completed last
    for seen in heard:
        assert [data["status"] for kind, data in seen if kind == "execution"] == [
            "running",
            "completed",
        ]
        assert [data["status"] for kind, data in seen if kind == "node"] == ["running", "completed"]


def test_a_tenant_past_its_cap_gets_429_while_another_tenant_still_opens_streams(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given two tenants, and a cap of 2 streams a tenant, 3 a process
    keys = {tenant: make_key(tenant) for tenant in ("acme", "globex")}
    for tenant in keys:
        conveyor_service.apply(parse_workflow(ONE_NODE), tenant)
    acme = [held(conveyor_service, "acme")[0] for _ in range(3)]
    globex = [held(conveyor_service, "globex")[0] for _ in range(2)]

    with (
        api_server(conveyor_service, streams_per_tenant="2", streams_per_process="3") as (api, _),
        httpx.Client(base_url=api, headers={"Authorization": f"Bearer {keys['acme']}"},
                     timeout=30) as as_acme,
        httpx.Client(base_url=api, headers={"Authorization": f"Bearer {keys['globex']}"},
                     timeout=30) as as_globex,
        contextlib.ExitStack() as open_streams,
    ):  # fmt: skip
        for execution_id in acme[:2]:
            answer = open_streams.enter_context(
                as_acme.stream("GET", f"/v1/executions/{execution_id}/events")
            )
            assert answer.status_code == 200

        # When acme asks for a third
        refused = as_acme.get(f"/v1/executions/{acme[2]}/events")

        # Then it is refused with 429, a Problem naming the setting, and when to retry
        assert refused.status_code == 429
        assert "CONVEYOR_STREAMS_PER_TENANT" in refused.json()["detail"]
        assert int(refused.headers["Retry-After"]) > 0

        # while globex still opens one; the process, now full, refuses globex's next
        first = open_streams.enter_context(
            as_globex.stream("GET", f"/v1/executions/{globex[0]}/events")
        )
        assert first.status_code == 200
        full = as_globex.get(f"/v1/executions/{globex[1]}/events")
        assert full.status_code == 429
        assert "CONVEYOR_STREAMS_PER_PROCESS" in full.json()["detail"]


def test_a_client_that_disconnects_frees_its_slot_at_once(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given a tenant holding the only stream its cap allows
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    first, second = held(conveyor_service)[0], held(conveyor_service)[0]
    with (
        api_server(conveyor_service, streams_per_tenant="1") as (api, _),
        httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
    ):
        with http.stream("GET", f"/v1/executions/{first}/events") as stream:
            assert stream.status_code == 200
            assert http.get(f"/v1/executions/{second}/events").status_code == 429
            assert registered() == 1

        # When its client goes away (long before the stream's next keep-alive)
        # Then the slot and the execution's registration are given back within a second or so
        eventually(lambda: registered() == 0, within=5)
        with http.stream("GET", f"/v1/executions/{second}/events") as again:
            assert again.status_code == 200


def test_an_idle_stream_sends_keepalive_comments_so_proxies_keep_it_open(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given a stream on an execution where nothing happens, and keep-alives every 0.2 s
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, _ = held(conveyor_service)
    lines: list[str] = []
    with (
        api_server(conveyor_service, streams_keepalive="0.2") as (api, _),
        httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=5) as http,
        http.stream("GET", f"/v1/executions/{execution_id}/events") as stream,
    ):
        # When the client listens for a while
        for line in stream.iter_lines():
            lines.append(line)
            if lines.count(": keepalive") == 3:
                break

    # Then after the first event only comment lines came, which SSE clients ignore
    assert lines[:2] == ["event: execution", 'data: {"status": "running"}']
    assert {line for line in lines[2:] if line} == {": keepalive"}


def read_stream(api: str, key: str, execution_id: uuid.UUID) -> tuple[threading.Thread, list[str]]:
    """A thread following one execution's stream, started and past its first event, and the
    data lines it has read so far (it adds to them until the stream ends)."""
    seen: list[str] = []
    opened = threading.Event()

    def listen() -> None:
        with (
            httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"},
                         timeout=30) as http,
            http.stream("GET", f"/v1/executions/{execution_id}/events") as stream,
        ):  # fmt: skip
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    seen.append(line)
                    opened.set()

    reader = threading.Thread(target=listen)
    reader.start()
    assert opened.wait(10)
    return reader, seen


def test_a_stream_hears_a_change_made_while_the_listen_connection_was_down(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given a stream on a running execution
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, _ = held(conveyor_service)
    with api_server(conveyor_service) as (api, _server):
        reader, seen = read_stream(api, key, execution_id)

        # When the hub's connection is killed, new connections to the database are refused
        # for a while, and meanwhile the execution completes (announced to nobody)
        admin_conninfo = PG_ADMIN_URL.replace("postgresql+psycopg", "postgresql")
        with (
            psycopg.connect(admin_conninfo, autocommit=True) as admin,
            psycopg.connect(TEST_CONNINFO, autocommit=True) as conn,
        ):
            admin.execute(f'ALTER DATABASE "{TEST_DB}" ALLOW_CONNECTIONS false')
            try:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    (APPLICATION_NAME,),
                )
                eventually(lambda: connections(conn)[1] == 0)
                with conn.transaction():
                    conn.execute(
                        "UPDATE node_states SET status = 'completed' WHERE execution_id = %s",
                        (execution_id,),
                    )
                    conn.execute(
                        "UPDATE executions SET status = 'completed' WHERE id = %s",
                        (execution_id,),
                    )
                time.sleep(0.5)  # the hub tries to reconnect, and is refused
                assert connections(conn)[1] == 0
            finally:
                admin.execute(f'ALTER DATABASE "{TEST_DB}" ALLOW_CONNECTIONS true')

        # Then once the hub is back, the stream re-reads the state and ends with completed
        reader.join(timeout=20)
        assert not reader.is_alive()
    assert seen[0] == 'data: {"status": "running"}'
    assert seen[-1] == 'data: {"status": "completed"}'
    assert 'data: {"node_id": "add", "status": "completed"}' in seen


def test_a_change_written_before_the_stream_registered_and_committed_after_still_reaches_it(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given a transaction that wrote the execution's completion while nobody watched it (so
    # its triggers announce nothing), and has not committed
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, _ = held(conveyor_service)
    with (
        api_server(conveyor_service) as (api, _server),
        psycopg.connect(TEST_CONNINFO) as writer,
    ):
        writer.execute(
            "UPDATE node_states SET status = 'completed' WHERE execution_id = %s", (execution_id,)
        )
        writer.execute("UPDATE executions SET status = 'completed' WHERE id = %s", (execution_id,))

        # When a stream opens (registers, reads: still running) and then the writer commits
        reader, seen = read_stream(api, key, execution_id)
        writer.commit()

        # Then the stream learns of the completion all the same, and ends
        reader.join(timeout=10)
        assert not reader.is_alive()
    assert seen[0] == 'data: {"status": "running"}'
    assert seen[-1] == 'data: {"status": "completed"}'


def test_a_new_stream_is_refused_with_503_while_the_listen_connection_cannot_be_made(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a hub whose database cannot be reached (nothing listens on its port), and a new
    # stream waiting at most 1 s for it
    monkeypatch.setattr(hub, "OPEN_TIMEOUT", 1.0)
    conveyor_service.apply(parse_workflow(ONE_NODE))
    execution_id, _ = held(conveyor_service, "default")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: connections to it are refused
    tenant = TenantRef(id=uuid.uuid4(), name="acme")

    async def open_one() -> tuple[BaseException | None, int]:
        listen = hub.ListenHub(f"postgresql://postgres@127.0.0.1:{port}/nowhere")
        streams = Streams(listen, Admission(per_tenant=5, per_process=5))
        await listen.start()
        try:
            await streams.open(conveyor_service, tenant, execution_id)
        except StreamsUnavailable as exc:
            return exc, streams.admission.open
        finally:
            await streams.close()
        return None, streams.admission.open

    # When a stream is asked for
    failure, held_after = asyncio.run(open_one())

    # Then it is refused as unavailable (the route answers 503 with when to retry), and its
    # place is given back
    assert isinstance(failure, StreamsUnavailable)
    answer = refused(failure)
    assert answer.status_code == 503 and int(answer.headers["Retry-After"]) > 0
    assert b"open the stream again" in bytes(answer.body)
    assert held_after == 0


def test_a_registration_the_retention_sweep_deleted_is_written_back_and_the_stream_re_reads(
    conveyor_service: Conveyor, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a stream on a running execution, and registrations re-written every 0.3 s
    monkeypatch.setattr(hub, "REFRESH", 0.3)
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, _ = held(conveyor_service)
    with api_server(conveyor_service) as (api, _server):
        reader, seen = read_stream(api, key, execution_id)
        time.sleep(hub.SETTLE + 0.2)  # past the re-read that follows a first registration

        # When its registration is deleted (as a sweep with a short cutoff does) together
        # with the execution's completion, which is therefore announced to nobody
        with psycopg.connect(TEST_CONNINFO) as conn:
            conn.execute("DELETE FROM stream_listeners WHERE execution_id = %s", (execution_id,))
            conn.execute(
                "UPDATE node_states SET status = 'completed' WHERE execution_id = %s",
                (execution_id,),
            )
            conn.execute(
                "UPDATE executions SET status = 'completed' WHERE id = %s", (execution_id,)
            )

        # Then the hub writes the registration back, and the stream re-reads and ends
        reader.join(timeout=10)
        assert not reader.is_alive()
    assert seen[-1] == 'data: {"status": "completed"}'


def test_stray_notices_on_an_execution_channel_are_ignored_and_the_stream_goes_on(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given a stream on a running execution
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, dispatches = held(conveyor_service)
    with api_server(conveyor_service) as (api, _server):
        reader, seen = read_stream(api, key, execution_id)

        hub_pid = database(HUB_PID, APPLICATION_NAME)

        # When someone with database access NOTIFYs garbage on its channel, then it runs
        with psycopg.connect(TEST_CONNINFO, autocommit=True) as conn:
            for payload in ("not json", "[1, 2]", '{"kind": "execution", "status": "bogus"}'):
                conn.execute("SELECT pg_notify(%s, %s)", (channel(execution_id), payload))
        conveyor_service.dispatcher.publish(dispatches)
        reader.join(timeout=30)
        assert database(HUB_PID, APPLICATION_NAME) == hub_pid  # the hub did not fall over

    # Then the stream ignored them and followed the execution to its end as usual
    assert not reader.is_alive()
    assert seen[0] == 'data: {"status": "running"}'
    assert seen[-1] == 'data: {"status": "completed"}'
    assert "bogus" not in "".join(seen)


def test_streams_end_cleanly_when_the_api_shuts_down(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given three open streams on running executions
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(ONE_NODE), "acme")
    executions = [held(conveyor_service)[0] for _ in range(3)]
    ended: list[list[str]] = []
    opened = threading.Semaphore(0)

    def listen(api: str, execution_id: uuid.UUID) -> None:
        lines: list[str] = []
        with (
            httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"},
                         timeout=30) as http,
            http.stream("GET", f"/v1/executions/{execution_id}/events") as stream,
        ):  # fmt: skip
            for line in stream.iter_lines():  # an unclean end raises here
                lines.append(line)
                if line.startswith("data: "):
                    opened.release()
        ended.append(lines)

    with api_server(conveyor_service) as (api, server):
        readers = [threading.Thread(target=listen, args=(api, e)) for e in executions]
        for reader in readers:
            reader.start()
        for _ in readers:
            assert opened.acquire(timeout=10)
        assert registered() == 3

        # When the server is told to stop (as SIGTERM tells `conveyor api`)
        server.should_exit = True
        for reader in readers:
            reader.join(timeout=10)

    # Then every stream ended cleanly (no finished status), and the registrations are gone
    assert len(ended) == 3
    assert all(lines[-1] != 'data: {"status": "completed"}' for lines in ended)
    assert registered() == 0


def test_the_sqlite_fallback_polls_and_is_capped_the_same(tmp_path: Path) -> None:
    from conveyor import migrations
    from conveyor.engine.credentials import new_api_key
    from conveyor.store import Database
    from conveyor.tasks.app import create_app as celery_app
    from conveyor.tasks.dispatch import CeleryDispatcher

    # Given the embedded SQLite database with a running execution, and a cap of one stream
    url = f"sqlite:///{tmp_path / 'conveyor.db'}"
    migrations.upgrade(url)
    database = Database(url)
    broker = Settings(database_url=url, broker_url="memory://localhost/")
    service = Conveyor(database, CeleryDispatcher(celery_app(broker)))
    made = new_api_key()
    with database.transaction() as store:
        tenant_id = store.create_tenant("acme")
        store.add_api_key(tenant_id, "test", made.prefix, made.digest, utcnow())
    service.apply(parse_workflow(ONE_NODE), "acme")
    execution_id, _ = held(service)
    other, _ = held(service)
    seen: list[str] = []
    opened = threading.Event()
    try:
        with (
            api_server(service, streams_per_tenant="1") as (api, _server),
            httpx.Client(base_url=api, headers={"Authorization": f"Bearer {made.key}"},
                         timeout=30) as http,
        ):  # fmt: skip

            def listen() -> None:
                with http.stream("GET", f"/v1/executions/{execution_id}/events") as stream:
                    for line in stream.iter_lines():
                        if line.startswith("data: "):
                            seen.append(line)
                            opened.set()

            reader = threading.Thread(target=listen)
            reader.start()
            assert opened.wait(10)

            # When a second stream is asked for, and then the execution completes
            refused = http.get(f"/v1/executions/{other}/events")
            with database.transaction() as store:
                store.session.execute(
                    text("UPDATE node_states SET status = 'completed' WHERE execution_id = :e"),
                    {"e": execution_id.hex},
                )
                store.session.execute(
                    text("UPDATE executions SET status = 'completed' WHERE id = :e"),
                    {"e": execution_id.hex},
                )
            reader.join(timeout=10)

        # Then the second is refused as on PostgreSQL, and the poll shows the completion
        assert refused.status_code == 429
        assert "CONVEYOR_STREAMS_PER_TENANT" in refused.json()["detail"]
        assert not reader.is_alive()
        assert seen[0] == 'data: {"status": "running"}'
        assert seen[-1] == 'data: {"status": "completed"}'
    finally:
        database.dispose()
