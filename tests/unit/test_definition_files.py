"""Definition files are read strictly: repeated keys, anchors, aliases and merge keys are
errors naming the line; a file over CONVEYOR_MAX_DEFINITION_BYTES is not parsed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.definition_files import load_definition, parse_json, parse_yaml
from conveyor.exceptions import DefinitionFileError

VALID = "name: a\nnodes:\n  - {id: x, type: python, config: {function: f}}\n"


def refusal(text: str) -> str:
    with pytest.raises(DefinitionFileError) as caught:
        parse_yaml(text)
    return str(caught.value)


def test_a_second_nodes_key_is_an_error_naming_the_key_and_both_lines() -> None:
    text = VALID + "nodes:\n  - {id: y, type: python, config: {function: f}}\n"

    assert refusal(text) == (
        ":4: invalid YAML: key 'nodes' appears twice in one mapping (lines 2 and 4); keep one "
        "(a YAML reader would silently keep the last)"
    )


def test_a_repeated_key_deep_in_a_node_is_an_error_too() -> None:
    text = "name: a\nnodes:\n  - id: x\n    config: {function: f}\n    config: {function: g}\n"

    assert refusal(text).startswith(":5: invalid YAML: key 'config' appears twice")


def test_an_anchor_is_refused_where_it_is_declared() -> None:
    assert refusal("a: &x [1]\nb: 2\n") == (
        ":1: invalid YAML: anchor &x refused: write each value out in full"
    )


def test_a_merge_key_is_refused() -> None:
    assert "merge key << refused" in refusal("a: {b: 1}\nc:\n  <<: {b: 2}\n")


def test_a_billion_laughs_file_is_refused_at_once() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    started = time.monotonic()

    assert "anchor &a0 refused" in refusal("\n".join(lines))
    assert time.monotonic() - started < 1  # it ran past two minutes


@pytest.mark.parametrize("text", ["a: " + "[" * 200_000, "a:\n" + "- " * 5000 + "1\n"])
def test_a_file_nested_thousands_deep_is_refused_quickly(text: str) -> None:
    started = time.monotonic()

    assert "nested more than 200 levels deep" in refusal(text)
    assert time.monotonic() - started < 5


def test_a_plain_file_reads_as_before() -> None:
    assert parse_yaml(VALID) == {
        "name": "a",
        "nodes": [{"id": "x", "type": "python", "config": {"function": "f"}}],
    }


def test_a_json_file_with_a_repeated_key_is_an_error() -> None:
    with pytest.raises(DefinitionFileError, match="key 'nodes' appears twice in one object"):
        parse_json('{"name": "a", "nodes": [], "nodes": []}')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_json_file_with_nan_or_infinity_is_an_error(constant: str) -> None:
    with pytest.raises(DefinitionFileError, match="is not JSON"):
        parse_json('{"a": ' + constant + "}")


def test_a_json_file_nested_past_what_the_reader_recurses_is_an_error() -> None:
    with pytest.raises(DefinitionFileError, match="nested more than 200 levels"):
        parse_json("[" * 100_000 + "]" * 100_000)


def test_a_file_over_the_definition_limit_is_refused_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(VALID + "description: " + "x" * 5000 + "\n")

    with pytest.raises(DefinitionFileError) as caught:
        load_definition(path, max_bytes=4096)

    assert str(caught.value) == (
        f"{path}: the file is over the limit of 4096 bytes (CONVEYOR_MAX_DEFINITION_BYTES); "
        f"split it, or raise CONVEYOR_MAX_DEFINITION_BYTES"
    )


def test_an_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "dup.yml"
    path.write_text("name: a\nname: b\n")

    with pytest.raises(DefinitionFileError, match=rf"^{path}:2: invalid YAML: key 'name'"):
        load_definition(path, max_bytes=4096)
