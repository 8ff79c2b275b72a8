"""A node's ``map`` as a definition writes it: validated (its type, its ``over``, its bounds),
left out of the stored definition when unset, and what an item's try reads and sees."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor import NodeContext
from conveyor.engine import node_types
from conveyor.engine.definitions import ItemFailure, Node, Workflow
from conveyor.engine.validation import validate


def mapped(node_id: str = "m", *needs: str, type: str = "python", **spec: Any) -> dict[str, Any]:
    config = {"function": "f"} if type == "python" else {"url": "https://example.com"}
    return {"id": node_id, "type": type, "needs": list(needs), "config": config,
            "map": {"over": "{{ input.rows }}", **spec}}  # fmt: skip


def errors(*nodes: dict[str, Any]) -> list[str]:
    return validate({"name": "wf", "nodes": list(nodes)})


def test_a_python_http_or_workflow_node_may_map_with_each_setting() -> None:
    child = {**mapped("w", type="workflow"), "config": {"workflow": "kid"}}
    assert (
        errors(
            mapped(concurrency=3, on_item_failure="run_all", max_items=50),
            mapped("h", type="http"),
            child,
        )
        == []
    )


@pytest.mark.parametrize("kind", ["delay", "condition"])
def test_a_delay_or_a_condition_node_cannot_map(kind: str) -> None:
    config = {"seconds": 1} if kind == "delay" else {"expression": "true", "if_true": ["x"]}
    node = {"id": "d", "type": kind, "config": config, "map": {"over": "{{ input.rows }}"}}
    found = errors(node, {"id": "x", "type": "python", "needs": ["d"], "config": {"function": "f"}})

    assert found == [
        f"node 'd': map: a {kind} node cannot map; only nodes that run a function, a request "
        f"or a child workflow can (python, http, workflow): remove map, or map a node of one "
        f"of those types"
    ]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"over": "input.rows"}, "map.over 'input.rows' is not a template; give one that"),
        ({"over": "{{ input.rows "}, "map.over: template '{{ input.rows ' does not parse"),
        ({"over": "{{ nodes.fetch.rows }}"}, "map.over refers to nodes.fetch, but 'fetch' is not"),
        ({"concurrency": 0}, "map.concurrency: Input should be greater than or equal to 1"),
        ({"max_items": 0}, "map.max_items: Input should be greater than or equal to 1"),
        ({"on_item_failure": "ignore"}, "map.on_item_failure: Input should be 'fail_fast'"),
        ({"every": 2}, "map.every: unknown field; remove it"),
    ],
)
def test_a_map_s_problems_are_named(spec: dict[str, Any], problem: str) -> None:
    (found,) = errors(mapped(**spec))

    assert found.startswith(f"node 'm': {problem}"), found


def test_a_node_without_map_is_stored_as_before_it_existed() -> None:
    plain = Workflow(name="wf", nodes=[Node(id="a", type="python", config={"function": "f"})])
    with_map = Workflow.model_validate({"name": "wf", "nodes": [mapped()]})

    assert "map" not in plain.canonical_json()
    assert with_map.nodes[0].map is not None
    assert with_map.nodes[0].map.on_item_failure is ItemFailure.FAIL_FAST
    assert '"map":{"concurrency":null,"on_item_failure":"fail_fast","over":' in (
        with_map.canonical_json()
    )  # and no max_items: a map stored before it existed keeps its digest
    capped = Workflow.model_validate({"name": "wf", "nodes": [mapped(max_items=5)]})
    assert '"max_items":5' in capped.canonical_json()


def test_an_item_reads_only_the_needs_its_inputs_and_config_name() -> None:
    node = Node.model_validate(
        mapped("m", "fetch", "config", "other", over="{{ nodes.fetch.rows }}")
        | {"inputs": {"row": "{{ item }}", "limit": "{{ nodes.config.limit }}"}}
    )

    assert node.item_reads == ("config",)


@pytest.mark.parametrize(
    ("inputs", "config", "reads"),
    [
        ({"row": "{{ item }}", "at": "{{ index }}"}, {}, False),
        ({"row": "{{ item }}", "plain": "input"}, {}, False),  # not a template
        ({"scale": "{{ input.scale * item }}"}, {}, True),
        ({"text": "{% set x = input %}{{ x.a }}"}, {}, True),
        ({}, {"function": "f", "url": "{{ input['base'] }}/{{ item }}"}, True),
        ({"broken": "{{ input.a "}, {}, True),  # does not parse: may read anything
    ],
)
def test_an_item_reads_the_execution_s_input_only_when_its_templates_name_it(
    inputs: dict[str, Any], config: dict[str, Any], reads: bool
) -> None:
    node = Node.model_validate(mapped() | {"inputs": inputs, "config": config or {"function": "f"}})

    assert node.item_reads_input is reads


def test_an_item_s_context_carries_its_item_and_index_and_keys_its_effects_by_them() -> None:
    item = NodeContext(execution_id="e", node_id="m", attempt=1, item={"id": 7}, index=3)
    plain = NodeContext(execution_id="e", node_id="m", attempt=1)

    assert (item.item, item.index, item.idempotency_key) == ({"id": 7}, 3, "e:m:3")
    assert (plain.item, plain.index, plain.idempotency_key) == (None, None, "e:m")


def test_the_types_that_map_are_the_registry_s_to_say() -> None:
    assert [n for n in node_types.names() if node_types.maps(n)] == ["python", "http", "workflow"]
    assert not node_types.maps("nonesuch")
