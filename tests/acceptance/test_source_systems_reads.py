"""Issue 27, seeing and finding, as an operator of the replaced job systems would: a running
node's heartbeat seen to move in `conveyor executions show` and the REST API, and executions
found by filter and counted by the status view, through `conveyor` and `conveyor api` processes
and a real `celery worker`, on Redis and on RabbitMQ (``acceptance_broker``): the worker, the
API and the CLI on the same broker."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import await_ready
from tests.acceptance.test_api import api  # noqa: F401  (the fixture: `conveyor api`)
from tests.acceptance.test_cli import conveyor, conveyor_session

Start = Callable[..., subprocess.Popen[str]]
# Runs until the test cancels it, however long the test takes on a loaded machine
SLOW = {"name": "export", "nodes": [{"id": "render", "type": "python",
                                     "config": {"function": "test.sleep"},
                                     "inputs": {"seconds": 3600}}]}  # fmt: skip
SUM = {"name": "sum", "nodes": [{"id": "add", "type": "python", "config": {"function": "test.add"},
                                 "inputs": {"a": 1, "b": 1}}]}  # fmt: skip
DOOMED = {"name": "doomed", "defaults": {"retry": {"max_attempts": 3, "backoff": 0.01}},
          "nodes": [{"id": "f", "type": "python", "config": {"function": "test.fail"},
                     "inputs": {"message": "no"}}]}  # fmt: skip


def cli_json(env: dict[str, str], *args: str) -> Any:
    done = conveyor(*args, "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def until(check: Callable[[], Any], what: str, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return found


# A worker, `conveyor api` and a dozen `conveyor` calls, each seconds on a loaded machine.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_a_heartbeat_moves_in_show_and_the_api_and_executions_are_found_and_counted(
    api: str,  # noqa: F811
    start_worker: Start,
    broker_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    # Given a worker that beats every 0.3 s, a tenant's key, and three workflows
    env = {**broker_env, "CONVEYOR_IMPORTS": "tests.support.nodes"}
    worker = start_worker("workflow-execution,workflow-node", concurrency=2, name="beats",
                          env={"CONVEYOR_HEARTBEAT_INTERVAL": "0.3"}, wait=False)  # fmt: skip
    made = conveyor_session(["tenants", "create", "acme"], ["keys", "create", "--tenant", "acme"],
                            env=env)  # fmt: skip
    assert [m.returncode for m in made] == [0, 0], made
    key = made[1].stdout.strip()
    await_ready(worker)
    http = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    request.addfinalizer(http.close)
    for flow in (SLOW, SUM, DOOMED):
        assert http.post("/v1/workflows", json=flow).status_code == 201

    # When a slow node runs
    slow = http.post("/v1/workflows/export/executions", json={"dedupe_key": "doc-1"}).json()["id"]

    def beat_in_show() -> dict[str, Any] | None:
        node = cli_json(env, "executions", "show", slow)["nodes"][0]
        return node if node["heartbeat_at"] else None

    # Then `executions show` names its worker and shows its heartbeat, which moves
    first = until(beat_in_show, "no heartbeat in executions show")
    assert first["status"] == "running" and first["worker"]  # host:pid
    assert first["heartbeat_age"] >= 0
    later = until(
        lambda: (n := beat_in_show()) and n["heartbeat_at"] > first["heartbeat_at"] and n,
        "the heartbeat did not move in executions show",
    )
    assert later["worker"] == first["worker"]
    table = conveyor("executions", "show", slow, env=env).stdout
    assert f"on {first['worker']}, heartbeat" in table
    # ... and so does the API's read of the execution
    seen = http.get(f"/v1/executions/{slow}").json()["nodes"][0]
    assert seen["worker"] == first["worker"] and seen["heartbeat_at"] >= later["heartbeat_at"]
    until(
        lambda: (
            http.get(f"/v1/executions/{slow}").json()["nodes"][0]["heartbeat_at"]
            > seen["heartbeat_at"]
        ),
        "the heartbeat did not move in the API",
    )

    # When quick runs finish beside it: two sums (one with an idempotency key) and a failure
    plain = http.post("/v1/workflows/sum/executions").json()["id"]
    keyed = http.post("/v1/workflows/sum/executions", headers={"Idempotency-Key": "pay-1"}).json()[
        "id"
    ]
    failed = http.post("/v1/workflows/doomed/executions").json()["id"]
    until(
        lambda: (
            len(http.get("/v1/executions", params={"status": "completed"}).json()) == 2
            and http.get("/v1/executions", params={"status": "failed"}).json()
        ),
        "the quick runs did not finish",
    )

    # Then the filters find each, in the API and the CLI (its reads in one process)
    def api_ids(**params: str) -> list[str]:
        return [e["id"] for e in http.get("/v1/executions", params=params).json()]

    page = api_ids(limit="2")
    created = http.get(f"/v1/executions/{plain}").json()["created_at"]
    listed = ["executions", "list", "--tenant", "acme", "--json"]
    *lists, stats = conveyor_session(
        [*listed, "--workflow", "sum"],
        [*listed, "--node-status", "running"],
        [*listed, "--dedupe-key", "doc-1"],
        [*listed, "--limit", "2", "--after", page[-1]],
        [*listed, "--created-before", created[:19]],  # no offset: UTC
        ["executions", "stats", "--tenant", "acme", "--json"],
        env=env,
    )
    assert [done.returncode for done in (*lists, stats)] == [0] * 6, (*lists, stats)
    by_sum, running, by_key, after, before = ([e["id"] for e in json.loads(done.stdout)]
                                              for done in lists)  # fmt: skip
    assert api_ids(workflow="sum") == by_sum == [keyed, plain]
    assert api_ids(node_status="running") == running == [slow]
    assert api_ids(node_status="failed") == [failed]
    assert api_ids(dedupe_key="doc-1") == by_key == [slow]
    assert api_ids(idempotency_key="pay-1") == [keyed]
    assert page + api_ids(after=page[-1]) == [failed, keyed, plain, slow]
    assert after == [plain, slow]
    assert api_ids(created_after=created) == [failed, keyed]
    assert before == [slow]

    # And the status view counts them by workflow and status, with the tries
    expected = [("doomed", "failed", 1, 3.0), ("export", "running", 1, 1.0),
                ("sum", "completed", 2, 1.0)]  # fmt: skip
    for rows in (http.get("/v1/executions/summary").json(), json.loads(stats.stdout)):
        assert [(r["workflow"], r["status"], r["count"], r["average_attempts"]) for r in rows] == (
            expected
        )
    assert http.post(f"/v1/executions/{slow}/cancel").status_code == 200
