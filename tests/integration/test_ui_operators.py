"""The dashboard's operator sessions over real HTTP: an operator's key (made only by the CLI's
store call, `conveyor keys create --operator`) sees every tenant, a tenant's key never does,
whatever its cookie or form claims; the operators' figures; each failed try's traceback; a
wait node shown waiting with its event, key and timeout."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from conveyor.engine import credentials
from conveyor.engine.states import ExecutionStatus
from conveyor.service import Conveyor
from conveyor.ui.sessions import COOKIE
from tests.support.services import wait_for

MakeKey = Callable[[str], str]
FLOW = {"name": "one", "nodes": [{"id": "a", "type": "python",
                                  "config": {"function": "test.noop"}}]}  # fmt: skip
FAILING = {"name": "broken", "defaults": {"retry": {"max_attempts": 1}},
           "nodes": [{"id": "boom", "type": "python", "config": {"function": "test.fail"},
                      "inputs": {"message": "it broke"}}]}  # fmt: skip


@contextmanager
def _signed_in(api_url: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_url, timeout=30) as browser:
        answer = browser.post("/ui/signin", data={"key": key, "next": "/ui/executions"})
        assert answer.status_code == 303
        yield browser


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def _started(api_url: str, key: str, service: Conveyor, flow: dict[str, Any]) -> str:
    """Apply ``flow`` as the key's tenant, start it and wait for it to finish; its id."""
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        assert api.post("/v1/workflows", json=flow).status_code in (200, 201)
        made = str(api.post(f"/v1/workflows/{flow['name']}/executions", json={}).json()["id"])
    wait_for(service, uuid.UUID(made))
    return made


def _ids(page: httpx.Response) -> set[str]:
    return set(re.findall(r'data-id="([0-9a-f-]{36})"', page.text))


