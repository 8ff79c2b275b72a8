"""A node job's message carries hints for its admission; a bad hint is no hint."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from conveyor.engine.records import NodeHints
from conveyor.engine.states import Priority
from conveyor.tasks.dispatch import decode_hints, encode_hints

HINTS = NodeHints(
    tenant_id=uuid.uuid4(),
    workflow_id=uuid.uuid4(),
    priority=Priority.LOW,
    enqueued_at=datetime(2026, 3, 1, 12, 30, 15, 250_000, tzinfo=UTC),
    node_id="send-mail",
    workflow="mailing",
)


def test_hints_survive_the_message() -> None:
    assert decode_hints(encode_hints(HINTS)) == HINTS


def test_hints_without_a_node_are_hints_still() -> None:
    raw = {k: v for k, v in encode_hints(HINTS).items() if k != "node_id"}
    assert decode_hints(raw) == NodeHints(**{**HINTS.__dict__, "node_id": None})


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "tenant",
        {},
        {**encode_hints(HINTS), "tenant_id": "not-a-uuid"},
        {**encode_hints(HINTS), "priority": "urgent"},
        {**encode_hints(HINTS), "enqueued_at_ms": "soon"},
        {**encode_hints(HINTS), "enqueued_at_ms": 10**20},
        {**encode_hints(HINTS), "node_id": 7},
        {k: v for k, v in encode_hints(HINTS).items() if k != "workflow_id"},
    ],
)
def test_a_malformed_hint_is_no_hint(raw: Any) -> None:
    assert decode_hints(raw) is None
