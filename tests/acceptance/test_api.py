"""`conveyor api` as an operator runs it, in its own process, with real `celery worker`
processes: keys and endpoints made with the CLI, a signed webhook in, a completed execution
out, watched over the live stream."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from tests.acceptance.conftest import ROOT, _wait_until_ready, await_ready
from tests.acceptance.test_cli import CONVEYOR, conveyor_session

Start = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def api(broker_env: dict[str, str], tmp_path: Path, client: object) -> Iterator[str]:
    """`conveyor api` on the test's broker (``acceptance_broker``)."""
    with serving_api({**broker_env, "CONVEYOR_IMPORTS": "tests.support.nodes"}, tmp_path) as url:
        yield url


@contextmanager
def serving_api(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """`conveyor api` in its own process on a free port, logging to tmp_path/api.log; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "api.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CONVEYOR, "api", "--port", str(port)], cwd=ROOT, env=env, text=True,
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until_ready(process, log, "Uvicorn running on")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_signed_webhook_through_conveyor_api_runs_its_workflow_on_real_workers(
    api: str, start_worker: Start, acceptance_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    # Given workers for the webhook, execution and node queues, a key and an endpoint
    worker = start_worker("workflow-webhook,workflow-execution,workflow-node", concurrency=2,
                          wait=False)  # fmt: skip
    tenant, made, endpoint = conveyor_session(
        ["tenants", "create", "acme"],
        ["keys", "create", "--tenant", "acme"],
        ["webhooks", "create", "billing", "--tenant", "acme"],
        env=acceptance_env,
    )
    await_ready(worker)
    assert tenant.returncode == 0, tenant.stderr
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert endpoint.returncode == 0, endpoint.stderr
    path = endpoint.stdout.strip()
    secret = endpoint.stderr.split("secret: ")[1].split(" ")[0]
    http = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    request.addfinalizer(http.close)
    flow = {"name": "on-paid", "webhooks": [{"endpoint": "billing"}],
            "nodes": [{"id": "add", "type": "python", "config": {"function": "test.add"},
                       "inputs": {"a": "{{ input.payload.amount }}", "b": 1}}]}  # fmt: skip
    assert http.post("/v1/workflows", json=flow).status_code == 201

    # When the provider posts a signed delivery
    body = json.dumps({"type": "invoice.paid", "amount": 41}).encode()
    now = datetime.now(UTC)
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())),
               "webhook-signature": Webhook(secret).sign("msg_1", now, body.decode())}  # fmt: skip
    answer = httpx.post(f"{api}{path}", content=body, headers=headers)
    assert answer.status_code == 202, answer.text

    # Then its execution appears and the live stream follows it to completion
    deadline = time.monotonic() + 30
    while not (listed := http.get("/v1/executions").json()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    execution_id = listed[0]["id"]
    with http.stream("GET", f"/v1/executions/{execution_id}/events") as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == 'data: {"status": "completed"}'
    shown = http.get(f"/v1/executions/{execution_id}").json()
    assert shown["output"] == {"add": {"sum": 42}}
    assert shown["trigger"] == "webhook" and shown["priority"] == "high"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_conveyor_api_serves_metrics_on_their_own_port_and_not_on_the_public_one(
    acceptance_env: dict[str, str], tmp_path: Path, client: object
) -> None:
    # Given `conveyor api --metrics-port`, without a metrics token
    port, metrics_port = _free_port(), _free_port()
    log = tmp_path / "api.log"
    env = {k: v for k, v in acceptance_env.items() if k != "CONVEYOR_METRICS_TOKEN"}
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CONVEYOR, "api", "--port", str(port), "--metrics-port", str(metrics_port)],
            cwd=ROOT, env=env, text=True, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until_ready(process, log, "Uvicorn running on")

        public = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        own = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30)
    finally:
        process.terminate()
        process.wait(timeout=20)

    # Then the public port refuses them, naming the settings, and their own port serves them
    assert public.status_code == 403
    assert "CONVEYOR_METRICS_PORT" in public.json()["detail"]
    assert own.status_code == 200 and "conveyor_executions" in own.text