def test_an_operator_session_sees_every_tenant_with_a_tenant_column_and_filter(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    # Given: an execution of each of two tenants
    red = _started(api_url, make_key("red"), conveyor_service, FLOW)
    blue = _started(api_url, make_key("blue"), conveyor_service, FLOW)

    with _signed_in(api_url, operator_key) as browser:
        every = browser.get("/ui/executions")
        assert {red, blue} <= _ids(every)
        assert '<td class="tenant">red</td>' in every.text and 'id="operator"' in every.text
        assert _ids(browser.get("/ui/executions", params={"tenant": "blue"})) == {blue}
        assert _ids(browser.get("/ui/executions", params={"tenant": "nobody"})) == set()
        # another tenant's execution opens, and its rerun is recorded under its own tenant
        page = browser.get(f"/ui/executions/{red}")
        assert page.status_code == 200
        done = browser.post(
            f"/ui/executions/{red}/rerun", data={"csrf": _csrf(page), "from_node": "a"}
        )
        assert done.status_code == 303
    with conveyor_service.db.transaction() as store:
        rerun = store.execution_reruns(uuid.UUID(red))[0]
        assert rerun.requested_by == "operator"
        assert store.execution_tenant(uuid.UUID(red)).name == "red"  # type: ignore[union-attr]


def test_a_tenant_session_cannot_become_or_act_as_an_operator(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    ops = _started(api_url, operator_key, conveyor_service, FLOW)  # the operator's own tenant
    mine = _started(api_url, make_key("plain"), conveyor_service, FLOW)
    with _signed_in(api_url, make_key("plain")) as browser:
        assert _ids(browser.get("/ui/executions")) == {mine}
        assert _ids(browser.get("/ui/executions", params={"tenant": "ops"})) == {mine}
        assert browser.get(f"/ui/executions/{ops}").status_code == 404
        assert browser.get("/ui/overview.json").status_code == 404
        # a forged post: a valid token of this session, another tenant's execution
        token = _csrf(browser.get(f"/ui/executions/{mine}"))
        refused = browser.post(f"/ui/executions/{ops}/rerun", data={"csrf": token})
        assert refused.status_code == 404

        # a forged cookie naming the operator's key prefix (its signature cannot match)
        cookie = str(browser.cookies.get(COOKIE))
        data, _ = cookie.rsplit(".", 1)
        fields = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        fields[2] = credentials.key_prefix(operator_key)
        forged = base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")
        browser.cookies.set(COOKIE, f"{forged}.{cookie.rsplit('.', 1)[1]}", path="/ui")
        assert browser.get("/ui/executions").status_code == 303  # signed out, not an operator
    with conveyor_service.db.transaction() as store:
        assert store.execution_reruns(uuid.UUID(ops)) == []


def test_the_operators_figures_count_every_tenants_tries_and_latency(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    _started(api_url, make_key("red"), conveyor_service, FLOW)
    _started(api_url, make_key("blue"), conveyor_service, FAILING)
    with _signed_in(api_url, operator_key) as browser:
        page = browser.get("/ui").text
        assert page.count('id="operator-overview"') == 1 and "<title>Overview · " in page
        figures = browser.get("/ui/overview.json").json()
    assert len(figures["steps"]) == 12
    assert sum(s["succeeded"] for s in figures["steps"]) >= 1
    assert sum(s["failed"] for s in figures["steps"]) == 1
    assert figures["latency"]["count"] == 2 and figures["latency"]["p95"] >= 0
    assert {q["priority"] for q in figures["queues"]} == {"high", "normal", "low"}
    assert figures["alerts"] == [] and isinstance(figures["limits"], list)


def test_a_failed_trys_traceback_is_stored_and_shown_with_its_error(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("tb")
    made = _started(api_url, key, conveyor_service, FAILING)
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        view = api.get(f"/v1/executions/{made}").json()
    attempt = view["jobs"][0]["attempts"][0]
    assert view["status"] == ExecutionStatus.FAILED
    assert attempt["error"] == "RuntimeError: it broke"
    assert "Traceback (most recent call last)" in attempt["traceback"]
    assert "raise RuntimeError(message)" in attempt["traceback"]
    with _signed_in(api_url, key) as browser:
        page = browser.get(f"/ui/executions/{made}").text
    assert "RuntimeError: it broke" in page and "<summary>traceback</summary>" in page


def test_a_waiting_execution_shows_its_event_key_and_timeout_and_is_listed_as_waiting(
    api_url: str, make_key: MakeKey, conveyor_service: Conveyor
) -> None:
    key = make_key("waiter")
    flow = {"name": "pay", "nodes": [{"id": "wait", "type": "wait", "config": {
        "event": "paid", "key": "{{ input.order }}", "timeout": 3600}}]}  # fmt: skip
    done = _started(api_url, key, conveyor_service, FLOW)
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}) as api:
        assert api.post("/v1/workflows", json=flow).status_code in (200, 201)
        body = {"input": {"order": "A-7"}}
        waiting = str(api.post("/v1/workflows/pay/executions", json=body).json()["id"])
        for _ in range(200):
            nodes = api.get(f"/v1/executions/{waiting}").json()["nodes"]
            if nodes and nodes[0]["status"] == "waiting":
                break
            time.sleep(0.05)
    with _signed_in(api_url, key) as browser:
        page = browser.get(f"/ui/executions/{waiting}").text
        assert 'data-wait="wait"' in page
        assert "<b>paid</b> with key <b>A-7</b>, until " in page
        assert _ids(browser.get("/ui/executions", params={"status": "waiting"})) == {waiting}
        assert done in _ids(browser.get("/ui/executions"))


def test_on_v1_an_operators_key_acts_for_its_own_tenant_only(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    red = _started(api_url, make_key("red"), conveyor_service, FLOW)
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {operator_key}"}) as api:
        assert api.get("/v1/executions").json() == []  # its own tenant, ops, has none
        assert api.get(f"/v1/executions/{red}").status_code == 404
        assert api.post(f"/v1/executions/{red}/rerun", json={"from_node": "a"}).status_code == 404
    with conveyor_service.db.transaction() as store:
        assert store.execution_reruns(uuid.UUID(red)) == []


def test_on_v1_an_operators_key_reads_a_tenant_it_names_and_any_other_key_only_its_own(
    api_url: str, make_key: MakeKey, operator_key: str, conveyor_service: Conveyor
) -> None:
    # Given an execution of each of red and blue
    red_key = make_key("red")
    red = _started(api_url, red_key, conveyor_service, FLOW)
    blue = _started(api_url, make_key("blue"), conveyor_service, FLOW)
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {operator_key}"}) as api:
        # When the operator's key lists and reads naming a tenant
        listed = api.get("/v1/executions", params={"tenant": "red"})
        read = api.get(f"/v1/executions/{red}", params={"tenant": "red"})
        crossed = api.get(f"/v1/executions/{red}", params={"tenant": "blue"})
        nobody = api.get("/v1/executions", params={"tenant": "nobody"})
    # Then it sees that tenant's, and an execution only under its own tenant's name
    assert listed.status_code == 200 and [e["id"] for e in listed.json()] == [red]
    assert read.status_code == 200 and read.json()["id"] == red
    assert crossed.status_code == 404
    assert nobody.status_code == 404 and "no tenant is named 'nobody'" in nobody.text

    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {red_key}"}) as api:
        # When a tenant's key names another tenant, or itself
        theirs = api.get("/v1/executions", params={"tenant": "blue"})
        their_one = api.get(f"/v1/executions/{blue}", params={"tenant": "blue"})
        own = api.get("/v1/executions", params={"tenant": "red"})
    # Then it is told that takes an operator's key, naming none of blue's; its own lists
    assert theirs.status_code == 404 and "operator's key" in theirs.text
    assert their_one.status_code == 404 and blue not in their_one.text
    assert [e["id"] for e in own.json()] == [red]
