"""`conveyor executions rerun` as an operator runs it, against PostgreSQL, Redis and real
`celery worker` processes: a diamond fails at its middle node, the cause is fixed, and the
execution runs again from that node to its end."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest

from conveyor import views
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, await_ready
from tests.acceptance.test_cli import conveyor
from tests.support.services import effects


def diamond(flag: Path) -> dict[str, object]:
    """start -> (broken, side) -> join; `broken` fails (one try) until ``flag`` exists."""

    def py(node_id: str, function: str, *needs: str, **inputs: object) -> dict[str, object]:
        return {"id": node_id, "type": "python", "config": {"function": f"test.{function}"},
                "needs": list(needs), "inputs": inputs}  # fmt: skip

    return {
        "name": "rerun-diamond",
        "defaults": {"retry": {"max_attempts": 1}},
        "nodes": [
            py("start", "add", a=1, b=1),
            py("broken", "until_file", "start", path=str(flag), after="side"),
            py("side", "add", "start", a="{{ nodes.start.sum }}", b=1),
            py("join", "add", "broken", "side", a="{{ nodes.side.sum }}", b=10),
        ],
    }


# Three `conveyor` processes and two workers start, each in seconds on a loaded machine; the
# two that wait for the execution have no time limit of their own but the test's.
@pytest.mark.timeout(300)
def test_a_failed_diamond_reruns_from_its_failed_node_on_real_workers_and_completes(
    acceptance_env: dict[str, str],
    start_worker: Callable[..., Popen[str]],
    client: Conveyor,
    tmp_path: Path,
) -> None:
    # Given two workers, and a diamond run that failed at its middle node
    env = {**acceptance_env, "CONVEYOR_IMPORTS": "tests.support.nodes"}
    await_ready(
        start_worker("workflow-execution,workflow-node", concurrency=2, name="a", env=env,
                     wait=False),
        start_worker("workflow-node", concurrency=2, name="b", env=env, wait=False),
    )  # fmt: skip
    flag = tmp_path / "fixed"
    definition = tmp_path / "rerun-diamond.json"
    definition.write_text(json.dumps(diamond(flag)))
    applied = conveyor("workflow", "apply", str(definition), env=env)
    assert applied.returncode == 0, applied.stderr
    failed = conveyor("run", "rerun-diamond", "--wait", "--json", env=env, timeout=None)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    execution_id = json.loads(failed.stdout)["execution_id"]

    # When the cause is fixed and the operator reruns it from that node
    flag.touch()
    rerun = conveyor("executions", "rerun", execution_id, "--from", "broken", "--wait", "--json",
                     env=env, timeout=None)  # fmt: skip

    # Then it completes; the node and its downstream ran again, the rest did not
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    outcome = json.loads(rerun.stdout)
    assert (outcome["status"], outcome["output"]) == ("completed", {"join": {"sum": 13.0}})
    ran = Counter(
        e["node_id"]
        for e in effects(ACCEPTANCE_DB_URL)
        if e["idempotency_key"].startswith(f"{execution_id}:")
    )
    assert ran == {"start": 1, "broken": 2, "side": 1, "join": 1}
    with client.db.transaction() as store:
        shown = views.execution_view(store, uuid.UUID(execution_id))
    tries = {j["node"]: [(a["number"], a["status"]) for a in j["attempts"]] for j in shown["jobs"]}
    assert tries["broken"] == [(1, "failed"), (2, "succeeded")]
    (recorded,) = shown["reruns"]
    assert recorded["from_node"] == "broken" and recorded["requested_by"].startswith("cli:")
