"""Child workflows with real `celery worker` processes (a parent whose child is a diamond; a
parent cancelled while its child runs; a map of children, each holding a map of its own), and
the child examples as their docs run them on the embedded default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from sqlalchemy import select

from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.models import Execution, Job
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, ROOT, await_ready
from tests.acceptance.test_cli import conveyor_session
from tests.support.services import effects, wait_for


def py(node_id: str, function: str, *needs: str, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
            "needs": list(needs), "inputs": inputs}  # fmt: skip


def call(node_id: str, workflow: str, *needs: str, **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "workflow", "config": {"workflow": workflow},
            "needs": list(needs), **fields}  # fmt: skip


def apply(service: Conveyor, name: str, *nodes: dict[str, Any]) -> None:
    service.apply(parse_workflow({"name": name, "nodes": list(nodes)}))


def children_of(service: Conveyor, execution_id: uuid.UUID) -> list[Execution]:
    with service.db.transaction() as store:
        return list(
            store.session.scalars(
                select(Execution).where(Execution.parent_execution_id == execution_id)
            )
        )


def job_status(service: Conveyor, execution_id: uuid.UUID, node_id: str) -> JobStatus:
    with service.db.transaction() as store:
        return store.session.scalars(
            select(Job.status).where(Job.execution_id == execution_id, Job.node_id == node_id)
        ).one()


def eventually(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "it did not happen in time"
        time.sleep(0.05)
    return found


def test_a_parent_completes_with_its_diamond_childs_output_on_real_workers(
    start_worker: Callable[..., Popen[str]], client: Conveyor
) -> None:
    # Given two worker processes, a diamond to run as a child, and a parent around it
    for name in ("a", "b"):
        start_worker("workflow-execution,workflow-node", concurrency=2, name=name, wait=False)
    apply(client, "diamond",
          py("start", "add", a="{{ input.x }}", b=1),
          py("left", "sleep_add", "start", a="{{ nodes.start.sum }}", b=10, seconds=0.2),
          py("right", "sleep_add", "start", a="{{ nodes.start.sum }}", b=20, seconds=0.2),
          py("join", "add", "left", "right", a="{{ nodes.left.sum }}",
             b="{{ nodes.right.sum }}"))  # fmt: skip
    apply(client, "parent", py("before", "add", a="{{ input.x }}", b=0),
          call("child", "diamond", "before", inputs={"x": "{{ nodes.before.sum }}"}),
          py("after", "add", "child", a="{{ nodes.child.join.sum }}", b=1000))  # fmt: skip

    # When the parent runs
    row = wait_for(client, client.trigger("parent", {"x": 1}), timeout=60)

    # Then it completed with its child's output, every node of both ran once
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"after": {"sum": 1034}}
    (child,) = children_of(client, row.id)
    assert (child.status, child.output, child.parent_node_id) == (
        ExecutionStatus.COMPLETED, {"join": {"sum": 34}}, "child",
    )  # fmt: skip
    ran = sorted(e["node_id"] for e in effects(ACCEPTANCE_DB_URL))
    assert ran == ["after", "before", "join", "left", "right", "start"]


def test_a_parent_cancelled_while_its_child_runs_cancels_the_child(
    start_worker: Callable[..., Popen[str]], client: Conveyor
) -> None:
    start_worker("workflow-execution,workflow-node", concurrency=2, name="w")
    apply(client, "slow", py("nap", "sleep", seconds=60))
    apply(client, "parent", call("child", "slow"), py("after", "add", "child", a=1, b=1))
    parent_id = client.trigger("parent")
    (child,) = eventually(lambda: children_of(client, parent_id))
    eventually(lambda: job_status(client, child.id, "nap") is JobStatus.PROCESSING)

    client.cancel(parent_id)

    assert wait_for(client, parent_id).status is ExecutionStatus.CANCELLED
    assert wait_for(client, child.id).status is ExecutionStatus.CANCELLED
    # the worker running the child's node saw it end, stopped it, and recorded its try
    eventually(lambda: job_status(client, child.id, "nap") is JobStatus.CANCELLED)
    assert [e["value"] for e in eventually(lambda: effects(ACCEPTANCE_DB_URL))] == ["slept"]
    assert job_status(client, parent_id, "child") is JobStatus.CANCELLED
    with client.db.transaction() as store:
        nodes = {n.node_id: n.status.value for n in store.execution_nodes(parent_id)}
    assert nodes == {"child": "cancelled", "after": "cancelled"}


def test_a_map_of_children_each_holding_a_map_runs_every_item_once_on_real_workers(
    start_worker: Callable[..., Popen[str]], client: Conveyor
) -> None:
    # Given two worker processes, a child that maps over its rows and totals them, and a
    # parent that maps over groups of rows, a child per group, then totals the children's
    await_ready(*(
        start_worker("workflow-execution,workflow-node", concurrency=2, name=name, wait=False)
        for name in ("a", "b")
    ))  # fmt: skip
    apply(
        client,
        "rows",
        {**py("each", "item", value="{{ item * 10 }}"), "map": {"over": "{{ input.rows }}"}},
        py("total", "collect", "each", values="{{ nodes.each | map(attribute='value') | list }}"),
    )
    apply(client, "groups",
          call("group", "rows", map={"over": "{{ input.groups }}", "concurrency": 2},
               inputs={"rows": "{{ item }}"}),
          py("all", "collect", "group",
             values="{{ nodes.group | map(attribute='total.values') | list }}"))  # fmt: skip
    groups = [[1, 2, 3], [4], [5, 6], [], [7, 8, 9, 10]]

    # When the parent runs over five groups
    row = wait_for(client, client.trigger("groups", {"groups": groups}), timeout=120)

    # Then every group's child completed with its map's output, in group order, and every
    # item and every successor ran exactly once (counted by the node functions)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"all": {"values": [[r * 10 for r in g] for g in groups]}}
    kids = children_of(client, row.id)
    assert sorted(k.input["rows"] for k in kids) == sorted(groups)
    assert {(k.status, k.parent_node_id, k.depth) for k in kids} == {
        (ExecutionStatus.COMPLETED, "group", 1)
    }
    found = effects(ACCEPTANCE_DB_URL)
    each = Counter(e["idempotency_key"] for e in found if e["node_id"] == "each")
    assert each == Counter(
        {f"{k.id}:each:{i}": 1 for k in kids for i in range(len(k.input["rows"]))}
    )
    assert Counter(e["node_id"] for e in found if e["node_id"] != "each") == {
        "total": len(groups), "all": 1,
    }  # fmt: skip


@pytest.mark.timeout(240)  # seven `conveyor` processes in a row, each importing the CLI
def test_the_child_examples_complete_on_the_embedded_default_as_their_docs_run_them(
    tmp_path: Path,
) -> None:
    # Given a fresh directory with the examples, no CONVEYOR_* settings but the demo's nodes
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("own-project"))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(CONVEYOR_IMPORTS="conveyor.demo",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")  # fmt: skip

    # When the commands of docs/definitions.md run (--json added, to read the outcome)
    def shell(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, text=True,
                              capture_output=True, timeout=120)  # fmt: skip

    applied = shell("conveyor workflow apply examples/diamond.yaml")
    run = shell(
        'conveyor run examples/child.yaml --input "$(cat examples/child.input.json)" --wait --json'
    )
    mapped = shell(
        "conveyor run examples/map-of-children.yaml --input "
        '"$(cat examples/map-of-children.input.json)" --wait --json'
    )

    # Then it completed, and `executions show` links the parent and its children both ways
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    outcome = json.loads(run.stdout)
    assert (outcome["status"], outcome["output"]) == ("completed", {"first": 70, "second": 20170})
    parent = outcome["execution_id"]
    as_json, human = shows(env, tmp_path, [parent, "--json"], [parent])
    shown = json.loads(as_json)
    assert (shown["children_count"], shown["parent"]) == (2, None)
    by_node = {c["node"]: c for c in shown["children"]}
    assert sorted(by_node) == ["again", "first"]
    assert {n["id"]: n["child"] for n in shown["nodes"]} == {
        node: child["id"] for node, child in by_node.items()
    }
    assert "children (2)" in human and by_node["first"]["id"] in human
    again = by_node["again"]["id"]
    child, child_json = shows(env, tmp_path, [again], [again, "--json"])
    assert f"child of execution {parent} (workflow child, node again, try 1)" in child
    assert json.loads(child_json)["output"] == {"x": 70, "total": 20170}

    # and the map of children completed
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    outcome = json.loads(mapped.stdout)
    assert (outcome["status"], outcome["output"]) == (
        "completed", {"totals": [22, 42, 70], "total": 134},
    )  # fmt: skip
    # (the links between a map of children and its children: tests/integration/test_children.py)


def shows(env: dict[str, str], cwd: Path, *args: list[str]) -> list[str]:
    """What `conveyor executions show ARGS` prints, for each ARGS (one process for them all)."""
    done = conveyor_session(*(["executions", "show", *a] for a in args), env=env, cwd=cwd)
    for shown in done:
        assert shown.returncode == 0, shown.stdout + shown.stderr
    return [shown.stdout for shown in done]
