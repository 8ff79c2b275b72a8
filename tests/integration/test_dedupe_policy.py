"""Dedupe policies over real HTTP, PostgreSQL, Redis and the in-process worker: the REST
trigger's answer says what became of the input, and a follow-up runs with the latest one; a
pending follow-up is shown by `conveyor executions show` and the API's execution view; on
PostgreSQL a replace racing the claim of the start job either goes first or replaces nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import update

from conveyor.engine.states import ExecutionStatus, JobKind, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Job
from conveyor.service import Conveyor, utcnow
from conveyor.store.listing import ExecutionFilter
from tests.integration.test_api import MakeKey, client
from tests.support.services import lock_waiters, wait_for


def summing(name: str, policy: str) -> dict[str, Any]:
    node = {
        "id": "add", "type": "python", "config": {"function": "test.add"},
        "inputs": {"a": "{{ input.v }}", "b": 0},
    }  # fmt: skip
    return {"name": name, "nodes": [node], "dedupe": {"policy": policy}}


def test_rest_answers_what_the_policy_did_and_the_follow_up_runs_with_the_latest_input(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    with client(api_url, key) as http:
        assert http.post("/v1/workflows", json=summing("sync", "follow_up")).status_code == 201
        # the first run waits a while (delay), so that the next three find it active
        first = http.post(
            "/v1/workflows/sync/executions",
            json={"input": {"v": 1}, "dedupe_key": "doc-1", "delay": 2},
        )
        more = [
            http.post("/v1/workflows/sync/executions",
                      json={"input": {"v": v}, "dedupe_key": "doc-1"})
            for v in (2, 3, 4)
        ]  # fmt: skip

    assert (first.status_code, first.json()["dedupe"], first.json()["replayed"]) == (
        201, None, False,
    )  # fmt: skip
    assert [(a.status_code, a.json()["id"], a.json()["dedupe"]) for a in more] == [
        (200, first.json()["id"], "follow_up")
    ] * 3
    assert wait_for(conveyor_service, first.json()["id"]).output == {"add": {"sum": 1}}
    deadline = time.monotonic() + 30
    while True:
        with conveyor_service.db.transaction() as store:
            runs = store.list_executions(None, where=ExecutionFilter(dedupe_key="doc-1"), limit=9)
        if len(runs) == 2:
            break
        assert time.monotonic() < deadline, runs
        time.sleep(0.05)
    follow = runs[0][0]  # newest first
    assert follow.input == {"v": 4}
    assert wait_for(conveyor_service, follow.id).output == {"add": {"sum": 4}}


HOLD = {"name": "hold", "dedupe": {"policy": "follow_up"},
        "nodes": [{"id": "wait", "type": "delay", "config": {"seconds": 600}}]}  # fmt: skip
CONVEYOR = [str(Path(sys.executable).parent / "conveyor")]


def show(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*CONVEYOR, "executions", "show", *args], env=dict(os.environ),
                          text=True, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_pending_follow_up_is_shown_by_executions_show_and_the_api(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a running execution with a dedupe key, and a newer input left as its follow-up
    key = make_key("acme")
    with client(api_url, key) as http:
        assert http.post("/v1/workflows", json=HOLD).status_code == 201
        first = http.post("/v1/workflows/hold/executions",
                          json={"input": {"v": 1}, "dedupe_key": "doc-1"}).json()["id"]  # fmt: skip
        before = utcnow()
        again = http.post("/v1/workflows/hold/executions",
                          json={"input": {"v": 2}, "dedupe_key": "doc-1"}).json()  # fmt: skip
        assert (again["id"], again["dedupe"]) == (first, "follow_up")

        # Then `executions show --json` and the API show it pending, with its input and time
        shown = json.loads(show(first, "--json").stdout)
        assert shown["status"] == "running" and shown["input"] == {"v": 1}
        follow = shown["follow_up"]
        assert (follow["status"], follow["input"], follow["input_bytes"]) == (
            "pending", {"v": 2}, len('{"v":2}'),
        )  # fmt: skip
        assert before <= datetime.fromisoformat(follow["left_at"]) <= utcnow()
        assert http.get(f"/v1/executions/{first}").json()["follow_up"] == follow
        # ... and so does the human view
        assert f"follow-up pending, left {follow['left_at'][:19].replace('T', ' ')}Z: input " in (
            show(first).stdout
        )

        # When a large input replaces it: only its size is shown
        large = {"blob": "x" * 70_000}
        http.post("/v1/workflows/hold/executions", json={"input": large, "dedupe_key": "doc-1"})
        follow = json.loads(show(first, "--json").stdout)["follow_up"]
        size = len(json.dumps(large, separators=(",", ":")))
        assert (follow["input"], follow["input_bytes"]) == (None, size)
        assert f"input of {size:,} bytes" in show(first).stdout

        # And a cancelled execution shows none: its follow-up never runs
        assert http.post(f"/v1/executions/{first}/cancel").status_code == 200
        assert json.loads(show(first, "--json").stdout)["follow_up"] is None
        assert http.get(f"/v1/executions/{first}").json()["follow_up"] is None


def test_a_replace_racing_the_start_jobs_claim_waits_and_then_replaces_nothing(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(summing("later", "replace")))
    made = conveyor_service.submit("later", {"v": 1}, dedupe_key="doc-2", delay=3600)
    replaced: list[bool] = []
    # Given the start job claimed in a transaction not committed yet (its row locked)
    with conveyor_service.db.transaction() as claiming:
        claiming.session.execute(
            update(Job)
            .where(Job.execution_id == made.execution_id, Job.kind == JobKind.EXECUTION)
            .values(status=JobStatus.PROCESSING)
        )
        # When a replace runs meanwhile
        racing = threading.Thread(
            target=lambda: replaced.append(
                conveyor_service.db.autocommit(
                    lambda s: s.replace_unstarted_input(made.execution_id, {"v": 2})
                )
            )
        )
        racing.start()
        deadline = time.monotonic() + 20
        while racing.is_alive() and not lock_waiters(conveyor_service):
            assert time.monotonic() < deadline, "the replace neither ended nor waited"
            time.sleep(0.02)
    racing.join(timeout=20)

    # Then it waited for the claim, saw the job claimed, and left the input
    assert replaced == [False]
    with conveyor_service.db.transaction() as store:
        execution = store.execution(made.execution_id)
    assert (execution.status, execution.input) == (ExecutionStatus.PENDING, {"v": 1})
    conveyor_service.cancel(made.execution_id)
