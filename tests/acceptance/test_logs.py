"""A real worker's logs: one JSON object a line, the level by meaning, and the job's fields
(never its input or output)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

from conveyor.engine.states import ExecutionStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
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
