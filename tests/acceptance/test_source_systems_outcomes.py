"""Issue 27, items 1 and 5, on real ``celery worker`` processes: a node snoozes while its input
is not ready (no attempt spent), a node ends itself cancelled, a node ends itself skipped. One
worker set runs all three."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest

from conveyor import views
from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, ROOT, await_ready
from tests.support.services import effects, wait_for


def _python(node_id: str, function: str, needs: list[str], **inputs: object) -> dict:
    return {"id": node_id, "type": "python", "config": {"function": function},
            "needs": needs, "inputs": inputs}  # fmt: skip


# The broker carries every run here: the same checks on Redis and RabbitMQ
@pytest.mark.parametrize("acceptance_broker", ["redis", "amqp"], indirect=True)
def test_a_node_snoozes_without_spending_attempts_cancels_its_execution_or_skips_itself(
    client: Conveyor,
    start_worker: Callable[..., Popen[str]],
    acceptance_env: dict[str, str],
    tmp_path: Path,
) -> None:
    await_ready(
        start_worker("workflow-execution", concurrency=1, name="exec", wait=False),
        start_worker("workflow-node", concurrency=2, name="node", wait=False),
    )
    once = {"retry": {"max_attempts": 1}}

    # Given a node whose input is not ready for its first five tries, with one attempt only
    client.apply(parse_workflow({
        "name": "ledger", "defaults": once,
        "nodes": [_python("post", "test.snooze", [], times=5, seconds=0.2),
                  _python("after", "test.add", ["post"], a="{{ nodes.post.tries }}", b=0)],
    }))  # fmt: skip
    # And a node that finds its document deleted, before a node that must not run
    client.apply(parse_workflow({
        "name": "export", "defaults": once,
        "nodes": [_python("render", "test.cancel", [], reason="the document was deleted"),
                  _python("upload", "test.add", ["render"], a=1, b=1)],
    }))  # fmt: skip

    # And a node with nothing to do, before a node of its own and a join with another
    client.apply(parse_workflow({
        "name": "digest", "defaults": once,
        "nodes": [_python("check", "test.skip", [], reason="nothing changed"),
                  _python("send", "test.add", ["check"], a=1, b=1),
                  _python("count", "test.add", [], a=1, b=2),
                  _python("tally", "test.add", ["check", "count"], a="{{ nodes.count.sum }}",
                          b=0)],
    }))  # fmt: skip

    snoozing = client.trigger("ledger", {})
    cancelling = client.trigger("export", {})
    skipping = client.trigger("digest", {})

    # Then the snoozing node ran six times on its one attempt, and succeeded
    row = wait_for(client, snoozing, timeout=60)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    assert row.output == {"after": {"sum": 6}}
    with client.db.transaction() as store:
        view = views.execution_view(store, snoozing)
    post = next(n for n in view["nodes"] if n["id"] == "post")
    assert (post["attempts"], post["snoozes"], post["error"]) == (1, 5, None)
    (job,) = [j for j in view["jobs"] if j["node"] == "post"]
    assert [a["status"] for a in job["attempts"]] == ["snoozed"] * 5 + ["succeeded"]
    assert job["attempts"][0]["error"] == "not ready yet (1 of 5)"
    assert job["last_error"] is None
    tries = [e["attempt"] for e in effects(ACCEPTANCE_DB_URL) if e["node_id"] == "post"]
    assert tries == [1] * 6  # ctx.attempt never moved

    # And the cancelling node ended itself and its execution cancelled, nothing dead-lettered
    row = wait_for(client, cancelling, timeout=60)
    reason = "cancelled by node 'render': the document was deleted"
    assert (row.status, row.error) == (ExecutionStatus.CANCELLED, reason)
    with client.db.transaction() as store:
        view = views.execution_view(store, cancelling)
        jobs = {j.node_id: j for j, _ in store.execution_jobs(cancelling)}
    assert {n["id"]: (n["status"], n["error"]) for n in view["nodes"]} == {
        "render": ("cancelled", reason), "upload": ("cancelled", None),
    }  # fmt: skip
    assert jobs["render"].status is JobStatus.CANCELLED
    assert not [j for j in jobs.values() if j.status is JobStatus.DEAD_LETTER]
    assert [e["node_id"] for e in effects(ACCEPTANCE_DB_URL)].count("upload") == 0

    # And the skipping node ended skipped, its own successor too, the join ran
    row = wait_for(client, skipping, timeout=60)
    assert row.status is ExecutionStatus.COMPLETED, row.error
    with client.db.transaction() as store:
        view = views.execution_view(store, skipping)
    assert {n["id"]: n["status"] for n in view["nodes"]} == {
        "check": "skipped", "send": "skipped", "count": "completed", "tally": "completed",
    }  # fmt: skip
    (job,) = [j for j in view["jobs"] if j["node"] == "check"]
    assert [(a["status"], a["error"]) for a in job["attempts"]] == [("skipped", "nothing changed")]

    # And `conveyor executions show` says so
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "conveyor"), "executions", "show", str(cancelling)],
        cwd=ROOT, env={**os.environ, **acceptance_env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "the document was deleted" in shown.stdout

    # And the node worker logged each snooze, skip and cancel as such, no error among them
    records = [json.loads(line) for line in (tmp_path / "node.log").read_text().splitlines()
               if line.startswith("{")]  # fmt: skip
    said = [r["event"] for r in records if r.get("node_id") in ("post", "render", "check")]
    assert said.count("snoozed") == 5
    assert {"job skipped", "cancelled by the node"} <= set(said)
    assert not [r for r in records if r.get("level") in ("error", "ERROR", "critical")]
    # And Celery (so Flower) saw each snooze as a retry, the skip and the cancel as successes
    tasks = [r["event"] for r in records if r.get("logger") == "celery.app.trace"]
    snoozes = [t for t in tasks if "ledger/post" in t and " retry: " in t]
    assert len(snoozes) == 5
    assert "runs again in 0.2s: snoozed for 0.2s: not ready yet (1 of 5)" in snoozes[0]
    succeeded = [t for t in tasks if " succeeded in " in t]  # a batch names its first job
    assert [t for t in succeeded if "cancelled by the node: the document was deleted" in t]
    assert [t for t in succeeded if "skipped by the node: nothing changed" in t]
