"""The live streams' pure parts: what a stream tells its client, who is refused, and what a
feed hands over (no services)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conveyor.api.hub import BACKLOG, Feed, Signal
from conveyor.api.stream import Admission, Tracker, event, refusal
from conveyor.engine.records import TenantRef
from conveyor.exceptions import TooManyStreams

ACME = TenantRef(id=uuid.uuid4(), name="acme")
GLOBEX = TenantRef(id=uuid.uuid4(), name="globex")


def test_a_stream_opens_with_the_execution_status_and_takes_its_nodes_as_known() -> None:
    tracker = Tracker()

    first = tracker.opened(("running", [("fetch", "completed"), ("send", "queued")]))

    assert first == event("execution", {"status": "running"})
    assert tracker.heard({"kind": "node", "node_id": "fetch", "status": "completed"}) is None
    assert tracker.heard({"kind": "node", "node_id": "send", "status": "running"}) == event(
        "node", {"node_id": "send", "status": "running"}
    )


def test_a_re_read_sends_only_what_changed_nodes_first_and_the_execution_last() -> None:
    tracker = Tracker()
    tracker.opened(("running", [("fetch", "running"), ("send", "waiting")]))

    nodes = [("fetch", "completed"), ("send", "waiting"), ("late", "completed")]
    sent = tracker.read(("completed", nodes))

    assert sent == [
        event("node", {"node_id": "fetch", "status": "completed"}),
        event("node", {"node_id": "late", "status": "completed"}),
        event("execution", {"status": "completed"}),
    ]
    assert tracker.finished


def test_nothing_is_sent_after_the_execution_finished() -> None:
    tracker = Tracker()
    tracker.opened(("running", []))
    tracker.heard({"kind": "execution", "status": "failed"})

    assert tracker.heard({"kind": "node", "node_id": "x", "status": "running"}) is None


def test_a_tenant_at_its_cap_is_refused_naming_the_setting() -> None:
    refused = refusal(ACME, 5, 7, per_tenant=5, per_process=100)

    assert isinstance(refused, TooManyStreams)
    assert "CONVEYOR_STREAMS_PER_TENANT" in str(refused) and "'acme'" in str(refused)
    assert refusal(ACME, 4, 7, per_tenant=5, per_process=100) is None


def test_a_full_process_refuses_every_tenant_naming_its_setting() -> None:
    refused = refusal(GLOBEX, 0, 100, per_tenant=5, per_process=100)

    assert isinstance(refused, TooManyStreams)
    assert "CONVEYOR_STREAMS_PER_PROCESS" in str(refused)


def test_admission_counts_per_tenant_and_a_release_frees_the_slot() -> None:
    admission = Admission(per_tenant=2, per_process=3)
    admission.admit(ACME)
    admission.admit(ACME)
    with pytest.raises(TooManyStreams):
        admission.admit(ACME)
    admission.admit(GLOBEX)
    with pytest.raises(TooManyStreams):
        admission.admit(GLOBEX)  # the process is full

    admission.release(ACME.id)

    admission.admit(GLOBEX)
    assert (admission.held(ACME.id), admission.held(GLOBEX.id), admission.open) == (1, 2, 3)


def test_a_feed_hands_over_its_notices_in_order_then_says_idle() -> None:
    async def scenario() -> tuple[object, object]:
        feed = Feed(uuid.uuid4())
        feed.push({"kind": "execution", "status": "running"})
        feed.push({"kind": "execution", "status": "completed"})
        return await feed.next(1.0), await feed.next(0.01)

    heard, idle = asyncio.run(scenario())

    assert heard == [
        {"kind": "execution", "status": "running"},
        {"kind": "execution", "status": "completed"},
    ]
    assert idle is Signal.IDLE


def test_a_feed_whose_reader_falls_behind_asks_for_a_re_read_instead_of_growing() -> None:
    async def scenario() -> tuple[object, object]:
        feed = Feed(uuid.uuid4())
        for n in range(BACKLOG + 5):
            feed.push({"kind": "node", "node_id": str(n), "status": "running"})
        return await feed.next(1.0), await feed.next(1.0)

    first, then = asyncio.run(scenario())

    assert first is Signal.RESYNC
    assert then == [{"kind": "node", "node_id": str(n), "status": "running"}
                    for n in range(BACKLOG + 1, BACKLOG + 5)]  # fmt: skip


def test_an_ended_feed_says_end_before_anything_else() -> None:
    async def scenario() -> object:
        feed = Feed(uuid.uuid4())
        feed.push({"kind": "execution", "status": "running"})
        feed.end()
        return await feed.next(1.0)

    assert asyncio.run(scenario()) is Signal.END


def test_a_polled_read_of_the_whole_state_sends_only_what_changed() -> None:
    tracker = Tracker()
    tracker.opened(("running", [("fetch", "running")]))
    state = {"kind": "state", "status": "running", "nodes": [("fetch", "running")]}

    assert tracker.heard(state) is None
    assert tracker.heard({**state, "nodes": [("fetch", "completed"), ("send", "queued")]}) == (
        event("node", {"node_id": "fetch", "status": "completed"})
        + event("node", {"node_id": "send", "status": "queued"})
    )
    assert tracker.heard({**state, "status": "bogus"}) is None


def test_a_notice_not_in_the_triggers_shape_is_ignored() -> None:
    tracker = Tracker()
    tracker.opened(("running", [("fetch", "running")]))

    for stray in (
        {"kind": "execution", "status": "exploded"},
        {"kind": "node", "status": "completed"},
        {"kind": "node", "node_id": 7, "status": "completed"},
        {"status": "completed"},
        {},
    ):
        assert tracker.heard(stray) is None
    assert (tracker.status, tracker.nodes) == ("running", {"fetch": "running"})
