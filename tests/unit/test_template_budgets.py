"""Template budgets: every kind of template bomb is refused quickly, naming the budget.

"Quickly" is generous (a loaded CI machine): each bomb below would run for minutes, or
forever, or exhaust memory, without its bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor.engine import template_budget as budgets
from conveyor.engine.definitions import Node
from conveyor.engine.templates import (
    MAX_TEMPLATE_CHARS,
    evaluate,
    referenced_nodes,
    render_value,
    syntax_error,
)
from conveyor.exceptions import TemplateBudgetExceeded, TemplateError
from conveyor.nodes import NodeContext, execute

QUICK = 3.0  # seconds; the budget's own time is 1 s

BIG = "x" * 500_000


def context() -> dict[str, Any]:
    return {
        "input": {"n": 9, "big": BIG, "list": list(range(1000))},
        "nodes": {},
        "execution": {"id": "e", "scheduled_for": None},
    }


def refused(template: str, budget: str) -> TemplateBudgetExceeded:
    started = time.monotonic()
    with pytest.raises(TemplateBudgetExceeded) as caught:
        render_value(template, context())
    assert time.monotonic() - started < QUICK
    assert budget in str(caught.value)
    return caught.value


SIZE = "CONVEYOR_TEMPLATE_MAX_SIZE"
OPERATIONS = "CONVEYOR_TEMPLATE_MAX_OPERATIONS"
TIME = "CONVEYOR_TEMPLATE_TIMEOUT"


# -- numbers --------------------------------------------------------------------------------------


def test_a_power_bomb_is_refused_before_it_is_computed() -> None:
    error = refused("{{ 9 ** (9 ** 9) }}", "bits")
    assert "9 ** (9 ** 9)" in str(error)


def test_a_power_bomb_from_the_input_is_refused() -> None:
    refused("{{ input.n ** (input.n ** input.n) }}", "bits")


def test_squaring_a_number_again_and_again_is_refused() -> None:
    refused(
        "{% set ns = namespace(x=2 ** 40000) %}"
        "{% for i in range(30) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 1 }}",
        "bits",
    )


@pytest.mark.parametrize(
    "template",
    ["{{ 5|round(-999999999) }}", "{{ 1.5|round(999999999, 'ceil') }}"],
)
def test_rounding_to_a_billion_digits_is_refused(template: str) -> None:
    refused(template, "round() to")


def test_a_float_power_that_overflows_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="out of range"):
        render_value("{{ 9.5 ** 99999 }}", context())


# -- repetition and concatenation -------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 10 ** 10 }}",
        "{{ 10 ** 10 * 'x' }}",
        "{{ [1] * 10 ** 10 }}",
        "{{ (1, 2) * 10 ** 9 }}",
        "{{ input.big * 3 }}",
    ],
)
def test_repeating_a_string_or_list_past_the_size_budget_is_refused(template: str) -> None:
    refused(template, SIZE)


@pytest.mark.parametrize("op", ["~", "+"])
def test_doubling_a_string_in_a_loop_stops_at_the_size_budget(op: str) -> None:
    refused(
        "{% set ns = namespace(s='x') %}"
        f"{{% for i in range(40) %}}{{% set ns.s = ns.s {op} ns.s %}}{{% endfor %}}{{{{ ns.s }}}}",
        SIZE,
    )


def test_doubling_a_list_in_a_loop_stops_at_the_size_budget() -> None:
    refused(
        "{% set ns = namespace(s=[1]) %}"
        "{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        SIZE,
    )


def test_a_billion_laughs_of_nested_lists_is_refused_when_made_not_when_printed() -> None:
    levels = ["{% set l0 = ['xxxxxxxxxx'] %}"]
    for i in range(1, 10):
        levels.append(f"{{% set l{i} = [{', '.join([f'l{i - 1}'] * 10)}] %}}")
    refused("".join(levels) + "{{ l9|length }}", SIZE)


def test_a_billion_laughs_of_nested_dicts_is_refused() -> None:
    levels = ["{% set l0 = {'k': 'xxxxxxxxxx'} %}"]
    for i in range(1, 10):
        items = ", ".join(f"'{k}': l{i - 1}" for k in "abcdefghij")
        levels.append(f"{{% set l{i} = {{{items}}} %}}")
    refused("".join(levels) + "{{ l9|length }}", SIZE)


def test_a_billion_laughs_by_repetition_is_refused() -> None:
    refused("{{ [[[[[[[input.big] * 10] * 10] * 10] * 10] * 10] * 10] }}", SIZE)


def test_a_list_nested_deeper_than_the_limit_is_refused() -> None:
    refused(
        "{% set ns = namespace(s=[]) %}"
        "{% for i in range(5000) %}{% set ns.s = [ns.s] %}{% endfor %}{{ ns.s }}",
        f"deeper than {budgets.MAX_DEPTH}",
    )


# -- format widths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ '%999999999d' % 1 }}",
        "{{ '%.999999999f' % 1.5 }}",
        "{{ ('%(a)99999s' * 10000) % {'a': 1} }}",
        "{{ '%s%s' % (input.big, input.big) }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ ('{0:>99999}' * 100000).format(1) }}",
        "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
        "{{ '%999999999s'|format('x') }}",
    ],
)
def test_a_format_wider_than_the_size_budget_is_refused(template: str) -> None:
    refused(template, SIZE)


def test_a_format_width_taken_from_an_argument_is_refused() -> None:
    refused("{{ '%*d' % (999999999, 1) }}", "(*)")


# -- filters and methods that grow text -------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x'|center(999999999) }}",
        "{{ ('\n' * 100000)|indent(100000) }}",
        "{{ ('a ' * 400000)|wordwrap(1, wrapstring='x' * 1000) }}",
        "{{ input.big|replace('x', 'yyyyyyyyyy') }}",
        "{{ input.big|replace('', 'yy') }}",
        "{{ range(100000)|join('x' * 100) }}",
        "{{ input.big|join('xx') }}",
        "{{ [1]|batch(999999999, 0)|list }}",
        "{{ [1]|slice(999999999)|list }}",
        "{{ ([[1] * 500] * 1000)|sum(start=[]) }}",
        "{{ ('a.co ' * 100000)|urlize(target='t' * 10000) }}",
        "{{ lipsum(n=100000) }}",
        "{{ 'x'.center(999999999) }}",
        "{{ 'x'.ljust(999999999) }}",
        "{{ 'x'.rjust(999999999) }}",
        "{{ '1'.zfill(999999999) }}",
        "{{ ('\t' * 1000).expandtabs(100000) }}",
        "{{ input.big.replace('x', 'y' * 100) }}",
        "{{ ('x' * 100).join(input.big) }}",
        "{{ input.big.translate({120: 'y' * 1000}) }}",
        "{{ (1).to_bytes(999999999, 'big') }}",
        "{{ dict(a=[input.big] * 1000) }}",
    ],
)
def test_a_filter_or_method_that_would_grow_text_past_the_budget_is_refused(
    template: str,
) -> None:
    refused(template, SIZE)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ('a'|safe).center(400000000) }}",
        "{{ ('a'|e).ljust(400000000) }}",
        "{{ ('1'|safe).zfill(400000000) }}",
        "{{ (('ab' * 400000)|safe).replace('a', 'y' * 1000) }}",
        "{{ ('x' * 100)|safe }}{{ (('x' * 100)|safe).join(input.big) }}",
        "{{ ('a'|safe).center(10 ** 15) }}",
    ],
)
def test_markup_s_methods_that_would_grow_text_are_refused_before_they_run(
    template: str,
) -> None:
    # Markup (what |safe and |e make) wraps str's methods in Python functions: they were not
    # weighed first, and built hundreds of MB (10 ** 15: a MemoryError, a 500 at trigger)
    refused(template, SIZE)


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'a'.encode('rot13') }}",
        "{{ '%(a)s' % {} }}",
        "{{ '{0}'.format() }}",
        "{{ input.list[5000] }}",
        "x{{ '{0}'.format() }}",
    ],
)
def test_a_template_that_looks_up_what_is_not_there_is_a_template_error(template: str) -> None:
    # a LookupError escaped: a trigger answered 500, and a worker retried the same failure
    with pytest.raises(TemplateError, match="failed"):
        render_value(template, context())


def test_a_wide_json_indent_is_refused() -> None:
    refused("{{ input.list|tojson(indent=100000) }}", "indent")


# -- loops, recursion, ranges ---------------------------------------------------------------------


def test_nested_loops_stop_at_the_operations_budget() -> None:
    refused(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        OPERATIONS,
    )


def test_nested_loops_over_the_input_stop_at_the_operations_budget() -> None:
    refused(
        "{% for i in input.list %}{% for j in input.list %}{% for k in input.list %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        OPERATIONS,
    )


def test_a_loop_over_a_generator_is_counted_item_by_item() -> None:
    refused(
        "{% for i in range(90000)|map('int') %}{% for j in range(90000)|select %}"
        "{% endfor %}{% endfor %}",
        OPERATIONS,
    )


def test_endless_macro_recursion_is_refused() -> None:
    refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses too deep")


def test_a_macro_that_forks_twice_per_level_stops_at_a_budget() -> None:
    error = refused(
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(40) }}",
        "CONVEYOR_TEMPLATE_",
    )
    assert OPERATIONS in str(error) or TIME in str(error)


def test_a_recursive_loop_that_never_ends_is_refused() -> None:
    refused("{% for i in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recurses too deep")


def test_a_huge_range_is_refused_at_once() -> None:
    refused("{{ range(10 ** 9)|list }}", OPERATIONS)


def test_a_range_within_the_budget_is_allowed() -> None:
    assert render_value("{{ range(1000)|list|length }}", context()) == 1000


# -- output size and time ----------------------------------------------------------------------


def test_rendered_text_past_the_size_budget_is_refused() -> None:
    refused("{% for i in range(10) %}{{ input.big }}{% endfor %}", "its text")


def test_a_set_block_past_the_size_budget_is_refused() -> None:
    refused("{% set x %}{% for i in range(10) %}{{ input.big }}{% endfor %}{% endset %}", SIZE)


@pytest.fixture
def budget() -> Iterator[None]:
    before = budgets.budget()
    yield
    budgets.configure(before)


def test_a_render_stops_at_its_time_budget(budget: None) -> None:
    budgets.configure(budgets.Budget(seconds=0.2, operations=10**9, size=10**6))
    refused(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
        "0.2 s (CONVEYOR_TEMPLATE_TIMEOUT)",
    )


@pytest.mark.parametrize(
    "body",
    ["{% if 'y' in input.big %}{% endif %}", "{% set x = input.big ~ '' %}"],
    ids=["scan", "copy"],
)
def test_a_loop_whose_every_iteration_scans_or_copies_the_input_stops_at_the_time_budget(
    budget: None, body: str
) -> None:
    # Without a clock read inside the loop, 100,000 scans of 500,000 characters take seconds.
    budgets.configure(budgets.Budget(seconds=0.2, operations=10**9, size=10**6))
    refused(f"{{% for i in range(100000) %}}{body}{{% endfor %}}", "0.2 s")


def test_a_render_stops_at_a_deadline_sooner_than_its_budget(budget: None) -> None:
    budgets.configure(budgets.Budget(seconds=30.0, operations=10**9, size=10**6))
    started = time.monotonic()
    with pytest.raises(TemplateBudgetExceeded, match=r"the node's timeout of 0\.2 s"):
        render_value(
            "{% for i in range(100000) %}{% for j in input.list %}{{ j }}{% endfor %}{% endfor %}",
            context(),
            deadline=(time.monotonic() + 0.2, "the node's timeout of 0.2 s"),
        )
    assert time.monotonic() - started < QUICK


def test_the_budget_covers_every_template_of_a_value_together(budget: None) -> None:
    budgets.configure(budgets.Budget(seconds=1.0, operations=1500, size=10**6))
    one = "{% for i in range(1000) %}{% endfor %}"
    assert render_value(one, context()) == ""
    with pytest.raises(TemplateBudgetExceeded, match=OPERATIONS):
        render_value({"a": one, "b": [one]}, context())


def test_an_expression_over_budget_names_the_expression() -> None:
    with pytest.raises(TemplateBudgetExceeded, match=r"expression ' 9 \*\* \(9 \*\* 9\) '"):
        evaluate(" 9 ** (9 ** 9) ", context())


def test_a_long_template_is_shortened_in_the_message() -> None:
    error = refused("{{ 'x' * 10 ** 10 }}" + " " * 1000, SIZE)
    assert len(str(error)) < 600


# -- what stays as it was ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ 2 ** 10 }}", 1024),
        ("{{ 1234.5678|round(2) }}", 1234.57),
        ("{{ 1234|round(-2) }}", 1200),
        ("{{ 1.21|round(1, 'ceil') }}", 1.3),
        ("{{ 9 ** 9 ** 9 }}", 387420489**9),  # Jinja's ** is left-associative
        ("{{ 'ab' * 3 }}", "ababab"),
        ("{{ 3 * [0] }}", [0, 0, 0]),
        ("{{ [1] + [2] }}", [1, 2]),
        ("{{ (1,) + (2,) }}", (1, 2)),
        ("{{ 'a' ~ 1 ~ none }}", "a1None"),
        ("{{ '%05.1f|%-4s|' % (3.14159, 'x') }}", "003.1|x   |"),
        ("{{ '%(a)s' % {'a': 1} }}", "1"),
        ("{{ '{:>6}|{}'.format('x', 2) }}", "     x|2"),
        ("{{ '{a}'.format_map({'a': 3}) }}", "3"),
        ("{{ 'x'|center(5) }}", "  x  "),
        ("{{ 'a\nb'|indent(2, true) }}", "  a\n  b"),
        ("{{ 'a-b'|replace('-', '+') }}", "a+b"),
        ("{{ [1, 2]|join(', ') }}", "1, 2"),
        ("{{ [[1], [2]]|sum(start=[]) }}", [1, 2]),
        ("{{ [1, 2, 3]|batch(2, 0)|list }}", [[1, 2], [3, 0]]),
        ("{{ [1, 2]|tojson }}", "[1, 2]"),
        ("{{ 'x'.ljust(3) ~ '|' }}", "x  |"),
        ("{{ dict(a=1) }}", {"a": 1}),
        ("{% for i in range(3) %}{{ loop.index }}{% endfor %}", "123"),
        ("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}", "a=1"),
        ("{% for i in [3, 1, 2] if i > 1 %}{{ i }}{% else %}none{% endfor %}", "32"),
        ("{% for i in [] %}{{ i }}{% else %}none{% endfor %}", "none"),
        ("{% for i in range(3) %}{{ loop.length }}{% endfor %}", "333"),
        ("{% for i in range(5)|select('odd') %}{{ loop.last }}{% endfor %}", "FalseTrue"),
        (
            "{% for n in [{'c': [{'c': []}]}] recursive %}[{{ loop(n.c) }}]{% endfor %}",
            "[[]]",
        ),
        ("{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) }}{{ m(2) }}", "<1><2>"),
    ],
)
def test_ordinary_templates_render_as_before(template: str, expected: Any) -> None:
    assert render_value(template, context()) == expected


def test_input_data_is_passed_through_as_it_is() -> None:
    ctx = context()
    assert render_value("{{ input.big }}", ctx) is BIG
    assert render_value("{{ input.list }}", ctx) is ctx["input"]["list"]


def test_a_render_keeps_at_most_a_few_budgets_of_the_values_it_weighed() -> None:
    meter = budgets.Meter(budgets.Budget())
    for _ in range(100):
        meter.made(["x" * 400_000])
    assert 0 < meter.kept <= 4 * meter.size
    assert len(meter.weights) <= 10


def test_outside_a_render_the_sizes_are_checked_and_nothing_is_kept() -> None:
    idle = budgets.current()
    with pytest.raises(budgets.Blown, match=SIZE):
        idle.made(["x" * 600_000, "x" * 600_000])
    idle.made([1, 2])
    assert idle.weights == {}


# -- a node's timeout covers its render ----------------------------------------------------------


def test_a_node_s_render_stops_at_the_node_s_timeout(budget: None) -> None:
    budgets.configure(budgets.Budget(seconds=60, operations=10**12, size=10**6))
    loop = (
        "{% for i in range(100000) %}{% for j in input.list %}{% set x = j %}{% endfor %}"
        "{% endfor %}"
    )
    node = Node(id="n", type="python", config={"function": "nowhere"}, inputs={"a": loop})
    started = time.monotonic()
    with pytest.raises(TemplateBudgetExceeded, match=r"the node's timeout of 0\.3 s"):
        execute(node, context(), NodeContext(execution_id="e", node_id="n", attempt=1), 0.3)
    assert time.monotonic() - started < QUICK


# -- the template's own size and shape -------------------------------------------------------------


def test_a_template_longer_than_the_limit_is_refused_before_it_is_compiled() -> None:
    long = "{{ input.n }}" * 6000
    assert len(long) > MAX_TEMPLATE_CHARS
    refused(long, f"over {MAX_TEMPLATE_CHARS:,}")
    problem = syntax_error(long)
    assert problem is not None and "characters long" in problem


def test_a_template_nested_too_deep_to_parse_is_a_syntax_problem_not_a_crash() -> None:
    deep = "{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}"
    problem = syntax_error(deep)
    assert problem is not None and "nests too deep" in problem
    assert referenced_nodes(deep) == set()
    refused(deep, "too deep")
