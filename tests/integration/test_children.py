"""Child workflows end to end: real PostgreSQL, Redis broker and the in-process worker. A
workflow node starts its child and waits holding no permit; the child's finish settles the
node in the same transaction; a failed child is retried as a new child; a cancel of the
parent cancels its children; depth and circles are bounded."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from typer.testing import CliRunner

from conveyor import views
from conveyor.cli import app
from conveyor.engine import cancellation, children, claiming, ready, success, triggering
from conveyor.engine.states import ExecutionStatus, JobStatus, NodeStatus
from conveyor.engine.validation import parse_workflow
from conveyor.exceptions import DefinitionError
from conveyor.models import Execution, Job
from conveyor.service import Conveyor, utcnow
from conveyor.store.listing import ExecutionFilter
from tests.conftest import TEST_DB_URL
from tests.integration.test_api import MakeKey, client
from tests.support import nodes as test_nodes
from tests.support.services import effects, in_thread, lock_waiters, wait_for


def py(node_id: str, function: str, *needs: str, **inputs: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
            "needs": list(needs), "inputs": inputs}  # fmt: skip


def call(node_id: str, workflow: str, *needs: str, **fields: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "workflow", "config": {"workflow": workflow},
            "needs": list(needs), **fields}  # fmt: skip


def apply(service: Conveyor, name: str, *nodes: dict[str, Any], **extra: Any) -> None:
    service.apply(parse_workflow({"name": name, "nodes": list(nodes), **extra}))


def children_of(service: Conveyor, execution_id: uuid.UUID) -> list[Execution]:
    with service.db.transaction() as store:
        return list(
            store.session.scalars(
                select(Execution)
                .where(Execution.parent_execution_id == execution_id)
                .order_by(Execution.created_at)
            )
        )


def job_of(service: Conveyor, execution_id: uuid.UUID, node_id: str) -> Job:
    with service.db.transaction() as store:
        return store.session.scalars(
            select(Job).where(Job.execution_id == execution_id, Job.node_id == node_id)
        ).one()


def wait_until(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "it did not happen in time"
        time.sleep(0.02)
    return found


# A diamond of additions, as a child: its output is the join's
DIAMOND = (
    py("start", "add", a="{{ input.x }}", b=1),
    py("left", "add", "start", a="{{ nodes.start.sum }}", b=10),
    py("right", "add", "start", a="{{ nodes.start.sum }}", b=20),
    py("join", "add", "left", "right", a="{{ nodes.left.sum }}", b="{{ nodes.right.sum }}"),
)


def test_a_parent_completes_with_its_childs_output(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "diamond", *DIAMOND)
    apply(conveyor_service, "parent",
          call("child", "diamond", inputs={"x": "{{ input.x }}"}),
          py("after", "add", "child", a="{{ nodes.child.join.sum }}", b=1000))  # fmt: skip

    row = wait_for(conveyor_service, conveyor_service.trigger("parent", {"x": 1}))

    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"after": {"sum": 1034}}
    (child,) = children_of(conveyor_service, row.id)
    assert (child.status, child.output, child.depth, child.parent_node_id) == (
        ExecutionStatus.COMPLETED, {"join": {"sum": 34}}, 1, "child",
    )  # fmt: skip
    # every node of both ran exactly once, as counted by the nodes themselves
    ran = sorted(e["node_id"] for e in effects(TEST_DB_URL))
    assert ran == ["after", "join", "left", "right", "start"]
    with conveyor_service.db.transaction() as store:
        nodes = {n.node_id: n for n in store.execution_nodes(row.id)}
    assert (nodes["child"].status, nodes["child"].output) == (
        NodeStatus.COMPLETED, {"join": {"sum": 34}},
    )  # fmt: skip


def test_a_failed_child_is_retried_as_a_new_child_then_fails_the_parent(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service, "broken", py("only", "fail", message="nope"),
          defaults={"retry": {"max_attempts": 1}})  # fmt: skip
    twice = {"max_attempts": 2, "backoff": 0.1, "jitter": 0}
    apply(conveyor_service, "parent", call("child", "broken", retry=twice))

    row = wait_for(conveyor_service, conveyor_service.trigger("parent"))

    assert row.status is ExecutionStatus.FAILED
    first, second = children_of(conveyor_service, row.id)
    assert (first.status, second.status) == (ExecutionStatus.FAILED, ExecutionStatus.FAILED)
    assert (first.parent_try, second.parent_try) == (1, 2)
    dead = job_of(conveyor_service, second.id, "only")
    assert row.error == (
        f"node 'child' failed after 2 attempt(s): child execution {second.id} failed at "
        f"node 'only' (dead letter {dead.id}): node 'only' failed after 1 attempt(s): "
        f"RuntimeError: nope"
    )
    assert job_of(conveyor_service, row.id, "child").status is JobStatus.DEAD_LETTER
    assert [e["node_id"] for e in effects(TEST_DB_URL)] == ["only", "only"]


def test_cancelling_a_parent_cancels_its_running_child(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "slow", py("nap", "sleep", seconds=30))
    apply(conveyor_service, "parent", call("child", "slow"))
    parent_id = conveyor_service.trigger("parent")
    (child,) = wait_until(lambda: children_of(conveyor_service, parent_id))
    wait_until(lambda: job_of(conveyor_service, child.id, "nap").status is JobStatus.PROCESSING)

    conveyor_service.cancel(parent_id)

    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.CANCELLED
    assert wait_for(conveyor_service, child.id).status is ExecutionStatus.CANCELLED
    # the running node saw its execution end and stopped (its effect says so)
    wait_until(lambda: effects(TEST_DB_URL))
    nap = wait_until(
        lambda: (j := job_of(conveyor_service, child.id, "nap")).status is JobStatus.CANCELLED and j
    )
    assert nap.status is JobStatus.CANCELLED
    assert job_of(conveyor_service, parent_id, "child").status is JobStatus.CANCELLED


def wide_tree(service: Conveyor, width: int) -> tuple[uuid.UUID, list[Execution]]:
    """A parent whose ``width`` workflow nodes each started a child that waits (a delay: no
    worker holds it, and nothing of it runs on after the test)."""
    apply(service, "pause", {"id": "wait", "type": "delay", "config": {"seconds": 600}})
    apply(service, "wide", *(call(f"c{i}", "pause") for i in range(width)))
    parent_id = service.trigger("wide")
    kids = wait_until(lambda: len(found := children_of(service, parent_id)) == width and found)
    return parent_id, kids


def statuses_of(service: Conveyor, kids: list[Execution]) -> set[ExecutionStatus]:
    with service.db.transaction() as store:
        return {store.execution(k.id).status for k in kids}


def test_cancelling_a_tree_wider_than_a_transaction_s_share_stops_it_all_before_answering(
    conveyor_service: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a parent with five children, and transactions that stop two children each
    parent_id, kids = wide_tree(conveyor_service, 5)
    monkeypatch.setattr(cancellation, "STOPS_A_TRANSACTION", 2)

    # When it is cancelled
    conveyor_service.cancel(parent_id)

    # Then every child is cancelled once the call returns (the cancel's two, then orphans')
    assert statuses_of(conveyor_service, kids) == {ExecutionStatus.CANCELLED}
    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.CANCELLED


def test_the_recovery_sweep_stops_children_a_stop_left_running(
    conveyor_service: Conveyor,
) -> None:
    # Given a parent with three children, stopped by a transaction that stopped one of them
    # (its process gone before it stopped the rest)
    parent_id, kids = wide_tree(conveyor_service, 3)
    stopped = conveyor_service.db.run(
        lambda s: cancellation.cancel_execution(s, parent_id, utcnow(), 1)
    )
    assert stopped.more and len(statuses_of(conveyor_service, kids)) == 2

    # When the recovery sweep runs
    done = conveyor_service.recover(heartbeat_timeout=60, lost_after=3600)

    # Then it stopped the two left, and counts them
    assert done["children_stopped"] == 2
    assert statuses_of(conveyor_service, kids) == {ExecutionStatus.CANCELLED}
    again = conveyor_service.recover(heartbeat_timeout=60, lost_after=3600)
    assert again["children_stopped"] == 0


@pytest.fixture
def shallow(conveyor_service: Conveyor) -> Iterator[Conveyor]:
    """The service with children nesting at most two deep."""
    before = conveyor_service.max_child_depth
    conveyor_service.max_child_depth = 2
    yield conveyor_service
    conveyor_service.max_child_depth = before


def test_a_child_past_the_maximum_depth_fails_and_so_do_its_parents(shallow: Conveyor) -> None:
    once = {"retry": {"max_attempts": 1}}
    apply(shallow, "leaf", py("x", "add", a=1, b=1))
    apply(shallow, "low", call("deeper", "leaf"), defaults=once)
    apply(shallow, "mid", call("deeper", "low"), defaults=once)
    apply(shallow, "top", call("deeper", "mid"), defaults=once)

    row = wait_for(shallow, shallow.trigger("top"))

    assert row.status is ExecutionStatus.FAILED
    (mid,) = children_of(shallow, row.id)
    (low,) = children_of(shallow, mid.id)
    assert children_of(shallow, low.id) == []
    assert (mid.depth, low.depth) == (1, 2)
    assert low.error == (
        "node 'deeper' failed after 1 attempt(s): node 'deeper' would start a child at depth "
        "3, past the limit of 2 (CONVEYOR_MAX_CHILD_DEPTH): its workflows start each other in "
        "a circle, or nest deeper than that; break the circle, or raise the setting"
    )
    assert effects(TEST_DB_URL) == []


def test_a_circle_of_workflows_is_refused_when_applied(conveyor_service: Conveyor) -> None:
    apply(conveyor_service, "ping", call("to_pong", "pong"))

    with pytest.raises(DefinitionError, match=r"\(pong -> ping -> pong\)"):
        apply(conveyor_service, "pong", call("to_ping", "ping"))
    with pytest.raises(DefinitionError, match="a workflow may not start itself"):
        apply(conveyor_service, "narcissus", call("again", "narcissus"))

    with conveyor_service.db.transaction() as store:
        assert [w.name for w in store.list_workflows(store.tenant_id("default"))] == ["ping"]


def test_a_message_delivered_again_and_starts_racing_start_one_child(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service, "slow", py("nap", "sleep", seconds=30))
    apply(conveyor_service, "parent", call("child", "slow"))
    parent_id = conveyor_service.trigger("parent")
    wait_until(lambda: children_of(conveyor_service, parent_id))

    # When the node's message is delivered three times more
    with conveyor_service.db.transaction() as store:
        job = store.job(job_of(conveyor_service, parent_id, "child").id)
    assert job is not None
    conveyor_service.dispatcher.publish([ready.dispatch_of(job, "parent")] * 3)
    time.sleep(1.0)

    # Then they were dropped: still one child
    assert len(children_of(conveyor_service, parent_id)) == 1
    conveyor_service.cancel(parent_id)


def test_two_starts_of_one_try_racing_make_one_child(conveyor_service: Conveyor) -> None:
    # Given a claimed try of a workflow node (claimed here, not by the worker)
    apply(conveyor_service, "kid", py("x", "add", a=1, b=2))
    apply(conveyor_service, "parent", call("child", "kid"))
    made = conveyor_service.db.autocommit(
        lambda s: triggering.trigger(
            s, workflow_name="parent", tenant="default", input={}, now=utcnow()
        )
    )  # not published: no worker sees it
    (dispatch,) = made.dispatches
    run = conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, dispatch.job_id, utcnow(), "racer")
    )
    assert run is not None

    # When two workers' transactions start it at once
    barrier = threading.Barrier(2)
    results: list[children.Started] = []

    def race() -> None:
        barrier.wait(timeout=10)
        results.append(conveyor_service.db.run(lambda s: children.start_child(s, run, utcnow())))

    racers = [threading.Thread(target=race) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=30)

    # Then one made the child, the other found the try waiting and made none
    assert sorted(r.child_id is not None for r in results) == [False, True]
    assert len(children_of(conveyor_service, made.execution_id)) == 1
    for started in results:
        conveyor_service.dispatcher.publish(started.dispatches)
    assert wait_for(conveyor_service, made.execution_id).status is ExecutionStatus.COMPLETED


def test_the_childs_finish_and_its_parents_settle_commit_together(
    conveyor_service: Conveyor,
) -> None:
    # (the child's node waits at a barrier until the lock is taken: a warm worker could
    # otherwise finish the child before the test locks its parent's job)
    gate = test_nodes.barriers["settle-together"] = threading.Barrier(2)
    apply(conveyor_service, "kid", py("x", "barrier", name="settle-together", value=3))
    apply(conveyor_service, "parent", call("child", "kid"))
    with conveyor_service.db.transaction() as holder:
        # Given the parent's waiting job locked by another transaction
        parent_id = conveyor_service.trigger("parent")
        job = wait_until(
            lambda: (
                (j := job_of(conveyor_service, parent_id, "child")).status
                is JobStatus.WAITING_CHILD
                and j
            )
        )
        (child,) = children_of(conveyor_service, parent_id)
        holder.session.execute(
            text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job.id}
        )
        # When the child's node completes, its transaction waits to settle the parent
        gate.wait(timeout=60)
        wait_until(lambda: lock_waiters(conveyor_service) > 0)
        # Then the child's completion is not visible before the parent's node settles
        with conveyor_service.db.transaction() as store:
            assert store.execution_row(child.id).status is ExecutionStatus.RUNNING
            assert effects(TEST_DB_URL)  # the node ran
    # and once the lock goes, both commit
    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.COMPLETED
    assert wait_for(conveyor_service, child.id).status is ExecutionStatus.COMPLETED


def test_a_parents_stop_and_its_childs_finish_racing_end_consistent(
    conveyor_service: Conveyor, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a parent whose workflow node waits on its child, the child's one node claimed
    # (here, not by the worker: nothing is published)
    caplog.set_level(logging.WARNING, logger="conveyor.store.unit_of_work")  # its retries
    apply(conveyor_service, "kid", py("one", "add", a=1, b=2))
    apply(conveyor_service, "mom", call("call", "kid"), py("after", "add", "call", a=0, b=0))
    made = conveyor_service.db.autocommit(
        lambda s: triggering.trigger(s, workflow_name="mom", tenant="default", input={},
                                     now=utcnow())
    )  # fmt: skip
    (dispatch,) = made.dispatches
    waiting = conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, dispatch.job_id, utcnow(), "racer")
    )
    assert waiting is not None
    started = conveyor_service.db.run(lambda s: children.start_child(s, waiting, utcnow()))
    assert started.child_id is not None
    kid_id = started.child_id
    (first,) = started.dispatches
    last = conveyor_service.db.autocommit(
        lambda s: claiming.claim_node(s, first.job_id, utcnow(), "racer")
    )
    assert last is not None

    # When the parent is cancelled while the child's last node completes, each holding what
    # the other locks next: the cancel the parent's rows (then the child's), the child's
    # finish its own rows (then the parent's waiting job). Another transaction holds that
    # job meanwhile, so that both reach it, the cancel first, before either goes on.
    with conveyor_service.db.transaction() as holder:
        holder.session.execute(
            text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": waiting.job.id}
        )
        cancelling, cancelled = in_thread(lambda: conveyor_service.cancel(made.execution_id))
        wait_until(lambda: lock_waiters(conveyor_service) == 1)
        finishing, finished = in_thread(
            lambda: conveyor_service.db.run(
                lambda s: success.complete_node(s, last, {"sum": 3}, utcnow(), 0.01)
            )
        )
        wait_until(lambda: lock_waiters(conveyor_service) == 2)
    cancelling.join(timeout=60)
    finishing.join(timeout=60)

    # Then PostgreSQL's deadlock was retried, and both went through
    assert "deadlock detected" in caplog.text
    assert cancelled == [None] and not isinstance(finished[0], Exception)
    # and both executions ended consistent: the parent cancelled, the child completed (its
    # finish first: the parent's node completed with its output) or cancelled (the cancel
    # first: the child's node, ending after, recorded cancelled)
    with conveyor_service.db.transaction() as store:
        mom = store.execution_row(made.execution_id)
        kid = store.execution_row(kid_id)
        nodes = {n.node_id: n for n in store.execution_nodes(made.execution_id)}
        tries = [
            (job, attempts)
            for execution_id in (made.execution_id, kid_id)
            for job, attempts in store.execution_jobs(execution_id)
        ]
    assert mom.status is ExecutionStatus.CANCELLED
    assert kid.status in (ExecutionStatus.COMPLETED, ExecutionStatus.CANCELLED)
    call_ended = (
        NodeStatus.COMPLETED if kid.status is ExecutionStatus.COMPLETED else NodeStatus.CANCELLED
    )
    assert (nodes["call"].status, nodes["after"].status) == (call_ended, NodeStatus.CANCELLED)
    assert {job.status for job, _ in tries} <= {JobStatus.COMPLETED, JobStatus.CANCELLED}
    assert "running" not in {a.status.value for _, attempts in tries for a in attempts}


def test_a_waiting_node_holds_no_permit(conveyor_service: Conveyor) -> None:
    # Given a tenant that may run one node at a time
    with conveyor_service.db.transaction() as store:
        store.create_tenant("solo")
        store.set_tenant_concurrency("solo", 1)
    for name, nodes in (
        ("kid", [py("x", "add", a=1, b=2), py("y", "add", "x", a=3, b=4)]),
        ("parent", [call("child", "kid"), call("again", "kid", "child")]),
    ):
        conveyor_service.apply(parse_workflow({"name": name, "nodes": nodes}), "solo")

    # When a parent waits on its child, whose nodes need that one permit
    made = conveyor_service.submit("parent", {}, tenant="solo")

    # Then the children run: the waiting node holds none
    row = wait_for(conveyor_service, made.execution_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    with conveyor_service.db.transaction() as store:
        found = store.list_executions(None, where=ExecutionFilter(workflow="kid"), limit=9)
    assert [e.status for e, _, _ in found] == [ExecutionStatus.COMPLETED] * 2
    usage = {u.key: u for u in conveyor_service.gate.limiter.snapshot()}  # type: ignore[union-attr]
    assert usage["global"].in_use == 0


def test_the_api_links_a_parent_and_its_children_both_ways_for_its_tenant_only(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    key, other = make_key("acme"), make_key("umbrella")
    kid = {"name": "kid", "nodes": [py("x", "add", a="{{ input.v }}", b=1)]}
    parent = {"name": "parent", "nodes": [
        call(f"c{i}", "kid", inputs={"v": i}) for i in range(3)
    ]}  # fmt: skip
    with client(api_url, key) as http:
        assert http.post("/v1/workflows", json=kid).status_code == 201
        assert http.post("/v1/workflows", json=parent).status_code == 201
        made = http.post("/v1/workflows/parent/executions", json={}).json()["id"]
        assert wait_for(conveyor_service, uuid.UUID(made)).status is ExecutionStatus.COMPLETED

        # The parent's children, newest first, paged, each with its node and try
        listed = http.get(f"/v1/executions/{made}/children").json()
        first_page = http.get(f"/v1/executions/{made}/children", params={"limit": 2}).json()
        rest = http.get(
            f"/v1/executions/{made}/children", params={"after": first_page[-1]["id"]}
        ).json()
        shown = http.get(f"/v1/executions/{made}").json()
        child = http.get(f"/v1/executions/{listed[0]['id']}").json()
    with client(api_url, other) as http:
        foreign = http.get(f"/v1/executions/{made}/children")

    assert sorted((c["node"], c["try_number"], c["workflow"]) for c in listed) == [
        (f"c{i}", 1, "kid") for i in range(3)
    ]
    assert {c["parent_execution_id"] for c in listed} == {made}
    assert [c["id"] for c in first_page + rest] == [c["id"] for c in listed]
    assert (shown["parent"], shown["depth"], shown["children_count"]) == (None, 0, 3)
    assert [c["id"] for c in shown["children"]] == [c["id"] for c in listed]
    by_node = {n["id"]: n["child"] for n in shown["nodes"]}
    assert by_node == {c["node"]: c["id"] for c in listed}
    assert child["parent"]["execution_id"] == made
    assert (child["parent"]["workflow"], child["parent"]["node"], child["depth"]) == (
        "parent", listed[0]["node"], 1,
    )  # fmt: skip
    assert child["output"] == {"x": {"sum": int(listed[0]["node"][1:]) + 1}}
    assert foreign.status_code == 404


def test_the_api_refuses_a_circle_of_workflows_naming_it(
    conveyor_service: Conveyor, api_url: str, make_key: MakeKey
) -> None:
    with client(api_url, make_key("acme")) as http:
        ping = {"name": "ping", "nodes": [call("to_pong", "pong")]}
        pong = {"name": "pong", "nodes": [call("to_ping", "ping")]}
        assert http.post("/v1/workflows", json=ping).status_code == 201
        refused = http.post("/v1/workflows", json=pong)

    assert refused.status_code == 422
    assert refused.json()["errors"] == [
        "workflow: its workflow nodes start 'pong' again through the workflows applied "
        "(pong -> ping -> pong); workflows may not start each other in a circle: remove one "
        "of these workflow nodes, or start another workflow"
    ]


def test_a_map_of_children_runs_a_child_per_item_and_goes_on_once_with_their_outputs(
    conveyor_service: Conveyor,
) -> None:
    # Given a parent whose workflow node maps over its input, a diamond child per row
    apply(conveyor_service, "diamond", *DIAMOND)
    apply(conveyor_service, "parent",
          call("each", "diamond", map={"over": "{{ input.rows }}", "concurrency": 2},
               inputs={"x": "{{ item }}"}),
          py("after", "add", "each", a="{{ nodes.each | map(attribute='join.sum') | sum }}",
             b=0))  # fmt: skip

    # When it runs over four rows
    row = wait_for(conveyor_service, conveyor_service.trigger("parent", {"rows": [1, 2, 3, 4]}))

    # Then a child per row completed, and the node's output is theirs in row order
    assert row.status is ExecutionStatus.COMPLETED, row.error
    kids = children_of(conveyor_service, row.id)
    assert sorted(k.input["x"] for k in kids) == [1, 2, 3, 4]
    assert {(k.status, k.parent_node_id, k.parent_try) for k in kids} == {
        (ExecutionStatus.COMPLETED, "each", 1)
    }
    with conveyor_service.db.transaction() as store:
        each = {n.node_id: n for n in store.execution_nodes(row.id)}["each"]
    # a diamond on x gives (x + 1 + 10) + (x + 1 + 20) = 2x + 32
    assert each.output == [{"join": {"sum": 2 * x + 32}} for x in (1, 2, 3, 4)]
    assert row.output == {"after": {"sum": 148}}
    # every node of every child ran once, and the successor once (counted by this test's
    # executions: an earlier test's node still finishing on the shared worker is not ours)
    ours = {str(row.id), *(str(k.id) for k in kids)}
    ran = sorted(e["node_id"] for e in effects(TEST_DB_URL)
                 if e["idempotency_key"].split(":")[0] in ours)  # fmt: skip
    assert ran == sorted(["after"] + ["join", "left", "right", "start"] * 4)
    # and the views link each child and its item both ways
    with conveyor_service.db.transaction() as store:
        shown = views.execution_view(store, row.id)
        listed = views.items_json(store, row.id, "each", after=None, limit=10, status=None)
        child = views.execution_view(store, uuid.UUID(listed[2]["child"] or ""))
    by_item = {c["item_index"]: c["id"] for c in shown["children"]}
    assert [i["child"] for i in listed] == [by_item[i] for i in range(4)]
    assert [n["child"] for n in shown["nodes"]] == [None, None]  # a map's are its items'
    assert child["parent"] is not None and child["parent"]["item_index"] == 2
    assert child["input"] == {"x": 3}
    # as `executions show` prints them: the parent's children by item, each item's child, and
    # a child's item
    cli = CliRunner()
    parent_table = cli.invoke(app, ["executions", "show", str(row.id)], terminal_width=200)
    items_table = cli.invoke(app, ["executions", "show", str(row.id), "--items", "each"],
                             terminal_width=200)  # fmt: skip
    child_shown = cli.invoke(app, ["executions", "show", child["id"]], terminal_width=200)
    assert all(r.exit_code == 0 for r in (parent_table, items_table, child_shown))
    assert all(f"each[{i}]" in parent_table.output for i in range(4))
    assert "child" in items_table.output and listed[2]["child"] in items_table.output
    assert "(workflow parent, node each, item 2, try 1)" in child_shown.output


def test_cancelling_a_parent_mid_map_of_children_cancels_every_running_child(
    conveyor_service: Conveyor,
) -> None:
    apply(conveyor_service, "slow", py("nap", "sleep", seconds=30))
    apply(conveyor_service, "parent",
          call("each", "slow", map={"over": "{{ input.rows }}", "concurrency": 2}))  # fmt: skip
    parent_id = conveyor_service.trigger("parent", {"rows": [1, 2, 3]})
    kids = wait_until(lambda: len(found := children_of(conveyor_service, parent_id)) == 2 and found)
    for kid in kids:
        wait_until(
            lambda k=kid: job_of(conveyor_service, k.id, "nap").status is JobStatus.PROCESSING
        )

    conveyor_service.cancel(parent_id)

    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.CANCELLED
    for kid in kids:
        assert wait_for(conveyor_service, kid.id).status is ExecutionStatus.CANCELLED
        wait_until(
            lambda k=kid: job_of(conveyor_service, k.id, "nap").status is JobStatus.CANCELLED
        )
    # the third row never started a child; every item of the map is cancelled
    assert len(children_of(conveyor_service, parent_id)) == 2
    with conveyor_service.db.transaction() as store:
        counts = store.item_counts(parent_id)
    assert counts == {"each": {JobStatus.CANCELLED: 3}}


def test_a_rerun_from_a_workflow_node_starts_a_new_child_and_the_parent_completes(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    # Given a parent whose child failed (its file is missing), failing the parent
    once = {"retry": {"max_attempts": 1}}
    apply(conveyor_service, "kid", py("x", "until_file", path=str(tmp_path / "fixed")),
          defaults=once)  # fmt: skip
    apply(conveyor_service, "parent", call("child", "kid"),
          py("after", "add", "child", a=1, b=2), defaults=once)  # fmt: skip
    parent_id = conveyor_service.trigger("parent")
    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.FAILED

    # When the cause is fixed and the parent is rerun from its workflow node
    (tmp_path / "fixed").touch()
    done = conveyor_service.rerun(parent_id, "child", requested_by="cli:ops")

    # Then a new child runs for the node's next try, and the parent completes
    assert done.nodes == ["child", "after"]
    row = wait_for(conveyor_service, parent_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    first, second = children_of(conveyor_service, parent_id)
    assert [(c.status, c.parent_try) for c in (first, second)] == [
        (ExecutionStatus.FAILED, 1), (ExecutionStatus.COMPLETED, 2),
    ]  # fmt: skip
    assert job_of(conveyor_service, parent_id, "child").status is JobStatus.COMPLETED
    assert sorted(e["node_id"] for e in effects(TEST_DB_URL)) == ["after", "x", "x"]


def test_a_rerun_through_a_map_of_children_starts_a_new_child_per_item(
    conveyor_service: Conveyor, tmp_path: Path
) -> None:
    # Given a map of children over two files, one missing: its child fails, and the map
    once = {"retry": {"max_attempts": 1}}
    (tmp_path / "a").touch()
    apply(conveyor_service, "kid", py("x", "until_file", path="{{ input.path }}"),
          defaults=once)  # fmt: skip
    apply(conveyor_service, "parent",
          call("each", "kid", map={"over": "{{ input.names }}"},
               inputs={"path": f"{tmp_path}/{{{{ item }}}}"}),
          defaults=once)  # fmt: skip
    parent_id = conveyor_service.trigger("parent", {"names": ["a", "b"]})
    assert wait_for(conveyor_service, parent_id).status is ExecutionStatus.FAILED
    wait_until(lambda: all(c.status.finished for c in children_of(conveyor_service, parent_id)))
    earlier = {c.id for c in children_of(conveyor_service, parent_id)}

    # When the file is there and the map is rerun
    (tmp_path / "b").touch()
    conveyor_service.rerun(parent_id, "each", requested_by="cli:ops")

    # Then each item starts a new child in its next try, and the parent completes
    row = wait_for(conveyor_service, parent_id)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"each": [{"x": {"on": True}}, {"x": {"on": True}}]}
    new = [c for c in children_of(conveyor_service, parent_id) if c.id not in earlier]
    assert sorted((c.status, c.input["path"][-1]) for c in new) == [
        (ExecutionStatus.COMPLETED, "a"), (ExecutionStatus.COMPLETED, "b"),
    ]  # fmt: skip
