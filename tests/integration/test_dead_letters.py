"""Dead letters repaired without SQL: a requeued one resumes and completes its execution, a
discarded one is archived and counted; over the service, the CLI and the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from conveyor.store.listing import ExecutionFilter
from tests.support import nodes as test_nodes
from tests.support.services import wait_for

CONVEYOR = [str(Path(sys.executable).parent / "conveyor")]


def fragile(name: str, switch: str, **extra: Any) -> dict[str, Any]:
    """start -> (broken, slow) -> join: `broken` fails while its switch is off."""

    def py(node_id: str, function: str, needs: list[str], **inputs: Any) -> dict[str, Any]:
        return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
                "needs": needs, "inputs": inputs}  # fmt: skip

    return {
        "name": name,
        "defaults": {"retry": {"max_attempts": 2, "backoff": 0.05, "jitter": 0}},
        "nodes": [
            py("start", "add", [], a=1, b=1),
            py("broken", "switch", ["start"], name=switch),
            py("slow", "sleep", ["start"], seconds=0.5),
            py("join", "add", ["broken", "slow"], a="{{ nodes.slow.cancelled | int }}", b=10),
        ],
        **extra,
    }


def dead(service: Conveyor, execution_id: uuid.UUID) -> Any:
    with service.db.transaction() as store:
        [job] = [
            j for j, _ in store.execution_jobs(execution_id) if j.status is JobStatus.DEAD_LETTER
        ]
        return job


def failed_run(service: Conveyor, switch: str, tenant: str = "default") -> tuple[uuid.UUID, Any]:
    test_nodes.switches[switch] = False
    service.apply(parse_workflow(fragile(f"wf-{switch}", switch)), tenant)
    execution_id = service.trigger(f"wf-{switch}", tenant=tenant)
    assert wait_for(service, execution_id).status is ExecutionStatus.FAILED
    return execution_id, dead(service, execution_id)


def test_a_requeued_dead_letter_resumes_its_execution_which_completes(
    conveyor_service: Conveyor,
) -> None:
    # Given an execution that failed at `broken` after two tries, `slow` stopped with it
    execution_id, job = failed_run(conveyor_service, "s1")

    # When the third party is fixed and an operator requeues the dead letter
    test_nodes.switches["s1"] = True
    outcomes = conveyor_service.requeue_dead_letters([job.id])

    # Then the execution resumes from it and completes, every node with its output
    assert outcomes == {job.id: None}
    done = wait_for(conveyor_service, execution_id)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"join": {"sum": 10}}  # slow was not cancelled on its re-run
    with conveyor_service.db.transaction() as store:
        nodes = {n.node_id: n.status for n in store.execution_nodes(execution_id)}
        [(again, attempts)] = [(j, a) for j, a in store.execution_jobs(execution_id)
                               if j.id == job.id]  # fmt: skip
    assert set(nodes.values()) == {NodeStatus.COMPLETED}
    # its tries were reset (one more sufficed) and its history kept: 2 failed, then 1
    assert [(a.attempt_number, a.status.value) for a in attempts] == [
        (1, "failed"), (2, "failed"), (3, "succeeded")]  # fmt: skip
    assert (again.status, again.tries_before, again.retry_count) == (JobStatus.COMPLETED, 2, 0)


def test_a_discarded_dead_letter_is_archived_counted_and_cannot_be_requeued(
    conveyor_service: Conveyor,
) -> None:
    execution_id, job = failed_run(conveyor_service, "s2")

    assert conveyor_service.discard_dead_letters([job.id]) == {job.id: None}

    from conveyor.store.dead_letters import DeadLetterFilter

    with conveyor_service.db.transaction() as store:
        live = store.dead_letter_rows(DeadLetterFilter(), 10)
        archive = store.dead_letter_rows(DeadLetterFilter(discarded=True), 10)
    assert live == [] and [row[0].id for row in archive] == [job.id]
    assert "discarded" in (conveyor_service.requeue_dead_letters([job.id])[job.id] or "")
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.FAILED


def test_requeue_refuses_what_it_cannot_resume_and_says_why(
    conveyor_service: Conveyor,
) -> None:
    # a dead letter whose execution went on without it (continue_on_failure)
    test_nodes.switches["s3"] = False
    tolerant = fragile("tolerant", "s3")
    tolerant["nodes"][1]["continue_on_failure"] = True
    conveyor_service.apply(parse_workflow(tolerant))
    execution_id = conveyor_service.trigger("tolerant")
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    tolerated = dead(conveyor_service, execution_id)
    stranger = uuid.uuid4()

    outcomes = conveyor_service.requeue_dead_letters([tolerated.id, stranger])

    assert "continue_on_failure" in (outcomes[tolerated.id] or "")
    assert "no dead letter has id" in (outcomes[stranger] or "")


def test_the_dlq_command_lists_shows_and_requeues_by_filter(
    conveyor_service: Conveyor,
) -> None:
    _, first = failed_run(conveyor_service, "s4")
    _, second = failed_run(conveyor_service, "s5")
    test_nodes.switches["s4"] = test_nodes.switches["s5"] = True
    env = dict(os.environ)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CONVEYOR, "dlq", *args], env=env, text=True,
                              capture_output=True, timeout=60)  # fmt: skip

    listed = json.loads(cli("list", "--error", "SWITCH S4", "--json").stdout)
    shown = json.loads(cli("show", str(first.id), "--json").stdout)
    refused = cli("requeue")
    requeued = cli("requeue", "--all", "--workflow", "wf-s5")

    assert [r["job_id"] for r in listed] == [str(first.id)]
    assert (shown["node"], shown["tries"], len(shown["attempts"])) == ("broken", 2, 2)
    assert refused.returncode == 2 and "--all" in refused.stderr
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout.strip() == f"{second.id}: requeued"
    assert wait_for(conveyor_service, second.execution_id).status is ExecutionStatus.COMPLETED


def test_over_the_api_a_tenant_repairs_only_its_own_dead_letters(
    conveyor_service: Conveyor, api_url: str, make_key: Callable[[str], str]
) -> None:
    key_a, key_b = make_key("tenant-a"), make_key("tenant-b")
    _, theirs = failed_run(conveyor_service, "s6", tenant="tenant-b")
    test_nodes.switches["s6"] = True
    body = {"job_ids": [str(theirs.id)]}
    with httpx.Client(base_url=api_url, timeout=30) as http:
        a = {"Authorization": f"Bearer {key_a}"}
        b = {"Authorization": f"Bearer {key_b}"}
        assert http.get(f"/v1/dead-letters/{theirs.id}", headers=a).status_code == 404
        stolen = http.post("/v1/dead-letters/requeue", json=body, headers=a).json()
        assert stolen["done"] == [] and str(theirs.id) in stolen["refused"]
        assert http.get("/v1/dead-letters", headers=b).json()[0]["job_id"] == str(theirs.id)
        mine = http.post("/v1/dead-letters/requeue", json=body, headers=b).json()
    assert mine == {"done": [str(theirs.id)], "refused": {}}
    assert wait_for(conveyor_service, theirs.execution_id).status is ExecutionStatus.COMPLETED


def test_requeue_revives_a_tolerant_sibling_the_failure_stopped(
    conveyor_service: Conveyor,
) -> None:
    # Given a -> charge (fails) and a -> notify (continue_on_failure, still running when
    # charge dies), both -> finish
    test_nodes.switches["s7"] = False
    flow = fragile("tolerant-sibling", "s7")
    flow["nodes"][2]["continue_on_failure"] = True  # `slow` tolerates failure
    conveyor_service.apply(parse_workflow(flow))
    execution_id = conveyor_service.trigger("tolerant-sibling")
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.FAILED
    job = dead(conveyor_service, execution_id)

    # When the dead letter is requeued once the cause is fixed
    test_nodes.switches["s7"] = True
    assert conveyor_service.requeue_dead_letters([job.id]) == {job.id: None}

    # Then the sibling stopped by the failure runs again too, and the execution completes
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED


def test_requeue_is_refused_when_a_dead_letter_of_the_execution_was_discarded(
    conveyor_service: Conveyor,
) -> None:
    # Given a failed execution with two dead letters (two failures committing at once), the
    # first of them discarded
    from sqlalchemy import update

    from conveyor.models import Job

    execution_id, first = failed_run(conveyor_service, "s8")
    with conveyor_service.db.transaction() as store:
        [second] = [j.id for j, _ in store.execution_jobs(execution_id) if j.node_id == "slow"]
        store.session.execute(
            update(Job).where(Job.id == second).values(status=JobStatus.DEAD_LETTER)
        )
    conveyor_service.discard_dead_letters([first.id])

    # When the other one is requeued, it is refused: the execution could never complete
    outcomes = conveyor_service.requeue_dead_letters([second])

    assert "another dead letter of its execution was discarded" in (outcomes[second] or "")
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.FAILED


def test_dlq_list_shows_a_map_item_s_index_and_links_a_child_s_dead_letters_both_ways(
    conveyor_service: Conveyor, api_url: str, make_key: Callable[[str], str], tmp_path: Path
) -> None:
    # Given a map whose item 1 dies, and a map of children whose second child's node dies
    # (both run on: continue), for the tenant of an API key
    key = make_key("links")
    once = {"retry": {"max_attempts": 1}}
    (tmp_path / "here").touch()
    conveyor_service.apply(parse_workflow({"name": "kid", "defaults": once, "nodes": [
        {"id": "x", "type": "python", "config": {"function": "test.until_file"},
         "inputs": {"path": "{{ input.path }}"}},
    ]}), "links")  # fmt: skip
    conveyor_service.apply(parse_workflow({"name": "maps", "defaults": once, "nodes": [
        {"id": "m", "type": "python", "config": {"function": "test.item"},
         "map": {"over": "{{ input.rows }}", "on_item_failure": "continue"},
         "inputs": {"value": "{{ item }}", "fail_on": [1]}},
        {"id": "each", "type": "workflow", "config": {"workflow": "kid"},
         "map": {"over": "{{ input.paths }}", "on_item_failure": "continue"},
         "inputs": {"path": "{{ item }}"}},
    ]}), "links")  # fmt: skip
    made = conveyor_service.submit(
        "maps", {"rows": [0, 1, 2], "paths": [str(tmp_path / "here"), str(tmp_path / "gone")]},
        tenant="links",
    )  # fmt: skip
    parent_id = made.execution_id
    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.COMPLETED
    with conveyor_service.db.transaction() as store:
        (child,) = [e for e, _, _ in store.list_executions(None, where=ExecutionFilter(
            parent=parent_id, status=ExecutionStatus.FAILED), limit=5)]  # fmt: skip
    env = dict(os.environ)

    def cli(*args: str) -> str:
        done = subprocess.run([*CONVEYOR, "dlq", *args], env=env, text=True,
                              capture_output=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    # When an operator lists them, and shows the item's
    listed = json.loads(cli("list", "--tenant", "links", "--json"))
    human = cli("list", "--tenant", "links")
    with httpx.Client(base_url=api_url, timeout=30) as http:
        api = http.get("/v1/dead-letters", headers={"Authorization": f"Bearer {key}"}).json()

    # Then the map's item shows its index; the workflow node's item names its child, and the
    # child's own dead letter its parent
    links = {
        (r["execution_id"], r["node"], r["item_index"]): (
            r["child_execution_id"],
            r["parent_execution_id"],
        )
        for r in listed
    }
    assert links == {
        (str(parent_id), "m", 1): (None, None),
        (str(parent_id), "each", 1): (str(child.id), None),
        (str(child.id), "x", None): (None, str(parent_id)),
    }
    assert sorted(r["job_id"] for r in api) == sorted(r["job_id"] for r in listed)
    assert {(r["node"], r["item_index"]) for r in api} == {("m", 1), ("each", 1), ("x", None)}
    assert "m[1]" in human and "each[1]" in human
    assert f"child {child.id}" in human and f"in a child of {parent_id}" in human
    (item,) = [r for r in listed if r["node"] == "m"]
    shown = cli("show", item["job_id"])
    assert f"node m[1], execution {parent_id}, 1 tries" in shown
