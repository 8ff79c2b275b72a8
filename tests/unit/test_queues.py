"""When a sweep takes jobs waiting too long for lost: only while their queue cannot hold them."""

from __future__ import annotations

from conveyor.engine.queues import NODE_QUEUE, jobs_held, may_hold


def test_jobs_are_taken_for_lost_when_the_broker_cannot_tell_what_it_holds() -> None:
    assert may_hold(None, NODE_QUEUE, 1) is False


def test_jobs_the_queue_may_still_name_are_taken_to_be_waiting() -> None:
    assert may_hold({NODE_QUEUE: 16}, NODE_QUEUE, 16) is True


def test_more_jobs_than_the_queue_may_name_are_taken_for_lost() -> None:
    assert may_hold({NODE_QUEUE: 16}, NODE_QUEUE, 17) is False
    assert may_hold({"workflow-execution": 500}, NODE_QUEUE, 1) is False


def test_a_queue_holds_its_messages_over_every_priority_times_the_jobs_one_names() -> None:
    # Redis: one line per priority; RabbitMQ: one count a queue, under "all"
    redis_depth = {
        (NODE_QUEUE, "high"): 1,
        (NODE_QUEUE, "normal"): 2,
        ("workflow-execution", "low"): 3,
    }
    amqp_depth = {(NODE_QUEUE, "all"): 3, ("workflow-execution", "all"): 3}

    assert jobs_held(redis_depth, {NODE_QUEUE: 8}) == {NODE_QUEUE: 24, "workflow-execution": 3}
    assert jobs_held(amqp_depth, {NODE_QUEUE: 8}) == jobs_held(redis_depth, {NODE_QUEUE: 8})
    assert jobs_held({}) == {}
