"""The REST API and the webhook receiver over real HTTP (uvicorn), with real PostgreSQL, Redis
and the in-process Celery worker: signed webhooks in, executions out, every call scoped to its
tenant."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from standardwebhooks import Webhook

from conveyor.engine import triggering
from conveyor.engine.credentials import new_webhook_secret
from conveyor.engine.states import ExecutionStatus, SignatureScheme, TriggerSource
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor, utcnow
from tests.support.services import wait_for

MakeKey = Callable[[str], str]


def add_node(workflow: str = "sum", **extra: Any) -> dict[str, Any]:
    return {
        "name": workflow,
        "nodes": [
            {
                "id": "add",
                "type": "python",
                "config": {"function": "test.add"},
                "inputs": {"a": "{{ input.a | default(1) }}", "b": 1},
            }
        ],
        **extra,
    }


def client(api_url: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=api_url, headers=headers, timeout=30)


def endpoint(service: Conveyor, tenant: str, name: str, scheme: SignatureScheme) -> tuple:
    secret = new_webhook_secret(scheme)
    with service.db.transaction() as store:
        made = store.add_endpoint(store.tenant_id(tenant), name, scheme, secret, utcnow())
    return made.id, secret


def signed(secret: str, body: bytes, msg_id: str = "msg_1", at: datetime | None = None) -> dict:
    at = at or datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body.decode()),
        "content-type": "application/json",
    }


def executions(service: Conveyor, tenant: str) -> list[Any]:
    with service.db.transaction() as store:
        return list(store.list_executions(store.tenant_id(tenant), limit=100))


def deliveries(service: Conveyor) -> int:
    from sqlalchemy import func, select

    from conveyor.models import WebhookDelivery

    with service.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).select_from(WebhookDelivery)))


# -- webhooks ----------------------------------------------------------------------------------


def test_a_standard_webhook_starts_the_matching_workflow_which_completes(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a tenant with a Standard Webhooks endpoint and two workflows listening to it,
    # one of them only for another event type
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "billing", SignatureScheme.STANDARD)
    wanted = add_node("on-paid", webhooks=[{"endpoint": "billing", "events": ["invoice.paid"]}])
    other = add_node("on-void", webhooks=[{"endpoint": "billing", "events": ["invoice.void"]}])
    conveyor_service.apply(parse_workflow(wanted), "acme")
    conveyor_service.apply(parse_workflow(other), "acme")
    body = json.dumps({"type": "invoice.paid", "a": 41}).encode()

    # When the provider posts a delivery signed by the standardwebhooks library
    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                        headers=signed(secret, body))  # fmt: skip

    # Then it is accepted at once, and the matching workflow runs to completion with it
    assert answer.status_code == 202, answer.text
    assert uuid.UUID(answer.json()["delivery_id"])
    [(run, name, _)] = _wait_executions(conveyor_service, "acme", 1)
    assert (name, run.trigger, run.priority.value) == ("on-paid", "webhook", "high")
    done = wait_for(conveyor_service, run.id)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.input["payload"] == {"type": "invoice.paid", "a": 41}
    assert done.output == {"add": {"sum": 2}}  # `a` is in the payload, not the input's top


def _wait_executions(service: Conveyor, tenant: str, count: int) -> list[Any]:
    import time

    deadline = time.monotonic() + 20
    while len(found := executions(service, tenant)) < count:
        assert time.monotonic() < deadline, found
        time.sleep(0.05)
    return found


def test_tampered_expired_unsigned_and_malformed_deliveries_start_nothing(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "billing", SignatureScheme.STANDARD)
    conveyor_service.apply(parse_workflow(add_node(webhooks=[{"endpoint": "billing"}])), "acme")
    url = f"{api_url}/webhooks/{endpoint_id}"
    body = b'{"type": "invoice.paid"}'
    good = signed(secret, body, "msg_ok")
    assert httpx.post(url, content=body, headers=good).status_code == 202

    refused = {
        "tampered": httpx.post(url, content=body.replace(b"paid", b"void"), headers=good),
        "expired": httpx.post(url, content=body, headers=signed(
            secret, body, "msg_old", datetime.now(UTC) - timedelta(minutes=6))),
        "unsigned": httpx.post(url, content=body),
        "malformed": httpx.post(url, content=body, headers={
            "webhook-id": "x", "webhook-timestamp": "yesterday", "webhook-signature": "v1"}),
        "foreign": httpx.post(url, content=body, headers=signed(
            new_webhook_secret(SignatureScheme.STANDARD), body, "msg_foreign")),
    }  # fmt: skip

    codes = {name: answer.status_code for name, answer in refused.items()}
    assert codes == {"tampered": 401, "expired": 401, "unsigned": 401, "malformed": 401,
                     "foreign": 401}  # fmt: skip
    assert "timestamp too old" in refused["expired"].json()["detail"]
    assert "missing header(s) webhook-id" in refused["unsigned"].json()["detail"]
    assert len(_wait_executions(conveyor_service, "acme", 1)) == 1  # only the good one
    assert deliveries(conveyor_service) == 1
    with conveyor_service.db.transaction() as store:
        [made] = store.endpoints(store.tenant_id("acme"))
    assert made.rejected == 5


def test_a_repeated_delivery_answers_2xx_with_the_executions_the_first_one_started(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given a Standard Webhooks endpoint and a workflow listening to it
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "billing", SignatureScheme.STANDARD)
    conveyor_service.apply(parse_workflow(add_node(webhooks=[{"endpoint": "billing"}])), "acme")
    url = f"{api_url}/webhooks/{endpoint_id}"
    body = b'{"type": "invoice.paid"}'

    # When the sender delivers it, then retries it (it took the answer for lost) once the
    # first one was handled, signed anew as a retry is
    first = httpx.post(url, content=body, headers=signed(secret, body, "msg_1"))
    [(run, _, _)] = _wait_executions(conveyor_service, "acme", 1)
    assert wait_for(conveyor_service, run.id).status is ExecutionStatus.COMPLETED
    repeat = httpx.post(url, content=body, headers=signed(secret, body, "msg_1"))

    # Then the first is accepted, and the repeat is told it was handled, with what it started:
    # a 2xx, so the sender stops retrying, and nothing starts twice
    delivery_id = first.json()["delivery_id"]
    assert first.status_code == 202, first.text
    assert first.json() == {"delivery_id": delivery_id, "status": "received", "executions": [],
                            "repeated": False}  # fmt: skip
    assert repeat.status_code == 200, repeat.text
    assert repeat.json() == {"delivery_id": delivery_id, "status": "processed",
                             "executions": [str(run.id)], "repeated": True}  # fmt: skip
    assert len(executions(conveyor_service, "acme")) == 1
    assert deliveries(conveyor_service) == 1


def test_a_github_webhook_with_its_event_header_starts_the_workflow(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "repo", SignatureScheme.GITHUB)
    flow = add_node("on-push", webhooks=[{"endpoint": "repo", "events": ["push"]}])
    conveyor_service.apply(parse_workflow(flow), "acme")

    def delivery(body: bytes, event: str, delivery_id: str) -> dict[str, str]:
        signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return {"X-Hub-Signature-256": signature, "X-GitHub-Delivery": delivery_id,
                "X-GitHub-Event": event}  # fmt: skip

    ping_body = b'{"zen": "Half measures are as bad as nothing at all.", "hook_id": 1, "hook": {}}'
    body = b'{"ref": "refs/heads/main", "before": "a", "after": "b", "commits": [], "pusher": {}}'

    ping = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=ping_body,
                      headers=delivery(ping_body, "ping", "g-0"))  # fmt: skip
    push = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                      headers=delivery(body, "push", "g-1"))  # fmt: skip

    assert (ping.status_code, push.status_code) == (202, 202)
    [(run, name, _)] = _wait_executions(conveyor_service, "acme", 1)
    assert name == "on-push"
    assert wait_for(conveyor_service, run.id).input["event"] == "push"

    # GitHub's "Redeliver" sends the same delivery id and body: told of the first, a 2xx
    again = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                       headers=delivery(body, "push", "g-1"))  # fmt: skip
    assert again.status_code == 200, again.text
    assert again.json() == {"delivery_id": push.json()["delivery_id"], "status": "processed",
                            "executions": [str(run.id)], "repeated": True}  # fmt: skip
    assert len(executions(conveyor_service, "acme")) == 1


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "billing", SignatureScheme.STANDARD)
    body = json.dumps({"blob": "x" * 2_000_000}).encode()

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                        headers=signed(secret, body))  # fmt: skip

    assert answer.status_code == 413
    assert "CONVEYOR_WEBHOOK_MAX_BYTES" in answer.json()["detail"]
    assert deliveries(conveyor_service) == 0


# -- REST ----------------------------------------------------------------------------------


def test_a_retried_trigger_with_the_same_idempotency_key_makes_one_execution(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    with client(api_url, key) as http:
        assert http.post("/v1/workflows", json=add_node()).status_code == 201
        # Given eight retries of one call racing each other, and one more after them
        gate = threading.Barrier(8)
        answers: list[httpx.Response] = []

        def call() -> None:
            gate.wait(timeout=10)
            answers.append(
                http.post(
                    "/v1/workflows/sum/executions",
                    json={"input": {"a": 2}},
                    headers={"Idempotency-Key": "order-42"},
                )
            )

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        later = http.post("/v1/workflows/sum/executions", json={"input": {"a": 2}},
                          headers={"Idempotency-Key": "order-42"})  # fmt: skip
        other = http.post("/v1/workflows/sum/executions", headers={"Idempotency-Key": "o-43"})

    # Then they all name one execution, made once; another key makes another
    ids = {a.json()["id"] for a in [*answers, later]}
    assert len(ids) == 1 and len(answers) == 8
    assert sorted(a.status_code for a in [*answers, later]) == [200] * 8 + [201]
    assert later.json()["replayed"] is True and later.headers["Location"].endswith(ids.pop())
    assert other.status_code == 201
    made = executions(conveyor_service, "acme")
    assert len(made) == 2
    for run, _, _ in made:  # (and leave no work running into the next test)
        assert wait_for(conveyor_service, run.id).status is ExecutionStatus.COMPLETED


def test_tenant_a_cannot_see_or_touch_tenant_bs_work(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given tenant B with a workflow, an execution and a dead letter
    key_a, key_b = make_key("tenant-a"), make_key("tenant-b")
    failing = {"name": "doomed", "defaults": {"retry": {"max_attempts": 1}},
               "nodes": [{"id": "f", "type": "python", "config": {"function": "test.fail"},
                          "inputs": {"message": "no"}}]}  # fmt: skip
    with client(api_url, key_b) as b:
        assert b.post("/v1/workflows", json=failing).status_code == 201
        started = b.post("/v1/workflows/doomed/executions").json()["id"]
    assert wait_for(conveyor_service, uuid.UUID(started)).status is ExecutionStatus.FAILED

    # When tenant A reaches for them
    with client(api_url, key_a) as a:
        assert a.get("/v1/workflows").json() == []
        assert a.get("/v1/workflows/doomed").status_code == 404
        assert a.post("/v1/workflows/doomed/executions").status_code == 404
        assert a.get("/v1/executions").json() == []
        assert a.get("/v1/executions", params={"workflow": "doomed"}).json() == []
        assert a.get("/v1/executions/summary").json() == []
        assert a.get(f"/v1/executions/{started}").status_code == 404
        assert a.post(f"/v1/executions/{started}/cancel").status_code == 404
        assert a.get(f"/v1/executions/{started}/events").status_code == 404
        assert a.get("/v1/dead-letters").json() == []

    # Then B still sees its own, dead letter included
    with client(api_url, key_b) as b:
        assert [d["workflow"] for d in b.get("/v1/dead-letters").json()] == ["doomed"]
        assert b.get(f"/v1/executions/{started}").json()["status"] == "failed"


def test_calls_without_a_valid_key_are_refused(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    prefix = key.split("_")[1]
    with conveyor_service.db.transaction() as store:
        store.revoke_api_key(store.tenant_id("acme"), prefix, utcnow())

    answers = [
        httpx.get(f"{api_url}/v1/workflows"),
        httpx.get(f"{api_url}/v1/workflows", headers={"Authorization": "Bearer nonsense"}),
        httpx.get(f"{api_url}/v1/workflows", headers={"Authorization": f"Bearer {key}x"}),
        httpx.get(f"{api_url}/v1/workflows", headers={"Authorization": f"Bearer {key}"}),
    ]

    assert [a.status_code for a in answers] == [401] * 4
    assert all(a.headers["WWW-Authenticate"] == "Bearer" for a in answers)


def test_an_application_event_starts_every_subscribed_workflow(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    with client(api_url, key) as http:
        for name in ("mail", "ledger"):
            flow = add_node(name, events=["invoice.created"])
            assert http.post("/v1/workflows", json=flow).status_code == 201
        http.post("/v1/workflows", json=add_node("unrelated", events=["invoice.void"]))

        answer = http.post("/v1/events", json={"type": "invoice.created", "payload": {"n": 1}})

    assert answer.status_code == 202
    started = [uuid.UUID(i) for i in answer.json()["executions"]]
    assert len(started) == 2
    for execution_id in started:
        done = wait_for(conveyor_service, execution_id)
        assert done.status is ExecutionStatus.COMPLETED
        assert done.input == {"event": "invoice.created", "payload": {"n": 1}}
        assert done.trigger == "event"


def test_an_invalid_definition_is_refused_with_every_problem(
    api_url: str, make_key: MakeKey
) -> None:
    bad = {"name": "loop", "nodes": [{"id": "a", "type": "python", "needs": ["b"],
                                      "config": {"function": "test.add"}},
                                     {"id": "b", "type": "python", "needs": ["a"],
                                      "config": {"function": "test.add"}}],
           "schedules": [{"cron": "61 * * * *"}]}  # fmt: skip
    with client(api_url, make_key("acme")) as http:
        answer = http.post("/v1/workflows", json=bad)

    assert answer.status_code == 422
    errors = answer.json()["errors"]
    assert any("cycle" in e for e in errors) and any("Bad minute" in e for e in errors)


def test_inputs_a_registered_function_does_not_take_are_refused_at_apply(
    api_url: str, make_key: MakeKey
) -> None:
    # test.add (tests/support/nodes.py, CONVEYOR_IMPORTS) takes a, b and ctx
    node = {"id": "s", "type": "python", "config": {"function": "test.add"},
            "inputs": {"a": 1, "bb": 2}}  # fmt: skip
    bad = {"name": "sum", "nodes": [node]}
    with client(api_url, make_key("acme")) as http:
        answer = http.post("/v1/workflows", json=bad)

    assert answer.status_code == 422
    assert answer.json()["errors"] == [
        "node 's': inputs.bb is not a parameter: function 'test.add' takes (a, b, ctx); did you "
        "mean 'b'?",
        "node 's': function 'test.add' takes (a, b, ctx): 'b' has no default, so inputs.b is "
        "required; add it",
    ]


def test_the_status_stream_shows_an_execution_go_from_running_to_completed(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given an execution stored and planned (a small one is planned by its trigger), its root
    # node's message not yet published
    key = make_key("acme")
    conveyor_service.apply(parse_workflow(add_node()), "acme")
    made = conveyor_service.db.run(
        lambda s: triggering.trigger(s, workflow_name="sum", tenant="acme", input={}, now=utcnow(),
                                 source=TriggerSource.API)
    )  # fmt: skip
    seen: list[tuple[str, dict[str, Any]]] = []
    opened = threading.Event()

    def listen() -> None:
        with (
            client(api_url, key) as http,
            http.stream("GET", f"/v1/executions/{made.execution_id}/events") as stream,
        ):
            kind = ""
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    seen.append((kind, json.loads(line.removeprefix("data: "))))
                    opened.set()

    reader = threading.Thread(target=listen)
    reader.start()
    assert opened.wait(10)

    # When its node's message is published and a worker runs it
    conveyor_service.dispatcher.publish(made.dispatches)
    reader.join(timeout=30)

    # Then the stream showed running first, the node's progress, completed last, and ended
    assert not reader.is_alive()
    statuses = [data["status"] for kind, data in seen if kind == "execution"]
    assert statuses == ["running", "completed"]
    nodes = [data["status"] for kind, data in seen if kind == "node"]
    assert nodes == ["running", "completed"]
    assert seen[-1] == ("execution", {"status": "completed"})


def test_the_openapi_schema_is_served(api_url: str) -> None:
    schema = httpx.get(f"{api_url}/openapi.json").json()

    assert {"/v1/workflows/{name}/executions", "/webhooks/{endpoint_id}", "/v1/events"} <= set(
        schema["paths"]
    )
