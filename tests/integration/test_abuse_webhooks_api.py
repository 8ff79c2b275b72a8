"""Abuse of the webhook receiver and the API's answers (issue 24), over real HTTP with real
PostgreSQL, Redis and the in-process worker: captured deliveries sent again, headers that lie
about the signed body, malformed timestamps, a broker that is down while calls come in, a
scrape of /metrics by whoever reaches the public port, and error answers that must keep the
shape the OpenAPI schema promises."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, update
from standardwebhooks import Webhook

from conveyor.api import create_app
from conveyor.api.schemas import Problem
from conveyor.config import Settings
from conveyor.engine.credentials import new_webhook_secret
from conveyor.engine.states import ExecutionStatus, SignatureScheme
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Job, JobAttempt, WebhookDelivery, WebhookSignature
from conveyor.service import Conveyor, utcnow
from conveyor.tasks.app import create_app as create_celery_app
from conveyor.tasks.dispatch import CeleryDispatcher
from tests.integration.conftest import METRICS_TOKEN, SCRAPER, served
from tests.support.services import wait_for

MakeKey = Callable[[str], str]

PING = json.dumps({"zen": "Speak like a human.", "hook_id": 9, "hook": {"id": 9}}).encode()
PUSH = json.dumps(
    {"ref": "refs/heads/main", "before": "a" * 40, "after": "b" * 40, "commits": [],
     "head_commit": None, "pusher": {"name": "octocat"}}
).encode()  # fmt: skip
FLOW = {
    "name": "on-push",
    "nodes": [
        {
            "id": "n",
            "type": "python",
            "config": {"function": "test.add"},
            "inputs": {"a": 1, "b": 2},
        }
    ],
    "webhooks": [{"endpoint": "repo", "events": ["push"]}],
}


def github(secret: str, body: bytes, event: str, delivery_id: str) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id, "Content-Type": "application/json"}  # fmt: skip


def endpoint(service: Conveyor, tenant: str, name: str, scheme: SignatureScheme) -> tuple:
    secret = new_webhook_secret(scheme)
    with service.db.transaction() as store:
        made = store.add_endpoint(store.tenant_id(tenant), name, scheme, secret, utcnow())
    return made.id, secret


def count(service: Conveyor, model: type[Any]) -> int:
    with service.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).select_from(model)) or 0)


def started(service: Conveyor) -> list[Execution]:
    with service.db.transaction() as store:
        return list(store.session.scalars(select(Execution)))


@pytest.fixture
def repo(conveyor_service: Conveyor, make_key: MakeKey) -> tuple[uuid.UUID, str]:
    """A tenant's GitHub endpoint 'repo', and a workflow its pushes start."""
    make_key("acme")
    made = endpoint(conveyor_service, "acme", "repo", SignatureScheme.GITHUB)
    conveyor_service.apply(parse_workflow(FLOW), "acme")
    return made


# -- GitHub: what its signature does not cover -------------------------------------------------


