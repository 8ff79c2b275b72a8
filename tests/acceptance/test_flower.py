"""Flower, as an operator opens it: our workers and tasks, named so that they mean something
(the workflow and node; the job and execution among the arguments), in the state that tells
what became of the job (a retried try RETRY, a dead letter FAILURE), from Celery's task
events."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

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


def test_flower_shows_each_node_task_by_its_workflow_and_node_with_its_true_state(
    client: Conveyor, start_worker: Callable[..., Popen[str]], flower: str, tmp_path: Path
) -> None:
    # Given one worker, and workflows that succeed, retry then dead-letter, and pack two
    # roots into one message
    start_worker("workflow-execution,workflow-node", concurrency=1, name="seen")
    add = {"type": "python", "config": {"function": "test.add"}, "inputs": {"a": 1, "b": 2}}
    client.apply(parse_workflow({"name": "watched", "nodes": [{"id": "step", **add}]}))
    client.apply(
        parse_workflow({"name": "pair", "nodes": [{"id": "a", **add}, {"id": "b", **add}]})
    )
    fail = {"type": "python", "config": {"function": "test.fail"},
            "inputs": {"message": "the disk is full"}}  # fmt: skip
    retry = {"retry": {"max_attempts": 2, "backoff": 0.05}}
    client.apply(
        parse_workflow({"name": "shaky", "defaults": retry, "nodes": [{"id": "f", **fail}]})
    )

    # When they run
    good, pair, bad = (client.trigger(name) for name in ("watched", "pair", "shaky"))
    assert wait_for(client, good).status is ExecutionStatus.COMPLETED
    assert wait_for(client, pair).status is ExecutionStatus.COMPLETED
    assert wait_for(client, bad).status is ExecutionStatus.FAILED

    # Then Flower names each node's task for its workflow and node, with its ids as arguments
    shown = {"watched/step", "pair/a and 1 more", "shaky/f"}
    tasks = _tasks_when(flower, lambda t: shown <= _finished(t).keys())
    finished = _finished(tasks)
    step = finished["watched/step"]
    assert step["state"] == "SUCCESS", step
    assert f"execution={good}" in step["args"] and "workflow=watched node=step" in step["args"]
    assert "job=" in step["args"]
    # two roots travel in one message: its name and arguments name both (a busy worker may
    # hand the second back, to run in a message of its own)
    both = finished["pair/a and 1 more"]
    assert both["state"] == "SUCCESS", both
    assert "workflow=pair node=a" in both["args"] and "workflow=pair node=b" in both["args"]
    # the failed try that is retried shows as RETRY, the last one as FAILURE, with the error
    tries = sorted((t for t in tasks.values() if t.get("name") == "shaky/f"),
                   key=lambda t: t["received"])  # fmt: skip
    assert [t["state"] for t in tries] == ["RETRY", "FAILURE"], tries
    assert all("the disk is full" in t["exception"] for t in tries), tries
    assert all(f"execution={bad}" in t["args"] for t in tries), tries
    # the dead letter is logged as an expected failure, in a line, not as a traceback
    log = (tmp_path / "seen.log").read_text()
    assert "Traceback" not in log and "DeadLettered" in log, log
    # refresh=1 asks the workers now and waits Flower's inspect timeout (1 s) for replies: on
    # a loaded machine a reply can miss it, and the answer is {}. Ask again until it shows.
    deadline = time.monotonic() + 20
    workers = _workers(flower)
    while not any(name.startswith("seen-") for name in workers):
        assert time.monotonic() < deadline, workers
        time.sleep(0.5)
        workers = _workers(flower)


Tasks = dict[str, dict[str, Any]]
_DONE = {"SUCCESS", "FAILURE"}


def _finished(tasks: Tasks) -> Tasks:
    """The node tasks Flower shows finished, by name (the first try of shaky/f is RETRY)."""
    return {t["name"]: t for t in tasks.values() if t.get("state") in _DONE
            and not str(t.get("name", "")).startswith("conveyor.")}  # fmt: skip


def _tasks_when(flower: str, ready: Callable[[Tasks], bool]) -> Tasks:
    """Flower's tasks once ``ready`` holds of them (task events arrive after the outcome)."""
    deadline = time.monotonic() + 20
    while True:
        tasks: Tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json()
        if ready(tasks):
            return tasks
        assert time.monotonic() < deadline, tasks
        time.sleep(0.2)


def _workers(flower: str) -> dict[str, object]:
    found: dict[str, object] = httpx.get(f"{flower}/api/workers?refresh=1", timeout=20).json()
    return found
