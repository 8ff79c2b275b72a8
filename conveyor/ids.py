"""Ids of the rows Conveyor makes."""

from __future__ import annotations

import uuid

import uuid6


def new_id() -> uuid.UUID:
    """A time-ordered id (UUIDv7): rows inserted together sit together in the primary key and
    in every index that starts with an id, so inserts stay in the few hot pages at the end of
    each index however many rows the tables hold. A random UUIDv4 would touch a random page of
    each, and with millions of rows most of those pages are not in memory."""
    return uuid.UUID(int=uuid6.uuid7().int)
