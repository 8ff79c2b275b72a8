"""The composition root builds the service without Celery: importing the CLI or the API, building
the service, and the commands that publish nothing leave Celery unloaded. Each check runs in a
fresh interpreter, since this one has Celery loaded already (pytest's Celery plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conveyor.migrations import ROOT

NO_CELERY = "import sys; assert 'celery' not in sys.modules, 'celery was imported'"


def python(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run ``code`` in a new interpreter; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def embedded_env(tmp_path: Path) -> dict[str, str]:
    """No CONVEYOR_* setting but a SQLite file of this test's own: the embedded default."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return env | {"CONVEYOR_DATABASE_URL": f"sqlite:///{tmp_path / 'conveyor.db'}"}


def test_importing_the_cli_and_the_api_does_not_import_celery(tmp_path: Path) -> None:
    python(f"import conveyor.cli, conveyor.api.app; {NO_CELERY}", cwd=tmp_path)


def test_the_service_the_root_builds_on_the_embedded_default_does_not_import_celery(
    tmp_path: Path,
) -> None:
    code = (
        "from conveyor import wiring; service = wiring.service(); "
        "assert service is wiring.service(); "
        "assert isinstance(service.dispatcher, wiring.LazyDispatcher); "
        f"{NO_CELERY}"
    )
    python(code, cwd=tmp_path, env=embedded_env(tmp_path))


def test_commands_that_publish_nothing_run_without_importing_celery(tmp_path: Path) -> None:
    # validate, migrate, apply, list, and prune (which builds the service): none publishes
    code = f"""
import sys
from typer.testing import CliRunner
from conveyor.cli import app

diamond = sys.argv[1]
commands = [
    ["workflow", "validate", diamond], ["db", "upgrade"], ["workflow", "apply", diamond],
    ["executions", "list"], ["db", "prune"],
]
for args in commands:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
{NO_CELERY}
"""
    diamond = str(ROOT / "examples" / "diamond.yaml")
    python(code, diamond, cwd=tmp_path, env=embedded_env(tmp_path))


def test_the_celery_app_asked_of_the_root_first_is_the_one_the_tasks_are_registered_on(
    tmp_path: Path,
) -> None:
    # Asked before anything imported conveyor.tasks: building it imports the tasks, which ask
    # the root for the app again on the same thread (a lock held across that import hangs)
    code = (
        "from conveyor import wiring; app = wiring.celery_app(); "
        "import conveyor.tasks; assert conveyor.tasks.app is app; "
        "assert 'conveyor.node.run' in app.tasks"
    )
    python(code, cwd=tmp_path, env=embedded_env(tmp_path))
