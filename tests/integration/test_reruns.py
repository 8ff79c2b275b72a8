"""Reruns of a finished execution from a node, on PostgreSQL, Redis and the in-process worker:
over the service, the CLI and the API. What ran is counted by the node functions themselves
(``test_effects``), not only by the engine's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import InvalidTransition, RerunError
from conveyor.service import Conveyor
from tests.conftest import TEST_DB_URL
from tests.support.services import effects, wait_for

CONVEYOR = [str(Path(sys.executable).parent / "conveyor")]


def py(node_id: str, function: str, *needs: str, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
            "needs": list(needs), "inputs": inputs}  # fmt: skip


def diamond(name: str, flag: Path) -> dict[str, Any]:
    """start -> (broken, side) -> join: `broken` fails (one try) until ``flag`` exists, once
    `side` has run."""
    return {
        "name": name,
        "defaults": {"retry": {"max_attempts": 1}},
        "nodes": [
            py("start", "add", a=1, b=1),
            py("broken", "until_file", "start", path=str(flag), after="side"),
            py("side", "add", "start", a="{{ nodes.start.sum }}", b=1),
            py("join", "add", "broken", "side", a="{{ nodes.side.sum }}", b=10),
        ],
    }


def chain(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": [
            py("first", "add", a="{{ input.n }}", b=1),
            py("second", "add", "first", a="{{ nodes.first.sum }}", b=100),
        ],
    }


def runs(execution_id: uuid.UUID) -> Counter[str]:
    """How many times each node's function ran in the execution (its own effect rows)."""
    return Counter(
        e["node_id"]
        for e in effects(TEST_DB_URL)
        if e["idempotency_key"].startswith(f"{execution_id}:")
    )


def attempts(service: Conveyor, execution_id: uuid.UUID) -> dict[str, list[tuple[int, str]]]:
    with service.db.transaction() as store:
        return {
            job.node_id or "": [(a.attempt_number, a.status.value) for a in tries]
            for job, tries in store.execution_jobs(execution_id)
        }


def cancel(service: Conveyor, execution_id: uuid.UUID) -> None:
    """Cancel, then wait until no node of it runs any more: a node told to stop records its
    effect as it ends, which must not land in the next test's table."""
    service.cancel(execution_id)
    deadline = time.monotonic() + 30
    while True:
        with service.db.transaction() as store:
            busy = [n.node_id for n in store.execution_nodes(execution_id)
                    if n.status is NodeStatus.RUNNING]  # fmt: skip
        if not busy:
            return
        assert time.monotonic() < deadline, f"nodes {busy} still run after the cancel"
        time.sleep(0.05)


def failed_diamond(service: Conveyor, tmp_path: Path, tenant: str = "default") -> uuid.UUID:
    service.apply(parse_workflow(diamond("diamond", tmp_path / "fixed")), tenant)
    execution_id = service.trigger("diamond", tenant=tenant)
    assert wait_for(service, execution_id).status is ExecutionStatus.FAILED
    return execution_id


