"""The CLI paths that need no services: validating files and refusing bad arguments."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.config import get_settings
from conveyor.migrations import ROOT
from tests.support.logging_state import kept_logging

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
    with kept_logging():  # the command configures this process's logging
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
    monkeypatch.setattr(sys, "path", list(sys.path))  # the current directory is added to it
    monkeypatch.setenv("CONVEYOR_IMPORTS", "no_such_module_here")
    path = write(
        tmp_path, "f.yaml", "name: f\nnodes:\n  - {id: a, type: delay, config: {seconds: 1}}\n"
    )

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert (
        "CONVEYOR_IMPORTS names the module 'no_such_module_here', which is not found (searched "
        f"the current directory {tmp_path} and sys.path); run from the directory that holds "
        "it, add that directory to PYTHONPATH, or install its package"
    ) in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


def test_a_module_of_conveyor_imports_that_imports_a_missing_package_names_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    write(tmp_path, "needy_nodes.py", "import package_nobody_installed\n")
    monkeypatch.setenv("CONVEYOR_IMPORTS", "needy_nodes")
    path = write(
        tmp_path, "f.yaml", "name: f\nnodes:\n  - {id: a, type: delay, config: {seconds: 1}}\n"
    )

    result = runner.invoke(app, ["workflow", "validate", str(path)])

    assert result.exit_code == 1
    assert (
        "the module 'needy_nodes' of CONVEYOR_IMPORTS imports 'package_nobody_installed', which "
        "is not installed"
    ) in " ".join(result.stderr.split())


def test_validate_refuses_inputs_that_do_not_match_the_registered_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the project's module, imported from the current directory, and a misnamed input
    monkeypatch.setattr(sys, "path", list(sys.path))
    write(tmp_path, "cli_billing.py", CLI_BILLING)
    monkeypatch.setenv("CONVEYOR_IMPORTS", "cli_billing")
    path = write(tmp_path, "pay.yaml", PAY.format(input="amt"))
    good = write(tmp_path, "good.yaml", PAY.format(input="amount"))

    result = runner.invoke(app, ["workflow", "validate", str(path), str(good)])

    assert result.exit_code == 1
    assert (
        f"{path}: node 'pay': inputs.amt is not a parameter: function 'cli_charge' takes "
        "(amount, ctx); did you mean 'amount'?"
    ) in result.stderr
    assert f"{good}: valid" in result.stdout


CLI_BILLING = """\
import conveyor


@conveyor.node("cli_charge")
def charge(amount, ctx):
    return {"charged": amount}
"""
PAY = """\
name: pay
nodes:
  - {{id: pay, type: python, config: {{function: cli_charge}}, inputs: {{{input}: 5}}}}
"""


def test_version_prints_the_installed_version() -> None:
    result = runner.invoke(app, ["--version"])

    assert result.exit_code == 0
    assert result.stdout == f"conveyor {importlib.metadata.version('conveyor')}\n"


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ([], {"warning", "error"}),  # Python shows warnings by default: so does the command
        (["-q"], set()),
        (["-v"], {"info", "warning", "error"}),
        (["-vv"], {"debug", "info", "warning", "error"}),
    ],
    ids=["default", "quiet", "verbose", "very-verbose"],
)
def test_the_log_level_follows_the_flags_and_the_records_go_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], shown: set[str]
) -> None:
    # Given a node module that logs at each level when imported (once per name: one a case)
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = "noisy_" + ("".join(flag.strip("-") for flag in flags) or "default")
    write(tmp_path, f"{module}.py", NOISY)
    monkeypatch.setenv("CONVEYOR_IMPORTS", module)
    path = write(
        tmp_path, "f.yaml", "name: f\nnodes:\n  - {id: a, type: delay, config: {seconds: 1}}\n"
    )

    result = runner.invoke(app, [*flags, "workflow", "validate", str(path)])

    assert result.exit_code == 0, result.output
    assert result.stdout == f"{path}: valid\n"
    logged = {level for level in LEVELS if f"noisy {level}" in result.stderr}
    assert logged == shown, result.stderr
    if not flags:  # errors and warnings only, an exception cut to one line
        assert result.stderr.count("\n") == 2, result.stderr
        assert f"UserWarning: noisy warning ({tmp_path / module}.py:" in result.stderr
        assert "raised='ValueError: an exception logged with its record'" in result.stderr
    assert ("Traceback" in result.stderr) == (flags not in ([], ["-q"]))


LEVELS = ("debug", "info", "warning", "error")
NOISY = """\
import logging
import warnings

log = logging.getLogger("noisy")
log.debug("noisy debug")
log.info("noisy info")
with warnings.catch_warnings():
    warnings.simplefilter("default")  # as outside the tests, where warnings are not errors
    warnings.warn("noisy warning")
try:
    raise ValueError("an exception logged with its record")
except ValueError:
    log.exception("noisy error")
"""


def test_a_command_s_help_answers_though_a_setting_is_invalid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVEYOR_MAX_NODES", "many")

    helped = runner.invoke(app, ["db", "upgrade", "--help"])
    ran = runner.invoke(app, ["db", "upgrade"])

    assert helped.exit_code == 0 and "Usage: root db upgrade" in helped.stdout
    assert ran.exit_code == 1 and "a CONVEYOR_* setting is invalid" in ran.stderr


def test_verbose_and_quiet_together_are_a_usage_error() -> None:
    result = runner.invoke(app, ["-v", "-q", "limits"])

    assert result.exit_code == 2
    assert "-v and -q contradict each other" in result.stderr


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
