"""The export-approval example as its comments run it on the embedded default: `conveyor run`
returns once the export waits, `conveyor approvals list` shows it, and `conveyor approvals
approve` decides it and follows the execution to its end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.conftest import examples_shell


@pytest.mark.timeout(300)  # four `conveyor` processes in a row, each importing the CLI
def test_the_export_approval_example_completes_on_the_embedded_default_once_approved(
    tmp_path: Path,
) -> None:
    # Given a fresh directory with the examples, no CONVEYOR_* settings but the demo's nodes
    shell = examples_shell(tmp_path)

    # When the export runs as the example's comments say: it comes to its approval and returns
    run = shell(
        "conveyor run examples/export-approval.yaml "
        '--input "$(cat examples/export-approval.input.json)" --json'
    )
    assert run.returncode == 0, run.stdout + run.stderr
    started = json.loads(run.stdout)
    assert started["status"] == "running" and "conveyor approvals list" in run.stderr

    # and its approval is listed, then approved by the CLI
    listed = shell("conveyor approvals list --json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (pending,) = json.loads(listed.stdout)
    assert pending["execution_id"] == started["execution_id"]
    assert pending["message"] == "Export the table to the partner's bucket?"
    approved = shell(
        f"conveyor approvals approve {pending['id']} --by ada --comment 'ok for the partner' --json"
    )

    # Then the export ran (twice the rows: demo.double) and the decision is the output
    assert approved.returncode == 0, approved.stdout + approved.stderr
    told = json.loads(approved.stdout)
    assert (told["decision"], told["by"], told["status"]) == ("approved", "ada", "completed")
    shown = shell(f"conveyor executions show {started['execution_id']} --json")
    view = json.loads(shown.stdout)
    assert view["output"] == {"decision": "approved", "exported": 2400}
    assert {n["id"]: n["status"] for n in view["nodes"]} == {
        "approve": "completed", "export": "completed", "notify": "skipped",
    }  # fmt: skip
    assert shell("conveyor approvals list --json").stdout.strip() == "[]"