def test_a_captured_github_delivery_sent_again_under_a_new_delivery_id_is_refused(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    endpoint_id, secret = repo
    url = f"{api_url}/webhooks/{endpoint_id}"
    first = httpx.post(url, content=PUSH, headers=github(secret, PUSH, "push", "g-1"))

    replays = [
        httpx.post(url, content=PUSH, headers=github(secret, PUSH, "push", f"g-new-{n}"))
        for n in range(3)
    ]

    assert first.status_code == 202
    assert [r.status_code for r in replays] == [409, 409, 409]
    assert "CONVEYOR_WEBHOOK_REPLAY_WINDOW_DAYS" in replays[0].json()["detail"]
    assert count(conveyor_service, WebhookDelivery) == 1
    _settle(conveyor_service, executions=1)  # the one delivery's execution, completed


def test_concurrent_replays_of_one_github_body_let_exactly_one_through(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    # Given eight copies of one signed body, each under its own delivery id, sent at once
    endpoint_id, secret = repo
    url = f"{api_url}/webhooks/{endpoint_id}"
    gate, codes = threading.Barrier(8), []

    def send(n: int) -> None:
        headers = github(secret, PUSH, "push", f"g-race-{n}")
        gate.wait()
        codes.append(httpx.post(url, content=PUSH, headers=headers, timeout=30).status_code)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then the database let one in: one delivery, one execution
    assert sorted(codes) == [202] + [409] * 7
    assert count(conveyor_service, WebhookDelivery) == 1
    _settle(conveyor_service, executions=1)  # the one delivery's execution, completed


def test_a_github_body_is_accepted_again_once_the_replay_window_has_passed(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    endpoint_id, secret = repo
    url = f"{api_url}/webhooks/{endpoint_id}"
    assert httpx.post(url, content=PUSH, headers=github(secret, PUSH, "push", "g-1")).is_success
    with conveyor_service.db.transaction() as store:  # received 31 days ago
        store.session.execute(
            update(WebhookSignature).values(seen_at=utcnow() - timedelta(days=31))
        )

    again = httpx.post(url, content=PUSH, headers=github(secret, PUSH, "push", "g-2"))

    assert again.status_code == 202  # the window (30 days by default) is over
    assert count(conveyor_service, WebhookDelivery) == 2
    _settle(conveyor_service, executions=2)


def test_the_retention_sweep_deletes_the_signatures_past_the_replay_window_only(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    # Given three bodies received, two of them longer ago than the window (30 days)
    endpoint_id, secret = repo
    bodies = [json.dumps({**json.loads(PUSH), "after": str(n)}).encode() for n in range(3)]
    for n, body in enumerate(bodies):
        headers = github(secret, body, "push", f"g-{n}")
        assert httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body, headers=headers)
    _settle(conveyor_service, executions=3)
    with conveyor_service.db.transaction() as store:
        store.session.execute(
            update(WebhookSignature)
            .where(WebhookSignature.digest != _digest(secret, bodies[2]))
            .values(seen_at=utcnow() - timedelta(days=31))
        )

    # When the retention sweep runs (a batch of one: it goes on until no more are due)
    conveyor_service.prune(timedelta(days=14), batch=1)

    # Then only the recent one is kept: the old ones refused nothing any more
    with conveyor_service.db.transaction() as store:
        kept = list(store.session.scalars(select(WebhookSignature.digest)))
    assert kept == [_digest(secret, bodies[2])]


def _digest(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_the_same_github_body_to_another_endpoint_is_not_a_replay(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    # one repository's webhook is set up on two endpoints with the same secret
    endpoint_id, secret = repo
    with conveyor_service.db.transaction() as store:
        other = store.add_endpoint(
            store.tenant_id("acme"), "mirror", SignatureScheme.GITHUB, secret, utcnow()
        ).id

    codes = [
        httpx.post(f"{api_url}/webhooks/{e}", content=PUSH,
                   headers=github(secret, PUSH, "push", "g-1")).status_code
        for e in (endpoint_id, other)
    ]  # fmt: skip

    assert codes == [202, 202]
    _settle(conveyor_service)


def test_a_captured_ping_sent_again_as_a_push_starts_nothing(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    endpoint_id, secret = repo
    url = f"{api_url}/webhooks/{endpoint_id}"
    ping = httpx.post(url, content=PING, headers=github(secret, PING, "ping", "g-ping"))

    as_push = httpx.post(url, content=PING, headers=github(secret, PING, "push", "g-forged"))

    assert ping.status_code == 202  # a ping starts nothing: the workflow wants pushes
    assert as_push.status_code == 401
    assert "X-GitHub-Event header does not match the signed body" in as_push.json()["detail"]
    assert "'push' payload always has ref, before, after" in as_push.json()["detail"]
    assert count(conveyor_service, WebhookDelivery) == 1  # the ping alone
    _settle(conveyor_service)
    assert started(conveyor_service) == []
    with conveyor_service.db.transaction() as store:
        [made] = store.endpoints(store.tenant_id("acme"))
    assert made.rejected == 1


@pytest.mark.parametrize("event", ["ping", "create", "pull_request", "release", "issues"])
def test_a_captured_push_sent_again_as_another_event_is_refused(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str], event: str
) -> None:
    endpoint_id, secret = repo

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=PUSH,
                        headers=github(secret, PUSH, event, "g-1"))  # fmt: skip

    assert answer.status_code == 401
    assert count(conveyor_service, WebhookDelivery) == 0


def test_a_captured_push_sent_again_without_its_event_header_is_refused(
    conveyor_service: Conveyor, api_url: str, repo: tuple[uuid.UUID, str]
) -> None:
    # a workflow listening to every delivery of the endpoint would have taken it
    endpoint_id, secret = repo
    headers = github(secret, PUSH, "push", "g-1")
    del headers["X-GitHub-Event"]

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=PUSH, headers=headers)

    assert answer.status_code == 401
    assert "missing header(s) X-GitHub-Event" in answer.json()["detail"]
    assert count(conveyor_service, WebhookDelivery) == 0


# -- Standard Webhooks: timestamps ---------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    # (HTTP strips spaces around a header value; the unit tests send those, and non-ASCII digits)
    ["{s}.5", "{s}.0", "{s}.999", "+{s}", "0{s}.", "{s}e0", "1_{s}", "-{s}", "0x{h}", "nan", "inf"],
)  # fmt: skip
def test_a_standard_webhook_timestamp_that_is_not_whole_seconds_is_refused(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey, shape: str
) -> None:
    # Given a delivery whose signature is right for the whole second the header rounds to
    make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "billing", SignatureScheme.STANDARD)
    body, at = b'{"type": "invoice.paid"}', datetime.now(UTC).replace(microsecond=0)
    seconds = int(at.timestamp())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": shape.format(s=seconds, h=f"{seconds:x}"),
        "webhook-signature": Webhook(secret).sign("msg_1", at, body.decode()),
    }

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body, headers=headers)

    assert answer.status_code == 401, answer.text
    assert "whole seconds since the epoch" in answer.json()["detail"]
    assert count(conveyor_service, WebhookDelivery) == 0


