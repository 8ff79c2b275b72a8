"""http, delay and condition nodes, timeouts, cancellation and versioning, end to end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import DefinitionError, InvalidTransition
from conveyor.service import Conveyor
from tests.support.outbound import http_allowed
from tests.support.services import effects, wait_for


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/broken":
            self.send_response(503)
            self.end_headers()
            return
        payload = json.dumps({"echo": body, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    """A server on loopback, which the http node calls only because the operator allows it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with http_allowed("127.0.0.1"):
        yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def apply(service: Conveyor, name: str, nodes: list[dict[str, Any]], **extra: Any) -> None:
    service.apply(parse_workflow({"name": name, "nodes": nodes, **extra}))


def node_states(service: Conveyor, execution_id: Any) -> dict[str, Any]:
    with service.db.transaction() as store:
        return {n.node_id: n for n in store.execution_nodes(execution_id)}


def only_node_job(service: Conveyor, execution_id: Any) -> tuple[Any, list[Any]]:
    """The single node job of a one-node workflow, with its attempts."""
    with service.db.transaction() as store:
        ((job, attempts),) = [(j, a) for j, a in store.execution_jobs(execution_id) if j.node_id]
    return job, attempts


def wait_until_stopped(service: Conveyor, execution_id: Any, node_id: str) -> None:
    deadline = time.monotonic() + 10
    while node_states(service, execution_id)[node_id].status is NodeStatus.RUNNING:
        assert time.monotonic() < deadline, f"the running node {node_id!r} was not stopped"
        time.sleep(0.05)


