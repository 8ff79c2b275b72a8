"""Validation refuses every invalid definition at once, naming the node and the fix."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import conveyor
from conveyor import NodeContext
from conveyor.engine.addresses import AllowList
from conveyor.engine.validation import find_cycle, parse_workflow, validate
from conveyor.exceptions import DefinitionError
from conveyor.nodes import function_parameters


def py(node_id: str, *needs: str, **fields: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"id": node_id, "type": "python", "config": {"function": "f"}}
    if needs:
        node["needs"] = list(needs)
    node.update(fields)
    return node


def http(node_id: str, *needs: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "http", "needs": list(needs), "config": config}


def delay(node_id: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "delay", "config": config}


def condition(node_id: str, *needs: str, **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "condition", "needs": list(needs), "config": config}


def workflow(*nodes: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"name": "wf", "nodes": list(nodes), **fields}


def only_error(definition: dict[str, Any], **kwargs: Any) -> str:
    errors = validate(definition, **kwargs)
    assert len(errors) == 1, errors
    return errors[0]


def diamond() -> dict[str, Any]:
    return workflow(
        py("a"),
        py("b", "a", inputs={"x": "{{ nodes.a.value }}"}),
        py("c", "a", inputs={"y": "{{ nodes['a'].value }}"}),
        py("d", "b", "c", inputs={"total": "{{ nodes.b.x + nodes.c.y }}"}),
    )


# Valid definitions


def test_valid_diamond_has_no_errors() -> None:
    assert validate(diamond()) == []


def test_valid_definition_using_every_node_type_has_no_errors() -> None:
    definition = workflow(
        py("start"),
        condition("check", "start", expression="nodes.start.n > 1", if_true=["call"]),
        http("call", "check", url="https://example.com/{{ nodes.check.result }}", method="post"),
        delay("wait", seconds=1.5),
        delay("wait_templated", seconds="{{ input.seconds }}"),
    )

    assert validate(definition, known_functions={"f"}) == []


def test_parse_workflow_returns_the_workflow_for_a_valid_definition() -> None:
    parsed = parse_workflow(diamond())

    assert [n.id for n in parsed.nodes] == ["a", "b", "c", "d"]
    assert parsed.node("d").needs == ["b", "c"]


# Graph errors


def test_duplicate_id_is_refused_naming_the_node() -> None:
    error = only_error(workflow(py("a"), py("a")))

    assert "'a'" in error
    assert "duplicate id" in error
    assert "unique id" in error


def test_need_naming_a_missing_node_is_refused() -> None:
    error = only_error(workflow(py("a", "ghost")))

    assert error.startswith("node 'a':")
    assert "'ghost'" in error
    assert "not a node of this workflow" in error
    assert "fix the name or add the node" in error


def test_node_needing_itself_is_refused() -> None:
    error = only_error(workflow(py("a", "a")))

    assert error.startswith("node 'a':")
    assert "needs itself" in error
    assert "remove 'a' from its needs" in error


def test_cycle_is_refused_naming_every_node_in_it() -> None:
    error = only_error(workflow(py("root"), py("a", "root", "c"), py("b", "a"), py("c", "b")))

    assert "cycle" in error
    for node_id in ("a", "b", "c"):
        assert f"'{node_id}'" in error
    assert "'root'" not in error
    assert "remove one of these needs" in error


def test_two_node_cycle_is_refused() -> None:
    error = only_error(workflow(py("a", "b"), py("b", "a")))

    assert "cycle" in error
    assert "'a'" in error
    assert "'b'" in error


def test_find_cycle_returns_a_closed_path_through_the_cycle() -> None:
    cycle = find_cycle({"root": [], "a": ["root", "c"], "b": ["a"], "c": ["b"]})

    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert sorted(cycle[:-1]) == ["a", "b", "c"]
    # Every step of the path follows a real need.
    needs = {"a": ["root", "c"], "b": ["a"], "c": ["b"]}
    for node_id, dep in itertools.pairwise(cycle):
        assert dep in needs[node_id]


def test_find_cycle_returns_none_for_an_acyclic_graph() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}) is None


# Node fields


def test_unknown_node_type_is_refused_listing_the_known_types() -> None:
    error = only_error(workflow({"id": "a", "type": "shell"}))

    assert error.startswith("node 'a':")
    assert "unknown type 'shell'" in error
    for known in ("python", "http", "delay", "condition"):
        assert known in error


@pytest.mark.parametrize(
    ("retry", "field", "hint"),
    [
        ({"max_attempts": 0}, "retry.max_attempts", "greater than or equal to 1"),
        ({"backoff": -1}, "retry.backoff", "greater than 0"),
    ],
)
def test_bad_retry_value_is_refused_naming_the_field(
    retry: dict[str, Any], field: str, hint: str
) -> None:
    error = only_error(workflow(py("a", retry=retry)))

    assert error.startswith(f"node 'a': {field}:")
    assert hint in error


@pytest.mark.parametrize("timeout", [0, -5])
def test_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    error = only_error(workflow(py("a", timeout=timeout)))

    assert error.startswith("node 'a': timeout:")
    assert "greater than 0" in error


def test_unknown_node_field_is_refused() -> None:
    error = only_error(workflow(py("a", colour="red")))

    assert error.startswith("node 'a': colour:")
    assert "unknown field; remove it" in error


def test_unknown_workflow_field_is_refused() -> None:
    error = only_error(workflow(py("a"), colour="red"))

    assert error.startswith("workflow: colour:")
    assert "unknown field; remove it" in error


def test_unknown_config_setting_is_refused_listing_the_settings() -> None:
    error = only_error(workflow(py("a", config={"function": "f", "module": "os"})))

    assert error.startswith("node 'a':")
    assert "config.module is not a python setting" in error
    assert "'function'" in error


# Python nodes


def test_python_node_without_function_is_refused() -> None:
    error = only_error(workflow({"id": "a", "type": "python"}))

    assert error.startswith("node 'a':")
    assert "config.function is required" in error


def test_python_node_naming_an_unregistered_function_is_refused() -> None:
    error = only_error(workflow(py("a")), known_functions={"g", "h"})

    assert error.startswith("node 'a':")
    assert "'f' is not registered" in error
    assert "registered: g, h" in error
    assert "@conveyor.node('f')" in error


def test_python_node_naming_a_registered_function_passes() -> None:
    assert validate(workflow(py("a")), known_functions={"f"}) == []


# HTTP nodes


def test_http_node_without_url_is_refused() -> None:
    error = only_error(workflow(http("a")))

    assert error.startswith("node 'a':")
    assert "config.url is required" in error


def test_http_node_with_unknown_method_is_refused_listing_the_methods() -> None:
    error = only_error(workflow(http("a", url="https://example.com", method="FETCH")))

    assert error.startswith("node 'a':")
    assert "config.method 'FETCH'" in error
    assert "GET, POST" in error


def test_http_node_with_a_non_http_url_is_refused() -> None:
    error = only_error(workflow(http("a", url="ftp://example.com/file")))

    assert error.startswith("node 'a':")
    assert "'ftp://example.com/file'" in error
    assert "must start with http:// or https://" in error


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/", "is the link-local (cloud metadata"),
        ("http://2130706433:8000/metrics", "is the loopback address 127.0.0.1"),
        ("http://localhost:8000/metrics", "'localhost' resolves to a loopback address"),
        ("https://[fd00::1]/", "private (unique local"),
    ],
)
def test_an_http_node_whose_written_url_the_node_would_refuse_is_refused_at_apply(
    url: str, words: str
) -> None:
    error = only_error(workflow(http("a", url=url)), http_allow=AllowList())

    assert error.startswith(f"node 'a': config.url {url!r}: the host")
    assert words in error
    assert "an operator can allow it with CONVEYOR_HTTP_ALLOW" in error


def test_an_allowed_or_templated_or_public_url_passes_the_address_check() -> None:
    allow = AllowList.parse(["10.0.0.0/8"])
    definition = workflow(
        py("p"),
        http("a", url="http://10.1.2.3/internal"),
        http("b", "p", url="{{ nodes.p.url }}"),
        http("c", url="https://api.example.com/items"),
    )

    assert validate(definition, http_allow=allow) == []


def test_without_an_allow_list_the_caller_asked_for_no_address_check() -> None:
    assert validate(workflow(http("a", url="http://127.0.0.1:9/"))) == []


# Delay nodes


def test_delay_node_without_seconds_is_refused() -> None:
    error = only_error(workflow(delay("a")))

    assert error.startswith("node 'a':")
    assert "config.seconds is required" in error


def test_delay_node_with_negative_seconds_is_refused() -> None:
    error = only_error(workflow(delay("a", seconds=-1)))

    assert error.startswith("node 'a':")
    assert "config.seconds" in error
    assert "from 0 to" in error


# Condition nodes


def test_condition_without_expression_is_refused() -> None:
    error = only_error(workflow(condition("c", if_true=["b"]), py("b", "c")))

    assert error.startswith("node 'c':")
    assert "config.expression is required" in error


def test_condition_with_unparsable_expression_is_refused() -> None:
    error = only_error(
        workflow(condition("c", expression="input.a >", if_true=["b"]), py("b", "c"))
    )

    assert error.startswith("node 'c':")
    assert "config.expression 'input.a >' does not parse" in error


def test_condition_branch_naming_a_node_that_does_not_need_it_is_refused() -> None:
    error = only_error(workflow(condition("c", expression="input.a", if_true=["b"]), py("b")))

    assert error.startswith("node 'c':")
    assert "config.if_true names 'b', which does not need 'c'" in error
    assert "add 'c' to the needs of 'b'" in error


def test_condition_without_any_branch_target_is_refused() -> None:
    error = only_error(workflow(condition("c", expression="input.a")))

    assert error.startswith("node 'c':")
    assert "if_true or config.if_false must name at least one node" in error


# Templates


@pytest.mark.parametrize("reference", ["nodes.a.value", "nodes['a'].value"])
def test_input_template_referring_to_a_node_outside_needs_is_refused(reference: str) -> None:
    definition = workflow(py("a"), py("b", inputs={"x": f"{{{{ {reference} }}}}"}))

    error = only_error(definition)

    assert error.startswith("node 'b': inputs.x refers to nodes.a")
    assert "add it to needs" in error


def test_config_template_referring_to_a_node_outside_needs_is_refused() -> None:
    error = only_error(workflow(py("a"), http("b", url="{{ nodes.a.url }}")))

    assert error.startswith("node 'b': config.url refers to nodes.a")


def test_condition_expression_referring_to_a_node_outside_needs_is_refused() -> None:
    definition = workflow(
        py("a"), condition("c", expression="nodes.a.n > 1", if_true=["b"]), py("b", "c")
    )

    error = only_error(definition)

    assert error.startswith("node 'c': config.expression refers to nodes.a")


def test_template_nested_in_a_list_referring_outside_needs_is_refused() -> None:
    definition = workflow(py("a"), py("b", inputs={"items": [{"x": "{{ nodes.a.v }}"}]}))

    assert only_error(definition).startswith("node 'b': inputs.items refers to nodes.a")


def test_template_that_does_not_parse_is_refused() -> None:
    error = only_error(workflow(py("a", inputs={"x": "{{ input.a "})))

    assert error.startswith("node 'a': inputs.x: template '{{ input.a ' does not parse")


# Several problems


def test_definition_with_several_problems_reports_all_of_them() -> None:
    definition = workflow(
        py("a"),
        py("a"),
        py("b", "ghost", retry={"max_attempts": 0}),
        {"id": "c", "type": "shell"},
        http("d", url="ftp://x"),
        delay("e", seconds=-3),
        py("f", inputs={"x": "{{ nodes.b.v }}"}),
        py("g", timeout=0),
    )

    errors = validate(definition)

    assert len(errors) == 8, errors
    expected = [
        "node 'a': duplicate id",
        "node 'b': needs 'ghost'",
        "node 'b': retry.max_attempts:",
        "node 'c': unknown type 'shell'",
        "node 'd': config.url 'ftp://x'",
        "node 'e': config.seconds",
        "node 'f': inputs.x refers to nodes.b",
        "node 'g': timeout:",
    ]
    for prefix in expected:
        assert sum(e.startswith(prefix) for e in errors) == 1, (prefix, errors)


def test_parse_workflow_raises_definition_error_listing_what_validate_reports() -> None:
    definition = workflow(py("a"), py("a"), py("b", "ghost"), delay("c"))

    with pytest.raises(DefinitionError) as raised:
        parse_workflow(definition, source="flows/wf.yaml")

    assert len(raised.value.errors) == 3
    assert raised.value.errors == validate(definition)
    assert "3 error(s) in flows/wf.yaml" in str(raised.value)


def test_parse_workflow_checks_functions_against_the_known_ones() -> None:
    with pytest.raises(DefinitionError) as raised:
        parse_workflow(workflow(py("a")), known_functions={"g"})

    assert raised.value.errors == validate(workflow(py("a")), known_functions={"g"})
    assert len(raised.value.errors) == 1


# Known gaps


def test_node_without_id_is_named_by_its_position_in_every_message() -> None:
    errors = validate(workflow({"type": "python"}))

    assert len(errors) == 2, errors
    assert all(e.startswith("nodes[0]:") for e in errors), errors


def test_workflow_output_template_that_does_not_parse_is_refused() -> None:
    errors = validate(workflow(py("a"), output={"x": "{{ nodes.a "}))

    assert len(errors) == 1, errors
    assert "output.x" in errors[0]


def test_workflow_output_referring_to_a_missing_node_is_refused() -> None:
    errors = validate(workflow(py("a"), output={"x": "{{ nodes.ghost.v }}"}))

    assert len(errors) == 1, errors
    assert "ghost" in errors[0]


def test_a_need_listed_twice_is_refused() -> None:
    errors = validate(workflow(py("a"), py("b", "a", "a")))

    assert errors == ["node 'b': needs 'a' more than once; list it once"]


# -- schedules -------------------------------------------------------------------------------


def test_declared_schedules_are_valid_with_a_cron_and_a_timezone() -> None:
    parsed = parse_workflow(
        workflow(
            py("a"),
            schedules=[
                {"cron": "0  9 * * 1-5", "timezone": "Europe/Paris", "input": {"k": 1}},
                {"name": "nightly", "cron": "@daily", "misfire": "all", "catch_up": 3},
            ],
        )
    )

    assert parsed.schedule_names() == ["wf", "nightly"]
    assert parsed.schedules[0].cron == "0 9 * * 1-5"  # whitespace folded
    assert parsed.schedules[1].timezone == "UTC"


def test_an_invalid_schedule_names_the_field_and_what_is_wrong() -> None:
    errors = validate(
        workflow(py("a"), schedules=[{"cron": "0 9 * *", "timezone": "America/NewYork"}])
    )

    assert errors == [
        "workflow: schedules.0.cron: cron expression '0 9 * *' has 4 field(s); write five "
        "(minute hour day-of-month month day-of-week), e.g. '0 9 * * 1-5', or a nickname "
        "such as @daily",
        "workflow: schedules.0.timezone: unknown timezone 'America/NewYork' (did you mean "
        "'America/New_York'?); use an IANA name such as 'Europe/Paris', 'America/New_York' "
        "or 'UTC'",
    ]


def test_two_schedules_with_one_name_are_refused() -> None:
    error = only_error(workflow(py("a"), schedules=[{"cron": "@daily"}, {"cron": "@hourly"}]))

    assert error == (
        "workflow: schedules.1: schedules 0 and 1 are both named 'wf'; give each a distinct `name`"
    )


# Python nodes' inputs against their functions' parameters (when the function is registered).


@conveyor.node("test_validation.charge")
def charge(amount: float, currency: str = "EUR", *, ctx: NodeContext) -> dict[str, float]:
    return {"charged": amount}


@conveyor.node("test_validation.anything")
def anything(label: str, **rest: Any) -> dict[str, Any]:
    return {"label": label, **rest}


def call(function: str, **inputs: Any) -> dict[str, Any]:
    return workflow(py("pay", config={"function": function}, inputs=inputs))


def test_an_input_the_function_does_not_take_is_refused_naming_node_input_and_parameters() -> None:
    definition = call("test_validation.charge", amt=5)

    errors = validate(definition, parameters=function_parameters)

    assert errors == [
        "node 'pay': inputs.amt is not a parameter: function 'test_validation.charge' takes "
        "(amount, currency='EUR', ctx); did you mean 'amount'?",
        "node 'pay': function 'test_validation.charge' takes (amount, currency='EUR', ctx): "
        "'amount' has no default, so inputs.amount is required; add it",
    ]


def test_inputs_that_match_are_valid_without_the_context_or_the_defaults() -> None:
    assert validate(call("test_validation.charge", amount=5), parameters=function_parameters) == []
    both = call("test_validation.charge", amount="{{ input.n }}", currency="USD")
    assert validate(both, parameters=function_parameters) == []


def test_an_input_named_ctx_is_refused_when_the_function_takes_the_context() -> None:
    errors = validate(
        call("test_validation.charge", amount=1, ctx=2), parameters=function_parameters
    )

    assert len(errors) == 1 and "inputs.ctx: " in errors[0]
    assert "which an input cannot replace; rename the input" in errors[0]


def test_a_function_taking_keywords_accepts_any_input_but_still_needs_its_required_ones() -> None:
    free = call("test_validation.anything", label="x", whatever=1)
    missing = call("test_validation.anything", whatever=1)

    assert validate(free, parameters=function_parameters) == []
    assert only_error(missing, parameters=function_parameters).endswith(
        "'label' has no default, so inputs.label is required; add it"
    )


def test_a_function_not_registered_here_is_not_checked() -> None:
    # the API may not import the node modules: the worker checks such a node when it runs
    definition = call("registered.elsewhere", anything=1)

    assert validate(definition, parameters=function_parameters) == []
    assert validate(call("test_validation.charge", amt=5)) == []  # no port: no check
