"""Templates render node inputs in Jinja2's sandbox, keeping native types where they can."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine import templates
from conveyor.engine.templates import evaluate, referenced_nodes, render_value, syntax_error
from conveyor.exceptions import TemplateError


def context(**outputs: Any) -> dict[str, Any]:
    return {
        "input": {"count": 3, "user": {"name": "ada", "tags": ["x", "y"]}},
        "nodes": outputs,
        "execution": {"id": "e-1"},
    }


# Native values


def test_whole_expression_keeps_an_int_an_int() -> None:
    assert render_value("{{ input.count }}", context()) == 3
    assert isinstance(render_value("{{ input.count + 1 }}", context()), int)


def test_whole_expression_keeps_a_dict_a_dict() -> None:
    assert render_value("{{ input.user }}", context()) == {"name": "ada", "tags": ["x", "y"]}


def test_whole_expression_with_surrounding_spaces_keeps_its_native_value() -> None:
    assert render_value("  {{ nodes.a.ok }}  ", context(a={"ok": False})) is False


def test_mixed_string_renders_to_text() -> None:
    assert render_value("n={{ input.count }}", context()) == "n=3"


def test_two_expressions_in_one_string_render_to_text() -> None:
    assert render_value("{{ input.count }}{{ input.count }}", context()) == "33"


def test_string_without_template_is_returned_unchanged() -> None:
    assert render_value("plain {text}", context()) == "plain {text}"


def test_non_string_values_are_returned_unchanged() -> None:
    assert render_value(4.5, context()) == 4.5
    assert render_value(None, context()) is None


def test_nested_lists_and_dicts_are_rendered() -> None:
    value = {
        "who": "{{ input.user.name }}",
        "items": [{"n": "{{ input.count }}"}, ["{{ nodes.a.v }}", "id-{{ execution.id }}"]],
        "fixed": 1,
    }

    assert render_value(value, context(a={"v": [1, 2]})) == {
        "who": "ada",
        "items": [{"n": 3}, [[1, 2], "id-e-1"]],
        "fixed": 1,
    }


def test_nodes_can_be_read_by_item_access() -> None:
    assert render_value("{{ nodes['a'].v }}", context(a={"v": 9})) == 9


def test_evaluate_returns_the_expression_value() -> None:
    assert evaluate("input.count > 2 and input.user.name == 'ada'", context()) is True


# Undefined names


def test_undefined_name_in_a_mixed_string_raises_template_error() -> None:
    with pytest.raises(TemplateError, match="missing"):
        render_value("x {{ missing }}", context())


def test_undefined_attribute_in_a_mixed_string_raises_template_error() -> None:
    with pytest.raises(TemplateError, match="nope"):
        render_value("x {{ input.nope }}", context())


@pytest.mark.parametrize("template", ["{{ missing }}", "{{ input.nope }}", "{{ nodes.ghost }}"])
def test_undefined_name_in_a_whole_expression_raises_template_error(template: str) -> None:
    with pytest.raises(TemplateError):
        render_value(template, context())


# Sandbox


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ input.__class__() }}",
        "{{ input.__class__.__subclasses__() }}",
        "x {{ input.__class__ }}",
    ],
)
def test_sandbox_refuses_unsafe_attribute_access(template: str) -> None:
    with pytest.raises(TemplateError, match="unsafe"):
        render_value(template, context())


def test_sandbox_refuses_mutating_the_context() -> None:
    ctx = context()

    with pytest.raises(TemplateError):
        render_value("{{ input.user.tags.append('z') }}", ctx)

    assert ctx["input"]["user"]["tags"] == ["x", "y"]


def test_sandbox_refuses_unsafe_attribute_access_as_a_whole_expression() -> None:
    with pytest.raises(TemplateError):
        render_value("{{ input.__class__ }}", context())


# Syntax and references


def test_syntax_error_describes_a_template_that_does_not_parse() -> None:
    assert syntax_error("{{ input.count ") is not None
    assert syntax_error("{{ input.count }}") is None


def test_referenced_nodes_finds_attribute_and_item_access() -> None:
    value = {"a": "{{ nodes.a.x }}", "list": ["{{ nodes['b'] }}"], "other": "{{ input.c }}"}

    assert referenced_nodes(value) == {"a", "b"}


def test_referenced_nodes_finds_nodes_inside_blocks_and_filters() -> None:
    text = "{% if nodes.a.ok %}{{ nodes.b.items | length }}{% endif %}"

    assert referenced_nodes(text) == {"a", "b"}


def test_referenced_nodes_reads_bare_expressions_when_asked() -> None:
    assert referenced_nodes("nodes.a.n > 1", expression=True) == {"a"}
    assert referenced_nodes("nodes.a.n > 1") == set()


# Cost: a template is compiled once per process, whatever the context


def test_a_template_is_compiled_once_and_rendered_with_each_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled: list[str] = []
    real = templates._ENV.compile_expression
    real_text = templates._ENV.from_string

    def expression(source: str, **kwargs: Any) -> Any:
        compiled.append(source)
        return real(source, **kwargs)

    def text(source: Any) -> Any:
        if isinstance(source, str):  # (compile_expression passes it a parsed tree)
            compiled.append(source)
        return real_text(source)

    monkeypatch.setattr(templates._ENV, "compile_expression", expression)
    monkeypatch.setattr(templates._ENV, "from_string", text)
    whole, mixed = "{{ input.count * 7 }}", "n={{ input.count * 7 }}!"

    found = [render_value([whole, mixed], {"input": {"count": n}}) for n in range(5)]

    assert found == [[n * 7, f"n={n * 7}!"] for n in range(5)]
    assert sorted(compiled) == sorted([" input.count * 7 ", mixed])
