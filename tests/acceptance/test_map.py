"""Maps on real processes: a map of 1,000 items on two ``celery worker`` processes, and the
map example as a newcomer runs it on the embedded default. The node functions count their own
runs (test_effects), not only the engine's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

from conveyor.engine.states import ExecutionStatus, JobStatus
from conveyor.engine.validation import parse_workflow
from conveyor.service import Conveyor
from tests.acceptance.conftest import ACCEPTANCE_DB_URL, ROOT, await_ready
from tests.support.services import effects, wait_for

CONVEYOR = str(Path(sys.executable).parent / "conveyor")  # the installed console script


def test_a_map_of_1000_items_runs_each_once_and_its_successor_once_with_the_outputs_in_order(
    acceptance_env: dict[str, str], start_worker: Callable[..., Popen[str]], client: Conveyor
) -> None:
    # Given two worker processes that keep at most 100 of a map's items queued or running,
    # and let a tenant and a workflow run 16 node jobs at once (all their slots)
    env = {
        "CONVEYOR_MAP_WINDOW": "100", "CONVEYOR_LIMIT_TENANT": "16",
        "CONVEYOR_LIMIT_WORKFLOW": "16",
    }  # fmt: skip
    await_ready(*(
        start_worker("workflow-execution,workflow-node", concurrency=4, name=name, env=env,
                     wait=False)
        for name in ("one", "two")
    ))  # fmt: skip
    client.apply(parse_workflow({"name": "map_1000", "nodes": [
        {"id": "m", "type": "python", "config": {"function": "test.item"},
         "map": {"over": "{{ input.rows }}"}, "inputs": {"value": "{{ item * 3 }}"}},
        {"id": "after", "type": "python", "config": {"function": "test.collect"},
         "needs": ["m"], "inputs": {"values": "{{ nodes.m | map(attribute='value') | list }}"}},
    ]}))  # fmt: skip

    # When it maps over 1,000 items
    execution_id = client.trigger("map_1000", {"rows": list(range(1000))})
    done = wait_for(client, execution_id, timeout=240)

    # Then every item ran once, and the successor once, with their outputs in item order
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.output == {"after": {"values": [i * 3 for i in range(1000)]}}
    found = effects(ACCEPTANCE_DB_URL)
    runs = Counter(e["idempotency_key"] for e in found if e["node_id"] == "m")
    assert runs == Counter({f"{execution_id}:m:{i}": 1 for i in range(1000)})
    assert [e["value"] for e in found if e["node_id"] == "after"] == ["1000"]
    with client.db.transaction() as store:
        statuses = store.item_counts(execution_id)
    assert statuses == {"m": {JobStatus.COMPLETED: 1000}}


def test_the_map_example_completes_on_the_embedded_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["CONVEYOR_IMPORTS"] = "conveyor.demo"
    given = (ROOT / "examples" / "map.input.json").read_text()

    run = subprocess.run(
        [CONVEYOR, "run", str(ROOT / "examples" / "map.yaml"), "--input", given, "--wait",
         "--json"],
        env=env, cwd=tmp_path, text=True, capture_output=True, timeout=120,
    )  # fmt: skip

    assert run.returncode == 0, run.stdout + run.stderr
    outcome = json.loads(run.stdout)
    assert (outcome["status"], outcome["output"]) == ("completed", {"orders": 5, "total": 31.25})
