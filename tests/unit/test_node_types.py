"""Node types are a registry: a new type joins with one entry, and validation, planning and the
worker's executor find it there."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from conveyor import NodeContext
from conveyor.engine import node_types, planning
from conveyor.engine.definitions import Node
from conveyor.engine.node_types import Checking, NodeType, Step
from conveyor.engine.validation import validate
from conveyor.exceptions import NonRetryableError
from conveyor.nodes import execute


def _shout_problems(config: Mapping[str, Any], checking: Checking) -> list[str]:
    return [] if isinstance(config.get("text"), str) else ["config.text is required: a string"]


def _shout(step: Step) -> dict[str, Any]:
    return {"shouted": f"{step.node.config['text'].upper()}{step.inputs.get('end', '')}"}


SHOUT = NodeType(
    name="shout", config_keys=frozenset({"text"}), check=_shout_problems, execute=_shout
)


@pytest.fixture
def shout() -> Iterator[NodeType]:
    node_types.register(SHOUT)
    try:
        yield SHOUT
    finally:
        node_types.unregister(SHOUT.name)


def definition(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"name": "wf", "nodes": list(nodes)}


def run(node: Node) -> Any:
    ctx = NodeContext(execution_id="e-1", node_id=node.id, attempt=1)
    return execute(node, {"input": {}, "nodes": {}, "execution": {"id": "e-1"}}, ctx, 5.0)


def test_a_registered_type_is_validated_by_its_own_check(shout: NodeType) -> None:
    assert validate(definition({"id": "a", "type": "shout", "config": {"text": "hi"}})) == []
    assert validate(definition({"id": "a", "type": "shout", "config": {}})) == [
        "node 'a': config.text is required: a string"
    ]
    assert validate(definition({"id": "a", "type": "shout", "config": {"text": "x", "n": 1}})) == [
        "node 'a': config.n is not a shout setting; use ['text']"
    ]


def test_a_registered_type_is_named_among_the_known_types(shout: NodeType) -> None:
    (error,) = validate(definition({"id": "a", "type": "shell"}))

    assert "use one of python, http, delay, condition, workflow, wait, approval, shout " in error


def test_a_registered_type_is_run_by_its_executor(shout: NodeType) -> None:
    node = Node(id="a", type="shout", config={"text": "hi"}, inputs={"end": "{{ '!' }}"})

    assert run(node) == {"shouted": "HI!"}


def test_an_unregistered_type_is_unknown_again() -> None:
    node_types.register(SHOUT)
    node_types.unregister(SHOUT.name)

    (error,) = validate(definition({"id": "a", "type": "shout", "config": {"text": "hi"}}))
    assert error.startswith("node 'a': unknown type 'shout';")
    with pytest.raises(NonRetryableError, match="'shout' is not supported by this worker"):
        run(Node(id="a", type="shout", config={"text": "hi"}))


def test_a_type_name_is_registered_once(shout: NodeType) -> None:
    with pytest.raises(ValueError, match="'shout' is already registered"):
        node_types.register(SHOUT)
    with pytest.raises(ValueError, match="'delay' is already registered"):
        node_types.register(NodeType(name="delay", config_keys=frozenset(), check=_shout_problems))


def test_a_type_that_waits_holds_its_job_for_what_its_wait_gives() -> None:
    later = NodeType(
        name="later",
        config_keys=frozenset({"minutes"}),
        check=_shout_problems,
        execute=lambda step: {},
        wait=lambda node, context, now: 60.0 * node.config["minutes"],
    )
    node = Node(id="a", type="later", config={"minutes": 2})
    node_types.register(later)
    try:
        assert node_types.waits(node)
        assert planning.delay_seconds(node, {}) == 120.0
    finally:
        node_types.unregister(later.name)


def test_a_type_whose_output_chooses_a_branch_gates_the_nodes_listed_on_it() -> None:
    switch = NodeType(
        name="switch",
        config_keys=frozenset({"left", "right"}),
        check=_shout_problems,
        branches=("left", "right"),
    )
    node = Node(id="s", type="switch", config={"left": ["a"], "right": ["b"]})
    node_types.register(switch)
    try:
        assert planning.gated_branch(node, "a") == "left"
        assert planning.gated_branch(node, "b") == "right"
        assert planning.gated_branch(node, "c") is None
    finally:
        node_types.unregister(switch.name)


@pytest.mark.parametrize(
    ("node", "waits", "branches"),
    [
        (Node(id="p", type="python", config={"function": "f"}), False, ()),
        (Node(id="h", type="http", config={"url": "https://example.com"}), False, ()),
        (Node(id="d", type="delay", config={"seconds": 1}), True, ()),
        (Node(id="c", type="condition", config={"expression": "true"}), False,
         ("if_true", "if_false")),
        (Node(id="x", type="removed"), False, ()),
    ],
)  # fmt: skip
def test_the_built_in_types_say_what_the_engine_does_differently(
    node: Node, waits: bool, branches: tuple[str, ...]
) -> None:
    assert node_types.waits(node) is waits
    assert node_types.branches(node) == branches


def test_the_worker_has_an_executor_for_every_built_in_type() -> None:
    for name in ("python", "http", "delay", "condition"):
        kind = node_types.named(name)
        assert kind is not None and kind.execute is not None, name
