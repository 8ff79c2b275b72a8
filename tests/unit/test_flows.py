"""Workflows written in Python (conveyor.flows) store exactly what their YAML stores, wire
their dependencies from the nodes they name, and point errors at the line that declared the
faulty node."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TypedDict

import pytest
from pydantic import BaseModel

import conveyor
from conveyor import nodes
from conveyor.definition_files import load_definition
from conveyor.engine.definitions import ScheduleSpec, Workflow
from conveyor.exceptions import DefinitionError
from conveyor.flows import Flow, flows_in, ref

ROOT = Path(__file__).resolve().parents[2]
# Each YAML example, and the module and flow that write it in Python.
PYTHON_FORMS = {
    "branching.yaml": ("examples.python.branching", "branching"),
    "child.yaml": ("examples.python.child", "child"),
    "diamond.yaml": ("examples.python.diamond", "diamond"),
    "flaky.yaml": ("examples.python.flaky", "flaky"),
    "map-of-children.yaml": ("examples.python.map_of_children", "children"),
    "map.yaml": ("examples.python.map", "prices"),
    "order-payment.yaml": ("examples.python.order_payment", "order_payment"),
    "export-approval.yaml": ("examples.python.export_approval", "export_approval"),
}


def test_every_yaml_example_has_a_python_form() -> None:
    assert sorted(p.name for p in (ROOT / "examples").glob("*.yaml")) == sorted(PYTHON_FORMS)


@pytest.mark.parametrize("example", sorted(PYTHON_FORMS))
def test_the_python_form_stores_exactly_the_yaml_definition(example: str) -> None:
    module, attribute = PYTHON_FORMS[example]
    flow = getattr(importlib.import_module(module), attribute)
    from_yaml = Workflow.model_validate(
        load_definition(ROOT / "examples" / example, max_bytes=10**6)
    )

    from_python = flow.definition()

    assert from_python.canonical_json() == from_yaml.canonical_json()
    assert from_python.digest() == from_yaml.digest()


class Page(BaseModel):
    url: str
    body: str


class Count(TypedDict):
    words: int


def test_a_decorated_function_is_registered_and_placed_with_the_nodes_it_reads() -> None:
    flow = Flow("words", input=Page)

    @flow.node(inputs={"url": flow.input.url})
    def fetch(url: str) -> Page:
        return Page(url=url, body="a b c")

    @flow.node(inputs={"text": fetch.out.body}, timeout=5)
    def count(text: str) -> Count:
        return {"words": len(text.split())}

    flow.returns({"words": count.out["words"]})
    made = flow.definition()

    assert made.node("count").needs == ["fetch"]
    assert made.node("count").inputs == {"text": "{{ nodes.fetch.body }}"}
    assert made.node("count").timeout == 5
    assert made.output == {"words": "{{ nodes.count.words }}"}
    assert nodes.registered_name(fetch.fn) == "words.fetch"
    assert count("x y") == {"words": 2}  # still the function


def test_a_registered_function_returning_a_model_stores_its_json_and_takes_models() -> None:
    flow = Flow("models")

    @flow.node()
    def shout(page: Page) -> Page:
        return Page(url=page.url, body=page.body.upper())

    registered = nodes._REGISTRY["models.shout"]

    assert registered(page={"url": "u", "body": "hi"}) == {"url": "u", "body": "HI"}


def test_references_compile_to_templates_for_items_indices_and_odd_keys() -> None:
    flow = Flow("refs")

    assert str(flow.input) == "{{ input }}"
    assert str(ref(flow.input)["a-b"][0]) == "{{ input['a-b'][0] }}"
    assert str(conveyor.item_of([1, 2])) == "{{ item }}"
    assert f"total: {ref(flow.input).total}" == "total: {{ input.total }}"


def test_a_validation_error_names_the_line_that_declared_the_faulty_node() -> None:
    flow = Flow("broken")
    flow.call("some.function", id="first")
    line = _next_line()
    flow.delay("wait", "not a number or template")

    with pytest.raises(DefinitionError) as raised:
        flow.definition()

    assert f"{__file__}:{line}: node 'wait': config.seconds" in str(raised.value)


def test_a_node_declared_twice_is_refused_at_its_second_line() -> None:
    flow = Flow("twice")
    flow.call("f", id="a")
    with pytest.raises(DefinitionError) as raised:
        line = _next_line()
        flow.call("f", id="a")

    assert f"{__file__}:{line}: node 'a' is declared twice" in str(raised.value)


def test_an_unregistered_function_object_is_refused_with_the_fix() -> None:
    def loose() -> None: ...

    with pytest.raises(DefinitionError, match=r"decorate it with @conveyor\.node"):
        Flow("loose").call(loose, id="x")


def test_a_condition_lists_each_branch_from_the_nodes_that_name_it() -> None:
    flow = Flow("route")
    check = flow.condition("check", "input.n > 1")
    flow.call("a", id="big", after=[check.if_true])
    flow.call("b", id="small", after=[check.if_false])

    config = flow.definition().node("check").config

    assert config == {"expression": "input.n > 1", "if_true": ["big"], "if_false": ["small"]}


def test_workflow_options_priority_concurrency_and_schedules_are_stored() -> None:
    flow = Flow(
        "nightly",
        priority=conveyor.Priority.HIGH,
        concurrency=3,
        schedules=[ScheduleSpec(cron="@daily")],
    )
    flow.http("ping", url="https://example.com/{{ input.id }}", method="POST", json={"a": 1})

    made = flow.definition()

    assert (made.priority, made.concurrency) == (conveyor.Priority.HIGH, 3)
    assert made.schedules[0].cron == "@daily"
    assert made.node("ping").config == {
        "url": "https://example.com/{{ input.id }}",
        "method": "POST",
        "json": {"a": 1},
    }


def test_the_flows_a_module_declares_are_found() -> None:
    module = importlib.import_module("examples.python.child")

    assert [f.name for f in flows_in(module)] == ["diamond", "child"]


def _next_line() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


BROKEN_MODULE = """
import conveyor

