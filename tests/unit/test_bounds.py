"""The bounds of inputs and outputs: nesting, counts of nodes and needs, delays, output size;
each refusal names its bound and setting, and validation stays linear past them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

import conveyor
from conveyor import NodeContext
from conveyor.config import Settings
from conveyor.engine.bounds import MAX_DELAY_SECONDS, Bounds, deeper_than, delay_problem
from conveyor.engine.definitions import Node
from conveyor.engine.planning import delay_seconds
from conveyor.engine.validation import validate
from conveyor.exceptions import NonRetryableError
from conveyor.nodes import execute


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": [value]} if levels % 2 else {"a": value}
    return value


def py(node_id: str, *needs: str, **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": "f"}, "needs": list(needs),
            **fields}  # fmt: skip


# -- depth ---------------------------------------------------------------------------------------


def test_depth_counts_each_list_and_mapping_level() -> None:
    assert not deeper_than(1, 0)
    assert not deeper_than({"a": 1}, 1)
    assert deeper_than({"a": [1]}, 1)
    assert not deeper_than({"a": [1]}, 2)
    assert deeper_than([[[[]]]], 3)


def test_depth_of_a_value_far_past_the_recursion_limit_is_measured_without_recursing() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]

    assert deeper_than(value, 64)


# -- definitions ---------------------------------------------------------------------------------


def test_a_definition_nested_past_the_depth_limit_is_refused_naming_the_setting() -> None:
    definition = {"name": "wf", "nodes": [py("a", inputs={"x": nested(70)})]}

    [error] = validate(definition)

    assert "nested more than 64 levels deep (CONVEYOR_MAX_JSON_DEPTH)" in error


def test_a_definition_with_more_nodes_than_the_limit_is_refused_naming_the_setting() -> None:
    definition = {"name": "wf", "nodes": [py(f"n{i}") for i in range(11)]}

    assert validate(definition, bounds=Bounds(nodes=10)) == [
        "workflow: nodes: 11 nodes, over the limit of 10 (CONVEYOR_MAX_NODES); split the "
        "workflow, or raise CONVEYOR_MAX_NODES"
    ]


def test_a_node_with_more_needs_than_the_limit_is_refused_naming_the_setting() -> None:
    definition = {"name": "wf", "nodes": [*(py(f"n{i}") for i in range(4)),
                                          py("join", "n0", "n1", "n2", "n3")]}  # fmt: skip

    assert validate(definition, bounds=Bounds(needs=3)) == [
        "node 'join': needs: 4 needs, over the limit of 3 (CONVEYOR_MAX_NEEDS); join through "
        "fewer nodes, or raise CONVEYOR_MAX_NEEDS"
    ]


def test_the_widest_benchmark_fan_out_is_within_the_default_limits() -> None:
    members = [f"n{i}" for i in range(2000)]
    definition = {"name": "wf", "nodes": [py("root"), *(py(m, "root") for m in members),
                                          py("join", *members)]}  # fmt: skip

    assert validate(definition) == []


def test_validating_one_node_that_needs_another_200000_times_takes_linear_time() -> None:
    # It took 9.2 s at 20,000: the duplicates were counted, and the cycle search filtered
    # the node's needs again, once a need
    definition = {"name": "wf", "nodes": [py("a"), py("b", *(["a"] * 200_000))]}
    started = time.monotonic()

    errors = validate(definition, bounds=Bounds(needs=1_000_000))

    assert errors == ["node 'b': needs 'a' more than once; list it once"]
    assert time.monotonic() - started < 5


def test_a_definition_whose_templates_hold_more_than_a_mib_is_refused_before_any_is_parsed() -> (
    None
):
    # 3.8 MiB of them took 8 s of an API thread to parse, all of it before any answer
    expression = "{{ input.a }}" * 300
    nodes = [{**py(f"n{i}"), "inputs": {"v": f"{expression}{i}"}} for i in range(1000)]
    started = time.monotonic()

    errors = validate({"name": "wf", "nodes": nodes})

    assert len(errors) == 1 and "over the limit of 1,048,576" in errors[0], errors
    assert "its templates hold 3,9" in errors[0]
    assert time.monotonic() - started < 1


def test_a_template_s_problem_and_the_nodes_it_reads_come_from_one_parse() -> None:
    inputs = {"ok": "{{ nodes.a.x }}", "bad": "{{ nodes.a.x ", "loose": "{{ nodes['c'] }}"}
    definition = {"name": "wf", "nodes": [py("a"), {**py("b"), "inputs": inputs}]}

    errors = validate(definition)

    assert any("inputs.bad: template '{{ nodes.a.x ' does not parse" in e for e in errors)
    assert any("refers to nodes.a, but 'a' is not in needs" in e for e in errors)
    assert any("refers to nodes.c, but 'c' is not in needs" in e for e in errors)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e15, 1e300, -1, 10**400])
def test_a_literal_delay_must_be_finite_and_at_most_a_year(seconds: float) -> None:
    definition = {"name": "wf", "nodes": [{"id": "d", "type": "delay",
                                           "config": {"seconds": seconds}}]}  # fmt: skip

    [error] = validate(definition)

    assert error.startswith("node 'd': config.seconds: delay seconds")
    assert error.endswith(f"give a number from 0 to {MAX_DELAY_SECONDS}")


def test_a_delay_of_exactly_a_year_is_valid() -> None:
    assert delay_problem(MAX_DELAY_SECONDS) is None
    assert delay_problem(0) is None


# -- run time ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rendered", ["nan", "inf", "-inf", "1e300", "1e15", True, "-3", "x"])
def test_a_templated_delay_out_of_range_is_a_non_retryable_error(rendered: Any) -> None:
    node = Node(id="d", type="delay", config={"seconds": "{{ input.s }}"})

    with pytest.raises(NonRetryableError, match=r"config\.seconds must give a number of seconds"):
        delay_seconds(node, {"input": {"s": rendered}, "nodes": {}})


@conveyor.node("bounds.returns")
def returns(value: Any) -> Any:
    return value


def run(value: Any) -> Any:
    node = Node(id="n", type="python", config={"function": "bounds.returns"},
                inputs={"value": "{{ input.v }}"})  # fmt: skip
    ctx = NodeContext(execution_id="e", node_id="n", attempt=1)
    return execute(node, {"input": {"v": value}, "nodes": {}}, ctx, 5.0)


def test_an_output_over_the_output_limit_fails_the_node_naming_the_setting() -> None:
    with pytest.raises(
        NonRetryableError, match=r"over the limit of 1048576 bytes \(CONVEYOR_MAX_OUTPUT_BYTES\)"
    ):
        run("x" * 1_048_577)


@pytest.mark.parametrize("levels", [65, 5000])
def test_an_output_nested_past_the_depth_limit_fails_the_node_naming_the_setting(
    levels: int,
) -> None:
    with pytest.raises(NonRetryableError, match="CONVEYOR_MAX_JSON_DEPTH"):
        run(nested(levels))


def test_an_output_within_the_limits_is_returned() -> None:
    assert run(nested(60)) == nested(60)


def test_an_output_limit_past_postgresqls_largest_jsonb_is_refused_naming_the_setting() -> None:
    # (a larger one would let an output through that the insert then fails on, uncaught)
    assert Settings(max_output_bytes=268_435_455).max_output_bytes == 268_435_455
    with pytest.raises(ValidationError, match=r"max_output_bytes[\s\S]*268435455"):
        Settings(max_output_bytes=268_435_456)