# -- a broker that is down: stored is success ---------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def broker_down(conveyor_service: Conveyor) -> Iterator[str]:
    """The API over the same database, publishing to a broker nothing listens for (every
    publish fails as when Redis is down); its URL."""
    dead = create_celery_app(Settings(broker_url=f"redis://127.0.0.1:{_free_port()}/0"))
    service = Conveyor(conveyor_service.db, CeleryDispatcher(dead), worker="abuse")
    with served(create_app(service, Settings(metrics_token=METRICS_TOKEN))) as url:
        yield url


def test_triggers_stored_while_the_broker_is_down_answer_201_and_each_runs_once_later(
    conveyor_service: Conveyor, broker_down: str, make_key: MakeKey
) -> None:
    # Given a workflow, and an API whose broker refuses every connection
    key = make_key("acme")
    conveyor_service.apply(parse_workflow({**FLOW, "webhooks": []}), "acme")

    # When a client triggers it five times (no Idempotency-Key)
    answers = [
        httpx.post(f"{broker_down}/v1/workflows/on-push/executions", json={"input": {}},
                   headers={"Authorization": f"Bearer {key}"}, timeout=60)
        for _ in range(5)
    ]  # fmt: skip

    # Then each is told of its execution, not asked to retry: 201 with the id
    assert [a.status_code for a in answers] == [201] * 5, answers[0].text
    made = {uuid.UUID(a.json()["id"]) for a in answers}
    assert {a.headers["Location"] for a in answers} == {f"/v1/executions/{i}" for i in made}
    assert {run.id for run in started(conveyor_service)} == made
    assert count(conveyor_service, JobAttempt) == 0  # none sent yet

    # And the recovery sweep (the broker back) sends them: each runs, once
    assert conveyor_service.recover(heartbeat_timeout=60, lost_after=0)["republished"] == 5
    for execution_id in made:
        assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    assert len(started(conveyor_service)) == 5
    with conveyor_service.db.transaction() as store:
        tries = store.session.execute(
            select(Job.execution_id, func.count()).select_from(JobAttempt).join(Job)
            .group_by(Job.execution_id)
        ).all()  # fmt: skip
    assert sorted(n for _, n in tries) == [1] * 5  # one node each, tried once


