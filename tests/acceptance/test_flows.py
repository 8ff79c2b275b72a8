"""Workflows written in Python as an application meets them: on the embedded default (a
fresh directory, no CONVEYOR_* settings: SQLite, the in-process broker and worker threads)
the client runs a flow to its typed result, sync and async, and CONVEYOR_APPLY_MODULES stores
a module's flows when the workers start; in production a `celery worker` does the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import conveyor
from conveyor.service import Conveyor
from examples.python.diamond import diamond

ROOT = Path(__file__).resolve().parents[2]
CONVEYOR = str(Path(sys.executable).parent / "conveyor")

APP = """
import asyncio
import json

import conveyor
from examples.python.diamond import diamond

with conveyor.Client() as client:
    client.apply(diamond)
    first = client.run(diamond, {"x": 3}, timeout=60)


async def main() -> object:
    async with conveyor.AsyncClient() as running:
        return await running.run(diamond, {"x": 1}, timeout=60)


print(json.dumps([first, asyncio.run(main())]))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return env | {"PYTHONPATH": str(ROOT)}


def test_the_client_runs_a_flow_on_the_embedded_default(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)

    done = subprocess.run(
        [sys.executable, "app.py"], env=_env(), cwd=tmp_path, text=True, capture_output=True,
        timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    # the last line: what runs before it may log (the worker threads' records)
    assert json.loads(done.stdout.splitlines()[-1]) == [
        {"x": 3, "total": 70},
        {"x": 1, "total": 22},
    ]
    assert (tmp_path / ".conveyor" / "conveyor.db").exists()


def test_the_workers_store_the_flows_of_conveyor_apply_modules_as_they_start(
    tmp_path: Path,
) -> None:
    env = _env() | {"CONVEYOR_APPLY_MODULES": "examples.python.diamond"}

    done = subprocess.run(
        [CONVEYOR, "run", "diamond", "--input", '{"x": 2}', "--json"], env=env, cwd=tmp_path,
        text=True, capture_output=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"x": 2, "total": 16 + 14 + 12}


def test_a_celery_worker_stores_the_flows_of_conveyor_apply_modules_and_runs_them(
    client: Conveyor, start_worker: Callable[..., subprocess.Popen[str]]
) -> None:
    # Given a production worker told to apply the diamond (its functions: conveyor.demo)
    start_worker(
        "workflow-execution,workflow-node",
        env={
            "CONVEYOR_APPLY_MODULES": "examples.python.diamond",
            "CONVEYOR_IMPORTS": "conveyor.demo",
        },
    )

    # When an application runs it through the client, on the production service
    result = conveyor.Client(client).run(diamond, {"x": 3}, timeout=90)

    # Then the worker had stored it, as written in Python, and ran it
    assert result == {"x": 3, "total": 70}
    with client.db.transaction() as store:
        stored = {w.name: w for w in store.list_workflows(store.tenant_id("default"))}
    assert stored["diamond"].digest == diamond.definition().digest()
