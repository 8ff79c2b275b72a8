"""Flower, as an operator opens it: our workers and tasks, named so that they mean something
(the job, its execution and node), from Celery's task events."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import Popen

import httpx
import pytest

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ROOT, _wait_until_ready
from tests.support.services import wait_for


@pytest.fixture
def flower(acceptance_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "flower.log"
    env = {**acceptance_env, "FLOWER_UNAUTHENTICATED_API": "true"}
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "conveyor.tasks", "flower",
             f"--port={port}", "--address=127.0.0.1"],
            cwd=ROOT, env=env, text=True, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until_ready(process, log, "Visit me at")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_flower_shows_node_tasks_with_their_job_execution_and_node(
    client: Conveyor, start_worker: Callable[..., Popen[str]], flower: str
) -> None:
    start_worker("workflow-execution,workflow-node", concurrency=1, name="seen")
    client.apply(parse_workflow({"name": "watched", "nodes": [
        {"id": "step", "type": "python", "config": {"function": "test.add"},
         "inputs": {"a": 1, "b": 2}}]}))  # fmt: skip
    execution_id = client.trigger("watched")
    assert wait_for(client, execution_id).status is ExecutionStatus.COMPLETED

    deadline = time.monotonic() + 20
    while True:
        tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json()
        nodes = [t for t in tasks.values() if t.get("name") == "conveyor.node.run"]
        if nodes and nodes[0].get("state") == "SUCCESS":
            break
        assert time.monotonic() < deadline, tasks
        time.sleep(0.2)
    shown = nodes[0]["args"]
    assert f"execution={execution_id}" in shown and "node=step" in shown and "job=" in shown
    # refresh=1 asks the workers now and waits Flower's inspect timeout (1 s) for replies: on
    # a loaded machine a reply can miss it, and the answer is {}. Ask again until it shows.
    workers = _workers(flower)
    while not any(name.startswith("seen-") for name in workers):
        assert time.monotonic() < deadline + 20, workers
        time.sleep(0.5)
        workers = _workers(flower)


def _workers(flower: str) -> dict[str, object]:
    found: dict[str, object] = httpx.get(f"{flower}/api/workers?refresh=1", timeout=20).json()
    return found
