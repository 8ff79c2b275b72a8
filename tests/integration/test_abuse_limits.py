"""Abuse: inputs too large, too deep, too many or not numbers, through the real API (uvicorn,
PostgreSQL, Redis, the in-process worker), at the default limits. Each is refused with 413 or
422 naming its limit and setting, stores nothing, and no request of the sweep answers 5xx;
a node whose output or delay is past its limit fails without a retry, and its execution ends.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

import conveyor
from conveyor.engine.states import ExecutionStatus, SignatureScheme
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, WebhookDelivery, WorkflowVersion
from conveyor.service import Conveyor
from tests.integration.test_api import add_node, client, endpoint, signed
from tests.support.services import wait_for

MakeKey = Callable[[str], str]
MB = 1_048_576


@conveyor.node("abuse.big")
def big(size: int) -> dict[str, str]:
    return {"text": "x" * size}


@conveyor.node("abuse.deep")
def deep_output(levels: int) -> Any:
    return nested(levels)


def nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def count(service: Conveyor, table: Any) -> int:
    with service.db.transaction() as store:
        return int(store.session.scalar(select(func.count()).select_from(table)))


@pytest.fixture
def acme(conveyor_service: Conveyor, api_url: str, make_key: MakeKey) -> Iterator[httpx.Client]:
    """A tenant with the one-node workflow `sum`, and its client."""
    with client(api_url, make_key("acme")) as http:
        assert http.post("/v1/workflows", json=add_node()).status_code == 201
        yield http


def post_raw(http: httpx.Client, url: str, body: bytes, **headers: str) -> httpx.Response:
    return http.post(url, content=body, headers={"content-type": "application/json", **headers})


# -- bytes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_a_trigger_body_over_the_input_limit_answers_413_naming_the_setting_and_starts_nothing(
    conveyor_service: Conveyor, acme: httpx.Client, streamed: bool
) -> None:
    body = json.dumps({"input": {"blob": "x" * (2 * MB)}}).encode()
    content: Any = iter([body[i : i + 65536] for i in range(0, len(body), 65536)])
    answer = acme.post(
        "/v1/workflows/sum/executions",
        content=content if streamed else body,
        headers={"content-type": "application/json"},
    )

    assert answer.status_code == 413, answer.text
    assert "CONVEYOR_MAX_INPUT_BYTES" in answer.json()["detail"]
    assert str(MB) in answer.json()["detail"]
    assert count(conveyor_service, Execution) == 0


def test_an_event_body_over_the_event_limit_answers_413_and_starts_nothing(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    acme.post("/v1/workflows", json=add_node("on-event", events=["big.event"]))
    body = json.dumps({"type": "big.event", "payload": {"blob": "x" * (10 * MB)}}).encode()

    answer = post_raw(acme, "/v1/events", body)

    assert answer.status_code == 413, answer.text
    assert "CONVEYOR_MAX_EVENT_BYTES" in answer.json()["detail"]
    assert count(conveyor_service, Execution) == 0


def test_a_definition_over_the_definition_limit_answers_413_and_stores_no_version(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    definition = add_node("huge", description="x" * (5 * MB))

    answer = acme.post("/v1/workflows", json=definition)

    assert answer.status_code == 413, answer.text
    assert "CONVEYOR_MAX_DEFINITION_BYTES" in answer.json()["detail"]
    assert count(conveyor_service, WorkflowVersion) == 1  # `sum` alone


def test_another_v1_body_over_its_fixed_limit_answers_413(acme: httpx.Client) -> None:
    ids = [str(uuid.uuid4()) for _ in range(3000)]

    answer = acme.post("/v1/dead-letters/requeue", json={"job_ids": ids})

    assert answer.status_code == 413, answer.text
    assert "65536 bytes" in answer.json()["detail"]


# -- depth ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [65, 260, 5000, 200_000])
def test_a_trigger_input_nested_past_the_depth_limit_answers_422_and_starts_nothing(
    conveyor_service: Conveyor, acme: httpx.Client, levels: int
) -> None:
    body = b'{"input": ' + b'{"a": ' * levels + b"1" + b"}" * levels + b"}"

    answer = post_raw(acme, "/v1/workflows/sum/executions", body)

    assert answer.status_code == (413 if len(body) > MB else 422), answer.text
    detail = answer.json()["detail"]
    assert ("CONVEYOR_MAX_JSON_DEPTH" if len(body) <= MB else "CONVEYOR_MAX_INPUT_BYTES") in detail
    assert count(conveyor_service, Execution) == 0


def test_an_input_within_the_depth_limit_is_stored_and_read_back(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    made = acme.post("/v1/workflows/sum/executions", json={"input": nested(62)})
    assert made.status_code == 201, made.text

    shown = acme.get(f"/v1/executions/{made.json()['id']}")

    assert shown.status_code == 200, shown.text
    assert shown.json()["input"] == nested(62)


def test_an_execution_stored_deeper_than_the_serializer_reaches_still_reads(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    # Given an input deeper than pydantic serializes (255), stored before any limit held it
    execution_id = conveyor_service.trigger("sum", nested(300), tenant="acme")

    # When it is read through the API, Then it is answered whole (it answered 500)
    shown = acme.get(f"/v1/executions/{execution_id}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["input"] == nested(300)


def test_an_event_payload_nested_past_the_depth_limit_answers_422(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    acme.post("/v1/workflows", json=add_node("on-event", events=["deep.event"]))

    answer = acme.post("/v1/events", json={"type": "deep.event", "payload": nested(100)})

    assert answer.status_code == 422, answer.text
    assert "CONVEYOR_MAX_JSON_DEPTH" in answer.json()["detail"]
    assert count(conveyor_service, Execution) == 0


@pytest.mark.parametrize("levels", [100, 100_000])
def test_a_signed_webhook_delivery_nested_past_the_depth_limit_answers_422_and_stores_nothing(
    conveyor_service: Conveyor, api_url: str, acme: httpx.Client, levels: int
) -> None:
    endpoint_id, secret = endpoint(conveyor_service, "acme", "hooks", SignatureScheme.STANDARD)
    body = b'{"type": "x", "a": ' + b"[" * levels + b"]" * levels + b"}"

    answer = httpx.post(f"{api_url}/webhooks/{endpoint_id}", content=body,
                        headers=signed(secret, body))  # fmt: skip

    assert answer.status_code == 422, answer.text
    assert "CONVEYOR_MAX_JSON_DEPTH" in answer.json()["detail"]
    assert count(conveyor_service, WebhookDelivery) == 0


def test_a_definition_with_inputs_nested_past_the_depth_limit_answers_422_not_500(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    definition = add_node("deep")
    definition["nodes"][0]["inputs"]["b"] = nested(300)

    answer = acme.post("/v1/workflows", json=definition)

    assert answer.status_code == 422, answer.text
    assert "CONVEYOR_MAX_JSON_DEPTH" in answer.json()["detail"]
    assert count(conveyor_service, WorkflowVersion) == 1


def test_a_nan_or_infinity_in_a_body_answers_422(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"input": {"a": ' + constant + b"}}"
        answer = post_raw(acme, "/v1/workflows/sum/executions", body)
        assert answer.status_code == 422, answer.text
        assert "not JSON" in answer.json()["detail"]
    assert count(conveyor_service, Execution) == 0


@pytest.mark.parametrize(
    "number",
    [b"1e400", b"-1E+400", b"1" * 400 + b".5", b"[1e999]"],
    ids=["exponent", "negative-exponent", "long-mantissa", "in-a-list"],
)
def test_a_number_too_large_for_a_float_answers_422_and_starts_nothing(
    conveyor_service: Conveyor, acme: httpx.Client, number: bytes
) -> None:
    # Python reads it as infinity: it was stored and read back as Infinity, which is not JSON
    answer = post_raw(acme, "/v1/workflows/sum/executions", b'{"input": {"a": ' + number + b"}}")

    assert answer.status_code == 422, answer.text
    assert "larger than a float holds" in answer.json()["detail"]
    assert count(conveyor_service, Execution) == 0


def test_large_finite_numbers_and_long_integers_are_taken_as_they_are(acme: httpx.Client) -> None:
    body = b'{"input": {"a": 1e300, "b": 1.5e-400, "c": ' + b"7" * 400 + b"}}"

    answer = post_raw(acme, "/v1/workflows/sum/executions", body)

    assert answer.status_code == 201, answer.text


# -- definitions ---------------------------------------------------------------------------------


def fan_in(needs: int, nodes: int = 1) -> dict[str, Any]:
    fn = {"config": {"function": "test.add"}, "inputs": {"a": 1, "b": 1}}
    members = [{"id": f"n{i}", "type": "python", **fn} for i in range(nodes)]
    join = {"id": "join", "type": "python", **fn, "needs": ["n0"] * needs}
    return {"name": "wide", "nodes": [*members, join]}


def test_a_definition_with_more_nodes_than_the_limit_answers_422_naming_the_setting(
    acme: httpx.Client,
) -> None:
    answer = acme.post("/v1/workflows", json=fan_in(1, nodes=10_001))

    assert answer.status_code == 422, answer.text
    assert "CONVEYOR_MAX_NODES" in answer.json()["errors"][0]


def test_a_node_needing_one_node_twice_is_refused(acme: httpx.Client) -> None:
    answer = acme.post("/v1/workflows", json=fan_in(2))

    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"] == ["node 'join': needs 'n0' more than once; list it once"]


def test_eight_definitions_needing_one_node_20000_times_are_refused_while_another_tenant_is_served(
    api_url: str, acme: httpx.Client, make_key: MakeKey
) -> None:
    # Given another tenant reading its executions all along
    other = client(api_url, make_key("other"))
    waits: list[float] = []

    def refuse(_: int) -> httpx.Response:
        with client(api_url, acme.headers["Authorization"].split()[1]) as http:
            return http.post("/v1/workflows", json=fan_in(20_000))

    # When eight such definitions are applied at once
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        pending = [pool.submit(refuse, i) for i in range(8)]
        while not waits or not all(f.done() for f in pending):
            asked = time.monotonic()
            assert other.get("/v1/executions").status_code == 200
            assert other.get("/health").status_code == 200
            waits.append(time.monotonic() - asked)
        answers = [f.result() for f in pending]
    took = time.monotonic() - started

    # Then each is refused, naming the needs limit, quickly, and the other tenant is served
    # throughout (the bounds are generous: they took 70 s and stalled everyone)
    assert all(a.status_code == 422 for a in answers), [a.text for a in answers]
    assert all("CONVEYOR_MAX_NEEDS" in a.json()["errors"][0] for a in answers)
    assert took < 10, took
    assert max(waits) < 5, waits
    other.close()


def test_a_literal_delay_that_is_not_a_finite_number_of_seconds_up_to_a_year_answers_422(
    acme: httpx.Client,
) -> None:
    for seconds in (1e15, 1e300, -1, 31_536_001):
        definition = {
            "name": "wait",
            "nodes": [{"id": "d", "type": "delay", "config": {"seconds": seconds}}],
        }
        answer = acme.post("/v1/workflows", json=definition)
        assert answer.status_code == 422, answer.text
        assert "config.seconds" in answer.json()["errors"][0]


@pytest.mark.parametrize("root", [True, False], ids=["root", "after-a-node"])
@pytest.mark.parametrize("seconds", ["nan", "inf", "1e300", "1e15", "-5", "soon"])
def test_a_templated_delay_out_of_range_fails_its_node_and_the_execution_ends(
    conveyor_service: Conveyor, acme: httpx.Client, root: bool, seconds: str
) -> None:
    delay: dict[str, Any] = {
        "id": "d",
        "type": "delay",
        "config": {"seconds": "{{ input.seconds }}"},
    }
    nodes: list[dict[str, Any]] = [delay]
    if not root:
        nodes = [{"id": "a", "type": "python", "config": {"function": "test.add"},
                  "inputs": {"a": 1, "b": 1}}, {**delay, "needs": ["a"]}]  # fmt: skip
    acme.post("/v1/workflows", json={"name": "wait", "nodes": nodes})

    made = acme.post("/v1/workflows/wait/executions", json={"input": {"seconds": seconds}})

    assert made.status_code == 201, made.text
    done = wait_for(conveyor_service, uuid.UUID(made.json()["id"]), timeout=20)
    assert done.status is ExecutionStatus.FAILED
    assert "delay seconds" in (done.error or ""), done.error
    shown = acme.get(f"/v1/executions/{made.json()['id']}").json()
    [job] = [j for j in shown["jobs"] if j["node"] == "d"]
    assert len(job["attempts"]) == 1  # not retried


# -- outputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "inputs", "setting"),
    [
        ("abuse.big", {"size": 2 * MB}, "CONVEYOR_MAX_OUTPUT_BYTES"),
        ("abuse.deep", {"levels": 100}, "CONVEYOR_MAX_JSON_DEPTH"),
        ("abuse.deep", {"levels": 5000}, "CONVEYOR_MAX_JSON_DEPTH"),
    ],
    ids=["big", "deep", "deeper-than-json-recurses"],
)
def test_a_node_output_past_its_limit_fails_the_node_once_naming_the_setting(
    conveyor_service: Conveyor,
    acme: httpx.Client,
    function: str,
    inputs: dict[str, int],
    setting: str,
) -> None:
    node = {"id": "n", "type": "python", "config": {"function": function}, "inputs": inputs}
    definition = {"name": "out", "nodes": [node]}
    conveyor_service.apply(parse_workflow(definition), "acme")

    done = wait_for(conveyor_service, conveyor_service.trigger("out", tenant="acme"), timeout=20)

    assert done.status is ExecutionStatus.FAILED
    assert setting in (done.error or ""), done.error
    with conveyor_service.db.transaction() as store:
        [(job, _)] = [j for j in store.execution_jobs(done.id) if j[0].node_id == "n"]
    assert job.retry_count == 0


# -- the sweep -----------------------------------------------------------------------------------


def delay_definition(seconds: Any) -> dict[str, Any]:
    return {"name": "n", "nodes": [{"id": "a", "type": "delay", "config": {"seconds": seconds}}]}


def sweep_bodies() -> list[tuple[str, bytes]]:
    deep_list = b"[" * 100_000 + b"]" * 100_000
    bodies = [
        b"",
        b"null",
        b"[]",
        b"{",
        b'{"input": ',
        b"\xff\xfe",
        b'"' + b'\\"' * 30_000,
        b"[" * 500_000,
        deep_list,
        b'{"input": ' + deep_list + b"}",
        b'{"input": {"a": NaN}}',
        b'{"input": {"a": 1e999}}',
        b'{"input": {"a": -1e999}}',
        b'{"input": {"a": "\\u0000"}}',
        b'{"input": {"\\ud800": "\\udfff"}}',
        b'{"input": {"a": ' + b"9" * 5000 + b"}}",
        b'{"type": "x", "payload": ' + b"{" * 70 + b"}" * 70 + b"}",
        json.dumps(nested(64)).encode(),
        json.dumps({"input": nested(200, [1] * 10)}).encode(),
        json.dumps(delay_definition(10**400)).encode(),
        json.dumps(delay_definition("{{ input.s }}")).encode(),
        json.dumps({"job_ids": [str(uuid.uuid4())] * 1000}).encode(),
    ]
    routes = [
        "/v1/workflows",
        "/v1/workflows/sum/executions",
        "/v1/events",
        "/v1/dead-letters/requeue",
        "/v1/dead-letters/discard",
        f"/v1/executions/{uuid.uuid4()}/cancel",
    ]
    return [(route, body) for route in routes for body in bodies]


def test_no_request_of_a_sweep_of_malformed_huge_deep_and_nan_bodies_answers_a_server_error(
    conveyor_service: Conveyor, acme: httpx.Client
) -> None:
    answers = {}
    for route, body in sweep_bodies():
        answer = post_raw(acme, route, body)
        answers[(route, body[:40])] = answer.status_code
        assert answer.status_code < 500, (route, body[:80], answer.text)
    for execution in acme.get("/v1/executions").json():  # every one stored reads back
        assert acme.get(f"/v1/executions/{execution['id']}").status_code == 200
    assert acme.get("/v1/workflows/n").status_code in (200, 404)


@pytest.mark.parametrize("digits", [20, 5000])
def test_a_content_length_of_thousands_of_digits_is_refused_without_a_server_error(
    api_url: str, acme: httpx.Client, digits: int
) -> None:
    host, port = api_url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/workflows/sum/executions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {acme.headers['Authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {'9' * digits}\r\n\r\n{{}}"
    )
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request.encode())
        status_line = conn.recv(200).split(b"\r\n")[0]

    assert status_line.split()[1] in (b"400", b"413"), status_line


def test_a_get_with_a_body_is_answered_as_a_get(acme: httpx.Client) -> None:
    answer = acme.request("GET", "/v1/executions", content=b"x" * 100_000)

    assert answer.status_code == 200, answer.text