def test_http_node_posts_rendered_json_and_stores_the_response(
    conveyor_service: Conveyor, http_server: str
) -> None:
    apply(
        conveyor_service,
        "hook",
        [
            {
                "id": "call",
                "type": "http",
                "config": {
                    "method": "POST",
                    "url": f"{http_server}/items",
                    "json": {"order": "{{ input.order }}"},
                },
            }
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("hook", {"order": 42}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {
        "call": {"status": 200, "body": {"echo": {"order": 42}, "path": "/items"}}
    }


def test_http_node_non_2xx_fails_the_try(conveyor_service: Conveyor, http_server: str) -> None:
    apply(
        conveyor_service,
        "hook",
        [
            {
                "id": "call",
                "type": "http",
                "retry": {"max_attempts": 2, "backoff": 0.05},
                "config": {"method": "POST", "url": f"{http_server}/broken"},
            }
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("hook", {}))

    assert row.status is ExecutionStatus.FAILED
    assert "503" in (row.error or "")


def test_delay_node_waits_in_the_database_then_completes(conveyor_service: Conveyor) -> None:
    apply(
        conveyor_service,
        "later",
        [
            {"id": "wait", "type": "delay", "config": {"seconds": "{{ input.seconds }}"}},
            {
                "id": "after",
                "type": "python",
                "needs": ["wait"],
                "config": {"function": "test.add"},
                "inputs": {"a": 1, "b": 1},
            },
        ],
    )

    execution_id = conveyor_service.trigger("later", {"seconds": 1.0})
    time.sleep(0.4)
    job, attempts = only_node_job(conveyor_service, execution_id)
    # While it waits, no worker holds it: the job is scheduled, untried, with a due time.
    assert job.status is JobStatus.SCHEDULED and attempts == [] and job.next_run_at is not None
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED
    states = node_states(conveyor_service, execution_id)
    assert states["wait"].output == {"delayed_seconds": 1.0}
    assert (states["after"].started_at - row.created_at).total_seconds() >= 1.0


def test_a_delay_after_a_node_takes_its_length_from_that_node_s_output(
    conveyor_service: Conveyor,
) -> None:
    apply(
        conveyor_service,
        "measured-wait",
        [
            {"id": "first", "type": "python", "config": {"function": "test.add"},
             "inputs": {"a": 0.25, "b": 0.5}},
            {"id": "wait", "type": "delay", "needs": ["first"],
             "config": {"seconds": "{{ nodes.first.sum }}"}},
        ],
    )  # fmt: skip

    row = wait_for(conveyor_service, conveyor_service.trigger("measured-wait"))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    states = node_states(conveyor_service, row.id)
    assert states["wait"].output == {"delayed_seconds": 0.75}
    assert (states["wait"].started_at - states["first"].finished_at).total_seconds() >= 0.75


@pytest.mark.parametrize(
    ("amount", "taken", "skipped"), [(500, "big", "small"), (5, "small", "big")]
)
def test_condition_skips_the_branch_not_taken_and_the_join_still_runs(
    conveyor_service: Conveyor, amount: int, taken: str, skipped: str
) -> None:
    apply(
        conveyor_service,
        "route",
        [
            {
                "id": "check",
                "type": "condition",
                "config": {
                    "expression": "input.amount > 100",
                    "if_true": ["big"],
                    "if_false": ["small"],
                },
            },
            {
                "id": "big",
                "type": "python",
                "needs": ["check"],
                "config": {"function": "test.add"},
                "inputs": {"a": "{{ input.amount }}", "b": 1000},
            },
            {
                "id": "small",
                "type": "python",
                "needs": ["check"],
                "config": {"function": "test.add"},
                "inputs": {"a": "{{ input.amount }}", "b": 1},
            },
            {
                "id": "after_small",
                "type": "python",
                "needs": ["small"],
                "config": {"function": "test.add"},
                "inputs": {"a": 0, "b": 0},
            },
            {
                "id": "join",
                "type": "python",
                "needs": ["big", "after_small"],
                "config": {"function": "test.add"},
                "inputs": {"a": 1, "b": 1},
            },
        ],
    )

    execution_id = conveyor_service.trigger("route", {"amount": amount})
    row = wait_for(conveyor_service, execution_id)

    assert row.status is ExecutionStatus.COMPLETED, row.error
    states = node_states(conveyor_service, execution_id)
    assert states[taken].status is NodeStatus.COMPLETED
    assert states[skipped].status is NodeStatus.SKIPPED
    assert states["join"].status is NodeStatus.COMPLETED
    expected_after_small = NodeStatus.SKIPPED if skipped == "small" else NodeStatus.COMPLETED
    assert states["after_small"].status is expected_after_small
    ran = {e["node_id"] for e in effects(conveyor_service.db.url)}
    assert skipped not in ran


def test_a_try_past_its_timeout_fails_with_an_error_saying_so(conveyor_service: Conveyor) -> None:
    apply(
        conveyor_service,
        "slow",
        [
            {
                "id": "nap",
                "type": "python",
                "config": {"function": "test.sleep"},
                "inputs": {"seconds": 5},
                "timeout": 0.3,
                "retry": {"max_attempts": 1},
            }
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("slow", {}))

    assert row.status is ExecutionStatus.FAILED
    assert "ran past its timeout of 0.3 s" in (row.error or "")
    job, attempts = only_node_job(conveyor_service, row.id)
    assert attempts[0].timed_out and job.status is JobStatus.DEAD_LETTER


def test_cancel_stops_running_nodes_and_cancels_pending_ones(conveyor_service: Conveyor) -> None:
    apply(
        conveyor_service,
        "long",
        [
            {
                "id": "nap",
                "type": "python",
                "config": {"function": "test.sleep"},
                "inputs": {"seconds": 20},
            },
            {
                "id": "next",
                "type": "python",
                "needs": ["nap"],
                "config": {"function": "test.add"},
                "inputs": {"a": 1, "b": 1},
            },
        ],
    )
    execution_id = conveyor_service.trigger("long", {})
    for _ in range(200):
        nap = node_states(conveyor_service, execution_id).get("nap")
        if nap is not None and nap.status is NodeStatus.RUNNING:
            break
        time.sleep(0.02)

    conveyor_service.cancel(execution_id)

    row = wait_for(conveyor_service, execution_id)
    assert row.status is ExecutionStatus.CANCELLED
    wait_until_stopped(conveyor_service, execution_id, "nap")
    states = node_states(conveyor_service, execution_id)
    assert states["nap"].status is NodeStatus.CANCELLED
    assert states["next"].status is NodeStatus.CANCELLED
    slept = [e for e in effects(conveyor_service.db.url) if e["node_id"] == "nap"]
    assert len(slept) == 1  # the node saw ctx.cancelled and returned early


def test_applying_from_python_refuses_inputs_a_registered_function_does_not_take(
    conveyor_service: Conveyor,
) -> None:
    # Given a definition built in Python, valid but for its inputs: test.add takes (a, b, ctx)
    node = {"id": "s", "type": "python", "config": {"function": "test.add"},
            "inputs": {"a": 1, "bb": 2}}  # fmt: skip
    workflow = parse_workflow({"name": "sum", "nodes": [node]})

    # When it is applied through the service, as the API and the CLI do
    with pytest.raises(DefinitionError) as refused:
        conveyor_service.apply(workflow)

    # Then it is refused with the sentences they give, and nothing is stored
    assert refused.value.errors == [
        "node 's': inputs.bb is not a parameter: function 'test.add' takes (a, b, ctx); did you "
        "mean 'b'?",
        "node 's': function 'test.add' takes (a, b, ctx): 'b' has no default, so inputs.b is "
        "required; add it",
    ]
    with conveyor_service.db.transaction() as store:
        assert store.list_workflows(store.tenant_id("default")) == []


def test_applying_a_changed_definition_makes_a_new_version_and_executions_pin_theirs(
    conveyor_service: Conveyor,
) -> None:
    def definition(b: int) -> Any:
        return parse_workflow(
            {
                "name": "versioned",
                "nodes": [
                    {
                        "id": "n",
                        "type": "python",
                        "config": {"function": "test.add"},
                        "inputs": {"a": 1, "b": b},
                    }
                ],
            }
        )

    first, created = conveyor_service.apply(definition(1))
    same, created_again = conveyor_service.apply(definition(1))
    assert created and not created_again and same.version == first.version == 1

    old_run = conveyor_service.trigger("versioned", {})
    second, created = conveyor_service.apply(definition(2))
    assert created and second.version == 2
    new_run = conveyor_service.trigger("versioned", {})

    assert wait_for(conveyor_service, old_run).output == {"n": {"sum": 2}}
    assert wait_for(conveyor_service, new_run).output == {"n": {"sum": 3}}


def test_a_template_error_fails_the_node_without_retrying(conveyor_service: Conveyor) -> None:
    apply(
        conveyor_service,
        "typo",
        [
            {
                "id": "n",
                "type": "python",
                "config": {"function": "test.add"},
                "inputs": {"a": "{{ input.missing }}", "b": 1},
                "retry": {"max_attempts": 3},
            }
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("typo", {}))

    assert row.status is ExecutionStatus.FAILED
    assert "missing" in (row.error or "")
    job, attempts = only_node_job(conveyor_service, row.id)
    assert len(attempts) == 1 and job.status is JobStatus.DEAD_LETTER


def test_a_sibling_stopped_by_a_failed_execution_is_cancelled_not_dead_lettered(
    conveyor_service: Conveyor,
) -> None:
    apply(
        conveyor_service,
        "half",
        [
            {"id": "boom", "type": "python", "config": {"function": "test.fail_permanently"}},
            {
                "id": "nap",
                "type": "python",
                "config": {"function": "test.sleep"},
                "inputs": {"seconds": 20},
            },
        ],
    )

    row = wait_for(conveyor_service, conveyor_service.trigger("half", {}))
    assert row.status is ExecutionStatus.FAILED
    wait_until_stopped(conveyor_service, row.id, "nap")

    with conveyor_service.db.transaction() as store:
        jobs = {j.node_id: j for j, _ in store.execution_jobs(row.id)}
    assert node_states(conveyor_service, row.id)["nap"].status is NodeStatus.CANCELLED
    assert jobs["nap"].status is JobStatus.CANCELLED
    assert jobs["boom"].status is JobStatus.DEAD_LETTER


def test_cancelling_a_finished_execution_is_refused(conveyor_service: Conveyor) -> None:
    apply(
        conveyor_service,
        "quick",
        [
            {
                "id": "n",
                "type": "python",
                "config": {"function": "test.add"},
                "inputs": {"a": 1, "b": 1},
            }
        ],
    )
    row = wait_for(conveyor_service, conveyor_service.trigger("quick", {}))

    with pytest.raises(InvalidTransition, match="already completed"):
        conveyor_service.cancel(row.id)


def test_a_delay_sleeps_until_the_time_its_template_gives_in_its_timezone(
    conveyor_service: Conveyor,
) -> None:
    # Given a delay until a time a second ahead, written as Paris's wall clock (no offset)
    paris = ZoneInfo("Europe/Paris")
    until = datetime.now(paris).replace(tzinfo=None, microsecond=0) + timedelta(seconds=2)
    apply(
        conveyor_service,
        "until",
        [{"id": "wait", "type": "delay",
          "config": {"until": "{{ input.at }}", "timezone": "Europe/Paris"}}],
    )  # fmt: skip

    execution_id = conveyor_service.trigger("until", {"at": until.isoformat()})
    time.sleep(0.4)
    job, attempts = only_node_job(conveyor_service, execution_id)

    # Then its job is held in the database until that moment, and it runs then
    due = until.replace(tzinfo=paris).astimezone(UTC)
    assert job.status is JobStatus.SCHEDULED and attempts == []
    assert job.next_run_at == due
    row = wait_for(conveyor_service, execution_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert node_states(conveyor_service, execution_id)["wait"].output == {
        "delayed_until": due.isoformat()
    }
