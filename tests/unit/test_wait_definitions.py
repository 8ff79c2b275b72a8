"""A wait node's definition: what it must name (the event, the key), its timeout, and the
branches its outcome takes; a bad one is refused at apply with the fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.engine import node_types, waits
from conveyor.engine.definitions import Node
from conveyor.engine.validation import validate
from conveyor.exceptions import NonRetryableError

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def problems(config: dict[str, Any], *others: dict[str, Any]) -> list[str]:
    wait = {"id": "wait", "type": "wait", "config": config}
    return validate({"name": "wf", "nodes": [wait, *others]})


def after(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "type": "delay", "needs": ["wait"], "config": {"seconds": 0}}


def test_a_wait_with_an_event_and_a_key_is_valid() -> None:
    assert problems({"event": "paid", "key": "{{ input.order }}"}) == []


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"key": "k"}, "config.event is required"),
        ({"event": "paid"}, "config.key is required"),
        ({"event": "paid", "key": "{{ input.order"}, "does not parse"),
        ({"event": "paid", "key": "k", "timeout": 0}, "config.timeout must be"),
        ({"event": "paid", "key": "k", "timeout": "soon"}, "config.timeout must be"),
        ({"event": "paid", "key": "k", "on_timeout": ["x"]}, "config.timeout is not given"),
        ({"event": "paid", "key": "k", "timeout": 5, "on_timeout": ["x"]}, "not a node"),
        ({"event": "paid", "key": "k", "then": 1}, "then"),
    ],
)
def test_a_bad_wait_is_refused_naming_the_fix(config: dict[str, Any], words: str) -> None:
    found = problems(config)
    assert any(words in p for p in found), found


def test_its_branches_must_name_nodes_that_need_it() -> None:
    config = {"event": "paid", "key": "k", "timeout": 5, "on_event": ["ok"],
              "on_timeout": ["late"]}  # fmt: skip
    assert problems(config, after("ok"), after("late")) == []
    lonely = {"id": "late", "type": "delay", "config": {"seconds": 0}}
    (found,) = problems(config, after("ok"), lonely)
    assert "does not need 'wait'" in found


def test_a_wait_takes_no_branch_from_its_output_and_may_not_map() -> None:
    wait = Node(id="w", type="wait", config={"event": "e", "key": "k"})
    assert node_types.waits_for_event(wait) and not node_types.waits(wait)
    assert node_types.branch_of(wait, {"branch": "on_timeout"}) is None
    assert not node_types.maps("wait")
    condition = Node(id="c", type="condition", config={"expression": "true"})
    assert node_types.branch_of(condition, {"branch": "if_true"}) == "if_true"


def wait_on(**config: Any) -> Node:
    return Node(id="w", type="wait", config={"event": "e", "key": "{{ input.k }}", **config})


def test_the_key_is_rendered_to_text_and_an_empty_one_fails_the_try() -> None:
    assert waits.wait_key(wait_on(), {"input": {"k": 42}}) == "42"
    with pytest.raises(NonRetryableError, match=r"config\.key rendered to"):
        waits.wait_key(wait_on(), {"input": {"k": ""}})


@pytest.mark.parametrize(
    ("timeout", "context", "at"),
    [
        (None, {}, None),
        (60, {}, NOW + timedelta(seconds=60)),
        ("{{ input.t }}", {"input": {"t": "90"}}, NOW + timedelta(seconds=90)),
        ("{{ input.t }}", {"input": {"t": "2026-01-02T00:00:00+00:00"}}, NOW + timedelta(days=1)),
        ("{{ input.t }}", {"input": {"t": "2026-01-02T00:00:00"}}, NOW + timedelta(days=1)),
    ],
)
def test_the_timeout_is_seconds_or_a_time(timeout: Any, context: dict[str, Any], at: Any) -> None:
    node = wait_on(timeout=timeout) if timeout is not None else wait_on()
    assert waits.timeout_of(node, context, NOW) == at


@pytest.mark.parametrize("value", ["tomorrow", -5, True])
def test_a_timeout_that_is_no_time_fails_the_try(value: Any) -> None:
    with pytest.raises(NonRetryableError, match=r"config\.timeout must give"):
        waits.timeout_of(wait_on(timeout="{{ input.t }}"), {"input": {"t": value}}, NOW)
