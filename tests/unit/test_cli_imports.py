"""The ``conveyor`` command imports what the command it runs needs, and no more: ``--version``
and ``--help`` load neither SQLAlchemy nor pydantic, a read loads neither the service nor
Redis's client, and ``import conveyor`` loads none of its public names until one is used.
Each check runs in a fresh interpreter (this one has imported everything already)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import conveyor
from conveyor.cli import app
from conveyor.cli.main import COMMANDS
from tests.unit.test_wiring import embedded_env, python

HEAVY = ("sqlalchemy", "pydantic", "redis", "celery", "conveyor.engine.definitions")


def not_imported(*modules: str) -> str:
    found = f"[m for m in {modules!r} if m in sys.modules]"
    return f"import sys; loaded = {found}; assert not loaded, loaded"


def command(*args: str) -> str:
    """Code that runs ``conveyor ARGS`` as the console script does, and expects it to end."""
    return (
        f"import sys; sys.argv = ['conveyor', *{args!r}]\n"
        "from conveyor.cli import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n    assert end.code in (0, None), end.code\n"
    )


@pytest.mark.parametrize("asked", ["--version", "--help"])
def test_the_version_and_the_help_import_nothing_heavy(asked: str, tmp_path: Path) -> None:
    python(command(asked) + not_imported(*HEAVY), cwd=tmp_path, env=embedded_env(tmp_path))


def test_a_read_imports_neither_the_service_nor_redis(tmp_path: Path) -> None:
    code = command("executions", "list") + not_imported("conveyor.service", "redis", "celery")
    python(code, cwd=tmp_path, env=embedded_env(tmp_path))


def test_importing_the_package_imports_none_of_its_public_names(tmp_path: Path) -> None:
    python(f"import conveyor; {not_imported(*HEAVY, 'conveyor.enqueuing')}", cwd=tmp_path)


def test_every_public_name_is_found_and_enqueue_is_the_function() -> None:
    assert sorted(conveyor.__all__) == sorted(conveyor._HOMES)
    for name in conveyor.__all__:
        assert getattr(conveyor, name).__name__ == name
    assert callable(conveyor.enqueue)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = conveyor.nothing  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_root_help_lists_each_command_with_its_own_first_line(name: str) -> None:
    entry = COMMANDS[name]
    real = entry.load(name)
    assert real.help is not None
    assert entry.help == real.help.split("\n\n")[0].replace("\n", " ").strip()


def test_every_command_of_the_root_runs_its_own_help() -> None:
    for name in COMMANDS:
        result = CliRunner().invoke(app, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f" {name} [OPTIONS]" in result.output
