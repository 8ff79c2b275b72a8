"""Live status of one execution as server-sent events.

On PostgreSQL, triggers on ``executions`` and ``node_states`` announce every status change on
the execution's own channel (migrations 0004, 0008) while a stream is registered for it (a
``stream_listeners`` row: a NOTIFY costs every commit a lock, so nothing else is announced).
The stream LISTENs and registers before it reads the current state, so no change falls
between the two; it removes its row when it ends (the retention sweep removes those of a
process that died). Nothing polls the tables. On SQLite (the
embedded default) it polls instead, every half second.

Events: ``execution`` (``{"status": ...}``) first with the current status, then on each change;
``node`` (``{"node_id": ..., "status": ...}``) on each node's change. The stream ends after the
execution finishes; a comment line every 15 s keeps idle connections open.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql
from starlette.concurrency import run_in_threadpool

from conveyor import views
from conveyor.engine.states import ExecutionStatus
from conveyor.service import Conveyor

KEEPALIVE = 15.0
POLL = 0.5


def channel(execution_id: uuid.UUID) -> str:
    return f"conveyor_execution_{execution_id.hex}"


def event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _finished(status: str) -> bool:
    return ExecutionStatus(status).finished


async def execution_events(service: Conveyor, execution_id: uuid.UUID) -> AsyncIterator[bytes]:
    url = service.db.engine.url
    if url.get_backend_name() != "postgresql":
        async for chunk in _polled(service, execution_id):
            yield chunk
        return
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    listener = uuid.uuid4()
    try:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(execution_id))))
        # Only then register: the triggers announce the executions someone listens to.
        await conn.execute(
            "INSERT INTO stream_listeners (id, execution_id, created_at) VALUES (%s, %s, now())",
            (listener, execution_id),
        )
        view = await run_in_threadpool(_view, service, execution_id)
        yield event("execution", {"status": view["status"]})
        if _finished(view["status"]):
            return
        while True:
            async for notice in conn.notifies(timeout=KEEPALIVE):
                data = json.loads(notice.payload)
                kind = data.pop("kind")
                yield event(kind, data)
                if kind == "execution" and _finished(data["status"]):
                    return
            yield b": keepalive\n\n"
    finally:
        try:
            await conn.execute("DELETE FROM stream_listeners WHERE id = %s", (listener,))
        finally:
            await conn.close()


async def _polled(service: Conveyor, execution_id: uuid.UUID) -> AsyncIterator[bytes]:
    seen: dict[str, str] = {}
    status = ""
    while True:
        view = await run_in_threadpool(_view, service, execution_id)
        for node in view["nodes"]:
            if seen.get(node["id"]) != node["status"]:
                seen[node["id"]] = node["status"]
                yield event("node", {"node_id": node["id"], "status": node["status"]})
        if view["status"] != status:
            status = view["status"]
            yield event("execution", {"status": status})
            if _finished(status):
                return
        await asyncio.sleep(POLL)


def _view(service: Conveyor, execution_id: uuid.UUID) -> views.ExecutionJson:
    with service.db.transaction() as store:
        return views.execution_view(store, execution_id)
