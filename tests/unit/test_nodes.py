"""Running python, condition and delay nodes in-process (http is covered by integration)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import conveyor
from conveyor import NodeContext
from conveyor.engine.definitions import Node
from conveyor.engine.planning import delay_seconds
from conveyor.exceptions import (
    NodeCancelled,
    NodeError,
    NodeTimeout,
    NonRetryableError,
    TemplateError,
    UnknownFunction,
)
from conveyor.nodes import execute, registered_functions


@conveyor.node("unit.add")
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@conveyor.node("unit.whoami")
def whoami(greeting: str, ctx: NodeContext) -> dict[str, Any]:
    return {
        "text": f"{greeting} {ctx.node_id}",
        "attempt": ctx.attempt,
        "key": ctx.idempotency_key,
    }


@conveyor.node("unit.sleep")
def sleep_two_seconds() -> None:
    time.sleep(2)


@conveyor.node("unit.polite_sleep")
def sleep_until_told_to_stop(ctx: NodeContext) -> None:
    ctx.cancel_event.wait(2)


@conveyor.node("unit.thread")
def thread_ident() -> dict[str, Any]:
    return {"ident": threading.get_ident(), "name": threading.current_thread().name}


@conveyor.node("unit.returns_set")
def returns_set() -> set[int]:
    return {1, 2}


@conveyor.node("unit.refuses")
def refuses() -> None:
    raise conveyor.NodeError("x", retryable=False)


@conveyor.node("unit.crashes")
def crashes() -> None:
    raise RuntimeError("boom")


def python(function: str, **inputs: Any) -> Node:
    return Node(id="n", type="python", config={"function": function}, inputs=inputs)


def condition(expression: str, **inputs: Any) -> Node:
    config = {"expression": expression, "if_true": ["yes"], "if_false": ["no"]}
    return Node(id="check", type="condition", config=config, inputs=inputs)


def delay(seconds: Any) -> Node:
    return Node(id="wait", type="delay", config={"seconds": seconds})


def context(workflow_input: Any = None, **outputs: Any) -> dict[str, Any]:
    return {"input": workflow_input or {}, "nodes": outputs, "execution": {"id": "e-1"}}


def node_ctx(node_id: str = "n", attempt: int = 1) -> NodeContext:
    return NodeContext(execution_id="e-1", node_id=node_id, attempt=attempt)


def run(node: Node, ctx: dict[str, Any] | None = None, timeout: float | None = 5.0) -> Any:
    return execute(node, ctx or context(), node_ctx(node.id), timeout)


# Python nodes


def test_decorated_function_is_registered_under_its_name() -> None:
    assert {"unit.add", "unit.whoami"} <= registered_functions()


def test_python_node_receives_its_rendered_inputs_as_keyword_arguments() -> None:
    node = python("unit.add", a="{{ input.a }}", b="{{ nodes.prev.b }}")

    assert run(node, context({"a": 2}, prev={"b": 40})) == {"sum": 42}


def test_python_node_receives_ctx_when_it_asks_for_it() -> None:
    node = python("unit.whoami", greeting="hello")

    result = execute(node, context(), node_ctx("n", attempt=3), 5.0)

    assert result == {"text": "hello n", "attempt": 3, "key": "e-1:n"}


def test_python_node_running_past_its_timeout_raises_a_retryable_node_timeout() -> None:
    ctx = node_ctx()
    started = time.monotonic()

    with pytest.raises(NodeTimeout) as raised:
        execute(python("unit.polite_sleep"), context(), ctx, 0.2)

    assert time.monotonic() - started < 1.5
    assert raised.value.retryable is True
    # The thread is told to stop, and it did.
    assert ctx.cancelled


def test_a_timed_out_node_that_ignores_cancellation_is_not_retried() -> None:
    ctx = node_ctx()

    with pytest.raises(NodeTimeout) as raised:
        execute(python("unit.sleep"), context(), ctx, 0.2)

    assert raised.value.retryable is False
    assert "did not stop" in str(raised.value)


def test_python_node_of_a_cancelled_execution_raises_node_cancelled() -> None:
    ctx = node_ctx()
    ctx.cancel_event.set()
    started = time.monotonic()

    with pytest.raises(NodeCancelled) as raised:
        execute(python("unit.sleep"), context(), ctx, None)

    assert time.monotonic() - started < 1.5
    assert raised.value.retryable is False


def test_nodes_run_one_after_another_on_the_same_thread_not_the_caller_s() -> None:
    first, second = run(python("unit.thread")), run(python("unit.thread"))

    assert first["ident"] == second["ident"] != threading.get_ident()
    assert first["name"] == "conveyor-node-n"  # named after the node while it runs


def test_a_thread_whose_node_timed_out_or_was_cancelled_is_not_given_another() -> None:
    before = run(python("unit.thread"))["ident"]
    with pytest.raises(NodeTimeout):  # the sleeping thread takes 2 s to come back
        execute(python("unit.sleep"), context(), node_ctx(), 0.1)
    timed_out = run(python("unit.thread"))["ident"]
    cancelled = node_ctx()
    cancelled.cancel_event.set()
    with pytest.raises(NodeCancelled):
        execute(python("unit.polite_sleep"), context(), cancelled, None)
    after = run(python("unit.thread"))["ident"]

    assert before != timed_out != after  # each give-up retired the thread it ran on
    assert run(python("unit.thread"))["ident"] == after


def test_a_forked_child_runs_nodes_on_threads_of_its_own() -> None:
    run(python("unit.thread"))  # the parent keeps an idle thread, which a child lacks
    pid = os.fork()
    if pid == 0:  # the child: a node handed to the parent's thread would never run
        code = 1
        try:
            result = execute(python("unit.add", a=1, b=2), context(), node_ctx(), 2.0)
            code = 0 if result == {"sum": 3} else 1
        finally:
            os._exit(code)
    _, code = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(code) == 0


def test_unregistered_function_raises_unknown_function_that_is_not_retryable() -> None:
    with pytest.raises(UnknownFunction, match=r"unit\.never_registered") as raised:
        run(python("unit.never_registered"))

    assert raised.value.retryable is False


def test_non_json_return_value_raises_non_retryable_error() -> None:
    with pytest.raises(NonRetryableError, match="not JSON-serializable"):
        run(python("unit.returns_set"))


def test_node_error_raised_by_the_function_propagates_with_its_retryable_flag() -> None:
    with pytest.raises(NodeError, match=r"^x$") as raised:
        run(python("unit.refuses"))

    assert raised.value.retryable is False


def test_other_exception_raised_by_the_function_propagates_unchanged() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        run(python("unit.crashes"))


def test_inputs_that_do_not_match_the_function_raise_non_retryable_error() -> None:
    with pytest.raises(NonRetryableError, match="inputs do not match"):
        run(python("unit.add", a=1, c=2))


def test_registering_another_function_under_a_taken_name_is_refused() -> None:
    def first() -> None: ...

    def second() -> None: ...

    conveyor.node("unit.taken")(first)

    with pytest.raises(ValueError, match="already registered"):
        conveyor.node("unit.taken")(second)


# Condition nodes


def test_condition_node_takes_the_true_branch_when_the_expression_holds() -> None:
    result = run(condition("input.amount > 100"), context({"amount": 150}))

    assert result == {"result": True, "branch": "if_true"}


def test_condition_node_takes_the_false_branch_when_the_expression_fails() -> None:
    result = run(condition("input.amount > 100"), context({"amount": 50}))

    assert result == {"result": False, "branch": "if_false"}


def test_condition_node_can_read_its_rendered_inputs() -> None:
    node = condition("inputs.total >= 10", total="{{ nodes.a.n * 2 }}")

    assert run(node, context(a={"n": 5})) == {"result": True, "branch": "if_true"}


def test_condition_node_with_a_failing_comparison_raises_template_error() -> None:
    with pytest.raises(TemplateError):
        run(condition("input.missing > 1"), context({"amount": 1}))


def test_condition_node_on_an_undefined_name_raises_template_error() -> None:
    with pytest.raises(TemplateError):
        run(condition("input.missing"), context({"amount": 1}))


# Delay nodes


def test_delay_node_reports_the_seconds_it_waited() -> None:
    assert run(delay("{{ input.s }}"), context({"s": 2})) == {"delayed_seconds": 2.0}


def test_delay_seconds_that_render_negative_raise_non_retryable_error() -> None:
    with pytest.raises(NonRetryableError, match="negative"):
        delay_seconds(delay("{{ input.s }}"), context({"s": -1}))


@conveyor.node("unit.returns_nan")
def returns_nan() -> dict[str, float]:
    return {"ratio": float("nan")}


@conveyor.node("unit.returns_nul")
def returns_nul() -> str:
    return "a\x00b"


@pytest.mark.parametrize("function", ["unit.returns_nan", "unit.returns_nul"])
def test_an_output_the_database_cannot_store_is_refused_without_retry(function: str) -> None:
    with pytest.raises(NonRetryableError):
        execute(python(function), context(), node_ctx(), 5.0)


def test_a_negative_delay_fails_without_retry() -> None:
    node = Node(id="d", type="delay", config={"seconds": "{{ input.s }}"})

    with pytest.raises(NonRetryableError, match="negative"):
        execute(node, context({"s": -5}), node_ctx(), 5.0)
