"""Issue 27, items 3 and 4 through the REST API (real HTTP, PostgreSQL, Redis and the
in-process worker): a trigger for later shown pending with its start time and cancelled
before it; bad start times refused, naming the fix; a requeue for later refused alike."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session

import conveyor
from conveyor import views
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import StartTimeError
from conveyor.service import Conveyor, utcnow
from tests.integration.test_api import MakeKey, add_node, client


def test_a_trigger_for_later_is_pending_with_its_start_time_and_can_be_cancelled(
    api_url: str, make_key: MakeKey
) -> None:
    run_at = utcnow() + timedelta(minutes=5)
    with client(api_url, make_key("acme")) as http:
        assert http.post("/v1/workflows", json=add_node()).status_code == 201

        made = http.post("/v1/workflows/sum/executions", json={"run_at": run_at.isoformat()})
        assert made.status_code == 201, made.text
        execution_id = made.json()["id"]
        shown = http.get(f"/v1/executions/{execution_id}").json()
        assert (shown["status"], shown["scheduled_for"]) == ("pending", run_at.isoformat())
        assert [(j["kind"], j["status"], j["next_run_at"]) for j in shown["jobs"]] == [
            ("execution", "scheduled", run_at.isoformat())
        ]
        listed = http.get("/v1/executions").json()
        assert [e["scheduled_for"] for e in listed] == [run_at.isoformat()]

        assert http.post(f"/v1/executions/{execution_id}/cancel").status_code == 200
        shown = http.get(f"/v1/executions/{execution_id}").json()
        assert (shown["status"], [j["status"] for j in shown["jobs"]]) == (
            "cancelled", ["cancelled"],
        )  # fmt: skip
        flow = {**add_node("on-signup"), "events": ["user.signup"]}
        assert http.post("/v1/workflows", json=flow).status_code == 201
        emitted = http.post("/v1/events", json={"type": "user.signup", "delay": 600})
        assert emitted.status_code == 202, emitted.text
        (by_event,) = emitted.json()["executions"]
        shown = http.get(f"/v1/executions/{by_event}").json()
        assert shown["status"] == "pending" and shown["scheduled_for"] is not None
        delayed = http.post(
            "/v1/workflows/sum/executions",
            json={"delay": 600, "max_attempts": 4, "timeout": 12.5},
        ).json()
        later = http.get(f"/v1/executions/{delayed['id']}").json()
        assert later["status"] == "pending" and later["scheduled_for"] is not None
        assert (later["max_attempts"], later["timeout"]) == (4, 12.5)


def test_bad_start_times_are_refused_naming_the_fix(api_url: str, make_key: MakeKey) -> None:
    now = utcnow()
    bad = {
        "run_at": (now + timedelta(hours=1)).replace(tzinfo=None).isoformat(),  # naive
    }
    cases = [
        (bad, "has no UTC offset"),
        ({"run_at": (now - timedelta(hours=1)).isoformat()}, "is in the past"),
        ({"run_at": (now + timedelta(days=400)).isoformat()}, "beyond the bound"),
        ({"delay": -5}, "0 or more"),
        ({"delay": 5, "run_at": now.isoformat()}, "not both"),
    ]
    with client(api_url, make_key("acme")) as http:
        assert http.post("/v1/workflows", json=add_node()).status_code == 201
        for body, says in cases:
            answer = http.post("/v1/workflows/sum/executions", json=body)
            assert answer.status_code == 422, (body, answer.text)
            assert says in answer.text, (body, answer.text)
        limits = http.post(
            "/v1/workflows/sum/executions", json={"max_attempts": 0, "timeout": 90_000}
        )
        assert limits.status_code == 422, limits.text
        assert "max_attempts input should be greater than or equal to 1" in limits.text
        assert "timeout input should be less than or equal to 86400" in limits.text
        requeue = http.post(
            "/v1/dead-letters/requeue",
            json={"job_ids": ["00000000-0000-0000-0000-000000000001"], "delay": -1},
        )
        assert requeue.status_code == 422 and "0 or more" in requeue.text, requeue.text
        assert http.get("/v1/executions").json() == []


def test_enqueue_in_the_callers_transaction_can_start_later_with_its_own_limits(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(add_node()))
    with Session(conveyor_service.db.engine) as session, session.begin():
        execution_id = conveyor.enqueue(session, "sum", {"a": 1}, delay=600, max_attempts=7)

    with conveyor_service.db.transaction() as store:
        shown = views.execution_view(store, execution_id)
    assert (shown["status"], shown["max_attempts"], shown["timeout"]) == ("pending", 7, None)
    assert [(j["kind"], j["status"]) for j in shown["jobs"]] == [("execution", "scheduled")]
    with (
        Session(conveyor_service.db.engine) as session,
        session.begin(),
        pytest.raises(StartTimeError, match="has no UTC offset"),
    ):
        conveyor.enqueue(session, "sum", run_at=datetime(2031, 1, 1))
