"""The CLI paths that need no services: validating files and refusing bad arguments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.config import get_settings
from conveyor.migrations import ROOT

BROKEN = """\
name: broken
nodes:
  - {id: a, type: python, config: {function: f}, needs: [c]}
  - {id: b, type: python, config: {function: f}, needs: [a]}
  - {id: c, type: python, config: {function: f}, needs: [b]}
  - {id: d, type: python, config: {function: f}, needs: [ghost]}
  - {id: d, type: shell, config: {command: ls}}
"""

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("CONVEYOR_IMPORTS", "")
    monkeypatch.chdir(tmp_path)  # nothing may touch a database; if it did, not the repo's
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_validate_prints_every_error_of_a_broken_definition_and_exits_1(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.yaml", BROKEN)

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    errors = result.stderr
    assert "node 'd': duplicate id" in errors
    assert "node 'd': needs 'ghost', which is not a node of this workflow" in errors
    assert "cycle between nodes 'a', 'c', 'b' (a -> c -> b -> a)" in errors
    assert "node 'd': unknown type 'shell'; use one of python, http, delay, condition" in errors
    assert all(line.startswith(f"{path}: ") for line in errors.splitlines())
    assert "valid" not in result.stdout


def test_validate_names_the_file_and_line_of_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "name: x\nnodes:\n  - id: a\n    type: [python\n")

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert f"{path}:5: invalid YAML" in result.stderr
    assert "Traceback" not in result.output


def test_validate_names_the_file_and_line_of_invalid_json(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.json", '{"name": "x",\n "nodes": [}\n')

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert f"{path}:2: invalid JSON" in result.stderr


def test_validate_reports_each_file_and_fails_if_any_is_invalid(tmp_path: Path) -> None:
    good = ROOT / "examples" / "diamond.yaml"
    empty = write(tmp_path, "empty.yaml", "")

    result = runner.invoke(app, ["workflow", "validate", str(good), str(empty)])

    assert result.exit_code == 1
    assert f"{good}: valid" in result.stdout
    assert f"{empty}: the definition must be a mapping" in result.stderr


def test_the_examples_are_valid_and_name_registered_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVEYOR_IMPORTS", "conveyor.demo")
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))

    result = runner.invoke(app, ["workflow", "validate", *examples])

    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"{p}: valid" for p in examples]


def test_validate_checks_function_names_only_when_imports_are_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path, "f.yaml", "name: f\nnodes:\n  - {id: a, type: python, config: {function: nope}}\n"
    )
    assert runner.invoke(app, ["workflow", "validate", str(path)]).exit_code == 0

    monkeypatch.setenv("CONVEYOR_IMPORTS", "conveyor.demo")
    get_settings.cache_clear()
    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert "config.function 'nope' is not registered" in result.stderr


def test_an_unimportable_module_in_conveyor_imports_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_IMPORTS", "no_such_module_here")
    path = write(
        tmp_path, "f.yaml", "name: f\nnodes:\n  - {id: a, type: delay, config: {seconds: 1}}\n"
    )

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert "CONVEYOR_IMPORTS names a module that cannot be imported" in result.stderr


def test_run_refuses_input_that_is_not_json_with_exit_2() -> None:
    result = runner.invoke(app, ["run", "diamond", "--input", '{"x": 1'])

    assert result.exit_code == 2
    assert "--input is not valid JSON" in result.stderr


def test_show_refuses_an_id_that_is_not_a_uuid_with_exit_2() -> None:
    result = runner.invoke(app, ["executions", "show", "nope"])

    assert result.exit_code == 2
    assert "'nope' is not an id (a UUID)" in result.stderr


METADATA = """\
name: metadata
nodes:
  - {id: steal, type: http, config: {url: "http://169.254.169.254/latest/meta-data/"}}
"""


def test_validate_refuses_an_http_url_the_node_would_refuse_unless_the_operator_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "metadata.yaml", METADATA)

    refused = runner.invoke(app, ["workflow", "validate", str(path)])
    monkeypatch.setenv("CONVEYOR_HTTP_ALLOW", "169.254.169.254")
    get_settings.cache_clear()
    allowed = runner.invoke(app, ["workflow", "validate", str(path)])

    assert refused.exit_code == 1
    assert "the host '169.254.169.254' is the link-local (cloud metadata" in refused.stderr
    assert "CONVEYOR_HTTP_ALLOW=169.254.169.254" in refused.stderr
    assert allowed.exit_code == 0, allowed.output


def test_an_allow_list_entry_of_no_kind_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "metadata.yaml", METADATA)
    monkeypatch.setenv("CONVEYOR_HTTP_ALLOW", "10.0.0.0/8,http://internal")
    get_settings.cache_clear()

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code != 0
    assert "CONVEYOR_HTTP_ALLOW entry 'http://internal' is not an address" in result.output
    assert "Traceback" not in result.output


def test_validate_refuses_a_file_with_two_node_lists_naming_the_key_and_lines(
    tmp_path: Path,
) -> None:
    # It was reported valid, the first node list silently dropped
    text = (
        "name: twice\nnodes:\n  - {id: a, type: python, config: {function: f}}\n"
        "nodes:\n  - {id: b, type: python, config: {function: f}}\n"
    )
    path = write(tmp_path, "twice.yaml", text)

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert f"{path}:4: invalid YAML: key 'nodes' appears twice" in result.stderr
    assert "(lines 2 and 4)" in result.stderr


def test_validate_refuses_a_billion_laughs_file_at_once(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = write(tmp_path, "laughs.yaml", "\n".join(lines))

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert f"{path}:1: invalid YAML: anchor &a0 refused" in result.stderr


def test_validate_refuses_a_file_over_the_definition_limit_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_MAX_DEFINITION_BYTES", "2048")
    get_settings.cache_clear()
    path = write(tmp_path, "big.json", '{"name": "big", "description": "' + "x" * 4096 + '"}')

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert "over the limit of 2048 bytes (CONVEYOR_MAX_DEFINITION_BYTES)" in result.stderr


def test_conveyor_worker_with_a_broker_configured_names_the_celery_commands_to_run() -> None:
    # the test run sets CONVEYOR_BROKER_URL: production, where celery runs the workers
    result = runner.invoke(app, ["worker"])

    assert result.exit_code == 1
    assert "celery -A conveyor.tasks worker" in result.output
    assert "celery -A conveyor.tasks beat" in result.output