def test_an_event_and_a_webhook_stored_while_the_broker_is_down_answer_success(
    conveyor_service: Conveyor, broker_down: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    endpoint_id, secret = endpoint(conveyor_service, "acme", "repo", SignatureScheme.GITHUB)
    conveyor_service.apply(parse_workflow({**FLOW, "events": ["repo.pushed"]}), "acme")

    event = httpx.post(f"{broker_down}/v1/events", json={"type": "repo.pushed"},
                       headers={"Authorization": f"Bearer {key}"}, timeout=60)  # fmt: skip
    delivery = httpx.post(f"{broker_down}/webhooks/{endpoint_id}", content=PUSH,
                          headers=github(secret, PUSH, "push", "g-1"), timeout=60)  # fmt: skip

    assert (event.status_code, delivery.status_code) == (202, 202), (event.text, delivery.text)
    assert len(event.json()["executions"]) == 1
    conveyor_service.recover(heartbeat_timeout=60, lost_after=0)  # the broker is back
    _settle(conveyor_service, executions=2)


def _settle(service: Conveyor, executions: int | None = None, timeout: float = 30.0) -> None:
    """Wait until every delivery is handled and every execution finished (``executions``:
    how many there must be by then)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        with service.db.transaction() as store:
            waiting = store.session.scalar(
                select(func.count()).where(WebhookDelivery.status == "received")
            )
            runs = list(store.session.scalars(select(Execution)))
        finished = all(r.status is ExecutionStatus.COMPLETED for r in runs)
        if not waiting and finished and executions in (None, len(runs)):
            return
        assert time.monotonic() < deadline, f"{waiting} deliveries wait; runs {runs}"
        time.sleep(0.05)


# -- /metrics ------------------------------------------------------------------------------------


def test_metrics_are_refused_without_the_token_on_the_public_port(api_url: str) -> None:
    refused = {
        "none": httpx.get(f"{api_url}/metrics"),
        "wrong": httpx.get(f"{api_url}/metrics", headers={"Authorization": "Bearer nope"}),
        "prefix": httpx.get(
            f"{api_url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN[:-1]}"}
        ),
        "basic": httpx.get(f"{api_url}/metrics", headers={"Authorization": METRICS_TOKEN}),
    }

    assert {k: r.status_code for k, r in refused.items()} == dict.fromkeys(refused, 401)
    assert refused["none"].headers["WWW-Authenticate"] == "Bearer"
    assert "CONVEYOR_METRICS_TOKEN" in refused["none"].json()["detail"]
    assert "conveyor_executions" not in refused["wrong"].text
    assert "conveyor_executions" in httpx.get(f"{api_url}/metrics", headers=SCRAPER).text


def test_without_a_token_the_api_serves_metrics_only_on_a_port_of_their_own(
    conveyor_service: Conveyor, make_key: MakeKey
) -> None:
    # Given tenants whose names the metrics would show
    make_key("acme")
    port = _free_port()
    app = create_app(conveyor_service, Settings(metrics_token="", metrics_port=port))

    with served(app) as api:
        public = httpx.get(f"{api}/metrics", headers=SCRAPER)
        own = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)

    assert public.status_code == 403
    assert "CONVEYOR_METRICS_PORT" in public.json()["detail"]
    assert own.status_code == 200 and "conveyor_executions" in own.text
    with pytest.raises(httpx.ConnectError):  # closed with the API
        httpx.get(f"http://127.0.0.1:{port}/metrics")


def test_a_token_set_is_required_on_the_metrics_own_port_too(conveyor_service: Conveyor) -> None:
    port = _free_port()
    app = create_app(conveyor_service, Settings(metrics_token="s3cret", metrics_port=port))

    with served(app):
        bare = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        wrong = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=SCRAPER, timeout=30)
        right = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": "Bearer s3cret"},
            timeout=30,
        )

    assert (bare.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert "conveyor_executions" not in bare.text and "conveyor_executions" in right.text


# -- error answers keep the documented shape -----------------------------------------------------


def _problem(answer: httpx.Response) -> Problem:
    """The answer's body, which must be a Problem: a string detail and a list of errors."""
    body = answer.json()
    assert isinstance(body.get("detail"), str), body
    assert isinstance(body.get("errors", []), list), body
    return Problem.model_validate(body)


def test_the_webhook_route_answers_invalid_input_with_a_problem_not_fastapis_shape(
    api_url: str,
) -> None:
    answer = httpx.post(f"{api_url}/webhooks/not-a-uuid", content=b"{}")

    assert answer.status_code == 422
    assert "endpoint_id" in _problem(answer).errors[0]


def test_an_unreadable_body_answers_422_not_an_undocumented_400(
    api_url: str, make_key: MakeKey
) -> None:
    key = make_key("acme")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    answers = [
        httpx.post(f"{api_url}/v1/events", content=b'{"type": "\xff\xfe"}', headers=headers),
        httpx.post(f"{api_url}/v1/events", content=b'{"type": ', headers=headers),
        httpx.post(f"{api_url}/v1/workflows", content=b"\x00\xff", headers=headers),
    ]

    assert [a.status_code for a in answers] == [422, 422, 422]
    for answer in answers:
        _problem(answer)


def test_a_delivery_id_too_long_answers_422(api_url: str, repo: tuple[uuid.UUID, str]) -> None:
    endpoint_id, secret = repo

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=PUSH,
                        headers=github(secret, PUSH, "push", "g" * 201))  # fmt: skip

    assert answer.status_code == 422
    assert "over 200 characters" in _problem(answer).detail


def test_unknown_paths_and_wrong_methods_answer_a_problem(api_url: str) -> None:
    missing = httpx.get(f"{api_url}/v2/nothing")
    wrong = httpx.delete(f"{api_url}/v1/workflows")

    assert (missing.status_code, wrong.status_code) == (404, 405)
    _problem(missing)
    _problem(wrong)
    assert "GET" in wrong.headers["Allow"]  # its headers kept


def test_every_route_documents_its_errors_as_problems_and_fastapis_shape_nowhere(
    api_url: str,
) -> None:
    schema = httpx.get(f"{api_url}/openapi.json").json()

    assert "HTTPValidationError" not in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            errors = {c: r for c, r in operation["responses"].items() if c >= "400"}
            if path not in ("/health", "/ready"):  # they take no input
                assert {"422", "503"} <= errors.keys(), (method, path)
            for code, response in errors.items():
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/Problem", (method, path, code)
