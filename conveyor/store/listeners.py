"""The statements of the live streams' LISTEN connection (PostgreSQL, psycopg).

The status triggers (migrations 0004 and 0008) announce a change of an execution or of one of
its nodes on the execution's own channel, and only while a ``stream_listeners`` row names the
execution: a NOTIFY costs every commit a database-wide lock, so nothing else is announced. An
API process registers one row per execution it watches (not one per stream), after it LISTENs
to the execution's channel and before any stream reads the state, and deletes the row when
its last stream on the execution ends. The retention sweep deletes the rows of a process that
died without doing so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from psycopg import sql

CHANNEL_PREFIX = "conveyor_execution_"

# An id the process chose once for the execution: after a reconnect the row is written again
# (it may have been swept meanwhile) and an existing one is kept.
REGISTER = (
    "INSERT INTO stream_listeners (id, execution_id, created_at) "
    "SELECT unnest(%s::uuid[]), unnest(%s::uuid[]), now() ON CONFLICT (id) DO NOTHING"
)
# Now and then the rows are written again with a fresh date: the retention sweep deletes
# registrations older than its cutoff, which would silence a stream open for longer. A row
# that had gone (``xmax = 0``: inserted, not updated) names an execution whose changes
# since were announced to nobody.
REFRESH = (
    "INSERT INTO stream_listeners (id, execution_id, created_at) "
    "SELECT unnest(%s::uuid[]), unnest(%s::uuid[]), now() "
    "ON CONFLICT (id) DO UPDATE SET created_at = now() "
    "RETURNING execution_id, xmax = 0"
)
UNREGISTER = "DELETE FROM stream_listeners WHERE id = ANY(%s::uuid[])"
UNLISTEN_ALL = "UNLISTEN *"


def channel(execution_id: uuid.UUID) -> str:
    """The channel the triggers announce the execution's changes on."""
    return f"{CHANNEL_PREFIX}{execution_id.hex}"


def execution_of(channel_name: str) -> uuid.UUID | None:
    """The execution a channel belongs to (None: not one of the triggers' channels)."""
    if not channel_name.startswith(CHANNEL_PREFIX):
        return None
    try:
        return uuid.UUID(hex=channel_name.removeprefix(CHANNEL_PREFIX))
    except ValueError:
        return None


def listen_changes(listen: Iterable[uuid.UUID], unlisten: Iterable[uuid.UUID]) -> sql.Composed:
    """One round trip that starts and stops listening to the channels of these executions."""
    statements = [sql.SQL("LISTEN {}").format(sql.Identifier(channel(e))) for e in listen] + [
        sql.SQL("UNLISTEN {}").format(sql.Identifier(channel(e))) for e in unlisten
    ]
    return sql.SQL("; ").join(statements)
