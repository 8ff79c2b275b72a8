"""Approvals with real services (PostgreSQL, Redis, an in-process worker) and the API served
over HTTP: listed and decided by the API (the decider the key's name) and by the CLI (--by),
a second decision refused with 409, a rejection following on_reject, and a tenant that can
neither see nor decide another's. And around waits: a rerun from the CLI of a wait that
completed takes its kept event again; a requeued dead letter of a wait that timed out waits
again."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Job
from conveyor.service import Conveyor
from tests.conftest import TEST_DB_URL
from tests.integration.test_api import MakeKey, client
from tests.integration.test_waits import apply, got, until, wait_node
from tests.support.services import effects, wait_for


def export_flow(service: Conveyor, tenant: str = "default") -> None:
    """approve -> export (on approval) or notify (on rejection), each counting its runs."""

    def counted(node_id: str) -> dict[str, Any]:
        return {"id": node_id, "type": "python", "config": {"function": "test.add"},
                "needs": ["approve"], "inputs": {"a": 1, "b": 1}}  # fmt: skip

    approve = {"id": "approve", "type": "approval",
               "config": {"message": "Export?", "on_approve": ["export"],
                          "on_reject": ["notify"]}}  # fmt: skip
    definition = {"name": "export", "nodes": [approve, counted("export"), counted("notify")]}
    service.apply(parse_workflow(definition), tenant=tenant)


def waiting(service: Conveyor) -> int:
    with service.db.transaction() as store:
        found = select(func.count()).where(Job.status == JobStatus.WAITING_EVENT)
        return int(store.session.scalar(found) or 0)


def node_output(service: Conveyor, execution_id: uuid.UUID, node_id: str) -> Any:
    with service.db.transaction() as store:
        nodes = {n.node_id: n.output for n in store.execution_nodes(execution_id)}
    return nodes[node_id]


def test_an_approval_is_listed_and_approved_by_the_api_once_and_not_by_another_tenant(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    # Given an export waiting for approval in acme, and globex with a key of its own
    service = conveyor_service
    acme, globex = make_key("acme"), make_key("globex")
    export_flow(service, "acme")
    execution_id = service.trigger("export", {}, tenant="acme")
    until(lambda: waiting(service) == 1)

    # When globex lists the approvals and tries to approve acme's
    with client(api_url, acme) as api:
        (pending,) = api.get("/v1/approvals").json()
    with client(api_url, globex) as api:
        seen = api.get("/v1/approvals")
        forged = api.post(f"/v1/approvals/{pending['id']}/approve", json={"comment": "me"})

    # Then globex sees none and is told it has no such approval; acme's still waits
    assert (pending["execution_id"], pending["node_id"]) == (str(execution_id), "approve")
    assert pending["message"] == "Export?" and pending["workflow"] == "export"
    assert seen.status_code == 200 and seen.json() == []
    assert forged.status_code == 404, forged.text
    assert waiting(service) == 1

    # When acme approves it, then tries again
    with client(api_url, acme) as api:
        approved = api.post(f"/v1/approvals/{pending['id']}/approve", json={"comment": "ok"})
        again = api.post(f"/v1/approvals/{pending['id']}/reject")
        left = api.get("/v1/approvals").json()

    # Then the export ran with the decision as the approval's output, and the second is a 409
    assert approved.status_code == 200, approved.text
    made = approved.json()
    assert (made["decision"], made["by"], made["comment"]) == ("approved", "key:test", "ok")
    assert again.status_code == 409, again.text
    assert "already approved by key:test" in again.json()["detail"]
    assert left == []
    assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["export"]
    output = node_output(service, execution_id, "approve")
    assert (output["decision"], output["by"]) == ("approved", "key:test")
    assert datetime.fromisoformat(output["at"]) == datetime.fromisoformat(made["at"])


def test_an_approval_is_rejected_from_the_cli_and_follows_its_on_reject_branch(
    conveyor_service: Conveyor,
) -> None:
    service = conveyor_service
    export_flow(service)
    execution_id = service.trigger("export", {})
    until(lambda: waiting(service) == 1)
    cli = CliRunner()

    listed = cli.invoke(app, ["approvals", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    (pending,) = json.loads(listed.output)
    rejected = cli.invoke(
        app, ["approvals", "reject", pending["id"], "--comment", "too big", "--by", "grace",
              "--json"],
    )  # fmt: skip
    twice = cli.invoke(app, ["approvals", "approve", pending["id"], "--by", "ada"])

    assert rejected.exit_code == 0, rejected.output
    told = json.loads(rejected.output)
    assert (told["decision"], told["by"], told["comment"]) == ("rejected", "grace", "too big")
    assert twice.exit_code != 0
    assert "already rejected by grace" in twice.output
    assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["notify"]
    assert node_output(service, execution_id, "approve")["comment"] == "too big"


def test_a_rerun_from_the_cli_of_a_completed_wait_takes_its_kept_event_again(
    conveyor_service: Conveyor,
) -> None:
    # Given an order woken by its event and completed
    service = conveyor_service
    apply(service, "pay", wait_node("wait"), got("wait"))
    execution_id = service.trigger("pay", {"order": "r1"})
    until(lambda: waiting(service) == 1)
    service.send_event("paid", {"n": 4}, key="r1")
    assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED

    # When it is rerun from its wait with the CLI
    rerun = CliRunner().invoke(
        app, ["executions", "rerun", str(execution_id), "--from", "wait", "--wait", "--json"]
    )

    # Then the wait took the event kept since the execution began, and its successor ran again
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.output)["status"] == "completed"
    assert node_output(service, execution_id, "wait") == {"n": 4}
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["got", "got"]


def test_a_requeued_dead_letter_of_a_timed_out_wait_waits_again_and_its_event_wakes_it(
    conveyor_service: Conveyor,
) -> None:
    # Given a wait that timed out with no branch: its job dead-lettered, its execution failed
    service = conveyor_service
    apply(service, "pay", wait_node("wait", timeout=1), got("wait"))
    execution_id = service.trigger("pay", {"order": "d1"})
    until(lambda: waiting(service) == 1)
    until(lambda: service.execution(execution_id)["status"] == "failed", tick=service.promote_due)
    with service.db.transaction() as store:
        (job_id,) = store.session.scalars(
            select(Job.id).where(Job.execution_id == execution_id, Job.node_id == "wait")
        )

    # When its dead letter is requeued, and its event sent once it waits again
    assert service.requeue_dead_letters([job_id]) == {job_id: None}
    until(lambda: waiting(service) == 1)
    service.send_event("paid", {"n": 6}, key="d1")

    # Then it resumed with the event, and the execution completed
    assert wait_for(service, execution_id).status is ExecutionStatus.COMPLETED
    assert node_output(service, execution_id, "wait") == {"n": 6}
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["got"]
