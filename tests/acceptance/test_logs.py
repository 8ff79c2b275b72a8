"""A real worker's logs: one JSON object a line, the level by meaning, and the job's fields
(never its input or output)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.test_embedded import CONVEYOR, free_port, stop, wait_until
from tests.support.services import wait_for

FIELDS = {"job_id", "execution_id", "node_id", "tenant_id", "workflow", "queue", "attempt"}


def node(node_id: str, function: str, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
            "inputs": inputs}  # fmt: skip


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def test_worker_logs_are_json_lines_with_the_jobs_fields(
    client: Conveyor, start_worker: Callable[..., Popen[str]], tmp_path: Path
) -> None:
    # Given a worker importing a module that warns, a run that succeeds on its second try and
    # one that dead-letters
    imports = "tests.support.nodes,tests.support.warning_nodes"
    start_worker("workflow-execution,workflow-node", concurrency=2, name="logged",
                 env={"CONVEYOR_IMPORTS": imports})  # fmt: skip
    retry = {"backoff": 0.05, "jitter": 0}
    client.apply(
        parse_workflow(
            {
                "name": "flaky",
                "defaults": {"retry": retry},
                "nodes": [node("shaky", "flaky", failures=1)],
            }
        )
    )
    doomed = {"name": "doomed", "defaults": {"retry": {**retry, "max_attempts": 1}},
              "nodes": [node("boom", "fail", message="no")]}  # fmt: skip
    client.apply(parse_workflow(doomed))
    ok, bad = client.trigger("flaky", {"token": "s3cr3t-input"}), client.trigger("doomed")
    assert wait_for(client, ok).status is ExecutionStatus.COMPLETED
    assert wait_for(client, bad).status is ExecutionStatus.FAILED
    time.sleep(0.5)  # the last lines are written after the commit

    # Then every line on stderr is a JSON object, the module's warning among them
    lines = (tmp_path / "logged.log").read_text().splitlines()
    assert [line for line in lines if not is_json_object(line)] == []
    records = [json.loads(line) for line in lines]
    warned = [r for r in records if r.get("logger") == "py.warnings"]
    assert any("warning_nodes warns at import" in r["event"] for r in warned), lines
    # and the job events carry the fields
    jobs = [r for r in records if r.get("logger") == "conveyor.jobs"]
    levels = {(r["event"], r["level"]) for r in jobs}
    assert {("job received", "info"), ("job completed", "info"),
            ("retry scheduled", "warning"), ("dead-lettered", "error")} <= levels  # fmt: skip
    assert all(r.keys() >= FIELDS for r in jobs if r["event"] != "message dropped")
    done = next(r for r in jobs if r["event"] == "job completed")
    assert done["workflow"] == "flaky" and done["attempt"] == 2 and done["duration"] >= 0
    assert "s3cr3t-input" not in "\n".join(lines)  # inputs never reach the log


def test_conveyor_api_with_json_logs_writes_json_lines_to_stderr_and_nothing_to_stdout(
    tmp_path: Path,
) -> None:
    # Given `conveyor api` on the embedded default with JSON logs, when it serves a request
    out, err = serve_one_request(tmp_path)

    # Then stdout is empty and every stderr line is a JSON object, uvicorn's own included:
    # its start and the request's access line
    assert out == ""
    lines = err.splitlines()
    assert [line for line in lines if not is_json_object(line)] == []
    events = [(r["logger"], r["event"]) for r in map(json.loads, lines)]
    assert any(logger == "uvicorn.error" and "Started server process" in event
               for logger, event in events), events  # fmt: skip
    assert any(logger == "uvicorn.access" and '"GET /health HTTP/1.1" 200' in event
               for logger, event in events), events  # fmt: skip


def test_conveyor_api_logs_nothing_with_q(tmp_path: Path) -> None:
    assert serve_one_request(tmp_path, "-q") == ("", "")


def serve_one_request(home: Path, *options: str) -> tuple[str, str]:
    """What `conveyor [OPTIONS] api` wrote to stdout and to stderr, run on the embedded default
    in ``home`` with JSON logs, while it answered GET /health and stopped on SIGINT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    port = free_port()
    out, err = home / "api.out", home / "api.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        api = subprocess.Popen(
            [CONVEYOR, *options, "api", "--port", str(port)], cwd=home, text=True,
            stdout=stdout, stderr=stderr, env={**env, "CONVEYOR_LOG_FORMAT": "json"},
        )  # fmt: skip
    try:
        health = wait_until(lambda: answer(f"http://127.0.0.1:{port}/health"), "answer")
        assert health.status_code == 200
    finally:
        stop(api, signal.SIGINT)
    return out.read_text(), err.read_text()


def answer(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None  # not listening yet
