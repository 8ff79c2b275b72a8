"""docs/quickstart.md runs as it says. Its code is read from the markdown: the node module of
step 2 and the workflow of step 3 are written where the page puts them, in an empty project
directory, and the commands of steps 4 and 5 run there as a reader's shell runs them, on the
embedded default (the real `conveyor` command: SQLite, worker threads); then step 6's
migrations and apply run against PostgreSQL and Redis, the page's placeholder URLs replaced by
the test's. The blocks that need Docker or a cluster are checked without them, in
tests/unit/test_quickstart_page.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.service import Conveyor
from tests.acceptance.conftest import ROOT
from tests.support.doc_blocks import Ran, blocks_under, commands_of, run_block

PAGE = ROOT / "docs" / "quickstart.md"
STEP = {
    2: "## 2. Write node functions",
    3: "## 3. Write a workflow",
    4: "## 4. Tell Conveyor where your nodes are",
    5: "## 5. Try it embedded",
    6: "## 6. Run it on PostgreSQL, Redis and Celery workers",
}


def project_of(tmp_path: Path) -> Path:
    """An empty project directory holding what steps 2 and 3 write, and nothing else."""
    project = tmp_path / "project"
    (project / "shop").mkdir(parents=True)
    (project / "shop" / "__init__.py").write_text("")  # step 2: "beside an empty __init__.py"
    (module,) = blocks_under(PAGE, STEP[2], "python")
    (project / "shop" / "nodes.py").write_text(module)
    (project / "workflows").mkdir()
    (workflow,) = blocks_under(PAGE, STEP[3], "yaml")
    (project / "workflows" / "order.yaml").write_text(workflow)
    return project


def commands(step: int, blocks: slice = slice(None)) -> list[str]:
    return [c for block in blocks_under(PAGE, STEP[step], "sh")[blocks] for c in commands_of(block)]


def said(ran: Ran) -> str:
    return ran.stdout + ran.stderr


@pytest.mark.timeout(300)
def test_the_quickstart_runs_embedded_then_on_postgresql(
    tmp_path: Path, client: Conveyor, acceptance_env: dict[str, str]
) -> None:
    project = project_of(tmp_path)

    # Steps 4 and 5: validate, then run, on the embedded default
    validated, ran = run_block(commands(4) + commands(5), clone=project)

    assert validated.returncode == 0, said(validated)
    assert validated.stdout == "workflows/order.yaml: valid\n"
    assert ran.returncode == 0, said(ran)
    output = json.loads(ran.stdout[ran.stdout.index("\n{") :])
    assert output == {"total": 22.8, "sent_to": "ada@example.com"}
    assert (project / ".conveyor" / "conveyor.db").is_file()

    # Step 6's first block: the schema and the workflow on PostgreSQL, with Redis as broker
    services = {k: acceptance_env[k] for k in ("CONVEYOR_DATABASE_URL", "CONVEYOR_BROKER_URL")}
    upgraded, applied = run_block(commands(6, slice(1)), clone=project, overrides=services)

    assert upgraded.returncode == 0, said(upgraded)
    assert applied.returncode == 0, said(applied)
    assert applied.stdout == "order: stored version 1\n"
    with client.db.transaction() as store:
        stored = store.latest_workflow(store.tenant_id("default"), "order")
    assert stored is not None and stored.definition["nodes"][1]["id"] == "receipt"