flow = conveyor.Flow("broken-module")
flow.call("some.function", id="first")
flow.delay("wait", -5)
"""


def test_apply_module_names_the_line_of_a_faulty_node_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from conveyor.cli import app

    (tmp_path / "flows_with_a_fault.py").write_text(BROKEN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    result = CliRunner().invoke(app, ["workflow", "apply", "--module", "flows_with_a_fault"])

    assert result.exit_code == 1
    assert f"{tmp_path / 'flows_with_a_fault.py'}:6: node 'wait': config.seconds" in result.output


def test_a_maps_outputs_are_read_as_a_list_and_its_single_output_is_refused() -> None:
    flow = Flow("mapped", input=Page)
    each = flow.call("f", id="each", map=conveyor.Map(over=["a", "b"]))
    once = flow.call("g", id="once")

    assert str(ref(each.outs)[0]) == "{{ nodes.each[0] }}"
    with pytest.raises(DefinitionError, match="node 'each' is a map; its outputs are a list"):
        each.out  # noqa: B018
    with pytest.raises(DefinitionError, match="node 'once' is not a map"):
        once.outs  # noqa: B018


def test_a_node_of_any_registered_type_can_be_placed_by_its_config() -> None:
    flow = Flow("generic")
    first = flow.add("wait", "delay", {"seconds": 5})
    flow.add("ping", "http", {"url": "https://example.com"}, after=[first])

    made = flow.definition()

    assert (made.node("wait").config, made.node("ping").needs) == ({"seconds": 5}, ["wait"])


def test_a_node_of_another_flow_cannot_be_a_need() -> None:
    other = Flow("other")
    theirs = other.call("f", id="theirs")

    with pytest.raises(DefinitionError, match="a node needs nodes of its own flow"):
        Flow("mine").call("g", id="mine", after=[theirs])