def test_a_rerun_from_the_failed_middle_node_of_a_diamond_completes_it(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    # Given a diamond that failed at its middle node `broken`, `join` never run
    execution_id = failed_diamond(conveyor_service, tmp_path)
    assert runs(execution_id) == {"start": 1, "broken": 1, "side": 1}

    # When the cause is fixed and an operator reruns it from `broken`
    (tmp_path / "fixed").touch()
    done = conveyor_service.rerun(execution_id, "broken", requested_by="cli:ops")

    # Then `broken` and `join` run again, `start` and `side` do not, and it completes
    assert (done.nodes, done.queued) == (["broken", "join"], ["broken"])
    finished = wait_for(conveyor_service, execution_id)
    assert finished.status is ExecutionStatus.COMPLETED, finished.error
    assert finished.output == {"join": {"sum": 13.0}}
    assert runs(execution_id) == {"start": 1, "broken": 2, "side": 1, "join": 1}
    # the failed try is still there, numbered before the new one
    assert attempts(conveyor_service, execution_id) == {
        "start": [(1, "succeeded")], "broken": [(1, "failed"), (2, "succeeded")],
        "side": [(1, "succeeded")], "join": [(1, "succeeded")],
    }  # fmt: skip
    with conveyor_service.db.transaction() as store:
        (rerun,) = store.execution_reruns(execution_id)
    assert (rerun.from_node, rerun.input, rerun.requested_by) == ("broken", None, "cli:ops")


def test_a_completed_execution_reruns_from_its_root_every_node_on_the_same_jobs(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(chain("chain")))
    execution_id = conveyor_service.trigger("chain", {"n": 1})
    assert wait_for(conveyor_service, execution_id).status is ExecutionStatus.COMPLETED
    with conveyor_service.db.transaction() as store:
        jobs_before = {j.node_id: j.id for j, _ in store.execution_jobs(execution_id)}

    conveyor_service.rerun(execution_id, "first", requested_by="cli:ops")

    finished = wait_for(conveyor_service, execution_id)
    assert finished.status is ExecutionStatus.COMPLETED, finished.error
    assert finished.output == {"second": {"sum": 102.0}}
    assert runs(execution_id) == {"first": 2, "second": 2}
    with conveyor_service.db.transaction() as store:
        jobs_after = {j.node_id: (j.id, j.status) for j, _ in store.execution_jobs(execution_id)}
    assert jobs_after == {n: (i, JobStatus.COMPLETED) for n, i in jobs_before.items()}
    tries = attempts(conveyor_service, execution_id)
    assert tries["first"] == tries["second"] == [(1, "succeeded"), (2, "succeeded")]


def test_a_rerun_with_an_input_gives_the_node_that_input_instead_of_its_templates(
    conveyor_service: Conveyor,
) -> None:
    conveyor_service.apply(parse_workflow(chain("chain")))
    execution_id = conveyor_service.trigger("chain", {"n": 1})
    assert wait_for(conveyor_service, execution_id).output == {"second": {"sum": 102.0}}

    conveyor_service.rerun(execution_id, "second", requested_by="cli:ops", input={"a": 40, "b": 2})

    finished = wait_for(conveyor_service, execution_id)
    assert (finished.status, finished.output) == (
        ExecutionStatus.COMPLETED,
        {"second": {"sum": 42}},
    )
    assert runs(execution_id) == {"first": 1, "second": 2}


def test_a_running_execution_and_an_unknown_node_are_refused(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    conveyor_service.apply(
        parse_workflow({"name": "slow", "nodes": [py("nap", "sleep", seconds=5)]})
    )
    running = conveyor_service.trigger("slow")
    failed = failed_diamond(conveyor_service, tmp_path)

    with pytest.raises(InvalidTransition, match=r"is (pending|running): only a finished one"):
        conveyor_service.rerun(running, "nap", requested_by="cli:ops")
    with pytest.raises(RerunError, match=r"has no node 'nope'; .*: start, broken, side, join"):
        conveyor_service.rerun(failed, "nope", requested_by="cli:ops")

    cancel(conveyor_service, running)
    assert wait_for(conveyor_service, failed).status is ExecutionStatus.FAILED
    assert runs(failed) == {"start": 1, "broken": 1, "side": 1}


def test_a_rerun_is_refused_while_another_execution_of_its_dedupe_key_runs(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    conveyor_service.apply(parse_workflow(diamond("diamond", tmp_path / "fixed")))
    first = conveyor_service.submit("diamond", dedupe_key="k").execution_id
    assert wait_for(conveyor_service, first).status is ExecutionStatus.FAILED
    conveyor_service.apply(
        parse_workflow({"name": "hold", "nodes": [py("nap", "sleep", seconds=5)]})
    )
    # (a key is the tenant's, whichever workflow holds it)
    second = conveyor_service.submit("hold", dedupe_key="k").execution_id

    with pytest.raises(InvalidTransition, match=f"while execution {second}"):
        conveyor_service.rerun(first, "broken", requested_by="cli:ops")
    cancel(conveyor_service, second)
    (tmp_path / "fixed").touch()
    conveyor_service.rerun(first, "broken", requested_by="cli:ops")
    assert wait_for(conveyor_service, first).status is ExecutionStatus.COMPLETED


def test_the_cli_reruns_from_a_node_and_shows_who_asked(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    execution_id = failed_diamond(conveyor_service, tmp_path)
    (tmp_path / "fixed").touch()
    env = dict(os.environ)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CONVEYOR, "executions", *args], env=env, text=True,
                              capture_output=True, timeout=60)  # fmt: skip

    unknown = cli("rerun", str(execution_id), "--from", "nope")
    not_json = cli("rerun", str(execution_id), "--from", "broken", "--input", "[1]")
    done = cli("rerun", str(execution_id), "--from", "broken", "--wait", "--json")
    shown = json.loads(cli("show", str(execution_id), "--json").stdout)
    human = cli("show", str(execution_id))

    assert unknown.returncode == 1
    assert "has no node 'nope'; rerun from one of its nodes: start, broken, side, join" in (
        unknown.stderr
    )
    assert not_json.returncode == 2 and "--input must be a JSON object" in not_json.stderr
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    (rerun,) = shown["reruns"]
    assert (rerun["from_node"], rerun["input"]) == ("broken", None)
    assert rerun["requested_by"].startswith("cli:") and len(rerun["requested_by"]) > 4
    assert f"re-run from broken by {rerun['requested_by']}" in human.stdout
    assert runs(execution_id) == {"start": 1, "broken": 2, "side": 1, "join": 1}


def test_over_the_api_a_tenant_reruns_only_its_own_executions(
    conveyor_service: Conveyor,
    api_url: str,
    make_key: Callable[[str], str],
    tmp_path: Path,
) -> None:
    # Given a failed diamond of tenant b, and a run of it still running
    key_a, key_b = make_key("tenant-a"), make_key("tenant-b")
    theirs = failed_diamond(conveyor_service, tmp_path, tenant="tenant-b")
    slow = parse_workflow({"name": "slow", "nodes": [py("nap", "sleep", seconds=5)]})
    conveyor_service.apply(slow, "tenant-b")
    running = conveyor_service.trigger("slow", tenant="tenant-b")
    fixed = str(tmp_path / "fixed-by-input")  # the rerun's input names a file that exists
    Path(fixed).touch()
    path = f"/v1/executions/{theirs}/rerun"
    with httpx.Client(base_url=api_url, timeout=30) as http:
        a = {"Authorization": f"Bearer {key_a}"}
        b = {"Authorization": f"Bearer {key_b}"}

        # When tenant a tries, tenant b names no node of it, reruns one still running, then
        # reruns it from `broken` with an input
        stolen = http.post(path, json={"from_node": "broken"}, headers=a)
        unknown = http.post(path, json={"from_node": "nope"}, headers=b)
        busy = http.post(f"/v1/executions/{running}/rerun", json={"from_node": "nap"}, headers=b)
        mine = http.post(path, json={"from_node": "broken", "input": {"path": fixed}}, headers=b)
        assert wait_for(conveyor_service, theirs).status is ExecutionStatus.COMPLETED
        shown = http.get(f"/v1/executions/{theirs}", headers=b).json()
        hidden = http.get(f"/v1/executions/{theirs}", headers=a)
    cancel(conveyor_service, running)

    # Then another tenant's is not found, the refusals say why, and the rerun is recorded
    # with the API key's name
    assert stolen.status_code == 404 and hidden.status_code == 404
    assert unknown.status_code == 422
    assert "rerun from one of its nodes: start, broken, side, join" in unknown.json()["detail"]
    assert busy.status_code == 409 and "only a finished one" in busy.json()["detail"]
    assert mine.status_code == 200, mine.text
    assert mine.json() == {
        "id": str(theirs), "status": "running", "from_node": "broken",
        "nodes": ["broken", "join"], "queued": ["broken"],
    }  # fmt: skip
    (rerun,) = shown["reruns"]
    assert (rerun["from_node"], rerun["input"], rerun["requested_by"]) == (
        "broken", {"path": fixed}, "test",
    )  # fmt: skip
    assert runs(theirs) == {"start": 1, "broken": 2, "side": 1, "join": 1}


def test_a_rerun_through_a_failed_map_runs_its_items_again_on_their_jobs_and_completes(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    # Given a map whose item "b" fails (its file is missing), every item run (run_all)
    for name in ("a", "c"):
        (tmp_path / name).touch()
    conveyor_service.apply(parse_workflow({
        "name": "files", "defaults": {"retry": {"max_attempts": 1}},
        "nodes": [
            {"id": "m", "type": "python", "config": {"function": "test.until_file"},
             "map": {"over": "{{ input.names }}", "on_item_failure": "run_all"},
             "inputs": {"path": f"{tmp_path}/{{{{ item }}}}"}},
            py("after", "collect", "m", values="{{ nodes.m | map(attribute='on') | list }}"),
        ],
    }))  # fmt: skip
    execution_id = conveyor_service.trigger("files", {"names": ["a", "b", "c"]})
    failed = wait_for(conveyor_service, execution_id)
    assert failed.status is ExecutionStatus.FAILED
    assert "1 of 3 items failed (indices 1)" in (failed.error or "")
    with conveyor_service.db.transaction() as store:
        before = [j.id for j, _ in store.execution_items(execution_id, "m", limit=10)]

    # When the file is there and the map is rerun
    (tmp_path / "b").touch()
    conveyor_service.rerun(execution_id, "m", requested_by="cli:ops")

    # Then every item ran again on its own job, and the successor once, on their outputs
    done = wait_for(conveyor_service, execution_id)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"after": {"values": [True, True, True]}}
    assert runs(execution_id) == {"m": 6, "after": 1}
    with conveyor_service.db.transaction() as store:
        found = store.execution_items(execution_id, "m", limit=10)
    assert [j.id for j, _ in found] == before
    assert [[(a.attempt_number, a.status.value) for a in tries] for _, tries in found] == [
        [(1, "succeeded"), (2, "succeeded")],
        [(1, "failed"), (2, "succeeded")],
        [(1, "succeeded"), (2, "succeeded")],
    ]
